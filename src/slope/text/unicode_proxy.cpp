#include "slope/text/unicode_proxy.h"

#include <algorithm>
#include <bitset>
#include <iterator>
#include <memory>

#include "slope/text/utf8.h"

namespace slope::text {
namespace {

struct Range {
  char32_t first, last, proxy;
};

constexpr Range kRanges[] = {
#include "slope/text/unicode_proxy_table.inc"
};

struct FrozenRange {
  char32_t first, last;
};

constexpr FrozenRange kFrozen[] = {
#include "slope/text/unicode_frozen_table.inc"
};

constexpr bool all_need_three_bytes() {
  for (const Range& r : kRanges)
    if (r.first < 0x800) return false;
  return true;
}
static_assert(all_need_three_bytes(), "unicode_proxy_text skips 1- and 2-byte characters");

// Whether any table range touches each 256-code-point block: most text never reaches the search.
struct Blocks {
  std::bitset<0x110000 / 256> any;
  Blocks() {
    for (const Range& r : kRanges)
      for (char32_t b = r.first / 256; b <= r.last / 256; ++b) any.set(b);
  }
};

const Blocks& blocks() {
  static const Blocks b;
  return b;
}

}  // namespace

bool unicode_frozen(char32_t cp) {
  const FrozenRange* r = std::upper_bound(std::begin(kFrozen), std::end(kFrozen), cp,
                                          [](char32_t c, const FrozenRange& x) { return c < x.first; });
  return r != std::begin(kFrozen) && cp <= (r - 1)->last;
}

char32_t unicode_proxy(char32_t cp) {
  if (cp >= 0x110000 || !blocks().any.test(cp / 256)) return cp;
  const Range* r = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                                    [](char32_t c, const Range& x) { return c < x.first; });
  if (r == std::begin(kRanges)) return cp;
  --r;
  return cp <= r->last ? r->proxy : cp;
}

bool unicode_proxy_text(std::string_view s, std::string& out) {
  bool any = false;
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0xE0) {  // every table entry needs 3 or 4 bytes
      ++i;
      continue;
    }
    const size_t b = i;
    const char32_t cp = utf8_next(s, i);
    const char32_t p = unicode_proxy(cp);
    if (p == cp) continue;
    if (!any) out.assign(s.data(), s.size()), any = true;
    std::string enc;
    utf8_append(enc, p);
    out.replace(b, enc.size(), enc);  // same length: offsets are kept
  }
  return any;
}

}  // namespace slope::text
