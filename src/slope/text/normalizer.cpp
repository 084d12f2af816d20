#include "slope/text/normalizer.h"

#include <cstdlib>
#include <optional>
#include <vector>

#include <utf8proc.h>

#include "slope/text/regex.h"
#include "slope/text/unicode_proxy.h"
#include "slope/text/utf8.h"

namespace slope::text {
namespace {

class UnicodeForm : public Normalizer {
 public:
  UnicodeForm(utf8proc_option_t options, std::string name) : options_(options), name_(std::move(name)) {}
  void normalize(std::string& s, bool&) const override {
    bool ascii = true;
    for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return;  // ASCII is invariant under every normalization form
    // Characters newer than the tables of `tokenizers` stay as they are; being starters there,
    // they split the text into runs that normalize independently.
    std::string out;
    size_t run = 0, i = 0;
    while (i < s.size()) {
      const size_t b = i;
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        ++i;
        continue;
      }
      if (!unicode_frozen(utf8_next(s, i))) continue;
      out += map(std::string_view(s).substr(run, b - run));
      out.append(s, b, i - b);
      run = i;
    }
    if (run == 0) {
      s = map(s);
      return;
    }
    out += map(std::string_view(s).substr(run));
    s = std::move(out);
  }

 private:
  std::string map(std::string_view s) const {
    if (s.empty()) return std::string();
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out, options_);
    SLOPE_CHECK(n >= 0, "normalizer ", name_, " failed: ", utf8proc_errmsg(n));
    std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }

  utf8proc_option_t options_;
  std::string name_;
};

size_t chars(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s, bool&) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

// Replace every occurrence of a literal string or a regex with `content`.
class Replace : public Normalizer {
 public:
  Replace(std::string literal, std::optional<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& s, bool& at_origin) const override { s = apply(s, at_origin); }
  std::string apply(std::string_view s, bool& at_origin) const {
    std::string out;
    out.reserve(s.size());
    if (regex_) {
      std::vector<std::pair<size_t, size_t>> m;
      regex_->find_all(s, m);
      size_t prev = 0;
      if (!m.empty() && m[0].first == 0 && chars(s.substr(0, m[0].second)) > chars(content_)) at_origin = false;
      for (auto [b, e] : m) {
        out.append(s.substr(prev, b - prev));
        out += content_;
        prev = e;
      }
      out.append(s.substr(prev));
      return out;
    }
    if (literal_.empty()) return std::string(s);
    if (s.compare(0, literal_.size(), literal_) == 0 && chars(literal_) > chars(content_)) at_origin = false;
    size_t prev = 0;
    for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, prev)) {
      out.append(s.substr(prev, at - prev));
      out += content_;
      prev = at + literal_.size();
    }
    out.append(s.substr(prev));
    return out;
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s, bool& at_origin) const override {
    for (const auto& p : parts_) p->normalize(s, at_origin);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_replace(const json& j, const std::string& where);

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "normalizer");
  const std::string where = "normalizer " + type;
  const auto form = [](int flags) { return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | flags); };
  if (type == "NFC") return std::make_unique<UnicodeForm>(form(UTF8PROC_COMPOSE), type);
  if (type == "NFD") return std::make_unique<UnicodeForm>(form(UTF8PROC_DECOMPOSE), type);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(form(UTF8PROC_COMPOSE | UTF8PROC_COMPAT), type);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(form(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), type);
  if (type == "Prepend") return std::make_unique<Prepend>(get_required<std::string>(j, "prepend", where));
  if (type == "Replace") return make_replace(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const json& list = required(j, "normalizers", where);
    SLOPE_CHECK(list.is_array(), "tokenizer.json: ", where, " 'normalizers' is not a list");
    for (const json& p : list) {
      auto n = make_normalizer(p);
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail("tokenizer.json: normalizer type '", type,
       "' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)");
}

// Replace's pattern is {"String": s} or {"Regex": r}; shared with the Replace decoder.
std::unique_ptr<Normalizer> make_replace(const json& j, const std::string& where) {
  const json& pat = required(j, "pattern", where);
  const std::string content = get_required<std::string>(j, "content", where);
  if (pat.is_object() && pat.contains("String"))
    return std::make_unique<Replace>(get_required<std::string>(pat, "String", where + " pattern"), std::nullopt, content);
  if (pat.is_object() && pat.contains("Regex"))
    return std::make_unique<Replace>("", Regex(get_required<std::string>(pat, "Regex", where + " pattern")), content);
  fail("tokenizer.json: ", where, " pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", pat.dump());
}

}  // namespace slope::text
