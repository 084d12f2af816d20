#include "slope/text/decoder.h"

#include "slope/text/normalizer.h"
#include "slope/text/pre_tokenizer.h"
#include "slope/text/utf8.h"

namespace slope::text {

std::unique_ptr<Normalizer> make_replace(const json& j, const std::string& where);

namespace {

// Byte-level characters back to bytes. A token with a character outside the table keeps its
// own UTF-8; the bytes of all tokens are then read as UTF-8, invalid parts as U+FFFD.
class ByteLevel : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t i = 0;
      bool all = true;
      while (i < t.size()) {
        const int b = byte_level_byte(utf8_next(t, i));
        if (b < 0) {
          all = false;
          break;
        }
        bytes += char(b);
      }
      if (!all) bytes.resize(mark), bytes += t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// Runs of <0xXX> tokens become the text their bytes spell, or one U+FFFD per byte when the run
// is not valid UTF-8.
class ByteFallback : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (utf8_invalid_offset(run) == std::string::npos) out.push_back(run);
      else
        for (size_t k = 0; k < run.size(); ++k) out.push_back("\xEF\xBF\xBD");
      run.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        const auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          return -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        run += char(byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Up to `start` leading and `stop` trailing copies of one character removed from each token.
class Strip : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> at;  // byte offset of each character, then the end
      for (size_t i = 0; i < t.size();) {
        at.push_back(i);
        utf8_next(t, i);
      }
      const size_t n = at.size();
      at.push_back(t.size());
      size_t begin = 0, end = n;
      while (begin < start_ && begin < n && char_at(t, at[begin]) == content_) ++begin;
      while (n - end < stop_ && end > begin && char_at(t, at[end - 1]) == content_) --end;
      t = t.substr(at[begin], at[end] - at[begin]);
    }
  }

 private:
  static char32_t char_at(const std::string& t, size_t i) { return utf8_next(t, i); }
  char32_t content_;
  size_t start_, stop_;
};

// Each replacement character becomes a space; in the first token it is dropped instead when
// the pre-tokenizer prepends one.
class Metaspace : public Decoder {
 public:
  Metaspace(char32_t replacement, bool strip_first) : replacement_(replacement), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        const size_t b = i;
        const char32_t c = utf8_next(t, i);
        if (c != replacement_) out.append(t, b, i - b);
        else if (!(k == 0 && strip_first_)) out += ' ';
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;
};

class Replace : public Decoder {
 public:
  explicit Replace(std::unique_ptr<Normalizer> r) : replace_(std::move(r)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) replace_->normalize(t);  // decoding has no offsets to track
  }

 private:
  std::unique_ptr<Normalizer> replace_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

char32_t one_char(const std::string& s, const std::string& where, const char* field) {
  size_t i = 0;
  const bool ok = !s.empty() && utf8_invalid_offset(s) == std::string::npos && (utf8_next(s, i), i == s.size());
  SLOPE_CHECK(ok, "tokenizer.json: ", where, " '", field, "' must be one character, got '", s, "'");
  i = 0;
  return utf8_next(s, i);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "decoder");
  const std::string where = "decoder " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip")
    return std::make_unique<Strip>(one_char(get_required<std::string>(j, "content", where), where, "content"),
                                   get_or<size_t>(j, "start", 0, where), get_or<size_t>(j, "stop", 0, where));
  if (type == "Metaspace") {
    const char32_t rep = one_char(get_or<std::string>(j, "replacement", "\xE2\x96\x81", where), where, "replacement");
    std::string scheme = get_or<std::string>(j, "prepend_scheme", "", where);
    if (scheme.empty()) scheme = get_or<bool>(j, "add_prefix_space", true, where) ? "always" : "never";
    SLOPE_CHECK(scheme == "always" || scheme == "never" || scheme == "first", "tokenizer.json: ", where,
                " prepend_scheme '", scheme, "' is unknown (always, never, first)");
    return std::make_unique<Metaspace>(rep, scheme != "never");
  }
  if (type == "Replace") return std::make_unique<Replace>(make_replace(j, where));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const json& list = required(j, "decoders", where);
    SLOPE_CHECK(list.is_array(), "tokenizer.json: ", where, " 'decoders' is not a list");
    for (const json& p : list) {
      auto d = make_decoder(p);
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail("tokenizer.json: decoder type '", type,
       "' is not supported (supported: ByteLevel, ByteFallback, Metaspace, Strip, Fuse, Replace, Sequence)");
}

}  // namespace slope::text
