// kvx::AddressList: the hosts a rank may push KV to (`slope serve --kv-push-allow`). Entries are
// CIDR blocks ("10.0.0.0/8", "fd00::/8"), single addresses, or host names (matched as written,
// case-insensitively, against the push target's host). The rank resolves a target once and
// dials only the addresses the list allows, so a name cannot resolve to one address when
// checked and another when dialed.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace slope::kvx {

class AddressList {
 public:
  AddressList() = default;
  // Throws slope::Error naming an entry that is neither an address, a CIDR block nor a name.
  explicit AddressList(const std::vector<std::string>& entries);

  bool empty() const { return blocks_.empty() && names_.empty(); }
  bool names(const std::string& host) const;  // host is one of the names listed
  bool allows(const sockaddr* address) const; // address is in one of the blocks
  const std::vector<std::string>& entries() const { return entries_; }

 private:
  struct Block {
    int family;                     // AF_INET or AF_INET6
    std::array<uint8_t, 16> bytes;  // the network's address
    int bits;                       // prefix length
  };
  std::vector<Block> blocks_;
  std::vector<std::string> names_, entries_;
};

}  // namespace slope::kvx
