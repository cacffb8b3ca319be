// ebb run: generate a continuation of a prompt, streamed to stdout.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>

#include "cli/options.h"
#include "model/chat_template.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

struct RunArgs {
  ModelArgs model;
  SamplerOptions sampling;
  ChatTemplateArgs chat_template;
  GrammarArgs grammar;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  int64_t n_predict = 128;
  std::vector<std::string> stop;
  bool chat = false;
  bool no_bos = false;
  bool special = false;
  bool escape = false;
  int64_t keep = -2;  // --keep (llama.cpp): accepted, noted; -2: not given
};

// -e/--escape: \n, \t, \r, \\, \", \' as in llama.cpp's prompts; any other
// backslash is kept as written.
std::string process_escapes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '"': out += '"'; break;
      case '\'': out += '\''; break;
      default: out += '\\'; out += c; break;
    }
  }
  return out;
}

// The prompt file's problems that need no model (it does not exist, it is a
// directory) are found before the model loads.
void check_prompt_file(const std::string& path) {
  if (path == "-") return;
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) throw Error("--file '" + path + "': cannot open (it does not exist)");
  if (std::filesystem::is_directory(st))
    throw Error("--file '" + path + "' is a directory; give a text file, or - for standard input");
}

int run(RunArgs& a) {
  if (!a.prompt.empty() && !a.prompt_file.empty())
    throw UsageError("give the prompt either with -p TEXT or with -f FILE, not both");
  if (a.prompt.empty() && a.prompt_file.empty()) throw UsageError("no prompt: give -p TEXT or -f FILE (- for standard input)");
  const int64_t max_tokens = max_tokens_of(a.n_predict);
  if (!a.prompt_file.empty()) check_prompt_file(a.prompt_file);
  const std::shared_ptr<const grammar::Grammar> output_rules = output_grammar(a.grammar);
  double load_s = 0;
  std::unique_ptr<Engine> engine = make_engine(a.model, &load_s);
  if (a.keep != -2 && !a.model.quiet)
    std::fprintf(stderr, "note: --keep is ignored: ebb run never shifts the context (a longer run ends at its end)\n");
  // Never more text than the context can use (a -f /dev/zero stops here).
  const uint64_t max_bytes = static_cast<uint64_t>(context_of(a.model, *engine)) * kPromptBytesPerToken;
  std::string text = a.prompt_file.empty() ? a.prompt : read_bounded_text(a.prompt_file, max_bytes, "--file");
  if (text.empty()) throw Error("--file '" + a.prompt_file + "' is empty: there is no prompt to continue");
  if (text.size() > max_bytes) {
    throw Error("the prompt is larger than the context can hold (" + format_bytes(text.size()) + "; at most " +
                format_bytes(max_bytes) + " for " + std::to_string(max_bytes / kPromptBytesPerToken) +
                " tokens: raise --ctx)");
  }
  if (a.escape) text = process_escapes(text);
  const std::string system = a.escape ? process_escapes(a.system) : a.system;
  const Tokenizer& tok = engine->tokenizer();
  resolve_seed(a.sampling);
  GenerateOptions go;
  go.max_tokens = max_tokens;
  go.sampling = a.sampling;
  go.stop_strings = a.stop;
  go.constraint = output_constraint(output_rules, tok);
  bool parse_special = a.special;
  bool template_bos = false;  // the chat template wrote the BOS text itself
  if (a.chat || !system.empty() || !a.chat_template.spec.empty()) {
    const ResolvedChatTemplate t = resolve_chat_template(a.chat_template, *engine, a.model.quiet);
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", text});
    try {
      text = t.renderer.render(msgs, true);
    } catch (const Error& e) {
      throw Error("the chat template (" + t.source + ") cannot render the prompt: " + e.what());
    }
    for (const std::string& s : t.renderer.stop_strings()) go.stop_strings.push_back(s);
    parse_special = true;
    template_bos = t.renderer.writes_bos(text);
  }
  EncodeOptions eo;
  eo.add_bos = !a.no_bos && tok.add_bos_default() && !template_bos;
  eo.parse_special = parse_special;
  const std::vector<TokenId> prompt = tok.encode(text, eo);
  if (prompt.empty()) throw Error("the prompt is empty (give -p TEXT or --file FILE)");

  Session session(*engine, session_options(a.model));
  session.set_adapters(adapter_bindings(a.model));
  if (static_cast<int64_t>(prompt.size()) >= session.n_ctx()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                std::to_string(session.n_ctx()) + " (raise --ctx)");
  }
  if (prompt.size() > 512) {
    go.prefill_progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\rprefill %lld/%lld tokens", static_cast<long long>(done), static_cast<long long>(total));
      if (done == total) std::fputc('\n', stderr);
    };
  }
  GenerateStats st;
  try {
    st = generate(session, prompt, go, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
  } catch (const std::bad_alloc&) {
    std::fputc('\n', stdout);
    throw Error("out of memory during generation after " + std::to_string(session.tokens().size()) +
                " tokens: lower --ctx, or use --memory-budget SIZE");
  } catch (const Error& e) {
    // The text so far stays on stdout; the error names the position.
    std::fputc('\n', stdout);
    std::fflush(stdout);
    throw Error("generation stopped at position " + std::to_string(session.tokens().size()) + ": " + e.what());
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!a.model.quiet) std::fprintf(stderr, "%s\n", summary_line(*engine, st, load_s).c_str());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate text from a prompt, streamed to stdout");
  add_model_options(sub, a->model);
  sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  sub->add_option("-f,--file", a->prompt_file,
                  "Read the prompt from a file (-: standard input); at most 64 bytes per context token");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most (-1: until a stop or the context ends)")
      ->capture_default_str();
  sub->add_option("-r,--reverse-prompt,--stop", a->stop, "Stop before this string (repeatable)");
  sub->add_option("--system-prompt", a->system, "System message, also spelled -sys (implies --chat)");
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as a user message");
  add_chat_template_options(sub, a->chat_template);
  sub->add_flag("-e,--escape", a->escape, "Process escapes (\\n, \\t, \\\\, \\\") in the prompt, as llama.cpp's -e");
  sub->add_flag("-q,--quiet", a->model.quiet, "No load progress, notes or summary line: only the text");
  sub->add_flag("--no-bos", a->no_bos, "Do not prepend the BOS token");
  sub->add_flag("--special", a->special, "Parse special-token text such as <|im_start|> in the prompt");
  sub->add_option("--keep", a->keep, "Accepted for llama.cpp and ignored: ebb run never shifts the context")
      ->group(kEngineGroup);
  add_sampling_options(sub, a->sampling);
  add_grammar_options(sub, a->grammar);
  sub->callback([a, rc] { *rc = run(*a); });
}

}  // namespace ebb::cli
