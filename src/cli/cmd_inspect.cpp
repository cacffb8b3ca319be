// ebb inspect: the summary first (tensor types and parameters, the model's
// shape, bytes per layer, KV bytes per 1k tokens, its chat template), then
// the metadata and the tensors.
#include <cstdio>
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cli/options.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "platform/error.h"
#include "runtime/budget_mode.h"

namespace ebb::cli {
namespace {

struct InspectArgs {
  std::string model;
  std::string model_flag;  // -m: the same file, as every other subcommand takes it
  bool tensors = true;
  std::string budget;         // --memory-budget: print the budget plan
  std::string system = "ebb";
  int window = 3;
  int64_t ctx = 0;
  int64_t batch = 64;
  int threads = 0;
};

// The plan budget mode would run with (ebb run -m MODEL --memory-budget SIZE).
void print_budget_plan(const InspectArgs& a) {
  Ledger ledger;
  Allocator alloc(&ledger);
  ModelOptions mo;
  mo.load_weights = false;
  auto model = Model::load(a.model, alloc, mo);
  ThreadPool pool(ThreadPoolOptions{.n_threads = a.threads});
  ForwardOptions fo;
  fo.max_batch = a.batch;
  Forward fwd(*model, best_isa(), pool, alloc, fo);
  BudgetOptions b;
  b.budget = parse_size(a.budget, model->weight_bytes());
  auto sys = parse_budget_system(a.system);
  if (!sys || *sys == BudgetSystem::kMmap) throw ebb::Error("--budget-system '" + a.system + "' has no plan");
  b.system = *sys;
  b.window = a.window;
  b.n_ctx = a.ctx;
  const BudgetPlan p = plan_for(*model, fwd, b, 256);
  std::printf("\nmodel weights %s\n%s", format_bytes(model->weight_bytes()).c_str(),
              describe_plan(p, model->layout()).c_str());
}

std::string value_str(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kString: return '"' + (v.str.size() > 80 ? v.str.substr(0, 77) + "..." : v.str) + '"';
    case GgufType::kArray: {
      std::string s = "[" + std::string(gguf_type_name(v.elem_type)) + " x " + std::to_string(v.array_size()) + "]";
      if (v.elem_type == GgufType::kString && !v.strings.empty()) s += " \"" + v.strings[0] + "\", ...";
      return s;
    }
    case GgufType::kFloat32:
    case GgufType::kFloat64: return std::to_string(v.f);
    case GgufType::kBool: return v.u ? "true" : "false";
    default: return v.is_integer() && v.type != GgufType::kUint64 && v.type != GgufType::kUint32 &&
                            v.type != GgufType::kUint16 && v.type != GgufType::kUint8
                        ? std::to_string(v.i)
                        : std::to_string(v.u);
  }
}

// Tensor types with their counts, in type-id order; those ebb cannot compute
// with listed again apart.
void print_types(const GgufFile& file) {
  std::map<uint32_t, size_t> by_type;  // type id -> tensors
  uint64_t params = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    ++by_type[static_cast<uint32_t>(t.type)];
    params += t.n_elements;
  }
  const std::optional<uint64_t> ft = file.get_uint("general.file_type");
  std::string ft_name = "not set";
  if (ft) {
    const std::string_view n = gguf_file_type_name(*ft);
    ft_name = (n.empty() ? std::string("unknown") : std::string(n)) + " (" + std::to_string(*ft) + ")";
  }
  std::printf("\nfile type: %s\nparameters: %llu (%.2f M)\ntensor types:", ft_name.c_str(),
              static_cast<unsigned long long>(params), static_cast<double>(params) / 1e6);
  std::string cannot;
  for (const auto& [id, count] : by_type) {
    const TypeInfo* ti = type_info(id);
    std::printf(" %s x %zu", std::string(ti->name).c_str(), count);
    if (!ti->computable)
      cannot += (cannot.empty() ? "" : ", ") + std::string(ti->name) + " (" + std::to_string(count) + " tensors)";
  }
  std::printf("\n");
  if (!cannot.empty()) std::printf("types ebb cannot compute with: %s\n", cannot.c_str());
}

// The model as ebb would run it: its shape, weight units and KV size.
void print_model(const GgufFile& file, const InspectArgs& a) {
  const ModelConfig c = read_model_config(file);
  std::printf("\nmodel: %s, %lld layers, width %lld, heads %lld/%lld (head %lld), FFN %lld, vocab %lld, context %lld\n",
              c.arch_name.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
              static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.n_ff), static_cast<long long>(c.n_vocab), static_cast<long long>(c.n_ctx_train));
  std::printf("rope: %s, base %.0f, %lld dims, freq scale %.3f; rms eps %g; %s output head%s\n",
              c.rope_style == RopeStyle::kNeox ? "neox" : "norm", c.rope_base, static_cast<long long>(c.rope_dim),
              c.rope_freq_scale, c.rms_eps, c.tied_output ? "tied" : "separate", c.qk_norm ? "; Q/K norm" : "");
  const WeightLayout layout = plan_weights(file, c);
  std::printf("\nweight units:\n  %-8s %12s\n", "globals", format_bytes(layout.globals.bytes()).c_str());
  uint64_t total = layout.globals.bytes();
  for (const WeightUnit& u : layout.layers) {
    std::printf("  layer %-2d %12s\n", u.layer(), format_bytes(u.bytes()).c_str());
    total += u.bytes();
  }
  std::printf("  %-8s %12s\n", "total", format_bytes(total).c_str());
  const uint64_t kv_f16 = 2ull * c.n_layer * c.kv_dim() * 2 * 1000;
  std::printf("\nKV per 1k tokens: %s (F16), %s (F32)\n", format_bytes(kv_f16).c_str(),
              format_bytes(kv_f16 * 2).c_str());
  if (!a.budget.empty()) print_budget_plan(a);
}

// The chat template's first lines and its size (the whole text is in the
// file's tokenizer.chat_template).
void print_chat_template(const GgufFile& file) {
  const std::optional<std::string> t = file.get_string("tokenizer.chat_template");
  if (!t || t->empty()) {
    std::printf("\nchat template: none (chat picks a format by the architecture)\n");
    return;
  }
  size_t lines = 0;
  for (char c : *t) lines += c == '\n';
  if (t->back() != '\n') ++lines;
  constexpr size_t kShown = 6;
  std::printf("\nchat template: %zu characters, %zu lines (tokenizer.chat_template); the first %zu:\n", t->size(), lines,
              std::min(lines, kShown));
  size_t at = 0;
  for (size_t i = 0; i < kShown && at < t->size(); ++i) {
    size_t end = t->find('\n', at);
    if (end == std::string::npos) end = t->size();
    std::string line = t->substr(at, end - at);
    if (line.size() > 120) line = line.substr(0, 117) + "...";
    std::printf("  | %s\n", line.c_str());
    at = end + 1;
  }
  if (lines > kShown) std::printf("  | ... (%zu more lines)\n", lines - kShown);
}

int inspect(const InspectArgs& a) {
  auto file = GgufFile::open(a.model);
  std::printf("file: %s\nGGUF v%u, %s, alignment %llu, %zu tensors, %zu metadata keys\n", a.model.c_str(),
              file->version(), format_bytes(file->file_size()).c_str(),
              static_cast<unsigned long long>(file->alignment()), file->tensors().size(), file->metadata().size());
  print_types(*file);

  // A valid file ebb cannot run (an architecture or a tensor type it does not
  // support) is still inspected: say why it cannot run, exit 0.
  std::fflush(stdout);
  try {
    print_model(*file, a);
  } catch (const ebb::Error& e) {
    std::printf("\nebb cannot run this model: %s\n", e.what());
  }
  print_chat_template(*file);

  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : file->metadata()) std::printf("  %-44s %s\n", key.c_str(), value_str(value).c_str());

  if (a.tensors) {
    std::printf("\ntensors:\n");
    for (const GgufTensorInfo& t : file->tensors()) {
      std::string dims;
      for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
      std::printf("  %-32s %-7s %-18s %12s\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(), dims.c_str(),
                  format_bytes(t.n_bytes).c_str());
    }
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "Show a model's metadata, tensors, bytes per layer and KV size");
  sub->add_option("model", a->model, "GGUF model file");
  sub->add_option("-m,--model", a->model_flag, "GGUF model file (the same as the positional argument)");
  sub->add_flag("!--no-tensors", a->tensors, "Do not list the tensors");
  sub->add_option("--memory-budget", a->budget, "Print the budget-mode plan for this budget (600MiB, 1.5GiB, 40%)");
  sub->add_option("--budget-system", a->system, "Planner: ebb, attn-first, ffn-first, unbalanced, sync, prefetch")
      ->capture_default_str();
  sub->add_option("--window", a->window, "Prefetch window in layers")->capture_default_str();
  sub->add_option("-c,--ctx", a->ctx, "Context the KV reserve covers (0: min(training context, 4096))");
  sub->add_option("--batch", a->batch, "Prefill micro-batch in tokens")->capture_default_str();
  sub->callback([a, rc] {
    if (a->model.empty() && a->model_flag.empty())
      throw CLI::RequiredError("ebb inspect needs a model: ebb inspect FILE (or -m FILE)");
    if (!a->model.empty() && !a->model_flag.empty() && a->model != a->model_flag)
      throw CLI::ValidationError("ebb inspect", "two models given (" + a->model + " and -m " + a->model_flag +
                                                    "): inspect takes one");
    if (a->model.empty()) a->model = a->model_flag;
    *rc = inspect(*a);
  });
}

}  // namespace ebb::cli
