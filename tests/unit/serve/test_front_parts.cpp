// The front's pieces without a server: instance mesh specs, the front-instance frames over a
// socket pair, and the API's request checks (each refusal names the field and the problem).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "../error_of.h"
#include "slope/serve/api.h"
#include "slope/serve/mesh_spec.h"
#include "slope/serve/wire.h"

using namespace slope;
using slope::testing::error_of;

TEST(MeshSpec, ParsesKeysInAnyOrderAndDefaultsToOne) {
  const engine::ParallelShape m = serve::parse_mesh_spec("ulysses=2,pp=3,ring=4");
  EXPECT_EQ(m.pp, 3);
  EXPECT_EQ(m.ring, 4);
  EXPECT_EQ(m.ulysses, 2);
  EXPECT_EQ(m.tp, 1);
  EXPECT_EQ(serve::mesh_spec(serve::parse_mesh_spec("ring=1")), "pp=1,ring=1,ulysses=1,tp=1");
  EXPECT_EQ(serve::parse_mesh_spec("pp=2,pp_chunk=512").pp_chunk, 512);
}

TEST(MeshSpec, RefusesBadEntries) {
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec(""); }), "empty");
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec("ring"); }), "has no '='");
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec("ring=2,ring=1"); }), "ring is given twice");
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec("ring=two"); }), "ring=two is not an integer");
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec("ring=0"); }), "ring must be in [1, 4096]");
  EXPECT_HAS(error_of([] { serve::parse_mesh_spec("rings=2"); }), "unknown key rings");
}

class Frames : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd_), 0); }
  void TearDown() override {
    for (int f : fd_)
      if (f >= 0) ::close(f);
  }
  int fd_[2] = {-1, -1};
};

TEST_F(Frames, RoundTripAndCleanEnd) {
  const nlohmann::json msg = {{"op", "prefill"}, {"prompts", {{1, 2, 3}}}, {"text", "é\n"}};
  serve::write_frame(fd_[0], msg);
  serve::write_frame(fd_[0], {{"op", "shutdown"}});
  EXPECT_EQ(serve::read_frame(fd_[1], 5), msg);
  EXPECT_EQ(serve::read_frame(fd_[1], 5)->at("op"), "shutdown");
  ::close(fd_[0]);
  fd_[0] = -1;
  EXPECT_FALSE(serve::read_frame(fd_[1], 5).has_value());  // end of stream between frames
}

TEST_F(Frames, TruncatedOversizedAndNotJson) {
  const unsigned char len[4] = {10, 0, 0, 0};
  ASSERT_EQ(::write(fd_[0], len, 4), 4);
  ASSERT_EQ(::write(fd_[0], "{\"a\"", 4), 4);
  ::close(fd_[0]);
  fd_[0] = -1;
  EXPECT_HAS(error_of([&] { serve::read_frame(fd_[1], 5); }), "ended in the middle of a message");

  int p[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(::write(p[0], huge, 4), 4);
  EXPECT_HAS(error_of([&] { serve::read_frame(p[1], 5); }), "over the limit");
  const unsigned char three[4] = {3, 0, 0, 0};
  ASSERT_EQ(::write(p[0], three, 4), 4);
  ASSERT_EQ(::write(p[0], "{x}", 3), 3);
  EXPECT_HAS(error_of([&] { serve::read_frame(p[1], 5); }), "not JSON");
  EXPECT_HAS(error_of([&] { serve::read_frame(p[1], 0.3); }), "no reply within the time limit");
  EXPECT_HAS(error_of([&] { serve::read_frame(p[1], -1, [] { return false; }); }), "the peer stopped");
  ::close(p[0]);
  ::close(p[1]);
}

namespace {

serve::ApiLimits limits() {
  serve::ApiLimits l;
  l.model_name = "tiny";
  l.vocab_size = 100;
  l.max_position = 50;
  l.max_prompt_tokens = 40;
  l.default_slo_ms = 1000;
  l.default_kv_lease_s = 60;
  l.max_kv_lease_s = 600;
  return l;
}

// The ApiError a body gets: "STATUS CODE: message".
std::string refusal(const std::string& body, serve::Endpoint ep = serve::Endpoint::Completions) {
  try {
    serve::parse_request(body, ep, limits());
  } catch (const serve::ApiError& e) {
    return std::to_string(e.status) + " " + e.code + ": " + e.what();
  }
  return "accepted";
}

}  // namespace

TEST(Api, AcceptsOpenAiFieldsAndSlopeExtensions) {
  const serve::ApiRequest r = serve::parse_request(
      R"({"model":"tiny","prompt":[1,2,99],"max_tokens":7,"logprobs":3,"temperature":0.7,"stop":["\n"],
          "ttft_slo_ms":250,"priority":2,"best_effort":true,"return_logits":true,"echo":false,"n":1})",
      serve::Endpoint::Completions, limits());
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{1, 2, 99}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_DOUBLE_EQ(r.ttft_slo_ms, 250);
  EXPECT_EQ(r.priority, 2);
  EXPECT_TRUE(r.best_effort);
  EXPECT_TRUE(r.return_logits);
  const serve::ApiRequest d = serve::parse_request(R"({"prompt":[5]})", serve::Endpoint::Prefill, limits());
  EXPECT_EQ(d.logprobs, -1);
  EXPECT_DOUBLE_EQ(d.ttft_slo_ms, 1000);  // the server's default
  EXPECT_DOUBLE_EQ(d.kv_lease_s, 60);
}

TEST(Api, RefusesEachMistakeByName) {
  EXPECT_HAS(refusal("{\"prompt\": [1,"), "400 invalid_json: the body is not valid JSON");
  EXPECT_HAS(refusal("3"), "400 invalid_json: the body must be a JSON object, got a number");
  EXPECT_HAS(refusal(R"({"prompt":[1],"max_token":2})"), "400 unknown_field: unknown field 'max_token'");
  EXPECT_HAS(refusal(R"({"prompt":[1],"max_tokens":2.5})"), "'max_tokens' must be an integer, got a number with a fraction");
  EXPECT_HAS(refusal(R"({"prompt":[1],"max_tokens":0})"), "'max_tokens' must be in [1, ");
  EXPECT_HAS(refusal(R"({"prompt":[]})"), "400 empty_prompt");
  EXPECT_HAS(refusal(R"({"max_tokens":1})"), "400 missing_field: 'prompt' is required");
  EXPECT_HAS(refusal(R"({"prompt":[1,100]})"), "400 invalid_token_id: 'prompt'[1] = 100 is outside the vocabulary [0, 100)");
  EXPECT_HAS(refusal(R"({"prompt":[1,true]})"), "'prompt'[1] must be a token id (an integer), got a boolean");
  EXPECT_HAS(refusal(R"({"prompt":[[1],[2]]})"), "send one prompt per request");
  EXPECT_HAS(refusal(R"({"prompt":"hi"})"), "400 tokenizer_missing");
  EXPECT_HAS(refusal(R"({"prompt":)" + nlohmann::json(std::vector<int>(51, 1)).dump() + "}"),
             "51 tokens, more than the model's max_position_embeddings (50)");
  EXPECT_HAS(refusal(R"({"prompt":)" + nlohmann::json(std::vector<int>(41, 1)).dump() + "}"),
             "more than any instance can hold in memory (40 tokens)");
  EXPECT_HAS(refusal(R"({"prompt":[1],"echo":true})"), "400 unsupported: 'echo' is not supported");
  EXPECT_HAS(refusal(R"({"prompt":[1],"model":"other"})"), "404 model_not_found: the model 'other' does not exist");
  EXPECT_HAS(refusal(R"({"prompt":[1],"max_tokens":1})", serve::Endpoint::Prefill), "unknown field 'max_tokens'");
  EXPECT_HAS(refusal(R"({"prompt":[1],"kv_lease_s":601})", serve::Endpoint::Prefill), "'kv_lease_s' must be in");
  EXPECT_EQ(refusal(R"({"prompt":[1],"kv_lease_s":600})", serve::Endpoint::Prefill), "accepted");
}

TEST(Api, SizeLimitsComeFirstAndNameTheirFlag) {
  serve::ApiLimits l = limits();
  l.max_prompt_bytes = 10;
  auto refused = [&](const std::string& body) {
    try {
      serve::parse_request(body, serve::Endpoint::Completions, l);
    } catch (const serve::ApiError& e) {
      return std::to_string(e.status) + " " + e.code + ": " + e.what();
    }
    return std::string("accepted");
  };
  // Text over the limit is refused before the tokenizer is looked for.
  EXPECT_HAS(refused(R"({"prompt":"01234567890"})"), "400 prompt_too_large: the text prompt is 11 bytes, over the limit of 10 (--max-prompt-bytes)");
  EXPECT_HAS(refused(R"({"prompt":"0123456789"})"), "400 tokenizer_missing");
  // Ids are counted before any is converted: 41 of anything is too long.
  EXPECT_HAS(refused(R"({"prompt":)" + nlohmann::json(std::vector<bool>(41, true)).dump() + "}"),
             "400 context_length_exceeded");
  const std::string deep = std::string(17, '[') + std::string(17, ']');
  EXPECT_HAS(refused(R"({"prompt":)" + deep + "}"), "400 too_deep: the body nests JSON more than 16 levels deep");
  EXPECT_HAS(refused(R"({"prompt":)" + std::string(15, '[') + std::string(15, ']') + "}"), "send one prompt per request");
  // Brackets in strings, escaped quotes included, are not nesting.
  EXPECT_EQ(refused(R"({"prompt":[1],"user":"[[[[[[[[[[[[[[[[[[[[{{{{"})"), "accepted");
  EXPECT_EQ(refused(R"({"prompt":[1],"user":"\"[[[[[[[[[[[[[[[[[[[[\\"})"), "accepted");
}

TEST(Api, ErrorBodyIsOpenAiShaped) {
  const nlohmann::json b = serve::error_body("bad", "invalid_request_error", "prompt", "empty_prompt");
  EXPECT_EQ(b, nlohmann::json::parse(
                   R"({"error":{"message":"bad","type":"invalid_request_error","param":"prompt","code":"empty_prompt"}})"));
  EXPECT_TRUE(serve::error_body("x", "server_error")["error"]["param"].is_null());
}

namespace {

// The ApiError a push body gets, for a lease of two ranks.
std::string push_refusal(const std::string& body) {
  try {
    serve::parse_push_request(body, 2, "f32");
  } catch (const serve::ApiError& e) {
    return std::to_string(e.status) + " " + e.param + ": " + e.what();
  }
  return "accepted";
}

}  // namespace

TEST(Api, ParsesPushBodies) {
  const serve::PushRequest p = serve::parse_push_request(
      R"({"targets":[{"rank":1,"endpoint":"10.0.0.2:9000"},{"rank":0,"endpoint":"[::1]:7"}],"window_trim":false})", 2,
      "bf16");
  ASSERT_EQ(p.targets.size(), 2u);
  EXPECT_EQ(p.targets[0].rank, 1);
  EXPECT_EQ(p.targets[0].endpoint, "10.0.0.2:9000");
  EXPECT_EQ(p.targets[1].rank, 0);
  EXPECT_EQ(p.dtype, "bf16");  // the lease's
  EXPECT_FALSE(p.window_trim);
  EXPECT_EQ(serve::parse_push_request(R"({"targets":[{"rank":0,"endpoint":"h:1"}],"dtype":"f32"})", 2, "bf16").dtype, "f32");
}

TEST(Api, RefusesEachPushMistakeByName) {
  EXPECT_HAS(push_refusal("[1"), "400 : the body is not valid JSON");
  EXPECT_HAS(push_refusal(R"({"targets":[]})"), "400 targets: the body must be {\"targets\"");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"h:1"}],"x":1})"), "400 x: unknown field 'x'");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"h:1"}],"dtype":"f16"})"), "400 dtype: 'dtype' must be");
  // Found by fuzz_http_bodies: a dtype that is not a string made nlohmann throw type_error,
  // which escaped the handler (a 500).
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"h:1"}],"dtype":false})"),
             "400 dtype: 'dtype' must be \"f32\" or \"bf16\", got a boolean");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"h:1"}],"window_trim":1})"), "400 window_trim:");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":2,"endpoint":"h:1"}]})"), "rank 2 is not a rank of the instance (it has 2)");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":-1,"endpoint":"h:1"}]})"), "400 targets[0].rank: 'targets[0].rank' must be in [0, ");
  // A rank beyond int's range was cut to an int: 2^32 became rank 0 and was accepted.
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":4294967296,"endpoint":"h:1"}]})"), "400 targets[0].rank:");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"h:1"},{"rank":0,"endpoint":"h:2"}]})"), "rank 0 is named twice");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0,"endpoint":"nowhere"}]})"), "is not HOST:PORT");
  EXPECT_HAS(push_refusal(R"({"targets":[{"rank":0}]})"), "each target must be {\"rank\": R, \"endpoint\"");
}
