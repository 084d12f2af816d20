#include "slope/planner/parse.h"

#include <cctype>
#include <sstream>

#include "slope/core/error.h"

namespace slope::planner {
namespace {

// A decimal integer with an optional sign (leading spaces skipped): false unless the rest is all
// digits. |value| saturates at `limit + 1`, so a longer number reads as "too large", never as an
// overflow.
bool parse_int(const std::string& s, int64_t limit, int64_t& value, bool& negative) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return false;
  value = 0;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    if (value <= limit) value = value * 10 + (s[i] - '0');  // value <= limit < 2^62: no overflow
  }
  if (value > limit) value = limit + 1;
  return true;
}

}  // namespace

std::vector<int64_t> parse_contexts(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string s;
    for (char c : item)
      if (!std::isspace(static_cast<unsigned char>(c))) s += char(std::tolower(static_cast<unsigned char>(c)));
    SLOPE_CHECK(!s.empty(), "--context '", text, "' has an empty entry; write e.g. 32k,64k,100000");
    int64_t mult = 1;
    if (s.back() == 'k') mult = 1024, s.pop_back();
    else if (s.back() == 'm') mult = 1024 * 1024, s.pop_back();
    int64_t v = 0;
    bool negative = false;
    SLOPE_CHECK(parse_int(s, kMaxContextTokens, v, negative) && !negative && v > 0, "--context entry '", item,
                "' is not a positive token count; write e.g. 32k,64k,100000 (k = 1024)");
    // v <= kMaxContextTokens + 1 and mult <= 2^20: the comparison cannot overflow.
    SLOPE_CHECK(v <= kMaxContextTokens / mult, "--context entry '", item, "' is more than ", kMaxContextTokens,
                " tokens (2048m), the longest prompt the planner models; give a shorter length");
    out.push_back(v * mult);
  }
  SLOPE_CHECK(!out.empty(), "--context is empty; write e.g. 32k,64k,100000");
  return out;
}

Mesh parse_mesh(const std::string& text, int64_t tokens) {
  const std::string usage = "write U,R,P,TP[,chunk], e.g. 1,2,1,1 or 1,1,2,1,2048";
  std::vector<int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    // The chunk may be as large as any prompt; degrees are checked against kMaxMeshDegree below.
    int64_t x = 0;
    bool negative = false;
    SLOPE_CHECK(parse_int(item, kMaxContextTokens, x, negative), "--mesh '", text,
                "': entries must be integers; ", usage);
    v.push_back(negative ? -x : x);
  }
  SLOPE_CHECK(v.size() == 4 || v.size() == 5, "--mesh '", text,
              "' needs 4 or 5 entries: U,R,P,TP[,chunk] (chunk: tokens per pipeline chunk, 0 = whole prompt)");
  int64_t ranks = 1;
  for (size_t i = 0; i < 4; ++i) {
    SLOPE_CHECK(v[i] >= 1 && v[i] <= kMaxMeshDegree, "--mesh '", text, "': U, R, P and TP must be between 1 and ",
                kMaxMeshDegree, "; ", usage);
    ranks *= v[i];  // <= 4096^4 = 2^48: no overflow
  }
  SLOPE_CHECK(ranks <= kMaxMeshRanks, "--mesh '", text, "' has ", ranks, " ranks; the planner models at most ",
              kMaxMeshRanks, " ranks per instance");
  Mesh m;
  m.ulysses = int(v[0]), m.ring = int(v[1]), m.pp = int(v[2]), m.tp = int(v[3]);
  const int64_t chunk = v.size() == 5 ? v[4] : -1;
  SLOPE_CHECK(chunk >= -1, "--mesh '", text, "': chunk must be 0 (whole prompt), positive, or -1 (engine default)");
  m.pp_chunk = chunk < 0 ? default_pipeline_chunk(m.pp, tokens) : chunk;
  return m;
}

}  // namespace slope::planner
