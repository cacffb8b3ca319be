// ChatStreamParser: the incremental reader of chat output (chat_parse.h).
//
// The text not yet decided waits in `buf`; each step looks at it in the
// current mode and either decides a prefix (gives deltas, drops it from buf)
// or waits for more text. A decision depends only on the text buffered and
// on whether the output has ended, never on how the text was split, which is
// what makes the streamed deltas equal the whole parse.
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "model/chat_parse.h"
#include "model/chat_parse_internal.h"

namespace ebb {

using chat_detail::is_space;
using chat_detail::JsonScan;
using chat_detail::NamedCall;

namespace {

// The deltas of one text channel (content or reasoning), trimmed: leading
// whitespace is dropped, trailing whitespace is held until more text follows.
struct Channel {
  ChatDelta::Kind kind;
  bool started = false;
  std::string held;

  void emit(std::string_view t, std::vector<ChatDelta>& out) {
    if (!started) {
      size_t i = 0;
      while (i < t.size() && is_space(t[i])) ++i;
      t.remove_prefix(i);
      if (t.empty()) return;
      started = true;
    }
    size_t end = t.size();
    while (end > 0 && is_space(t[end - 1])) --end;
    if (end == 0) {
      held += t;
      return;
    }
    ChatDelta d;
    d.kind = kind;
    d.text = std::move(held);
    d.text += t.substr(0, end);
    held = std::string(t.substr(end));
    out.push_back(std::move(d));
  }
};

// The length of the longest suffix of s that is a proper prefix of a marker.
size_t partial_marker(std::string_view s, const std::vector<std::string>& markers) {
  size_t best = 0;
  for (const std::string& m : markers) {
    for (size_t n = std::min(s.size(), m.size() - 1); n > best; --n) {
      if (s.substr(s.size() - n) == std::string_view(m).substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

bool is_prefix(std::string_view p, std::string_view of) { return p.size() <= of.size() && of.substr(0, p.size()) == p; }

}  // namespace

struct ChatStreamParser::State {
  enum class Mode { kContent, kReasoning, kCall, kBareJson, kAfterBare };

  ChatOutputFormat f;
  bool tools = false;
  CallIdFn next_id;
  std::string buf;
  Mode mode = Mode::kContent;
  bool seen_reasoning = false;
  bool opened_here = false;  // the output wrote <think> itself
  bool finished = false;
  std::string marker;  // kCall: the marker that opened it
  int n_calls = 0;
  Channel content{ChatDelta::Kind::kContent, false, {}};
  Channel reasoning{ChatDelta::Kind::kReasoning, false, {}};
  std::vector<std::string> markers;  // call markers recognised anywhere in content

  bool bare_json() const {
    return tools && (f.syntax == ToolCallSyntax::kLlama3 || f.syntax == ToolCallSyntax::kGeneric);
  }

  void call(NamedCall c, std::vector<ChatDelta>& out) {
    ChatDelta h;
    h.kind = ChatDelta::Kind::kToolCall;
    h.index = n_calls;
    h.id = next_id ? next_id() : "call_" + std::to_string(n_calls);
    h.name = std::move(c.name);
    out.push_back(std::move(h));
    ChatDelta a;
    a.kind = ChatDelta::Kind::kToolArguments;
    a.index = n_calls;
    a.text = std::move(c.arguments);
    out.push_back(std::move(a));
    ++n_calls;
  }

  // Text that was not a call after all: content, as written.
  void not_a_call(size_t n, std::vector<ChatDelta>& out) {
    content.emit(marker, out);
    content.emit(std::string_view(buf).substr(0, n), out);
    buf.erase(0, n);
    marker.clear();
    mode = Mode::kContent;
  }

  // One decision; false when it must wait for more text (or nothing is left).
  bool step(bool final, std::vector<ChatDelta>& out) {
    switch (mode) {
      case Mode::kContent: return step_content(final, out);
      case Mode::kReasoning: return step_reasoning(final, out);
      case Mode::kCall: return step_call(final, out);
      case Mode::kBareJson: return step_bare(final, out);
      case Mode::kAfterBare: return step_after_bare(final, out);
    }
    return false;
  }

  bool step_content(bool final, std::vector<ChatDelta>& out) {
    if (buf.empty()) return false;
    const bool at_start = !content.started && n_calls == 0;
    const bool think_here = f.thinking && !seen_reasoning && at_start;
    if (think_here || (at_start && bare_json())) {
      size_t i = 0;
      while (i < buf.size() && is_space(buf[i])) ++i;
      const std::string_view rest = std::string_view(buf).substr(i);
      if (think_here && rest.substr(0, f.think_start.size()) == f.think_start) {
        buf.erase(0, i + f.think_start.size());
        seen_reasoning = true;
        opened_here = true;
        mode = Mode::kReasoning;
        return true;
      }
      if (!final && (rest.empty() || (think_here && is_prefix(rest, f.think_start)))) return false;
      if (at_start && bare_json() && !rest.empty() && rest[0] == '{') {
        buf.erase(0, i);
        mode = Mode::kBareJson;
        return true;
      }
    }
    size_t at = std::string::npos;
    const std::string* found = nullptr;
    if (tools) {
      for (const std::string& m : markers) {
        const size_t p = buf.find(m);
        if (p != std::string::npos && p < at) at = p, found = &m;
      }
    }
    if (found) {
      content.emit(std::string_view(buf).substr(0, at), out);
      marker = *found;
      buf.erase(0, at + found->size());
      mode = Mode::kCall;
      return true;
    }
    const size_t keep = final || !tools ? 0 : partial_marker(buf, markers);
    if (keep == buf.size()) return false;
    content.emit(std::string_view(buf).substr(0, buf.size() - keep), out);
    buf.erase(0, buf.size() - keep);
    return false;  // the rest is held for more text
  }

  bool step_reasoning(bool final, std::vector<ChatDelta>& out) {
    if (buf.empty()) return false;
    if (!reasoning.started && !opened_here) {
      // The prompt opened <think>, yet some models write it again.
      size_t i = 0;
      while (i < buf.size() && is_space(buf[i])) ++i;
      const std::string_view rest = std::string_view(buf).substr(i);
      if (rest.substr(0, f.think_start.size()) == f.think_start) {
        buf.erase(0, i + f.think_start.size());
        opened_here = true;
        return true;
      }
      if (!final && is_prefix(rest, f.think_start)) return false;
    }
    const size_t p = buf.find(f.think_end);
    if (p != std::string::npos) {
      reasoning.emit(std::string_view(buf).substr(0, p), out);
      buf.erase(0, p + f.think_end.size());
      mode = Mode::kContent;
      return true;
    }
    const size_t keep = final ? 0 : partial_marker(buf, {f.think_end});
    if (keep == buf.size()) return false;
    reasoning.emit(std::string_view(buf).substr(0, buf.size() - keep), out);
    buf.erase(0, buf.size() - keep);
    return false;
  }

  bool emit_calls(std::vector<NamedCall> calls, size_t consumed, std::vector<ChatDelta>& out) {
    for (NamedCall& c : calls) call(std::move(c), out);
    buf.erase(0, consumed);
    marker.clear();
    mode = Mode::kContent;
    return true;
  }

  bool step_call(bool final, std::vector<ChatDelta>& out) {
    switch (f.syntax) {
      case ToolCallSyntax::kHermes: return step_hermes(final, out);
      case ToolCallSyntax::kLlama3: return step_python_tag(final, out);
      case ToolCallSyntax::kMistral: return step_mistral(final, out);
      case ToolCallSyntax::kGeneric: break;
    }
    not_a_call(0, out);
    return true;
  }

  // <tool_call> J </tool_call>; an unclosed call at the end is read whole.
  bool step_hermes(bool final, std::vector<ChatDelta>& out) {
    static const std::string kEnd = "</tool_call>";
    const size_t p = buf.find(kEnd);
    if (p == std::string::npos && !final) return false;
    const size_t body_end = p == std::string::npos ? buf.size() : p;
    const size_t consumed = p == std::string::npos ? buf.size() : p + kEnd.size();
    std::optional<NamedCall> c = chat_detail::call_from_json_text(std::string_view(buf).substr(0, body_end), true);
    if (!c) {
      not_a_call(consumed, out);
      return true;
    }
    std::vector<NamedCall> one;
    one.push_back(std::move(*c));
    return emit_calls(std::move(one), consumed, out);
  }

  // <|python_tag|> runs to the end of the output.
  bool step_python_tag(bool final, std::vector<ChatDelta>& out) {
    if (!final) return false;
    std::optional<std::vector<NamedCall>> calls = chat_detail::python_tag_calls(buf);
    if (!calls) {
      not_a_call(buf.size(), out);
      return true;
    }
    return emit_calls(std::move(*calls), buf.size(), out);
  }

  // [TOOL_CALLS] followed by [J, ...], J, or name[CALL_ID]id[ARGS]{...}.
  bool step_mistral(bool final, std::vector<ChatDelta>& out) {
    size_t i = 0;
    while (i < buf.size() && is_space(buf[i])) ++i;
    if (i == buf.size()) {
      if (final) not_a_call(buf.size(), out);
      return final;
    }
    if (buf[i] == '[' || buf[i] == '{') {
      // "[" could also open "[ARGS]" after an empty name: not a valid call.
      const JsonScan sc = chat_detail::scan_json(buf, i);
      if (sc.status == JsonScan::Status::kIncomplete && !final) return false;
      if (sc.status != JsonScan::Status::kComplete) {
        not_a_call(sc.status == JsonScan::Status::kInvalid ? sc.end : buf.size(), out);
        return true;
      }
      std::optional<std::vector<NamedCall>> calls = chat_detail::calls_from_json_value(
          std::string_view(buf).substr(i, sc.end - i), ToolCallSyntax::kMistral, true, nullptr);
      if (!calls) {
        not_a_call(sc.end, out);
        return true;
      }
      return emit_calls(std::move(*calls), sc.end, out);
    }
    // name[ARGS]{...}
    size_t j = i;
    while (j < buf.size() && (std::isalnum(static_cast<unsigned char>(buf[j])) || buf[j] == '_' || buf[j] == '-' ||
                              buf[j] == '.'))
      ++j;
    const std::string name = buf.substr(i, j - i);
    static const std::string kArgs = "[ARGS]", kCallId = "[CALL_ID]";
    const std::string_view after = std::string_view(buf).substr(j);
    if (!final && (is_prefix(after, kArgs) || is_prefix(after, kCallId))) return false;
    if (name.empty() || !(after.substr(0, kArgs.size()) == kArgs || after.substr(0, kCallId.size()) == kCallId)) {
      not_a_call(j, out);
      return true;
    }
    size_t k = j;
    if (after.substr(0, kCallId.size()) == kCallId) {
      const size_t a = buf.find(kArgs, j + kCallId.size());
      if (a == std::string::npos) {
        if (!final) return false;
        not_a_call(buf.size(), out);
        return true;
      }
      k = a;
    }
    k += kArgs.size();
    while (k < buf.size() && is_space(buf[k])) ++k;
    if (k == buf.size() && !final) return false;
    if (k == buf.size() || buf[k] != '{') {
      not_a_call(k, out);
      return true;
    }
    const JsonScan sc = chat_detail::scan_json(buf, k);
    if (sc.status == JsonScan::Status::kIncomplete && !final) return false;
    if (sc.status != JsonScan::Status::kComplete) {
      not_a_call(sc.status == JsonScan::Status::kInvalid ? sc.end : buf.size(), out);
      return true;
    }
    std::string args_text = "{\"name\":" + quote_name(name) + ",\"arguments\":" + buf.substr(k, sc.end - k) + "}";
    std::optional<NamedCall> c = chat_detail::call_from_json_text(args_text, false);
    if (!c) {
      not_a_call(sc.end, out);
      return true;
    }
    std::vector<NamedCall> one;
    one.push_back(std::move(*c));
    return emit_calls(std::move(one), sc.end, out);
  }

  // Names are [A-Za-z0-9_.-]: nothing to escape.
  static std::string quote_name(const std::string& s) { return "\"" + s + "\""; }

  // The output starts with a JSON object: a call (or kGeneric's envelope)?
  bool step_bare(bool final, std::vector<ChatDelta>& out) {
    const JsonScan sc = chat_detail::scan_json(buf, 0);
    if (sc.status == JsonScan::Status::kIncomplete && !final) return false;
    if (sc.status != JsonScan::Status::kComplete) {
      not_a_call(sc.status == JsonScan::Status::kInvalid ? sc.end : buf.size(), out);
      return true;
    }
    std::string text;
    std::optional<std::vector<NamedCall>> calls =
        chat_detail::calls_from_json_value(std::string_view(buf).substr(0, sc.end), f.syntax, false, &text);
    if (!calls) {
      not_a_call(sc.end, out);
      return true;
    }
    content.emit(text, out);
    emit_calls(std::move(*calls), sc.end, out);
    mode = Mode::kAfterBare;
    return true;
  }

  // After a bare call: "; {...}" or whitespace and another call, or content.
  bool step_after_bare(bool final, std::vector<ChatDelta>& out) {
    size_t i = 0;
    while (i < buf.size() && (is_space(buf[i]) || buf[i] == ';')) ++i;
    if (i == buf.size()) {
      if (final) buf.clear();
      return false;
    }
    buf.erase(0, i);
    mode = buf[0] == '{' ? Mode::kBareJson : Mode::kContent;
    (void)out;
    return true;
  }
};

ChatStreamParser::ChatStreamParser(ChatOutputFormat f, bool tools_present, CallIdFn next_id)
    : s_(std::make_unique<State>()) {
  s_->f = std::move(f);
  s_->tools = tools_present;
  s_->next_id = std::move(next_id);
  s_->mode = s_->f.open_think && s_->f.thinking ? State::Mode::kReasoning : State::Mode::kContent;
  s_->seen_reasoning = s_->mode == State::Mode::kReasoning;
  switch (s_->f.syntax) {
    case ToolCallSyntax::kHermes: s_->markers = {"<tool_call>"}; break;
    case ToolCallSyntax::kLlama3: s_->markers = {"<|python_tag|>"}; break;
    case ToolCallSyntax::kMistral: s_->markers = {"[TOOL_CALLS]"}; break;
    case ToolCallSyntax::kGeneric: break;
  }
}

ChatStreamParser::~ChatStreamParser() = default;

std::vector<ChatDelta> ChatStreamParser::feed(std::string_view piece) {
  if (s_->finished) throw std::logic_error("ChatStreamParser::feed after finish");
  std::vector<ChatDelta> out;
  s_->buf += piece;
  while (s_->step(false, out)) {
  }
  return out;
}

std::vector<ChatDelta> ChatStreamParser::finish() {
  if (s_->finished) throw std::logic_error("ChatStreamParser::finish called twice");
  s_->finished = true;
  std::vector<ChatDelta> out;
  while (s_->step(true, out)) {
  }
  // The last step in each mode consumes all with final = true; anything a
  // mode could not place is content.
  if (!s_->buf.empty()) {
    s_->content.emit(s_->buf, out);
    s_->buf.clear();
  }
  return out;
}

}  // namespace ebb
