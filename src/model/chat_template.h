// Chat prompt formats. GGUF files carry a Jinja template
// (tokenizer.chat_template); rather than run Jinja, ebb recognises the few
// formats it supports by their marker tokens and renders them in C++.
//
// The rendered text contains control-token text ("<|im_start|>", "</s>"), so
// it must be encoded with EncodeOptions::parse_special = true. BOS is never
// written as text at the start: the tokenizer adds it (add_bos), and writing
// it too would give the model two.
//
// The formats, exactly as rendered (S, U, A: system, user, assistant content):
//
//   kChatML (Qwen 2/2.5/3, and others that use <|im_start|>):
//     "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
//     "<|im_start|>assistant\nA<|im_end|>\n"
//     generation prompt "<|im_start|>assistant\n". Content is not trimmed.
//     Unlike some Qwen templates, no default system message is invented and
//     no "<think>" block is added or removed; the caller decides.
//
//   kLlama3 (Llama 3.x Instruct):
//     "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
//     "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>" ...
//     generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//     Content is trimmed of surrounding whitespace, as Meta's template does.
//
//   kLlama2 (Llama 2 Chat), following Meta's reference (chat_completion in
//   llama/generation.py) and its Hugging Face template:
//     "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] U2 [/INST]"
//     The system message, if any, must come first and is folded into the
//     first user turn; the text of each user turn (with the folded system
//     block) and each assistant answer is trimmed; "[INST] " and " [/INST]"
//     wrap the user text; an answer is " A </s>" and every later turn starts
//     with "<s>". The first "<s>" is the tokenizer's BOS. After the system
//     message, roles must alternate user, assistant, user, ... starting with
//     user (the template raises otherwise; ebb throws ebb::Error). The prompt
//     already ends in " [/INST]", so the generation prompt adds nothing.
//     A lone system message (no user turn yet) is rendered as a first turn
//     with empty user text, "[INST] <<SYS>>\nS\n<</SYS>> [/INST]", where
//     Meta's template would silently drop it.
//
//   kPlain (base models such as TinyStories, with no chat training):
//     "System: S\nUser: U\nAssistant: A\nUser: U2\n"
//     generation prompt "Assistant:" with no trailing space: SentencePiece
//     vocabularies put the space inside the next word's token ("▁Once"), so
//     a trailing space would push the model onto rare space-only tokens.
//     Content is trimmed. The stop string "\nUser:" ends the answer when the
//     model goes on to write the next user line itself.
//
// Roles are "system", "user" and "assistant"; any other role throws
// ebb::Error naming it.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

enum class ChatFormat { kChatML, kLlama3, kLlama2, kPlain };

// Picks the format from markers in the GGUF's template text:
//   "<|im_start|>" -> kChatML, "<|start_header_id|>" -> kLlama3,
//   "[INST]" -> kLlama2 (checked in that order; Mistral's [INST] templates
//   also land on kLlama2, the closest supported format).
// With an empty template, arch "qwen2"/"qwen3" (and their variants such as
// "qwen2moe") give kChatML, since Qwen models are trained on it. Anything
// else is kPlain.
ChatFormat detect_chat_format(std::string_view jinja_template, std::string_view arch);

// "chatml", "llama3", "llama2", "plain".
std::string_view chat_format_name(ChatFormat f);
// Inverse of chat_format_name, ignoring ASCII case; nullopt when unknown.
std::optional<ChatFormat> parse_chat_format(std::string_view name);

// Renders `msgs` in format `f`; add_generation_prompt appends the header that
// opens the assistant's turn, so the model's next tokens are its answer.
std::string apply_chat_template(ChatFormat f, std::span<const ChatMessage> msgs,
                                bool add_generation_prompt);

// Text that ends an assistant turn in format `f`, for use as stop strings
// (the end-of-turn token is also an end-of-generation token, but a model or
// tokenizer that spells it as text still stops here).
std::vector<std::string> chat_stop_strings(ChatFormat f);

}  // namespace ebb
