#include "model/chat_jinja.h"

#include "model/jinja/interpreter.h"
#include "model/jinja/json_dump.h"
#include "model/jinja/parser.h"

namespace ebb {

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token, ChatTemplateOptions opts)
    : source_(std::move(source)), bos_(std::move(bos_token)), eos_(std::move(eos_token)), opts_(std::move(opts)) {
  tpl_ = jinja::parse_template(source_, opts_.limits);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

template <class J>
std::string ChatTemplate::render_impl(const J& messages, const J& tools, bool add_generation_prompt,
                                      const J& extra) const {
  jinja::Renderer r(*tpl_, opts_.limits, opts_.clock);
  try {
    r.set_global("messages", jinja::from_json(messages));
    if (!tools.is_null()) r.set_global("tools", jinja::from_json(tools));
    r.set_global("add_generation_prompt", jinja::Value(add_generation_prompt));
    r.set_global("bos_token", jinja::Value(bos_));
    r.set_global("eos_token", jinja::Value(eos_));
    if (!extra.is_null()) {
      if (!extra.is_object()) throw ebb::Error("chat template: extra variables must be a JSON object");
      for (auto it = extra.begin(); it != extra.end(); ++it) r.set_global(it.key(), jinja::from_json(it.value()));
    }
  } catch (const jinja::Fail& f) {
    throw ebb::Error(std::string("chat template input: ") + f.what());
  }
  return r.render();
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  return render_impl(messages, tools, add_generation_prompt, extra);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& extra) const {
  return render_impl(messages, tools, add_generation_prompt, extra);
}

}  // namespace ebb
