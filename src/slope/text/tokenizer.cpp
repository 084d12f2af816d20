#include "slope/text/tokenizer.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "slope/text/added_tokens.h"
#include "slope/text/bpe.h"
#include "slope/text/decoder.h"
#include "slope/text/json_fields.h"
#include "slope/text/normalizer.h"
#include "slope/text/pre_tokenizer.h"
#include "slope/text/utf8.h"

namespace slope::text {
namespace {

// The ids a post-processor adds around one sequence: a list of special-token id runs and
// places for the sequence itself (TemplateProcessing's "single").
struct Template {
  std::vector<std::optional<std::vector<int32_t>>> items;  // nullopt: the encoded sequence
};

void parse_post_processor(const json& j, std::vector<Template>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "post_processor");
  const std::string where = "post_processor " + type;
  if (type == "ByteLevel") return;  // adjusts offsets only; ids are unchanged
  if (type == "Sequence") {
    const json& list = required(j, "processors", where);
    SLOPE_CHECK(list.is_array(), "tokenizer.json: ", where, " 'processors' is not a list");
    for (const json& p : list) parse_post_processor(p, out);
    return;
  }
  SLOPE_CHECK(type == "TemplateProcessing", "tokenizer.json: post_processor type '", type,
              "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  const json& single = required(j, "single", where);
  const json& specials = get_or<json>(j, "special_tokens", json::object(), where);
  SLOPE_CHECK(single.is_array(), "tokenizer.json: ", where, " 'single' is not a list");
  Template t;
  for (const json& item : single) {
    if (item.is_object() && item.contains("Sequence")) {
      const std::string seq = get_or<std::string>(item.at("Sequence"), "id", "A", where + " Sequence");
      SLOPE_CHECK(seq == "A", "tokenizer.json: ", where, " single template uses sequence '", seq,
                  "'; a single sequence is $A");
      t.items.emplace_back(std::nullopt);
    } else if (item.is_object() && item.contains("SpecialToken")) {
      const std::string name = get_required<std::string>(item.at("SpecialToken"), "id", where + " SpecialToken");
      SLOPE_CHECK(specials.is_object() && specials.contains(name), "tokenizer.json: ", where, " template uses '",
                  name, "', which its special_tokens do not define");
      t.items.emplace_back(get_required<std::vector<int32_t>>(specials.at(name), "ids", where + " special token " + name));
    } else {
      fail("tokenizer.json: ", where, " template item ", item.dump(), " is neither a Sequence nor a SpecialToken");
    }
  }
  out.push_back(std::move(t));
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<Decoder> decoder;
  std::vector<Template> post;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  std::unordered_map<int32_t, std::string> added_text;  // what decode gives: normalized content when normalized
  std::unordered_map<std::string, int32_t> added_by_content;
  std::optional<AddedTokenMatcher> raw_matcher, normalized_matcher;

  void encode_piece(std::string_view raw, bool at_start, std::vector<int32_t>& ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SLOPE_CHECK(in, "cannot read tokenizer '", path, "'; pass a Hugging Face tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return from_json(ss.str());
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

Tokenizer Tokenizer::from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer.json is not valid JSON: ", e.what());
  }
  SLOPE_CHECK(j.is_object(), "tokenizer.json must be a JSON object");
  auto impl = std::make_unique<Impl>();
  for (const char* unsupported : {"truncation", "padding"})
    SLOPE_CHECK(!j.contains(unsupported) || j.at(unsupported).is_null(), "tokenizer.json: '", unsupported,
                "' is set, which this tokenizer does not apply; set it to null");
  const json& model = required(j, "model", "the tokenizer");
  const std::string model_type = get_or<std::string>(model, "type", model.contains("merges") ? "BPE" : "", "model");
  SLOPE_CHECK(model_type == "BPE", "tokenizer.json: model type '", model_type,
              "' is not supported (supported: BPE, as byte-level and SentencePiece-style tokenizers use)");
  impl->model = std::make_unique<Bpe>(model);
  impl->normalizer = make_normalizer(j.value("normalizer", json()));
  impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()));
  impl->decoder = make_decoder(j.value("decoder", json()));
  parse_post_processor(j.value("post_processor", json()), impl->post);

  const json added = j.value("added_tokens", json::array());
  SLOPE_CHECK(added.is_array(), "tokenizer.json: 'added_tokens' is not a list");
  impl->added.reserve(added.size());
  for (const json& a : added) {
    AddedToken t;
    t.content = get_required<std::string>(a, "content", "added token");
    const std::string where = "added token '" + t.content + "'";
    t.id = get_required<int32_t>(a, "id", where);
    t.single_word = get_or<bool>(a, "single_word", false, where);
    t.lstrip = get_or<bool>(a, "lstrip", false, where);
    t.rstrip = get_or<bool>(a, "rstrip", false, where);
    t.special = get_or<bool>(a, "special", false, where);
    t.normalized = get_or<bool>(a, "normalized", !t.special, where);
    SLOPE_CHECK(t.id >= 0 && !t.content.empty(), "tokenizer.json: ", where, " needs a non-empty content and an id >= 0");
    SLOPE_CHECK(utf8_invalid_offset(t.content) == std::string::npos, "tokenizer.json: ", where, " is not valid UTF-8");
    const int32_t in_vocab = impl->model->token_to_id(t.content);
    SLOPE_CHECK(in_vocab < 0 || in_vocab == t.id, "tokenizer.json: ", where, " has id ", t.id, " but the vocab has it at id ",
                in_vocab, "; `tokenizers` would use ", in_vocab, ", so the file is inconsistent: fix one of the two");
    impl->added.push_back(std::move(t));
  }
  // Special tokens are listed first, as `tokenizers` builds its matchers.
  std::vector<std::string> raw_p, norm_p;
  std::vector<const AddedToken*> raw_t, norm_t;
  for (int pass = 0; pass < 2; ++pass) {
    for (const AddedToken& t : impl->added) {
      if (t.special != (pass == 0)) continue;
      impl->added_by_id[t.id] = &t;
      impl->added_by_content[t.content] = t.id;
      if (t.normalized) {
        std::string n = t.content;
        if (impl->normalizer) impl->normalizer->normalize(n);
        impl->added_text[t.id] = n;
        norm_p.push_back(n), norm_t.push_back(&t);
      } else {
        impl->added_text[t.id] = t.content;
        raw_p.push_back(t.content), raw_t.push_back(&t);
      }
    }
  }
  impl->raw_matcher.emplace(std::move(raw_p), std::move(raw_t));
  impl->normalized_matcher.emplace(std::move(norm_p), std::move(norm_t));
  // The post-processor's special token ids are added to every encoding as they are: each must be
  // a token of the vocabulary or an added token, or encode would give ids the model has no row for.
  for (const Template& t : impl->post)
    for (const auto& item : t.items)
      if (item)
        for (const int32_t id : *item)
          SLOPE_CHECK(impl->added_text.count(id) || (id >= 0 && impl->model->id_to_token(id)), "tokenizer.json: ",
                      "post_processor template adds token id ", id, ", which is neither in the vocab nor an added token; ",
                      "fix its special_tokens ids");
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_piece(std::string_view raw, bool at_start, std::vector<int32_t>& ids) const {
  std::string text(raw);
  if (normalizer) normalizer->normalize(text, at_start);
  std::vector<AddedTokenMatcher::Segment> segs;
  if (normalized_matcher->empty()) segs.push_back({0, text.size(), -1});
  else normalized_matcher->split(text, segs);
  std::vector<Piece> pieces;
  for (const auto& s : segs) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    if (s.end <= s.begin) continue;
    pieces.assign(1, Piece{text.substr(s.begin, s.end - s.begin), at_start && s.begin == 0});
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
    for (const Piece& p : pieces) model->encode_word(p.text, ids);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  const size_t bad = utf8_invalid_offset(text);
  SLOPE_CHECK(bad == std::string_view::npos, "input text is not valid UTF-8: byte ", bad, " (0x", std::hex,
              int(static_cast<unsigned char>(text[bad == std::string_view::npos ? 0 : bad])), std::dec,
              ") does not start a character; convert the text to UTF-8 first");
  std::vector<int32_t> ids;
  std::vector<AddedTokenMatcher::Segment> segs;
  if (impl_->raw_matcher->empty()) segs.push_back({0, text.size(), -1});
  else impl_->raw_matcher->split(text, segs);
  for (const auto& s : segs) {
    if (s.id >= 0) ids.push_back(s.id);
    else if (s.end > s.begin) impl_->encode_piece(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids);
  }
  if (!add_special) return ids;
  for (const Template& t : impl_->post) {
    std::vector<int32_t> out;
    for (const auto& item : t.items) {
      const std::vector<int32_t>& part = item ? *item : ids;
      out.insert(out.end(), part.begin(), part.end());
    }
    ids = std::move(out);
  }
  return ids;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_text.find(id);
  if (it != impl_->added_text.end()) return it->second;
  const std::string* t = impl_->model->id_to_token(id);
  SLOPE_CHECK(t, "token id ", id, " is not in the tokenizer's vocabulary (ids 0..", vocab_size() - 1, ")");
  return *t;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

int32_t Tokenizer::vocab_size() const {
  int32_t n = impl_->model->max_id() + 1;
  for (const AddedToken& t : impl_->added) n = std::max(n, t.id + 1);
  return n;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = impl_->added_by_id.find(id);
    if (it != impl_->added_by_id.end() && skip_special && it->second->special) continue;
    tokens.push_back(id_to_token(id));
  }
  if (!impl_->decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  impl_->decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace slope::text
