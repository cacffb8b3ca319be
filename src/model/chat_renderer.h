// ChatRenderer: how a conversation becomes prompt text, one value shared by
// `ebb run --chat`, `ebb chat`, `ebb train` (messages samples) and the C API.
//
// Two ways, chosen once:
//  - Jinja: the template the GGUF carries (tokenizer.chat_template) or one
//    given as a file (--chat-template FILE), run by ChatTemplate exactly as
//    transformers runs it. Tools reach the model only this way.
//  - Markers: the C++ renderers of chat_template.h (chatml, llama3, llama2,
//    plain), used when a format is asked for by name, or as a fallback for a
//    file without a template (or whose template does not parse); `note`
//    then says so in one line.
//
// The rendered text holds control-token text: encode it with
// parse_special = true, and without the tokenizer's BOS when the template
// wrote the BOS text itself (writes_bos).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_jinja.h"
#include "model/chat_parse.h"
#include "model/chat_template.h"

namespace ebb {

class Tokenizer;

class ChatRenderer {
 public:
  // The marker renderer for `format`.
  ChatRenderer(ChatFormat format, std::string_view arch);
  // A Jinja template (never null).
  ChatRenderer(std::shared_ptr<const ChatTemplate> jinja, std::string_view arch);

  // The model's own: its template when it has one that parses, else the
  // marker format its template or architecture suggests, with `note` set to
  // one line saying why (empty when the template is used).
  static ChatRenderer for_model(const std::string& model_template, std::string_view arch, const Tokenizer& tok,
                                std::string* note);
  // A template's source text (a --chat-template FILE): throws ebb::Error
  // naming line and column when it does not parse.
  static ChatRenderer from_source(std::string source, std::string_view arch, const Tokenizer& tok);

  bool is_jinja() const { return jinja_ != nullptr; }
  const ChatTemplate* jinja() const { return jinja_.get(); }
  ChatFormat marker() const { return marker_; }
  // "jinja" or the marker format's name.
  std::string name() const;

  std::string render(std::span<const ChatMessage> msgs, bool add_generation_prompt) const;
  // OpenAI-shaped messages and tools (tool-call arguments as objects). The
  // marker renderer takes only role/content messages and no tools (ebb::Error
  // naming what it cannot render).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt) const;

  // Stop strings for an answer (the end-of-turn text when a tokenizer spells
  // it as text, and what the family's output format needs).
  std::vector<std::string> stop_strings() const;
  // The family's tool-call syntax (for parsing answers and tool grammars).
  const ChatOutputFormat& output_format() const { return output_; }
  // True when `text` begins with the template's BOS text (the tokenizer must
  // not add a second one).
  bool writes_bos(std::string_view text) const;

 private:
  std::shared_ptr<const ChatTemplate> jinja_;
  ChatFormat marker_ = ChatFormat::kPlain;
  ChatOutputFormat output_;
};

// The loss mask of a rendered conversation: for each assistant message, the
// byte range [begin, end) of `full` (render(msgs, false)) that the model must
// learn to write: from the end of the text rendered before it with the
// generation prompt, through its first end-of-turn text (one of `turn_ends`,
// e.g. the pieces of the tokenizer's end-of-generation tokens), or to where
// the rendering with the next message diverges when there is none. Works for
// templates that render a message differently once it is no longer the last
// (Qwen3's empty <think> block). Ranges may be empty; never overlap.
std::vector<std::pair<size_t, size_t>> assistant_spans(const ChatRenderer& r, std::span<const ChatMessage> msgs,
                                                       const std::string& full,
                                                       const std::vector<std::string>& turn_ends);

// The text of every end-of-generation token of `tok` (as control text).
std::vector<std::string> end_of_turn_texts(const Tokenizer& tok);

}  // namespace ebb
