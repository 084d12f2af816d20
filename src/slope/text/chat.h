// Chat messages rendered into prompt text, for three chat formats written out directly in C++
// (no Jinja engine): the text each model's published chat template gives for the same
// messages, byte for byte.
//
//   harmony  gpt-oss: "<|start|>system<|message|>" with the default system message (model
//            identity, "Knowledge cutoff: 2024-06", an optional "Current date: ",
//            "Reasoning: medium", the valid channels), a first system message as the
//            developer message "# Instructions\n\n...", user turns "<|start|>user<|message|>
//            ...<|end|>", assistant turns on the final channel
//            "<|start|>assistant<|channel|>final<|message|>...<|end|>"; generation prompt
//            "<|start|>assistant".
//   llama3   Llama-3: "<|begin_of_text|>" then "<|start_header_id|>ROLE<|end_header_id|>\n\n"
//            + the content stripped of whitespace at both ends (Python's str.strip) +
//            "<|eot_id|>"; generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//   chatml   Qwen2's ChatML: "<|im_start|>ROLE\n" + content + "<|im_end|>\n", with the default
//            system message "You are a helpful assistant." when the first message is not a
//            system message; generation prompt "<|im_start|>assistant\n".
//
// The text carries its own BOS where the format has one (llama3), so it is encoded with
// add_special = false. Roles are system, user and assistant; anything else (tools, tool calls,
// reasoning content) is a slope::Error naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace slope::text {

enum class ChatFormat { Harmony, Llama3, ChatML };

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // harmony: the "Current date: " line of the system message (YYYY-MM-DD); empty: no line.
  std::string date;
  // harmony: "Reasoning: " of the system message: low, medium or high.
  std::string reasoning_effort = "medium";
};

// "harmony", "llama3" or "chatml"; anything else is a slope::Error listing these.
ChatFormat parse_chat_format(std::string_view name);
const char* chat_format_name(ChatFormat format);

// The prompt text of `messages`. Throws slope::Error for an unknown role, a system message
// anywhere but first (harmony), or a bad option.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, const ChatOptions& options = {});

// A JSON array of {"role": ..., "content": ...} objects (the OpenAI messages shape; content a
// string). Throws slope::Error naming the message and field at fault.
std::vector<ChatMessage> parse_chat_messages(std::string_view json);

}  // namespace slope::text
