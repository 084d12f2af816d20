// bf16 round-to-nearest-even for tests, computed independently of core/half.h's bit trick: the
// two bf16 neighbours of x (its truncation and one unit above), the one nearer in double, a tie
// to the even mantissa. For finite x.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace slope::testing {

inline float bf16_reference(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dlo = std::fabs(double(x) - double(flo)), dhi = std::fabs(double(fhi) - double(x));
  if (dlo < dhi) return flo;
  if (dhi < dlo) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

}  // namespace slope::testing
