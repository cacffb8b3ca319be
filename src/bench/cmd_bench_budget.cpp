// ebb bench budget: budget mode and its baselines at several budgets.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/options.h"
#include "model/gguf.h"
#include "platform/error.h"
#include "bench/bench_budget.h"

namespace ebb::cli {
namespace {

// Memory of the process that is not the LLM's (binary, libraries, tokenizer,
// thread stacks) granted on top of the budget in the mmap baseline's cgroup.
constexpr uint64_t kCgroupAllowance = 64ull << 20;
const char* kCgroupRoot = "/sys/fs/cgroup/memory";

struct BudgetArgs {
  BenchBudgetOptions o;
  std::string budgets;
  std::string systems = "ebb,mmap,sync,prefetch,unbalanced,attn-first,ffn-first";
  bool json = false;
  std::string plot;
  bool child = false;        // internal: one run inside a cgroup, JSON rows out
  double storage_gbps = 0;   // internal: measured by the parent
  bool resident = true;      // also measure the fully resident reference
  int threads = 0;           // 0: all hardware threads, as in every subcommand
};

nlohmann::json to_json(const BenchBudgetRow& r) {
  return {{"system", r.system},
          {"budget_bytes", r.budget_bytes},
          {"decode_tok_s", r.decode_tok_s},
          {"prefill_tok_s", r.prefill_tok_s},
          {"roofline_tok_s", r.roofline_tok_s},
          {"streamed_per_token", r.streamed_per_token},
          {"io_wait_fraction", r.io_wait_fraction},
          {"storage_gbps", r.storage_gbps}};
}

BenchBudgetRow from_json(const nlohmann::json& j) {
  BenchBudgetRow r;
  r.system = j.at("system");
  r.budget_bytes = j.at("budget_bytes");
  r.decode_tok_s = j.at("decode_tok_s");
  r.prefill_tok_s = j.at("prefill_tok_s");
  r.roofline_tok_s = j.at("roofline_tok_s");
  r.streamed_per_token = j.at("streamed_per_token");
  r.storage_gbps = j.at("storage_gbps");
  return r;
}

// Runs the mmap baseline in a child process inside a memory cgroup of the
// budget, so the page cache is really limited. nullopt when cgroup v1 is unavailable.
std::optional<BenchBudgetRow> run_in_cgroup(const BudgetArgs& a, uint64_t budget, double gbps) {
  if (::access((std::string(kCgroupRoot) + "/cgroup.procs").c_str(), W_OK) != 0) return std::nullopt;
  const std::string cg = std::string(kCgroupRoot) + "/ebb-bench-budget-" + std::to_string(::getpid());
  std::filesystem::create_directory(cg);
  {
    std::ofstream(cg + "/memory.limit_in_bytes") << budget + kCgroupAllowance;
  }
  std::ostringstream cmd;
  cmd << "sh -c 'echo $$ > " << cg << "/cgroup.procs && exec " << std::filesystem::read_symlink("/proc/self/exe").string()
      << " bench budget --child --json -m \"" << a.o.model << "\" --budget " << budget << " --systems mmap -n "
      << a.o.gen_tokens << " -p " << a.o.prompt_tokens << " -r " << a.o.reps << " -t " << a.o.n_threads
      << " --storage-gbps " << gbps << (a.o.drop_caches ? " --drop-caches" : "") << "'";
  std::string out;
  if (FILE* p = ::popen(cmd.str().c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    std::filesystem::remove(cg);
    if (st != 0) throw Error("bench budget: the mmap run in cgroup " + cg + " failed (status " + std::to_string(st) + ")");
  }
  return from_json(nlohmann::json::parse(out).at(0));
}

int run_budget(BudgetArgs& a) {
  a.o.n_threads = resolve_threads(a.threads);
  uint64_t model_bytes = 0;
  // The file stays open through the loop (a temporary's tensors() would dangle).
  const std::unique_ptr<GgufFile> gguf = GgufFile::open(a.o.model);
  for (const GgufTensorInfo& t : gguf->tensors()) model_bytes += t.n_bytes;
  std::vector<uint64_t> budgets;
  std::stringstream bs(a.budgets);
  for (std::string item; std::getline(bs, item, ',');) budgets.push_back(parse_size(item, model_bytes));
  std::vector<BudgetSystem> systems;
  std::stringstream ss(a.systems);
  for (std::string item; std::getline(ss, item, ',');) {
    auto s = parse_budget_system(item);
    if (!s) throw Error("--systems: '" + item + "' is not one of ebb, mmap, sync, prefetch, unbalanced, attn-first, ffn-first");
    systems.push_back(*s);
  }
  const double gbps = a.storage_gbps > 0 ? a.storage_gbps : measure_storage_gbps(a.o.model);
  std::vector<BenchBudgetRow> rows;
  if (!a.child && a.resident) rows.push_back(bench_budget_one(a.o, BudgetSystem::kEbb, 0, gbps));
  // A budget or system that cannot run (a budget below what the plan needs)
  // is reported after the table; the others still run.
  std::vector<std::string> failures;
  for (uint64_t b : budgets) {
    double ebb_roof = 0;
    for (BudgetSystem s : systems) {
      const std::string what = std::string(budget_system_name(s)) + " at " + format_bytes(b);
      if (!a.child) std::fprintf(stderr, "bench budget: %s\n", what.c_str());
      try {
        std::optional<BenchBudgetRow> r;
        if (s == BudgetSystem::kMmap && !a.child && b < model_bytes) r = run_in_cgroup(a, b, gbps);
        if (!r) r = bench_budget_one(a.o, s, b, gbps);
        if (s == BudgetSystem::kEbb) ebb_roof = r->roofline_tok_s;
        if (s == BudgetSystem::kMmap) r->roofline_tok_s = ebb_roof;  // the same bytes at best
        rows.push_back(*r);
      } catch (const Error& e) {
        if (a.child) throw;
        failures.push_back(what + ": " + e.what());
      }
    }
  }
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const BenchBudgetRow& r : rows) j.push_back(to_json(r));
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s (%s), storage %.2f GB/s (direct I/O), %lld prompt + %lld decoded tokens, %d reps\n",
                a.o.model.c_str(), format_bytes(model_bytes).c_str(), gbps, static_cast<long long>(a.o.prompt_tokens),
                static_cast<long long>(a.o.gen_tokens), a.o.reps);
    std::printf("%-11s %11s %10s %10s %10s %8s %12s %7s\n", "system", "budget", "decode", "prefill", "roofline",
                "dec/roof", "streamed/tok", "io wait");
    for (const BenchBudgetRow& r : rows) {
      std::printf("%-11s %11s %10.2f %10.2f %10.2f %8.2f %12s %6.0f%%\n", r.system.c_str(),
                  r.budget_bytes ? format_bytes(r.budget_bytes).c_str() : "-", r.decode_tok_s, r.prefill_tok_s,
                  r.roofline_tok_s, r.roofline_tok_s > 0 ? r.decode_tok_s / r.roofline_tok_s : 0.0,
                  format_bytes(r.streamed_per_token).c_str(), 100 * r.io_wait_fraction);
    }
  }
  if (!a.plot.empty()) {
    std::ofstream f(a.plot);
    f << budget_plot_svg(rows, model_bytes);
    if (!f) throw Error("--plot: cannot write " + a.plot);
  }
  std::fflush(stdout);
  for (const std::string& f : failures) std::fprintf(stderr, "ebb: error: bench budget: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace

void add_budget_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<BudgetArgs>();
  CLI::App* sub = bench->add_subcommand("budget", "Budget mode (FlexInfer) and baselines: tok/s against memory budget");
  sub->add_option("-m,--model", a->o.model, "GGUF model file")->required();
  sub->add_option("--budget", a->budgets, "Budgets, comma-separated (600MiB,1.5GiB,40%)")->required();
  sub->add_option("--systems", a->systems, "Systems to run")->capture_default_str();
  sub->add_option("-n,--gen-tokens", a->o.gen_tokens, "Decoded tokens")->capture_default_str();
  sub->add_option("-p,--prompt-tokens", a->o.prompt_tokens, "Prompt tokens (one prefill)")->capture_default_str();
  sub->add_option("--reps", a->o.reps, "Repetitions; medians are reported")->capture_default_str();
  sub->add_option("-t,--threads", a->threads, "Compute threads (0: all hardware threads)")->capture_default_str();
  sub->add_option("--window", a->o.window, "Prefetch window in layers")->capture_default_str();
  sub->add_flag("--drop-caches", a->o.drop_caches, "Drop the page cache before each run (root)");
  sub->add_flag("!--no-resident", a->resident, "Skip the fully resident reference row");
  sub->add_flag("--json", a->json, "Print JSON rows");
  sub->add_option("--plot", a->plot, "Write decode tok/s against budget as an SVG");
  // Internal (the parent's run of the mmap baseline inside a cgroup): hidden from help.
  sub->add_flag("--child", a->child, "one run inside a cgroup")->group("");
  sub->add_option("--storage-gbps", a->storage_gbps, "storage bandwidth measured by the parent")->group("");
  sub->callback([a, rc] { *rc = run_budget(*a); });
}

}  // namespace ebb::cli
