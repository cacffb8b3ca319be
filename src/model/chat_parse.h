// What a chat model writes, read back: plain content, reasoning in
// <think>...</think>, and tool calls in the family's own syntax, turned into
// OpenAI's {content, reasoning_content, tool_calls}. Whole (parse_chat_output)
// or as the text grows (ChatStreamParser, for streamed responses).
//
// Why the model layer and not serve/: the syntax is a property of the model
// family, as the prompt format is (chat_template.h); nothing here knows HTTP
// or JSON-over-the-wire, and the grammar engine (lazy triggers) and the CLI
// need the same ChatOutputFormat as the server.
//
// The syntaxes (J: a JSON object {"name": N, "arguments": {...}}):
//   kHermes   Qwen 2.5 / 3, QwQ, Hermes 2/3 Pro:  <tool_call>J</tool_call>, any
//             number of them, anywhere in the text ("parameters" is accepted
//             for "arguments"; no arguments: {}).
//   kLlama3   Llama 3.x: the output starts with J or J; J ... whose arguments
//             key is "parameters" ("arguments" accepted), or <|python_tag|>
//             followed (to the end of the output) by J (';'-separated for
//             several) or a built-in call `brave_search.call(query="...")`
//             (name + keyword arguments as an object).
//   kMistral  [TOOL_CALLS][J, J, ...] (v3), [TOOL_CALLS]J, and the newer
//             [TOOL_CALLS]name[ARGS]{...} (optionally name[CALL_ID]id[ARGS]),
//             repeated for several calls.
//   kGeneric  any other model: the output is {"tool_calls": [J, ...]}
//             (with an optional "content" string), or J, or several J
//             separated by whitespace or ';'.
// A bare-JSON call (kLlama3 without the tag, kGeneric) must carry its
// arguments; only a call inside an explicit marker may omit them.
//
// Rules common to all:
//   - With tools_present false nothing is read as a call: all is content.
//   - <think>...</think> (format.thinking) at the start of the output is
//     reasoning_content; with format.open_think (the prompt already opened
//     <think>, as DeepSeek-R1's and some Qwen3 templates do) the output
//     starts inside it (a <think> the model writes again there is dropped).
//     Text that looks like a call inside the reasoning is
//     reasoning. An unclosed <think> is reasoning to the end.
//   - A call whose JSON is malformed, lacks a name, has non-object arguments
//     or is cut off stays in the content as written: never a half call.
//   - Arguments are re-serialised compactly, keys in the model's order.
//   - content and reasoning_content are trimmed of surrounding whitespace;
//     whitespace between calls is dropped with them.
//   - Call ids come from the CallIdFn given (make_call_id in the server,
//     something deterministic in tests; an empty one gives call_0, call_1...).
//
// Streaming: ChatStreamParser is fed the text as it is generated and gives
// back deltas. Text that might be the start of a marker ("<tool_c") or
// trailing whitespace is held back until it is decided; a tool call is held
// until it is complete and valid, then given as one kToolCall delta (id and
// name) followed by one kToolArguments delta (its whole arguments), since a
// call that later proved malformed or cut off could not be taken back. The
// concatenated deltas equal parse_chat_output of the same text however it was
// split (parse_chat_output is the stream parser fed the whole text at once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {

enum class ToolCallSyntax { kHermes, kLlama3, kMistral, kGeneric };

// Everything a request needs to know about one family's output: what the
// parser reads, and what a (lazy) grammar constraining the calls needs.
struct ChatOutputFormat {
  ToolCallSyntax syntax = ToolCallSyntax::kGeneric;
  bool thinking = false;    // may write <think>...</think> first
  bool open_think = false;  // the prompt ends inside <think>: output starts as reasoning
  std::string think_start = "<think>", think_end = "</think>";
  // Text that starts a call: a lazy grammar switches on when the output
  // reaches one of `triggers` anywhere, or one of `start_triggers` as the
  // output's first non-whitespace text (after any reasoning): kLlama3's and
  // kGeneric's bare '{'.
  std::vector<std::string> triggers;
  std::vector<std::string> start_triggers;
  // What a grammar writes around one call's JSON object {"name",
  // "arguments"}; parallel calls repeat prefix + call + suffix with
  // whitespace between, which the parser reads for every syntax (kMistral:
  // "[TOOL_CALLS][" J "]" each; kLlama3, kGeneric: bare objects). The
  // family's own key for the arguments is arguments_key (Llama 3 writes
  // "parameters"); the parser takes either.
  std::string call_prefix, call_suffix;
  std::string arguments_key = "arguments";
  // Stop strings the family needs beyond its template's end-of-turn token.
  std::vector<std::string> stop_strings;
  // Special tokens the detokenizer must render as text for the parser to see
  // them (decode with special = true, or at least these).
  std::vector<std::string> preserved_tokens;
};

// "hermes", "llama3", "mistral", "generic".
std::string_view tool_call_syntax_name(ToolCallSyntax s);

// A format for a syntax, with its triggers, prefix/suffix and tokens filled in.
ChatOutputFormat chat_output_format(ToolCallSyntax s, bool thinking = false);

// Picks the format from the GGUF's Jinja template (tokenizer.chat_template)
// and arch: "<tool_call>" -> kHermes, "[TOOL_CALLS]" -> kMistral,
// "<|python_tag|>" or "<|start_header_id|>" -> kLlama3; an empty template
// with arch qwen2*/qwen3* -> kHermes; else kGeneric. thinking: the template
// mentions "<think>" (or arch qwen3* without a template).
ChatOutputFormat detect_chat_output_format(std::string_view jinja_template, std::string_view arch);

// True when a rendered prompt ends inside an opened <think> (the template
// wrote "<think>" and optional whitespace last): set format.open_think.
bool prompt_opens_think(std::string_view prompt, const ChatOutputFormat& f);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a compact JSON object, as text
};

struct ParsedOutput {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

using CallIdFn = std::function<std::string()>;

// "call_" and 24 random letters and digits from rng.
std::string make_call_id(std::mt19937_64& rng);

// The whole output at once (see the rules above). Never throws on any text.
ParsedOutput parse_chat_output(const ChatOutputFormat& f, std::string_view text, bool tools_present,
                               const CallIdFn& next_id);

struct ChatDelta {
  enum class Kind { kContent, kReasoning, kToolCall, kToolArguments };
  Kind kind = Kind::kContent;
  std::string text;  // kContent, kReasoning: the piece; kToolArguments: arguments text
  int index = 0;     // kToolCall, kToolArguments: the call's index in this output
  std::string id, name;  // kToolCall
};

// Folds deltas into a ParsedOutput (what a client accumulating a stream gets).
void apply_deltas(ParsedOutput& out, const std::vector<ChatDelta>& deltas);

class ChatStreamParser {
 public:
  ChatStreamParser(ChatOutputFormat f, bool tools_present, CallIdFn next_id);
  ~ChatStreamParser();
  ChatStreamParser(const ChatStreamParser&) = delete;
  ChatStreamParser& operator=(const ChatStreamParser&) = delete;

  // The next piece of generated text; returns the deltas it decides.
  std::vector<ChatDelta> feed(std::string_view piece);
  // The output has ended: decides everything held back. Call once; feed and
  // finish are refused afterwards (std::logic_error: a bug in the caller).
  std::vector<ChatDelta> finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ebb
