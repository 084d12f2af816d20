// The chat formats' fixed parts and their errors; tests/text/check_chat.py compares the
// renderings with jinja2 and the ids with `tokenizers` for many conversations.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "slope/core/error.h"
#include "slope/text/chat.h"

using namespace slope::text;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const slope::Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}};

TEST(Chat, Harmony) {
  ChatOptions o;
  o.date = "2025-06-28";
  EXPECT_EQ(render_chat(ChatFormat::Harmony, kChat, o),
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
            "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
            "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
            "<|start|>assistant");
}

TEST(Chat, Llama3StripsContent) {
  EXPECT_EQ(render_chat(ChatFormat::Llama3, {{"user", " \u00a0 Hi \u3000\n"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(ChatFormat::Llama3, {{"user", " \n "}}, {false}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

TEST(Chat, ChatMLDefaultSystem) {
  EXPECT_EQ(render_chat(ChatFormat::ChatML, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::ChatML, {{"system", "S"}}, {false}), "<|im_start|>system\nS<|im_end|>\n");
}

TEST(Chat, Errors) {
  EXPECT_NE(error_of([] { parse_chat_format("jinja"); }).find("unknown chat format 'jinja'; use harmony"), std::string::npos);
  EXPECT_NE(error_of([] { render_chat(ChatFormat::ChatML, {{"tool", "x"}}); })
                .find("chat message 0: role 'tool' is not supported; use system, user or assistant"),
            std::string::npos);
  EXPECT_NE(error_of([] { render_chat(ChatFormat::Harmony, {{"user", "a"}, {"system", "b"}}); })
                .find("chat message 1: harmony takes a system message only first"),
            std::string::npos);
  EXPECT_NE(error_of([] { render_chat(ChatFormat::Llama3, {{"user", "a\xff"}}); })
                .find("chat message 0: content is not valid UTF-8: byte 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_chat_messages("{\"role\": \"user\"}"); }).find("must be a JSON array"), std::string::npos);
  EXPECT_NE(error_of([] { parse_chat_messages("[{\"role\": \"user\"}]"); })
                .find("chat message 0: \"content\" must be a string and is missing"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_chat_messages("[{\"role\": \"user\", \"content\": \"x\", \"name\": \"n\"}]"); })
                .find("field \"name\" is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_chat_messages("[1,"); }).find("not valid JSON"), std::string::npos);
  const auto m = parse_chat_messages("[{\"role\": \"user\", \"content\": \"x\\ny\"}]");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].content, "x\ny");
}

}  // namespace
