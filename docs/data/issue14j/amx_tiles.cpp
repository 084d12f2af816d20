// AMX tile micro-benchmark (issue 14, tenth window; README.md): four tile loads and four tdpbf16ps a
// step over SPAN bytes of A tiles; MODE 1 adds, every other step, the attention kernel's round trips
// (tile stores read back by a vector load, a vector store read by the next tile loads).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
struct alignas(64) Cfg { uint8_t p=1,s=0,r[14]={}; uint16_t c[16]={}; uint8_t rows[16]={}; Cfg(){for(int t=0;t<8;++t){c[t]=64;rows[t]=16;}} };
int main(int argc,char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; _tile_loadconfig(&cfg);
  size_t span = argc>1? atol(argv[1]) : 16384; // bytes of A region cycled through
  int mode = argc>2? atoi(argv[2]) : 0;
  char* a = (char*)aligned_alloc(64, span+8192); memset(a, 1, span+8192);
  alignas(64) static char b[4096*8]; memset(b,1,sizeof b);
  alignas(64) static float st[4*256*8];
  const long iters = 2000000;
  auto t0=std::chrono::steady_clock::now();
  size_t off=0;
  for(long i=0;i<iters;++i){
    _tile_loadd(4, a+off, 64); _tile_loadd(5, a+off+1024, 64);
    _tile_loadd(6, b, 64); _tile_loadd(7, b+1024, 64);
    _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
    off += 2048; if (off >= span) off = 0;
    if (mode==2 && (i&1)) { _tile_stored(0, st, 64); _tile_stored(1, st+256, 64); _tile_stored(2, st+512,64); _tile_stored(3, st+768,64);
       __m512 x=_mm512_load_ps(st); _mm512_store_ps((float*)st+2048, x); }
    if (mode==3 && (i&1)) { __m512 x=_mm512_load_ps(st+1024); _mm512_store_ps((float*)b, x); }
    if (mode==4 && (i&1)) { _tile_stored(0, st, 64); _tile_stored(1, st+256, 64); _tile_stored(2, st+512,64); _tile_stored(3, st+768,64); }
    if (mode==5 && (i&1)) { _tile_stored(0, st, 64); _tile_stored(1, st+256, 64); _tile_stored(2, st+512,64); _tile_stored(3, st+768,64);
       __m512 x=_mm512_load_ps(st+4096); _mm512_store_ps((float*)b+2048, x); }
    if (mode==1 && (i&1)) { _tile_stored(0, st, 64); _tile_stored(1, st+256, 64); _tile_stored(2, st+512,64); _tile_stored(3, st+768,64);
       __m512 x=_mm512_load_ps(st); _mm512_store_ps((float*)b, x); }
  }
  _tile_stored(0, st, 64);
  auto t1=std::chrono::steady_clock::now();
  double s=std::chrono::duration<double>(t1-t0).count();
  printf("span %zu mode %d: %.1f GFLOP/s, %.1f ns per dp\n", span, mode, iters*4*16384.0/s/1e9, s/(iters*4)*1e9);
}
