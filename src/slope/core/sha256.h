// SHA-256 (FIPS 180-4), for API keys: the server and the ranks' KV services compare and store a
// key's digest, never the key itself (a rank learns who owns a KV shard from the digest).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace slope {

std::array<uint8_t, 32> sha256(std::string_view data);
std::string sha256_hex(std::string_view data);  // 64 lowercase hex digits

// a == b in a time that depends on the lengths only, not on where the first difference is
// (for secrets and their digests).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace slope
