// FNV-1a 64: a simple, fast, non-cryptographic 64-bit checksum, used to detect corrupted bytes
// in KV files and to fingerprint inputs (docs/kv-format.md). Each step is h = (h xor byte) *
// 0x100000001b3 mod 2^64; both operations are bijections of h, so a change confined to one byte
// always changes the result, and other random corruptions go undetected with probability about
// 2^-64. It is not a defence against deliberate tampering (collisions are easy to construct).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace slope {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ull;

// Continues the checksum `h` over `bytes` bytes at `data` (start with kFnv1a64Offset).
inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * kFnv1a64Prime;
  return h;
}
inline uint64_t fnv1a64(const std::string& s, uint64_t h = kFnv1a64Offset) { return fnv1a64(s.data(), s.size(), h); }

// 16 lower-case hex digits, most significant first.
inline std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = digits[v & 15];
  return s;
}

}  // namespace slope
