// The AVX2 attention kernel's QK micro-kernel (attention_avx2.cpp, Qk<6>: 6 keys x 16 query rows, D = 64) alone on
// L1-resident operands, one thread: what the loop reaches outside the kernel. Output: qk_microkernel.txt.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
constexpr int kRows=16;
template <int NB>
__attribute__((always_inline)) inline void qk(const float* qt, const float* k, long kstride, long D, float* st) {
    __m256 acc[NB][2];
    for (int b = 0; b < NB; ++b) { acc[b][0] = _mm256_setzero_ps(); acc[b][1] = _mm256_setzero_ps(); }
    for (long d = 0; d < D; ++d) {  // qk4: _Pragma("GCC unroll 4") before this loop
      const __m256 q0 = _mm256_load_ps(qt + d * kRows), q1 = _mm256_load_ps(qt + d * kRows + 8);
      for (int b = 0; b < NB; ++b) {
        const __m256 kb = _mm256_broadcast_ss(k + b * kstride + d);
        acc[b][0] = _mm256_fmadd_ps(kb, q0, acc[b][0]);
        acc[b][1] = _mm256_fmadd_ps(kb, q1, acc[b][1]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      _mm256_store_ps(st + b * kRows, acc[b][0]);
      _mm256_store_ps(st + b * kRows + 8, acc[b][1]);
    }
}
__attribute__((noinline)) void block(const float* qt,const float* k,long D,float* st){ for(int j=0;j<60;j+=6) qk<6>(qt,k+j*D,D,D,st+j*16); }
int main(int argc,char**argv){
  long D=atol(argv[1]);
  float* qt=(float*)aligned_alloc(64,4*D*16); float* k=(float*)aligned_alloc(64,4*D*64); float* st=(float*)aligned_alloc(64,4*64*16);
  for(long i=0;i<D*16;i++) qt[i]=0.001f*i; for(long i=0;i<D*64;i++) k[i]=0.0001f;
  long iters=atol(argv[2]);
  for(int rep=0;rep<3;rep++){
  auto t0=std::chrono::steady_clock::now();
  for(long it=0;it<iters;it++){ block(qt,k,D,st); asm volatile(""::"r"(st):"memory"); }
  double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  double fl=2.0*iters*60*16*D; printf("D=%ld %.1f GFLOP/s\n",D,fl/s*1e-9);}
}
