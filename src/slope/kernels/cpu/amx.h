// Intel AMX (Sapphire Rapids and later): eight tile registers of up to 16 rows x 64 bytes and a
// matrix unit whose tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one (packed in key
// pairs, as vdpbf16ps) into a 16 x 16 f32 tile: 16·16·32·2 = 16384 FLOP per instruction. Linux
// hands the tile state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM), so a
// kernel uses AMX only where amx_usable() says the CPU has it and the request was granted.
// Internal to kernels/cpu and bench/peak.cpp.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define SLOPE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define SLOPE_AMX 0
#endif

namespace slope::kernels::cpu {

#if SLOPE_AMX
// True when this CPU has AMX-BF16 and the kernel granted this process the tile data state. The
// request is made once per process (the grant is per process, for every thread).
inline bool amx_usable() {
  static const bool usable = [] {
    if (!__builtin_cpu_supports("amx-bf16")) return false;
    constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl codes (asm/prctl.h)
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

// The 64-byte tile configuration (palette 1): every tile 16 rows of 64 bytes. Each thread loads
// it (_tile_loadconfig) before its first tile instruction and releases the state
// (_tile_release) when done.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");
#else
inline bool amx_usable() { return false; }
#endif

}  // namespace slope::kernels::cpu
