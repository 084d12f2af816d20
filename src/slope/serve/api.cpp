#include "slope/serve/api.h"

#include <cmath>
#include <set>

#include "slope/kvx/protocol.h"
#include "slope/text/tokenizer.h"

namespace slope::serve {
namespace {

using nlohmann::json;

const char* kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction";
    default: return "a number";
  }
}

int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad_request(name, "invalid_type", str_cat("'", name, "' must be an integer, got ", kind(v)));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi)
    bad_request(name, "invalid_value", str_cat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

double number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad_request(name, "invalid_type", str_cat("'", name, "' must be a number, got ", kind(v)));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    bad_request(name, "invalid_value", str_cat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad_request(name, "invalid_type", str_cat("'", name, "' must be true or false, got ", kind(v)));
  return v.get<bool>();
}

std::vector<int32_t> prompt_of(const json& p, const ApiLimits& lim) {
  auto check_length = [&](int64_t n) {
    if (n > lim.max_position)
      bad_request("prompt", "context_length_exceeded", str_cat("the prompt is ", n, " tokens, more than the model's ",
                                                               "max_position_embeddings (", lim.max_position, "); shorten it"));
    if (n > lim.max_prompt_tokens)
      bad_request("prompt", "context_length_exceeded",
                  str_cat("the prompt is ", n, " tokens, more than any instance can hold in memory (", lim.max_prompt_tokens,
                          " tokens); shorten it, or start the server with a larger instance"));
  };
  std::vector<int32_t> ids;
  const json* text = p.is_string() ? &p : nullptr;
  if (p.is_array() && p.size() == 1 && p[0].is_string()) text = &p[0];
  if (text) {
    if (lim.max_prompt_bytes > 0 && text->get_ref<const std::string&>().size() > lim.max_prompt_bytes)
      bad_request("prompt", "prompt_too_large",
                  str_cat("the text prompt is ", text->get_ref<const std::string&>().size(), " bytes, over the limit of ",
                          lim.max_prompt_bytes, " (--max-prompt-bytes); shorten it, or start the server with a larger limit"));
    if (!lim.tokenizer)
      bad_request("prompt", "tokenizer_missing",
                  "this model has no tokenizer.json, so 'prompt' must be a list of token ids, not text");
    try {
      ids = lim.tokenizer->encode(text->get<std::string>(), true);
    } catch (const Error& e) {
      bad_request("prompt", "invalid_prompt", str_cat("'prompt' cannot be encoded: ", e.what()));
    }
  } else if (p.is_array()) {
    if (!p.empty() && (p[0].is_array() || p[0].is_string()))
      bad_request("prompt", "invalid_prompt", str_cat("'prompt' holds ", p.size(), " prompts; send one prompt per request"));
    check_length(int64_t(p.size()));  // before converting any id
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer())
        bad_request("prompt", "invalid_type", str_cat("'prompt'[", i, "] must be a token id (an integer), got ", kind(p[i])));
      const int64_t id = p[i].is_number_unsigned() && p[i].get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : p[i].get<int64_t>();
      if (id < 0 || id >= lim.vocab_size)
        bad_request("prompt", "invalid_token_id", str_cat("'prompt'[", i, "] = ", id, " is outside the vocabulary [0, ",
                                                          lim.vocab_size, ")"));
      ids.push_back(int32_t(id));
    }
  } else {
    bad_request("prompt", "invalid_type", str_cat("'prompt' must be a list of token ids or a string, got ", kind(p)));
  }
  if (ids.empty()) bad_request("prompt", "empty_prompt", "'prompt' is empty; send at least one token");
  check_length(int64_t(ids.size()));
  return ids;
}

}  // namespace

void bad_request(const std::string& param, const std::string& code, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

json error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)},
                     {"code", code.empty() ? json() : json(code)}}}};
}

void check_json_depth(const std::string& body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        bad_request("", "too_deep", str_cat("the body nests JSON more than ", kMaxJsonDepth, " levels deep (a fixed limit: ",
                                            "no field of this API needs more than 3)"));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

ApiRequest parse_request(const std::string& body, Endpoint endpoint, const ApiLimits& lim) {
  check_json_depth(body);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad_request("", "invalid_json", str_cat("the body is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) bad_request("", "invalid_json", str_cat("the body must be a JSON object, got ", kind(j)));
  // Fields OpenAI's completions API defines that a prefill worker accepts (sampling fields do
  // not change the greedy first token; docs/serving.md), then SLOPE's.
  static const std::set<std::string> completions = {
      "model", "prompt", "max_tokens", "logprobs", "echo", "n", "best_of", "stream", "stop", "temperature", "top_p",
      "presence_penalty", "frequency_penalty", "user", "seed", "logit_bias", "suffix",
      "ttft_slo_ms", "priority", "best_effort", "return_logits"};
  static const std::set<std::string> prefill = {"model", "prompt", "logprobs", "ttft_slo_ms", "priority",
                                                "best_effort", "return_logits", "kv_lease_s", "kv_dtype"};
  const std::set<std::string>& known = endpoint == Endpoint::Completions ? completions : prefill;
  for (const auto& [k, v] : j.items())
    if (!known.count(k)) {
      std::string list;
      for (const auto& f : known) list += (list.empty() ? "" : ", ") + f;
      bad_request(k, "unknown_field", str_cat("unknown field '", k, "'; this endpoint takes: ", list));
    }
  if (!j.contains("prompt")) bad_request("prompt", "missing_field", "'prompt' is required");
  if (j.contains("model")) {
    if (!j["model"].is_string()) bad_request("model", "invalid_type", str_cat("'model' must be a string, got ", kind(j["model"])));
    if (j["model"].get<std::string>() != lim.model_name)
      throw ApiError(404, str_cat("the model '", j["model"].get<std::string>(), "' does not exist; this server serves '",
                                  lim.model_name, "' (GET /v1/models)"),
                     "invalid_request_error", "model", "model_not_found");
  }
  ApiRequest r;
  r.ttft_slo_ms = lim.default_slo_ms;
  r.kv_lease_s = lim.default_kv_lease_s;
  for (const auto& [k, v] : j.items()) {
    if (k == "max_tokens") r.max_tokens = integer(v, k, 1, INT32_MAX);
    else if (k == "logprobs") r.logprobs = v.is_null() ? -1 : int(integer(v, k, 0, 20));
    else if (k == "echo") {
      if (boolean(v, k))
        bad_request(k, "unsupported", "'echo' is not supported: a prefill worker returns the first new token only, "
                                      "not the prompt's log-probabilities; leave it out or set it to false");
    } else if (k == "n" || k == "best_of") {
      if (integer(v, k, 1, INT32_MAX) != 1)
        bad_request(k, "unsupported", str_cat("'", k, "' must be 1: a prefill worker returns one greedy token"));
    } else if (k == "stream") {
      if (!v.is_null() && boolean(v, k))
        bad_request(k, "unsupported", "'stream' is not supported: the response is the first token, sent whole");
    } else if (k == "stop") {
      if (!v.is_null() && !v.is_string() && !v.is_array())
        bad_request(k, "invalid_type", str_cat("'stop' must be a string or a list of strings, got ", kind(v)));
    } else if (k == "temperature") number(v, k, 0, 2);
    else if (k == "top_p") number(v, k, 0, 1);
    else if (k == "presence_penalty" || k == "frequency_penalty") number(v, k, -2, 2);
    else if (k == "user") {
      if (!v.is_string()) bad_request(k, "invalid_type", str_cat("'user' must be a string, got ", kind(v)));
    } else if (k == "seed") {
      if (!v.is_null()) integer(v, k, INT64_MIN, INT64_MAX);
    } else if (k == "logit_bias") {
      if (!v.is_null() && !(v.is_object() && v.empty()))
        bad_request(k, "unsupported", "'logit_bias' is not supported: the first token is the model's greedy one");
    } else if (k == "suffix") {
      if (!v.is_null()) bad_request(k, "unsupported", "'suffix' is not supported by a prefill worker");
    } else if (k == "ttft_slo_ms") r.ttft_slo_ms = number(v, k, 1e-3, 1e9);
    else if (k == "priority") r.priority = int(integer(v, k, -1000, 1000));
    else if (k == "best_effort") r.best_effort = boolean(v, k);
    else if (k == "return_logits") r.return_logits = boolean(v, k);
    else if (k == "kv_lease_s") r.kv_lease_s = number(v, k, 1e-3, lim.max_kv_lease_s);
    else if (k == "kv_dtype") {
      if (!v.is_string() || (v.get<std::string>() != "f32" && v.get<std::string>() != "bf16"))
        bad_request(k, "invalid_value", "'kv_dtype' must be \"f32\" or \"bf16\" (the KV pull's default dtype)");
      r.kv_dtype = v.get<std::string>();
    }
  }
  r.prompt = prompt_of(j["prompt"], lim);
  return r;
}

PushRequest parse_push_request(const std::string& body, int ranks, const std::string& default_dtype) {
  auto refuse = [](const std::string& param, const std::string& message) {
    bad_request(param, "invalid_value", message);
  };
  check_json_depth(body);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    refuse("", str_cat("the body is not valid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("targets") || !j["targets"].is_array() || j["targets"].empty())
    refuse("targets", "the body must be {\"targets\": [{\"rank\": R, \"endpoint\": \"host:port\"}, ...]}");
  for (const auto& [k, v] : j.items())
    if (k != "targets" && k != "dtype" && k != "window_trim")
      refuse(k, str_cat("unknown field '", k, "'; this endpoint takes: targets, dtype, window_trim"));
  PushRequest r;
  r.dtype = default_dtype;
  if (j.contains("dtype")) {
    if (!j["dtype"].is_string()) refuse("dtype", str_cat("'dtype' must be \"f32\" or \"bf16\", got ", kind(j["dtype"])));
    r.dtype = j["dtype"].get<std::string>();
  }
  if (r.dtype != "f32" && r.dtype != "bf16") refuse("dtype", "'dtype' must be \"f32\" or \"bf16\"");
  if (j.contains("window_trim") && !j["window_trim"].is_boolean())
    refuse("window_trim", "'window_trim' must be true or false");
  r.window_trim = j.value("window_trim", true);
  for (size_t i = 0; i < j["targets"].size(); ++i) {
    const json& t = j["targets"][i];
    if (!t.is_object() || !t.contains("rank") || !t["rank"].is_number_integer() || !t.contains("endpoint") ||
        !t["endpoint"].is_string())
      refuse("targets", "each target must be {\"rank\": R, \"endpoint\": \"host:port\"}");
    const int64_t rank = integer(t["rank"], str_cat("targets[", i, "].rank"), 0, INT32_MAX);  // never wrapped onto a rank
    if (rank >= ranks) refuse("targets", str_cat("rank ", rank, " is not a rank of the instance (it has ", ranks, ")"));
    for (const PushTarget& other : r.targets)
      if (other.rank == rank) refuse("targets", str_cat("rank ", rank, " is named twice"));
    try {
      kvx::parse_endpoint(t["endpoint"].get<std::string>());
    } catch (const Error& e) {
      refuse("targets", e.what());
    }
    r.targets.push_back({int(rank), t["endpoint"].get<std::string>()});
  }
  return r;
}

}  // namespace slope::serve
