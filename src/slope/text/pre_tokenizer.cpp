#include "slope/text/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <utility>

#include <utf8proc.h>

#include "slope/text/regex.h"
#include "slope/text/unicode_proxy.h"
#include "slope/text/utf8.h"

namespace slope::text {
namespace {

// How a split keeps the pattern's matches, as `tokenizers` defines SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  fail("tokenizer.json: ", where, " behavior '", s,
       "' is unknown (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct Span {
  size_t begin, end;
  bool match;
};

// The whole piece as alternating non-match / match spans (the pattern's find_matches).
using Matcher = std::function<void(std::string_view, std::vector<Span>&)>;

// Keeps or merges the spans per behaviour; returns the ranges that become new pieces.
void apply_behavior(std::vector<Span>& spans, Behavior b) {
  std::vector<Span> out;
  out.reserve(spans.size());
  bool prev_match = false;
  switch (b) {
    case Behavior::kIsolated:
      return;
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.match) out.push_back(s);
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.match && !prev_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        prev_match = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !out.empty()) out.back().begin = s.begin;
        else out.push_back(s);
        prev_match = s.match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.match == prev_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        prev_match = s.match;
      }
      break;
  }
  spans = std::move(out);
}

void split_pieces(std::vector<Piece>& pieces, const Matcher& matcher, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  std::vector<Span> spans;
  for (Piece& p : pieces) {
    spans.clear();
    matcher(p.text, spans);
    if (invert)
      for (Span& s : spans) s.match = !s.match;
    apply_behavior(spans, behavior);
    for (const Span& s : spans) {
      if (s.end <= s.begin) continue;  // empty pieces are dropped
      out.push_back(Piece{p.text.substr(s.begin, s.end - s.begin), p.at_start && s.begin == 0});
    }
  }
  pieces = std::move(out);
}

// Matches of a regex, with the gaps between them.
void regex_spans(const Regex& re, std::string_view text, std::vector<Span>& spans) {
  thread_local std::vector<std::pair<size_t, size_t>> m;
  m.clear();
  re.find_all(text, m);
  size_t prev = 0;
  for (auto [b, e] : m) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
}

// Each character for which `pred` holds is one match.
void char_spans(std::string_view text, const std::function<bool(char32_t)>& pred, std::vector<Span>& spans) {
  size_t last = 0, i = 0;
  while (i < text.size()) {
    const size_t b = i;
    const char32_t c = utf8_next(text, i);
    if (!pred(c)) continue;
    if (last < b) spans.push_back({last, b, false});
    spans.push_back({b, i, true});
    last = i;
  }
  if (last < text.size()) spans.push_back({last, text.size(), false});
}

void literal_spans(std::string_view text, const std::string& lit, std::vector<Span>& spans) {
  size_t prev = 0;
  if (!lit.empty()) {
    for (size_t at = text.find(lit); at != std::string_view::npos; at = text.find(lit, prev)) {
      if (prev != at) spans.push_back({prev, at, false});
      spans.push_back({at, at + lit.size(), true});
      prev = at + lit.size();
    }
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
}

class Split : public PreTokenizer {
 public:
  Split(std::string literal, std::optional<Regex> regex, Behavior b, bool invert)
      : literal_(std::move(literal)), regex_(std::move(regex)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (regex_)
      split_pieces(pieces, [&](std::string_view t, std::vector<Span>& s) { regex_spans(*regex_, t, s); }, behavior_, invert_);
    else
      split_pieces(pieces, [&](std::string_view t, std::vector<Span>& s) { literal_spans(t, literal_, s); }, behavior_, invert_);
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's word pattern, which ByteLevel applies when use_regex is set.
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteTable {
  std::array<std::string, 256> to_char;
  std::array<int, 0x200> to_byte;  // every table character is below U+0200
  ByteTable() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? char32_t(b) : char32_t(256 + n++);
      utf8_append(to_char[b], c);
      to_byte[c] = b;
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_.emplace(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = " " + p.text;
    if (regex_)
      split_pieces(pieces, [&](std::string_view t, std::vector<Span>& s) { regex_spans(*regex_, t, s); },
                   Behavior::kIsolated, false);
    const ByteTable& t = byte_table();
    std::string mapped;
    for (Piece& p : pieces) {
      mapped.resize(p.text.size() * 2);  // each byte becomes a 1- or 2-byte character
      char* o = mapped.data();
      for (char c : p.text) {
        const std::string& ch = t.to_char[static_cast<unsigned char>(c)];
        *o++ = ch[0];
        if (ch.size() == 2) *o++ = ch[1];
      }
      mapped.resize(size_t(o - mapped.data()));
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class Metaspace : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kNever, kFirst };
  Metaspace(char32_t replacement, Prepend scheme, bool split) : replacement_(replacement), scheme_(scheme), split_(split) {
    utf8_append(rep_, replacement);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + rep_.size());
      for (char c : p.text) {
        if (c == ' ') t += rep_;
        else t += c;
      }
      const bool starts = t.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == Prepend::kAlways || (scheme_ == Prepend::kFirst && p.at_start))) t.insert(0, rep_);
      p.text = std::move(t);
    }
    if (split_)
      split_pieces(pieces, [&](std::string_view t, std::vector<Span>& s) {
        char_spans(t, [&](char32_t c) { return c == replacement_; }, s);
      }, Behavior::kMergedWithNext, false);
  }

 private:
  char32_t replacement_;
  std::string rep_;
  Prepend scheme_;
  bool split_;
};

// Rust's char::is_numeric: general categories Nd, Nl and No.
bool is_numeric(char32_t c);

class Digits : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [](std::string_view t, std::vector<Span>& s) { char_spans(t, is_numeric, s); },
                 individual_ ? Behavior::kIsolated : Behavior::kContiguous, false);
  }

 private:
  bool individual_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

char32_t single_char(const std::string& s, const std::string& where) {
  SLOPE_CHECK(!s.empty() && utf8_invalid_offset(s) == std::string::npos, "tokenizer.json: ", where,
              " replacement must be one character, got '", s, "'");
  size_t i = 0;
  const char32_t c = utf8_next(s, i);
  SLOPE_CHECK(i == s.size(), "tokenizer.json: ", where, " replacement must be one character, got '", s, "'");
  return c;
}

bool is_numeric(char32_t c) {
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(unicode_proxy(c)));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}
}  // namespace

const std::string& byte_level_char(unsigned char b) { return byte_table().to_char[b]; }
int byte_level_byte(char32_t c) { return c < 0x200 ? byte_table().to_byte[c] : -1; }

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "pre_tokenizer");
  const std::string where = "pre_tokenizer " + type;
  if (type == "Split") {
    const json& pat = required(j, "pattern", where);
    const Behavior b = parse_behavior(get_required<std::string>(j, "behavior", where), where);
    const bool invert = get_or<bool>(j, "invert", false, where);
    if (pat.is_object() && pat.contains("Regex"))
      return std::make_unique<Split>("", Regex(get_required<std::string>(pat, "Regex", where + " pattern")), b, invert);
    if (pat.is_object() && pat.contains("String"))
      return std::make_unique<Split>(get_required<std::string>(pat, "String", where + " pattern"), std::nullopt, b, invert);
    fail("tokenizer.json: ", where, " pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", pat.dump());
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(get_or<bool>(j, "add_prefix_space", true, where), get_or<bool>(j, "use_regex", true, where));
  if (type == "Metaspace") {
    const char32_t rep = single_char(get_or<std::string>(j, "replacement", "\xE2\x96\x81", where), where);
    std::string scheme = get_or<std::string>(j, "prepend_scheme", "", where);
    if (scheme.empty()) scheme = get_or<bool>(j, "add_prefix_space", true, where) ? "always" : "never";
    Metaspace::Prepend p;
    if (scheme == "always") p = Metaspace::Prepend::kAlways;
    else if (scheme == "never") p = Metaspace::Prepend::kNever;
    else if (scheme == "first") p = Metaspace::Prepend::kFirst;
    else fail("tokenizer.json: ", where, " prepend_scheme '", scheme, "' is unknown (always, never, first)");
    return std::make_unique<Metaspace>(rep, p, get_or<bool>(j, "split", true, where));
  }
  if (type == "Digits") return std::make_unique<Digits>(get_or<bool>(j, "individual_digits", false, where));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const json& list = required(j, "pretokenizers", where);
    SLOPE_CHECK(list.is_array(), "tokenizer.json: ", where, " 'pretokenizers' is not a list");
    for (const json& p : list) {
      auto t = make_pre_tokenizer(p);
      if (t) parts.push_back(std::move(t));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail("tokenizer.json: pre_tokenizer type '", type,
       "' is not supported (supported: Split, ByteLevel, Metaspace, Digits, Sequence)");
}

}  // namespace slope::text
