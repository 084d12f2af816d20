// The request bodies of `slope serve`'s endpoints (src/slope/serve/api.h): POST /v1/completions
// and /v1/prefill (serve::parse_request, with the test tokenizer and without one: text prompts
// are then refused) and POST /v1/kv/{id}/push (serve::parse_push_request). The first byte picks
// the endpoint (bits 0-1: completions, prefill, push), the tokenizer (bit 2) and the push lease's
// rank count (bits 3-4: 1 to 4 ranks); the rest is the body. The other endpoints take no body,
// and the {id} of /v1/kv/{id} is only looked up, never parsed.
//
// The server answers an ApiError with its status; any other exception would escape the handler
// (a 500), so it is a finding, and so is an accepted request outside the limits.
#include <memory>
#include <string>

#include "slope/serve/api.h"
#include "slope/text/tokenizer.h"

namespace {

using namespace slope;

const text::Tokenizer& tokenizer() {
  static const text::Tokenizer t = text::Tokenizer::from_file(SLOPE_SOURCE_DIR "/tests/text/tokenizers/tiny_llama3/tokenizer.json");
  return t;
}

serve::ApiLimits limits(bool with_tokenizer) {
  serve::ApiLimits l;
  l.model_name = "tiny";
  l.vocab_size = 512;
  l.max_position = 2048;
  l.max_prompt_tokens = 1024;
  l.default_slo_ms = 1000;
  l.max_kv_lease_s = 60;
  l.default_kv_lease_s = 10;
  l.tokenizer = with_tokenizer ? &tokenizer() : nullptr;
  return l;
}

void check(const serve::ApiRequest& r, const serve::ApiLimits& l) {
  if (r.prompt.empty() || int64_t(r.prompt.size()) > l.max_prompt_tokens) __builtin_trap();
  for (const int32_t id : r.prompt)
    if (id < 0 || id >= l.vocab_size) __builtin_trap();
  if (r.logprobs < -1 || r.logprobs > 20 || r.max_tokens < 1 || !(r.ttft_slo_ms > 0) || !(r.kv_lease_s > 0) ||
      r.kv_lease_s > l.max_kv_lease_s || (r.kv_dtype != "f32" && r.kv_dtype != "bf16"))
    __builtin_trap();
}

void check(const serve::PushRequest& p, int ranks) {
  if (p.targets.empty() || int(p.targets.size()) > ranks || (p.dtype != "f32" && p.dtype != "bf16")) __builtin_trap();
  for (size_t i = 0; i < p.targets.size(); ++i) {
    if (p.targets[i].rank < 0 || p.targets[i].rank >= ranks) __builtin_trap();
    for (size_t j = 0; j < i; ++j)
      if (p.targets[j].rank == p.targets[i].rank) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if ((mode & 3) == 2 || (mode & 3) == 3) {
      const int ranks = 1 + ((mode >> 3) & 3);
      check(serve::parse_push_request(body, ranks, mode & 4 ? "bf16" : "f32"), ranks);
    } else {
      const serve::ApiLimits l = limits(mode & 4);
      check(serve::parse_request(body, mode & 1 ? serve::Endpoint::Prefill : serve::Endpoint::Completions, l), l);
    }
  } catch (const serve::ApiError& e) {
    if (e.status != 400 && e.status != 404) __builtin_trap();
  }
  return 0;
}
