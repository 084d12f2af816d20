#include "slope/text/chat.h"

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/text/utf8.h"

namespace slope::text {
namespace {

void check_role(const ChatMessage& m, size_t i) {
  SLOPE_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat message ", i, ": role '", m.role,
              "' is not supported; use system, user or assistant");
}

// Python's str.isspace() characters, which Jinja's trim filter (str.strip) removes.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string python_strip(const std::string& s) {
  size_t begin = 0, end = s.size();
  for (size_t i = 0; i < s.size();) {
    if (!python_space(utf8_next(s, i))) break;
    begin = i;
  }
  // The last non-space character ends the text.
  for (size_t i = begin; i < s.size();) {
    const char32_t c = utf8_next(s, i);
    if (!python_space(c)) end = i;
  }
  return begin >= end ? std::string() : s.substr(begin, end - begin);
}

std::string harmony(const std::vector<ChatMessage>& msgs, const ChatOptions& o) {
  SLOPE_CHECK(o.reasoning_effort == "low" || o.reasoning_effort == "medium" || o.reasoning_effort == "high",
              "harmony reasoning effort must be low, medium or high, got '", o.reasoning_effort, "'");
  std::string out = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                    "Knowledge cutoff: 2024-06";
  if (!o.date.empty()) out += "\nCurrent date: " + o.date;
  out += "\n\nReasoning: " + o.reasoning_effort +
         "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>";
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      SLOPE_CHECK(i == 0, "chat message ", i, ": harmony takes a system message only first (as the developer instructions)");
      out += "<|start|>developer<|message|># Instructions\n\n" + m.content + "<|end|>";
    } else if (m.role == "user") {
      out += "<|start|>user<|message|>" + m.content + "<|end|>";
    } else {
      out += "<|start|>assistant<|channel|>final<|message|>" + m.content + "<|end|>";
    }
  }
  if (o.add_generation_prompt) out += "<|start|>assistant";
  return out;
}

std::string llama3(const std::vector<ChatMessage>& msgs, const ChatOptions& o) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0) out += "<|begin_of_text|>";
    out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + python_strip(msgs[i].content) + "<|eot_id|>";
  }
  if (o.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string chatml(const std::vector<ChatMessage>& msgs, const ChatOptions& o) {
  std::string out;
  if (!msgs.empty() && msgs[0].role != "system") out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
  for (const ChatMessage& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (o.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "harmony") return ChatFormat::Harmony;
  if (name == "llama3") return ChatFormat::Llama3;
  if (name == "chatml") return ChatFormat::ChatML;
  fail("unknown chat format '", name, "'; use harmony (gpt-oss), llama3 (Llama-3) or chatml (Qwen2/Qwen3)");
}

const char* chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::Harmony: return "harmony";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::ChatML: return "chatml";
  }
  return "?";
}

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  for (size_t i = 0; i < messages.size(); ++i) {
    check_role(messages[i], i);
    const size_t bad = utf8_invalid_offset(messages[i].content);
    SLOPE_CHECK(bad == std::string::npos, "chat message ", i, ": content is not valid UTF-8: byte ", bad);
  }
  switch (format) {
    case ChatFormat::Harmony: return harmony(messages, options);
    case ChatFormat::Llama3: return llama3(messages, options);
    case ChatFormat::ChatML: return chatml(messages, options);
  }
  fail("unknown chat format");
}

std::vector<ChatMessage> parse_chat_messages(std::string_view json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fail("chat messages are not valid JSON: ", e.what());
  }
  SLOPE_CHECK(j.is_array(), "chat messages must be a JSON array of {\"role\": ..., \"content\": ...} objects");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& m = j[i];
    SLOPE_CHECK(m.is_object(), "chat message ", i, " is not a JSON object");
    for (const char* key : {"role", "content"})
      SLOPE_CHECK(m.contains(key) && m[key].is_string(), "chat message ", i, ": \"", key, "\" must be a string",
                  m.contains(key) ? "" : " and is missing");
    for (const auto& [key, value] : m.items())
      SLOPE_CHECK(key == "role" || key == "content", "chat message ", i, ": field \"", key,
                  "\" is not supported (only role and content)");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace slope::text
