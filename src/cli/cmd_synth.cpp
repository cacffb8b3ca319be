// ebb synth: write a GGUF with the shapes of a real model and seeded random
// weights (src/model/synth.h).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/options.h"
#include "model/chat_jinja.h"
#include "model/synth.h"
#include "platform/error.h"
#include "platform/timer.h"

namespace ebb::cli {
namespace {

struct SynthArgs {
  std::string shape;
  std::string type;
  std::string output;
  uint64_t seed = 1;
  int threads = 0;
  bool list = false;
  std::string chat_template;  // a Jinja file
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "596M", "1.72B"
std::string format_count(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof buf, "%.0fM", n / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fK", n / 1e3);
  }
  return buf;
}

// Compact size for the table: "1.41G", "432M", "5.1M".
std::string short_bytes(uint64_t b) {
  char buf[32];
  const double mib = b / double(1 << 20);
  if (mib >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2fG", mib / 1024);
  } else if (mib >= 100) {
    std::snprintf(buf, sizeof buf, "%.0fM", mib);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fM", mib);
  }
  return buf;
}

int list_shapes() {
  const std::vector<std::string> types = synth_type_names();
  std::printf("%-15s %-6s %6s %6s %7s %6s %7s %7s", "shape", "arch", "layers", "width", "heads", "ffn", "vocab",
              "params");
  for (const std::string& t : types) std::printf(" %7s", t.c_str());
  std::printf("\n");
  for (const SynthShape& s : synth_shapes()) {
    const std::string heads = std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv);
    std::printf("%-15s %-6s %6lld %6lld %7s %6lld %7lld %7s", s.name.c_str(), s.arch.c_str(),
                static_cast<long long>(s.n_layer), static_cast<long long>(s.n_embd), heads.c_str(),
                static_cast<long long>(s.n_ff), static_cast<long long>(s.n_vocab), format_count(s.n_params()).c_str());
    for (const std::string& t : types) {
      const SynthPlan p = plan_synth_model(s, *parse_synth_type(t));
      std::printf(" %7s", short_bytes(p.file_bytes).c_str());
    }
    std::printf("\n");
  }
  std::printf("\nsizes are of the written file (MiB/GiB); q4_k_m/q5_k_m use Q6_K for the output head and\n"
              "for attn_v/ffn_down in about half of the layers; see src/model/synth.h for the rules.\n");
  return 0;
}

int synth(const SynthArgs& a) {
  if (a.list) return list_shapes();
  if (a.shape.empty()) throw Error("synth: give a SHAPE (one of " + join(synth_shape_names()) + ") or --list");
  const SynthShape* shape = find_synth_shape(a.shape);
  if (!shape) throw Error("synth: unknown shape '" + a.shape + "' (one of " + join(synth_shape_names()) + ")");
  if (a.type.empty()) throw Error("synth: --type is required (one of " + join(synth_type_names()) + ")");
  const std::optional<SynthType> type = parse_synth_type(a.type);
  if (!type) throw Error("synth: unknown --type '" + a.type + "' (one of " + join(synth_type_names()) + ")");
  if (a.output.empty()) throw Error("synth: -o/--output is required");
  if (a.threads < 0) throw Error("synth: --threads must be >= 0");

  SynthOptions o;
  o.shape = *shape;
  o.type = *type;
  o.seed = a.seed;
  o.n_threads = a.threads;
  if (!a.chat_template.empty()) {
    o.chat_template = read_bounded_text(a.chat_template, 1u << 20, "synth: --chat-template");
    try {  // a template that does not parse is refused here, not by every later load
      ChatTemplate check(o.chat_template, "<s>", "</s>");
    } catch (const Error& e) {
      throw Error("synth: --chat-template '" + a.chat_template + "': " + e.what());
    }
  }
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const Stopwatch clock;
  double last_print = 0;
  bool printed = false;
  o.progress = [&](uint64_t done, uint64_t total) {
    const double t = clock.seconds();
    // Only once it takes more than a moment; a line every 2 s when stderr is
    // not a terminal.
    if (t < 0.5 || (done < total && t - last_print < (tty ? 0.1 : 2.0))) return;
    last_print = t;
    printed = true;
    std::fprintf(stderr, "%swriting %s: %3.0f%%  %7.1f MB/s", tty ? "\r" : "", a.output.c_str(),
                 100.0 * done / double(total), done / t / 1e6);
    if (!tty) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
  write_synth_model(o, a.output);
  const double secs = clock.seconds();
  if (printed && tty) std::fputc('\n', stderr);
  const SynthPlan plan = plan_synth_model(o.shape, o.type, o.chat_template);
  std::printf("wrote %s: %s (%s, %s, %s params, seed %llu) in %.2f s (%.0f MB/s)\n", a.output.c_str(),
              format_bytes(plan.file_bytes).c_str(), shape->name.c_str(), synth_type_name(*type).c_str(),
              format_count(plan.n_params).c_str(), static_cast<unsigned long long>(a.seed), secs,
              plan.file_bytes / secs / 1e6);
  return 0;
}

}  // namespace

void add_synth_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sub = app.add_subcommand("synth", "Write a GGUF with a real model's shapes and seeded random weights");
  sub->add_option("shape", a->shape, "Model shape: " + join(synth_shape_names()));
  sub->add_option("--type", a->type, "Weight type: " + join(synth_type_names()));
  sub->add_option("-o,--output", a->output, "Output GGUF file");
  sub->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  sub->add_option("-t,--threads", a->threads, "Threads (0: all hardware threads)")->capture_default_str();
  sub->add_option("--chat-template", a->chat_template,
                  "Jinja chat template FILE to store (tokenizer.chat_template); its special tokens join the vocabulary");
  sub->add_flag("--list", a->list, "List the shapes with parameter counts and file size per type");
  sub->callback([a, rc] { *rc = synth(*a); });
}

}  // namespace ebb::cli
