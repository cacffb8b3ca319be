// ebb run: generate a continuation of a prompt, streamed to stdout.
#include <cstdio>
#include <memory>

#include "cli/options.h"
#include "model/chat_template.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

struct RunArgs {
  ModelArgs model;
  SamplerOptions sampling;
  std::string prompt;
  std::string prompt_file;
  int64_t n_predict = 128;
  std::vector<std::string> stop;
  bool chat = false;
  bool no_bos = false;
  bool special = false;
};

int run(RunArgs& a) {
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const Tokenizer& tok = engine->tokenizer();
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) {
    FILE* f = std::fopen(a.prompt_file.c_str(), "rb");
    if (!f) throw Error("--file '" + a.prompt_file + "': cannot open");
    text.clear();
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  GenerateOptions go;
  go.max_tokens = a.n_predict;
  go.sampling = a.sampling;
  go.stop_strings = a.stop;
  bool parse_special = a.special;
  if (a.chat) {
    const ChatFormat fmt = detect_chat_format(engine->model().chat_template(), engine->config().arch_name);
    const ChatMessage msg{"user", text};
    text = apply_chat_template(fmt, std::span<const ChatMessage>(&msg, 1), true);
    for (const std::string& s : chat_stop_strings(fmt)) go.stop_strings.push_back(s);
    parse_special = true;
  }
  EncodeOptions eo;
  eo.add_bos = !a.no_bos && tok.add_bos_default();
  eo.parse_special = parse_special;
  const std::vector<TokenId> prompt = tok.encode(text, eo);
  if (prompt.empty()) throw Error("the prompt is empty (give -p TEXT or --file FILE)");

  Session session(*engine, session_options(a.model));
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
  const GenerateStats st = generate(session, prompt, go, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", summary_line(*engine, st).c_str());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate text from a prompt, streamed to stdout");
  add_model_options(sub, a->model);
  sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  sub->add_option("-f,--file", a->prompt_file, "Read the prompt from a file");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most")->capture_default_str();
  sub->add_option("--stop", a->stop, "Stop before this string (repeatable)");
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as a user message");
  sub->add_flag("--no-bos", a->no_bos, "Do not prepend the BOS token");
  sub->add_flag("--special", a->special, "Parse special-token text such as <|im_start|> in the prompt");
  add_sampling_options(sub, a->sampling);
  sub->callback([a, rc] { *rc = run(*a); });
}

}  // namespace ebb::cli
