#include "model/chat_template.h"

#include <array>

#include "platform/error.h"

namespace ebb {
namespace {

enum class Role { kSystem, kUser, kAssistant };

Role parse_role(const ChatMessage& m, ChatFormat f) {
  if (m.role == "system") return Role::kSystem;
  if (m.role == "user") return Role::kUser;
  if (m.role == "assistant") return Role::kAssistant;
  throw Error("chat message role '" + m.role + "' is not one of system, user, assistant (format " +
              std::string(chat_format_name(f)) + ")");
}

// Python's str.strip() and Jinja's |trim remove Unicode whitespace; chat text
// that starts or ends with anything but ASCII whitespace is rare enough that
// ASCII is what we strip.
std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

void append(std::string& out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out += p;
}

std::string render_chatml(std::span<const ChatMessage> msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    parse_role(m, ChatFormat::kChatML);
    append(out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(std::span<const ChatMessage> msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    parse_role(m, ChatFormat::kLlama3);
    append(out, {"<|start_header_id|>", m.role, "<|end_header_id|>\n\n", trim(m.content), "<|eot_id|>"});
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_llama2(std::span<const ChatMessage> msgs) {
  size_t i = 0;
  std::string system_block;
  bool has_system = false;
  if (!msgs.empty() && parse_role(msgs[0], ChatFormat::kLlama2) == Role::kSystem) {
    system_block = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n";
    has_system = true;
    i = 1;
  }
  std::string out;
  // A system message with no user turn after it would vanish in Meta's
  // template; render it as a first turn with empty user text instead.
  if (has_system && i == msgs.size()) append(out, {"[INST] ", trim(system_block), " [/INST]"});

  for (size_t turn = 0; i < msgs.size(); ++i, ++turn) {
    const Role role = parse_role(msgs[i], ChatFormat::kLlama2);
    const Role expected = turn % 2 == 0 ? Role::kUser : Role::kAssistant;
    if (role != expected) {
      throw Error("chat message " + std::to_string(i) + " has role '" + msgs[i].role +
                  "', but the llama2 format needs an optional first system message, then "
                  "user and assistant turns alternating, starting with user");
    }
    if (role == Role::kUser) {
      // The first "<s>" is the tokenizer's BOS; later turns write it as text.
      if (turn > 0) out += "<s>";
      const std::string text = turn == 0 ? system_block + msgs[i].content : msgs[i].content;
      append(out, {"[INST] ", trim(text), " [/INST]"});
    } else {
      append(out, {" ", trim(msgs[i].content), " </s>"});
    }
  }
  return out;
}

std::string render_plain(std::span<const ChatMessage> msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    std::string_view label;
    switch (parse_role(m, ChatFormat::kPlain)) {
      case Role::kSystem: label = "System: "; break;
      case Role::kUser: label = "User: "; break;
      case Role::kAssistant: label = "Assistant: "; break;
    }
    append(out, {label, trim(m.content), "\n"});
  }
  if (gen) out += "Assistant:";
  return out;
}

constexpr std::array<std::pair<ChatFormat, std::string_view>, 4> kNames = {{
    {ChatFormat::kChatML, "chatml"},
    {ChatFormat::kLlama3, "llama3"},
    {ChatFormat::kLlama2, "llama2"},
    {ChatFormat::kPlain, "plain"},
}};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view jinja_template, std::string_view arch) {
  // Most specific markers first: a ChatML or Llama 3 template never contains
  // the others' markers, while "[INST]" is plain enough text to appear in a
  // template's comments or examples.
  if (jinja_template.find("<|im_start|>") != std::string_view::npos) return ChatFormat::kChatML;
  if (jinja_template.find("<|start_header_id|>") != std::string_view::npos) return ChatFormat::kLlama3;
  if (jinja_template.find("[INST]") != std::string_view::npos) return ChatFormat::kLlama2;
  if (jinja_template.empty() && (arch.starts_with("qwen2") || arch.starts_with("qwen3")))
    return ChatFormat::kChatML;
  return ChatFormat::kPlain;
}

std::string_view chat_format_name(ChatFormat f) {
  for (const auto& [format, name] : kNames)
    if (format == f) return name;
  EBB_CHECK_MSG(false, "unknown ChatFormat value");
  return {};
}

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& [format, n] : kNames)
    if (iequals(n, name)) return format;
  return std::nullopt;
}

std::string apply_chat_template(ChatFormat f, std::span<const ChatMessage> msgs,
                                bool add_generation_prompt) {
  switch (f) {
    case ChatFormat::kChatML: return render_chatml(msgs, add_generation_prompt);
    case ChatFormat::kLlama3: return render_llama3(msgs, add_generation_prompt);
    case ChatFormat::kLlama2: return render_llama2(msgs);  // already ends in " [/INST]"
    case ChatFormat::kPlain: return render_plain(msgs, add_generation_prompt);
  }
  EBB_CHECK_MSG(false, "unknown ChatFormat value");
  return {};
}

std::vector<std::string> chat_stop_strings(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML: return {"<|im_end|>"};
    case ChatFormat::kLlama3: return {"<|eot_id|>"};
    // "</s>" ends the answer; "[INST]" catches a model that skips it and
    // starts writing the next user turn.
    case ChatFormat::kLlama2: return {"</s>", "[INST]"};
    case ChatFormat::kPlain: return {"\nUser:"};
  }
  EBB_CHECK_MSG(false, "unknown ChatFormat value");
  return {};
}

}  // namespace ebb
