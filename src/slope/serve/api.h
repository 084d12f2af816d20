// The HTTP API's requests and errors, without the server: parsing and checking a JSON body into
// a typed request (every field's type and range; unknown fields refused), and the OpenAI-style
// error body. docs/serving.md lists every field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slope/core/error.h"

namespace slope::text {
class Tokenizer;
}

namespace slope::serve {

// A request the API refuses: HTTP status, and the OpenAI error object's fields.
struct ApiError : Error {
  ApiError(int status, std::string message, std::string type, std::string param = "", std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;
};
[[noreturn]] void bad_request(const std::string& param, const std::string& code, const std::string& message);

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param = "",
                          const std::string& code = "");

// What the API checks a prompt against.
struct ApiLimits {
  std::string model_name;           // the id /v1/models lists; "model" must be it (or absent)
  int64_t vocab_size = 0;
  int64_t max_position = 0;         // the model's max_position_embeddings
  int64_t max_prompt_tokens = 0;    // the longest prompt some instance can run (memory)
  size_t max_prompt_bytes = 0;      // a text prompt's bytes, before the tokenizer (--max-prompt-bytes; 0: none)
  double default_slo_ms = 0;
  double max_kv_lease_s = 0;
  double default_kv_lease_s = 0;
  const text::Tokenizer* tokenizer = nullptr;  // text prompts need it
};

enum class Endpoint { Completions, Prefill };

struct ApiRequest {
  std::vector<int32_t> prompt;
  int logprobs = -1;           // -1: none; else top-k at the last position
  int64_t max_tokens = 16;
  double ttft_slo_ms = 0;
  int priority = 0;
  bool best_effort = false;
  bool return_logits = false;  // SLOPE: the last position's logits in the response
  double kv_lease_s = 0;       // /v1/prefill
  std::string kv_dtype = "f32";  // /v1/prefill: the KV pull's default dtype (the handle's "dtype")
};

// The deepest JSON nesting a body may have. nlohmann::json parses and frees deep nesting without
// recursion, but each level costs ~170 bytes of memory per byte of body: a body of brackets
// within --max-body-bytes would take gigabytes. No field of this API nests more than 3 deep.
inline constexpr int kMaxJsonDepth = 16;
// Throws ApiError (400) when `body` nests JSON deeper than kMaxJsonDepth (a scan, before parsing).
void check_json_depth(const std::string& body);

// Throws ApiError (400, or 404 for an unknown model) naming the field and the problem.
ApiRequest parse_request(const std::string& body, Endpoint endpoint, const ApiLimits& limits);

// POST /v1/kv/{id}/push's body: {"targets": [{"rank": r, "endpoint": "host:port"}, ...], "dtype",
// "window_trim"}.
struct PushTarget {
  int rank = 0;
  std::string endpoint;  // where that rank dials: "host:port"
};
struct PushRequest {
  std::vector<PushTarget> targets;
  std::string dtype;  // f32 or bf16
  bool window_trim = true;
};

// `ranks`: how many ranks the lease's instance has; `default_dtype`: the lease's. Throws
// ApiError (400) naming the field and the problem.
PushRequest parse_push_request(const std::string& body, int ranks, const std::string& default_dtype);

}  // namespace slope::serve
