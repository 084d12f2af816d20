// CRC-32 (the polynomial of zlib, gzip and PNG: reflected 0xEDB88320, initial and final value
// 0xFFFFFFFF), the checksum of every tensor a KV transfer sends (docs/kv-format.md). Chosen
// over the files' FNV-1a because a client verifies it at memory speed: Python's zlib.crc32 runs
// at GB/s where a byte loop of FNV-1a in Python runs at a few MB/s. Slice-by-8: eight bytes per
// step through eight 256-entry tables. It detects every error burst of up to 32 bits; other
// random corruption escapes with probability about 2^-32. Not a defence against tampering.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace slope::kvx {

using Crc32Tables = std::array<std::array<uint32_t, 256>, 8>;

inline const Crc32Tables& crc32_tables() {
  static const Crc32Tables tables = [] {
    Crc32Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    // t[s][i]: the CRC of byte i followed by s zero bytes.
    for (uint32_t i = 0; i < 256; ++i)
      for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  return tables;
}

// Continues `crc` (0 to start) over `bytes` bytes, as zlib's crc32(crc, data, bytes) does.
inline uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0) {
  const Crc32Tables& t = crc32_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  auto word = [](const unsigned char* q) {
    return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
  };
  crc = ~crc;
  for (; bytes >= 8; p += 8, bytes -= 8) {
    const uint32_t a = crc ^ word(p), b = word(p + 4);
    crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^ t[3][b & 0xFF] ^
          t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
  }
  for (; bytes > 0; ++p, --bytes) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// 8 lower-case hex digits, most significant first.
inline std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[size_t(i)] = digits[v & 15];
  return s;
}

}  // namespace slope::kvx
