#include "slope/kvx/address_list.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "slope/core/error.h"

namespace slope::kvx {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool prefix_equal(const uint8_t* a, const uint8_t* b, int bits) {
  const int whole = bits / 8, rest = bits % 8;
  if (std::memcmp(a, b, size_t(whole)) != 0) return false;
  if (rest == 0) return true;
  const uint8_t mask = uint8_t(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

AddressList::AddressList(const std::vector<std::string>& entries) : entries_(entries) {
  for (const std::string& e : entries) {
    SLOPE_CHECK(!e.empty(), "an empty --kv-push-allow entry; give a CIDR block, an address or a host name");
    const size_t slash = e.find('/');
    const std::string addr = e.substr(0, slash);
    Block b{};
    b.bytes.fill(0);
    if (::inet_pton(AF_INET, addr.c_str(), b.bytes.data()) == 1) b.family = AF_INET;
    else if (::inet_pton(AF_INET6, addr.c_str(), b.bytes.data()) == 1) b.family = AF_INET6;
    if (b.family == 0) {
      SLOPE_CHECK(slash == std::string::npos, "the --kv-push-allow entry '", e, "' is not a CIDR block (ADDRESS/BITS)");
      const bool name = std::all_of(e.begin(), e.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.'; });
      SLOPE_CHECK(name, "the --kv-push-allow entry '", e, "' is neither an address, a CIDR block nor a host name");
      names_.push_back(lower(e));
      continue;
    }
    const int max_bits = b.family == AF_INET ? 32 : 128;
    b.bits = max_bits;
    if (slash != std::string::npos) {
      const std::string bits = e.substr(slash + 1);
      SLOPE_CHECK(!bits.empty() && bits.size() <= 3 && std::all_of(bits.begin(), bits.end(), ::isdigit) &&
                      std::stoi(bits) <= max_bits,
                  "the --kv-push-allow entry '", e, "' has a bad prefix length (0 to ", max_bits, ")");
      b.bits = std::stoi(bits);
    }
    blocks_.push_back(b);
  }
}

bool AddressList::names(const std::string& host) const {
  const std::string h = lower(host);
  return std::find(names_.begin(), names_.end(), h) != names_.end();
}

bool AddressList::allows(const sockaddr* a) const {
  int family = a->sa_family;
  const uint8_t* bytes = nullptr;
  static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (family == AF_INET) {
    bytes = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr);
  } else if (family == AF_INET6) {
    bytes = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
    if (std::memcmp(bytes, v4_mapped, 12) == 0) family = AF_INET, bytes += 12;  // ::ffff:a.b.c.d is a.b.c.d
  } else {
    return false;
  }
  for (const Block& b : blocks_)
    if (b.family == family && prefix_equal(bytes, b.bytes.data(), b.bits)) return true;
  return false;
}

}  // namespace slope::kvx
