#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "platform/error.h"

namespace ebb {
namespace {

// system + user + assistant + user, the conversation every format renders.
const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello!"},
    {"assistant", "Hi. How can I help?"},
    {"user", "Tell me a story."},
};

TEST(ChatTemplateRender, ChatML) {
  const std::string body =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHello!<|im_end|>\n"
      "<|im_start|>assistant\nHi. How can I help?<|im_end|>\n"
      "<|im_start|>user\nTell me a story.<|im_end|>\n";
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, kConversation, false), body);
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, kConversation, true),
            body + "<|im_start|>assistant\n");
}

TEST(ChatTemplateRender, ChatMLKeepsContentVerbatim) {
  const std::vector<ChatMessage> msgs = {{"user", "  two\nlines  "}};
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, msgs, false),
            "<|im_start|>user\n  two\nlines  <|im_end|>\n");
}

TEST(ChatTemplateRender, Llama3) {
  const std::string body =
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi. How can I help?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nTell me a story.<|eot_id|>";
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama3, kConversation, false), body);
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama3, kConversation, true),
            body + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No BOS text: the tokenizer adds it.
  EXPECT_EQ(body.find("<|begin_of_text|>"), std::string::npos);
}

TEST(ChatTemplateRender, Llama3TrimsContent) {
  const std::vector<ChatMessage> msgs = {{"user", "\n  Hello!  \n"}};
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama3, msgs, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>");
}

TEST(ChatTemplateRender, Llama2) {
  const std::string expected =
      "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST]"
      " Hi. How can I help? </s>"
      "<s>[INST] Tell me a story. [/INST]";
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama2, kConversation, false), expected);
  // The prompt already ends in " [/INST]"; nothing is appended.
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama2, kConversation, true), expected);
}

TEST(ChatTemplateRender, Llama2WithoutSystemAndTrimmed) {
  const std::vector<ChatMessage> msgs = {
      {"user", " Hello! \n"}, {"assistant", "  Hi.  "}, {"user", "Bye."}};
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama2, msgs, true),
            "[INST] Hello! [/INST] Hi. </s><s>[INST] Bye. [/INST]");
}

TEST(ChatTemplateRender, Llama2SystemOnly) {
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}};
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama2, msgs, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>> [/INST]");
}

TEST(ChatTemplateRender, Llama2RejectsRolesOutOfOrder) {
  const std::vector<std::vector<ChatMessage>> bad = {
      {{"assistant", "Hi."}},
      {{"user", "a"}, {"user", "b"}},
      {{"user", "a"}, {"system", "late system"}},
  };
  for (const auto& msgs : bad) {
    try {
      apply_chat_template(ChatFormat::kLlama2, msgs, true);
      ADD_FAILURE() << "no error for " << msgs.back().role;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("llama2"), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplateRender, Plain) {
  const std::string body =
      "System: You are a helpful assistant.\n"
      "User: Hello!\n"
      "Assistant: Hi. How can I help?\n"
      "User: Tell me a story.\n";
  EXPECT_EQ(apply_chat_template(ChatFormat::kPlain, kConversation, false), body);
  EXPECT_EQ(apply_chat_template(ChatFormat::kPlain, kConversation, true), body + "Assistant:");
}

TEST(ChatTemplateRender, EmptyConversation) {
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, {}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama2, {}, true), "");
  EXPECT_EQ(apply_chat_template(ChatFormat::kPlain, {}, false), "");
}

TEST(ChatTemplateRender, UnknownRoleThrowsNamingIt) {
  const std::vector<ChatMessage> msgs = {{"user", "hi"}, {"tool", "42"}};
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kLlama2,
                       ChatFormat::kPlain}) {
    try {
      apply_chat_template(f, msgs, true);
      ADD_FAILURE() << "no error in " << chat_format_name(f);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'tool'"), std::string::npos) << e.what();
    }
  }
}

// Shortened but verbatim in their markers: the templates these models ship.
constexpr std::string_view kQwenTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}";
constexpr std::string_view kLlama3Template =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
constexpr std::string_view kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
    "{% endif %}{% for message in loop_messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kZephyrTemplate =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
    "message['content'] + eos_token }}{% endif %}{% endfor %}";

TEST(ChatTemplateDetect, FromTemplateMarkers) {
  EXPECT_EQ(detect_chat_format(kQwenTemplate, "qwen3"), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format(kQwenTemplate, "llama"), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format(kLlama3Template, "llama"), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format(kLlama2Template, "llama"), ChatFormat::kLlama2);
  // A template the runtime does not know falls back to plain text, whatever the arch.
  EXPECT_EQ(detect_chat_format(kZephyrTemplate, "llama"), ChatFormat::kPlain);
  EXPECT_EQ(detect_chat_format(kZephyrTemplate, "qwen2"), ChatFormat::kPlain);
}

TEST(ChatTemplateDetect, FromArchWhenTemplateIsMissing) {
  EXPECT_EQ(detect_chat_format("", "qwen2"), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format("", "qwen3"), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format("", "qwen3moe"), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format("", "llama"), ChatFormat::kPlain);  // e.g. TinyStories
  EXPECT_EQ(detect_chat_format("", ""), ChatFormat::kPlain);
}

TEST(ChatTemplateNames, RoundTripAndCaseInsensitive) {
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kLlama2,
                       ChatFormat::kPlain}) {
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  }
  EXPECT_EQ(chat_format_name(ChatFormat::kChatML), "chatml");
  EXPECT_EQ(parse_chat_format("ChatML"), ChatFormat::kChatML);
  EXPECT_EQ(parse_chat_format("LLAMA3"), ChatFormat::kLlama3);
  EXPECT_EQ(parse_chat_format("llama"), std::nullopt);
  EXPECT_EQ(parse_chat_format(""), std::nullopt);
}

TEST(ChatTemplateStop, EndOfTurnText) {
  using V = std::vector<std::string>;
  EXPECT_EQ(chat_stop_strings(ChatFormat::kChatML), V{"<|im_end|>"});
  EXPECT_EQ(chat_stop_strings(ChatFormat::kLlama3), V{"<|eot_id|>"});
  EXPECT_EQ(chat_stop_strings(ChatFormat::kLlama2), (V{"</s>", "[INST]"}));
  EXPECT_EQ(chat_stop_strings(ChatFormat::kPlain), V{"\nUser:"});
}

TEST(ChatTemplateStop, StopStringEndsARenderedAssistantTurn) {
  // Rendering a finished assistant turn must contain the stop string right
  // after the answer, or generation would run past the turn.
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Again"}};
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kLlama2,
                       ChatFormat::kPlain}) {
    const std::string text = apply_chat_template(f, msgs, false);
    const std::string stop = chat_stop_strings(f).front();
    EXPECT_NE(text.find(std::string("Yo") + (f == ChatFormat::kLlama2 ? " " : "") + stop),
              std::string::npos)
        << chat_format_name(f) << ": " << text;
  }
}

}  // namespace
}  // namespace ebb
