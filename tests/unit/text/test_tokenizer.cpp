// slope::text::Tokenizer on small hand-made tokenizer.json files: bad files and bad input give
// errors that name the problem; the merge order, byte fallback, added-token options and
// decoders behave as `tokenizers` defines them (the corpus-wide comparison against PyPI
// `tokenizers` is tests/text/check_tokenizers.py).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/text/tokenizer.h"

namespace {

using json = nlohmann::json;
using slope::text::Tokenizer;
using Ids = std::vector<int32_t>;

// A byte-level BPE over "abc" with merges a+b then ab+c, and one special token.
json byte_level() {
  json vocab = json::object();
  for (const char* t : {"a", "b", "c", "ab", "abc", "bc", "\xC4\xA0"}) vocab[t] = vocab.size();
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", 7}, {"content", "<|bos|>"}, {"special", true}, {"normalized", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", {{"type", "TemplateProcessing"},
                                  {"single", json::array({json{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                                          json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                  {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {7}}, {"tokens", {"<|bos|>"}}}}}}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}), json::array({"b", "c"})})}}}};
}

std::string error_of(const json& j) {
  try {
    Tokenizer::from_json(j.dump());
  } catch (const slope::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Tokenizer, MergesInRankOrderAndBos) {
  const Tokenizer t = Tokenizer::from_json(byte_level().dump());
  EXPECT_EQ(t.encode("abc"), (Ids{7, 4}));
  EXPECT_EQ(t.encode("abc", false), (Ids{4}));  // a+b (rank 0) before b+c (rank 2)
  EXPECT_EQ(t.encode("bcabc", false), (Ids{5, 4}));
  EXPECT_EQ(t.encode("ab<|bos|>c", false), (Ids{3, 7, 2}));  // the special token is cut out first
  EXPECT_EQ(t.encode("", true), (Ids{7}));
  EXPECT_EQ(t.decode({7, 4, 6, 0}), "<|bos|>abc a");
  EXPECT_EQ(t.decode({7, 4}, true), "abc");
}

TEST(Tokenizer, MalformedFilesNameTheProblem) {
  json j = byte_level();
  j["model"].erase("merges");
  EXPECT_NE(error_of(j).find("no 'merges' field"), std::string::npos) << error_of(j);
  j = byte_level();
  j["model"]["merges"].push_back("a z");
  EXPECT_NE(error_of(j).find("not in the vocab ('z')"), std::string::npos) << error_of(j);
  j = byte_level();
  j["model"]["merges"].push_back("abc");
  EXPECT_NE(error_of(j).find("not two tokens"), std::string::npos) << error_of(j);
  j = byte_level();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}+"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of(j).find("does not compile"), std::string::npos) << error_of(j);
  j = byte_level();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(error_of(j).find("behavior 'Sideways'"), std::string::npos) << error_of(j);
  j = byte_level();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of(j).find("normalizer type 'Lowercase' is not supported"), std::string::npos) << error_of(j);
  j = byte_level();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer type 'Whitespace'"), std::string::npos) << error_of(j);
  j = byte_level();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(error_of(j).find("decoder type 'WordPiece'"), std::string::npos) << error_of(j);
  j = byte_level();
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_NE(error_of(j).find("post_processor type 'BertProcessing'"), std::string::npos) << error_of(j);
  j = byte_level();
  j["model"]["type"] = "Unigram";
  EXPECT_NE(error_of(j).find("model type 'Unigram'"), std::string::npos) << error_of(j);
  j = byte_level();
  j["model"]["dropout"] = 0.1;
  EXPECT_NE(error_of(j).find("dropout"), std::string::npos) << error_of(j);
  j = byte_level();
  j["truncation"] = {{"max_length", 8}};
  EXPECT_NE(error_of(j).find("'truncation' is set"), std::string::npos) << error_of(j);
  // A template's special token id outside the vocabulary (found by fuzz_tokenizer): encode would
  // have emitted it as it is.
  j = byte_level();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {100000}}, {"tokens", {"<s>"}}}}}}};
  EXPECT_NE(error_of(j).find("adds token id 100000, which is neither in the vocab nor an added token"), std::string::npos)
      << error_of(j);
  EXPECT_NE(error_of(json::array()).find("must be a JSON object"), std::string::npos);
  EXPECT_THROW(Tokenizer::from_json("{not json"), slope::Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), slope::Error);
}

TEST(Tokenizer, InvalidUtf8IsRejectedWithItsOffset) {
  const Tokenizer t = Tokenizer::from_json(byte_level().dump());
  for (const std::string& bad : {std::string("ab\xFF"), std::string("ab\xC3"), std::string("ab\xED\xA0\x80"),  // surrogate
                                std::string("ab\xC0\xAF"), std::string("ab\xF4\x90\x80\x80")}) {        // overlong, > U+10FFFF
    try {
      t.encode(bad);
      ADD_FAILURE() << "no error for invalid UTF-8";
    } catch (const slope::Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8: byte 2"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(t.decode({99}), slope::Error);  // an id outside the vocabulary
}

// A SentencePiece-style BPE: byte fallback for characters outside the vocab, unk when a byte
// token is missing, Metaspace decoding with the first space stripped.
json sentencepiece(bool with_bytes) {
  json vocab = {{"<unk>", 0}, {"\xE2\x96\x81", 1}, {"h", 2}, {"i", 3}, {"\xE2\x96\x81h", 4}, {"\xE2\x96\x81hi", 5}};
  if (with_bytes)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      vocab[name] = 6 + b;
    }
  return json{{"added_tokens", json::array()},
              {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                                                               json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}}},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", {{"type", "Sequence"}, {"decoders", json::array({json{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                                                          json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}},
                                                                          json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h i"})},
                         {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}}}};
}

TEST(Tokenizer, ByteFallbackUnkAndMetaspaceDecoding) {
  const Tokenizer t = Tokenizer::from_json(sentencepiece(true).dump());
  // "é" is not in the vocab: its two bytes C3 A9.
  EXPECT_EQ(t.encode("hi \xC3\xA9"), (Ids{5, 1, 6 + 0xC3, 6 + 0xA9}));
  EXPECT_EQ(t.decode(t.encode("hi \xC3\xA9")), "hi \xC3\xA9");
  EXPECT_EQ(t.decode({6 + 0xC3}), "\xEF\xBF\xBD");               // half a character: U+FFFD
  EXPECT_EQ(t.decode({2, 6 + 0xC3, 6 + 0xC3}), "h\xEF\xBF\xBD\xEF\xBF\xBD");  // one per byte
  const Tokenizer u = Tokenizer::from_json(sentencepiece(false).dump());
  EXPECT_EQ(u.encode("hi \xC3\xA9\xC3\xA9 h"), (Ids{5, 1, 0, 4}));  // unknown characters fuse into one unk
}

TEST(Tokenizer, AddedTokenOptions) {
  json j = byte_level();
  j["added_tokens"].push_back({{"id", 8}, {"content", "ca"}, {"single_word", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 9}, {"content", "<m>"}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}, {"special", true}});
  const Tokenizer t = Tokenizer::from_json(j.dump());
  EXPECT_EQ(t.encode("ca", false), (Ids{8}));
  EXPECT_EQ(t.encode(" ca!", false), (Ids{6, 8}));  // "!" has no token and no unk: dropped, as `tokenizers` does
  EXPECT_EQ(t.encode("cab", false), (Ids{2, 3}));  // not a whole word: BPE as usual
  EXPECT_EQ(t.encode("c  <m>  c", false), (Ids{2, 9, 2}));  // the spaces go into the token
  EXPECT_EQ(t.encode("c <m> c", false), (Ids{2, 9, 2}));
  // An added token whose content the vocab has at another id: `tokenizers` would use the vocab's.
  j["added_tokens"].push_back({{"id", 10}, {"content", "bc"}, {"normalized", false}});
  EXPECT_NE(error_of(j).find("the vocab has it at id 5"), std::string::npos) << error_of(j);
}

}  // namespace
