// ChatTemplate: a GGUF file's tokenizer.chat_template run as Hugging Face
// transformers runs it (apply_chat_template): Jinja2 3.1 in an immutable
// sandbox with trim_blocks and lstrip_blocks and the loop controls
// extension, the tojson filter as json.dumps(ensure_ascii=False), and the
// globals raise_exception(msg) and strftime_now(fmt). The engine lives in
// model/jinja/ (lexer, parser, renderer, builtins); this is its API.
//
// The template is parsed once, in the constructor; render() is const and may
// be called from many threads at once (each call has its own state).
//
// Variables a render sees: messages, tools (undefined when null), the
// add_generation_prompt flag, bos_token, eos_token, and any `extra` ones
// (enable_thinking, documents, ...), which may override those.
//
// Key order: Python keeps a JSON object's keys in the order the client sent
// them, and templates print tool schemas with tojson. nlohmann::json sorts
// keys; pass nlohmann::ordered_json (parse requests with it) to render
// exactly as transformers does. The nlohmann::json overload is for callers
// that built their data in code and do not care.
//
// Every failure is an ebb::Error: a syntax error from the constructor
// ("chat template line 3, column 14: unknown filter 'foo'"), a template that
// raises ("...: the template raised an error: Conversation roles must
// alternate user/assistant/..."), misuse Jinja2 would refuse (an undefined
// attribute used, list.append in the sandbox), or a limit crossed
// (JinjaLimits: nesting, loop iterations, output and string sizes, work).
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/jinja/limits.h"
#include "platform/error.h"

namespace ebb {

namespace jinja {
struct Template;
}

struct ChatTemplateOptions {
  JinjaLimits limits;
  // The time strftime_now formats (as local time); empty: the current time.
  std::function<std::time_t()> clock;
};

class ChatTemplate {
 public:
  // Parses once; throws ebb::Error naming line and column on a syntax error.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token, ChatTemplateOptions opts = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // messages: the OpenAI-shaped list (tool-call arguments already parsed
  // into objects by the caller). tools: null/absent leaves `tools`
  // undefined. extra: an object of more variables.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  template <class J>
  std::string render_impl(const J& messages, const J& tools, bool add_generation_prompt, const J& extra) const;

  std::string source_, bos_, eos_;
  ChatTemplateOptions opts_;
  std::unique_ptr<jinja::Template> tpl_;
};

}  // namespace ebb
