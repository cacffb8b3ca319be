// ChatRenderer: the Jinja template or the marker renderer behind one call.
#include "model/chat_renderer.h"

#include <algorithm>

#include "model/tokenizer.h"
#include "platform/error.h"

namespace ebb {

using nlohmann::ordered_json;

namespace {

std::string piece_of(const Tokenizer& tok, TokenId id) { return id >= 0 ? tok.token_to_piece(id, true) : ""; }

ordered_json to_json(std::span<const ChatMessage> msgs) {
  ordered_json out = ordered_json::array();
  for (const ChatMessage& m : msgs) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

ChatRenderer::ChatRenderer(ChatFormat format, std::string_view arch)
    : marker_(format), output_(detect_chat_output_format("", arch)) {}

ChatRenderer::ChatRenderer(std::shared_ptr<const ChatTemplate> jinja, std::string_view arch)
    : jinja_(std::move(jinja)) {
  EBB_CHECK_MSG(jinja_ != nullptr, "ChatRenderer: a null template");
  marker_ = detect_chat_format(jinja_->source(), arch);
  output_ = detect_chat_output_format(jinja_->source(), arch);
}

ChatRenderer ChatRenderer::for_model(const std::string& model_template, std::string_view arch, const Tokenizer& tok,
                                     std::string* note) {
  const ChatFormat fallback = detect_chat_format(model_template, arch);
  if (model_template.empty()) {
    if (note) {
      *note = "the model has no chat template: prompts use the " + std::string(chat_format_name(fallback)) +
              " marker format, chosen by its architecture (--chat-template FILE gives one)";
    }
    return ChatRenderer(fallback, arch);
  }
  try {
    ChatRenderer r = from_source(model_template, arch, tok);
    if (note) note->clear();
    return r;
  } catch (const Error& e) {
    if (note) {
      *note = "the model's chat template does not parse (" + std::string(e.what()) + "): prompts use the " +
              std::string(chat_format_name(fallback)) + " marker format recognised in it";
    }
    return ChatRenderer(fallback, arch);
  }
}

ChatRenderer ChatRenderer::from_source(std::string source, std::string_view arch, const Tokenizer& tok) {
  return ChatRenderer(
      std::make_shared<const ChatTemplate>(std::move(source), piece_of(tok, tok.bos()), piece_of(tok, tok.eos())), arch);
}

std::string ChatRenderer::name() const { return jinja_ ? "jinja" : std::string(chat_format_name(marker_)); }

std::string ChatRenderer::render(std::span<const ChatMessage> msgs, bool add_generation_prompt) const {
  if (!jinja_) return apply_chat_template(marker_, msgs, add_generation_prompt);
  return jinja_->render(to_json(msgs), ordered_json(), add_generation_prompt);
}

std::string ChatRenderer::render(const ordered_json& messages, const ordered_json& tools,
                                 bool add_generation_prompt) const {
  if (jinja_) return jinja_->render(messages, tools, add_generation_prompt);
  if (!tools.is_null() && !(tools.is_array() && tools.empty())) {
    throw Error("tools need the model's Jinja chat template; the " + name() +
                " marker format cannot show them to the model");
  }
  if (!messages.is_array()) throw Error("messages must be an array");
  std::vector<ChatMessage> msgs;
  for (const ordered_json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      throw Error("the " + name() + " marker format takes messages with a string role and a string content only");
    }
    msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return apply_chat_template(marker_, msgs, add_generation_prompt);
}

std::vector<std::string> ChatRenderer::stop_strings() const {
  std::vector<std::string> out;
  // A Jinja template of an unrecognised family gets no marker stop strings
  // (kPlain's "\nUser:" would cut answers that are not in its format).
  if (!jinja_ || marker_ != ChatFormat::kPlain) out = chat_stop_strings(marker_);
  for (const std::string& s : output_.stop_strings)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

bool ChatRenderer::writes_bos(std::string_view text) const {
  if (!jinja_) return false;
  const std::string& bos = jinja_->bos_token();
  return !bos.empty() && text.substr(0, bos.size()) == bos;
}

std::vector<std::pair<size_t, size_t>> assistant_spans(const ChatRenderer& r, std::span<const ChatMessage> msgs,
                                                       const std::string& full,
                                                       const std::vector<std::string>& turn_ends) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t floor = 0;  // spans never go back before the previous one's end
  for (size_t k = 0; k < msgs.size(); ++k) {
    if (msgs[k].role != "assistant") continue;
    size_t begin = floor;
    try {
      begin = std::max(floor, common_prefix(full, r.render(msgs.subspan(0, k), true)));
    } catch (const Error&) {
      // A template that refuses the prefix (e.g. an answer first): from the
      // previous span's end.
    }
    size_t end = std::string::npos;
    for (const std::string& e : turn_ends) {
      if (e.empty()) continue;
      const size_t at = full.find(e, begin);
      if (at != std::string::npos) end = std::min(end, at + e.size());
    }
    if (end == std::string::npos) {
      // No end-of-turn text: to where this message's own rendering as the
      // last one stops agreeing with the whole (the whole, for the last).
      end = k + 1 == msgs.size() ? full.size() : common_prefix(full, r.render(msgs.subspan(0, k + 1), false));
    }
    end = std::max(begin, std::min(end, full.size()));
    spans.emplace_back(begin, end);
    floor = end;
  }
  return spans;
}

std::vector<std::string> end_of_turn_texts(const Tokenizer& tok) {
  std::vector<std::string> out;
  for (TokenId id = 0; id < tok.n_vocab(); ++id) {
    if (!tok.is_eog(id)) continue;
    std::string p = tok.token_to_piece(id, true);
    if (!p.empty() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ebb
