// ebb bench train: LoRA training throughput (forward + backward + optimizer
// of one sample per step) beside the prefill throughput of the same model in
// the same run, rounds interleaved (the machine is shared and noisy):
//
//   train tok/s   = seq / (forward + backward + commit phases of a step)
//   prefill tok/s = seq / feed(seq tokens) of a fresh session
//
// and their ratio against the bound. A full backward costs about twice the
// forward's FLOPs (dX = W^T dY and dW = dY X^T per product), so training
// runs at most ~1/3 of prefill speed; over a frozen base the backward skips
// the base's dW (only the LoRA pairs get gradients), so ~1/2 is the tighter
// bound for LoRA (the loss head and attention add to both sides). Also the
// phase durations (p50 and max, for the scheduler's yield window) and the
// peak memory (the trainer's own allocations, the engine's total, and the
// process's peak RSS). Medians over the reps.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "train/trainer.h"

namespace ebb::cli {
namespace {

struct TrainBenchArgs {
  ModelArgs model;
  int64_t rank = 16;
  int64_t seq = 256;
  int64_t reps = 3;
  std::string targets = "q,k,v,o,gate,up,down";
  std::string recompute = "never";
  int64_t phase_layers = 0;     // 0: a sample's forward and backward are one phase each
  int64_t phase_head_rows = 0;
  double phase_seconds = 0.15;  // with phase_layers 0: pieces sized to about this (0: whole samples)
  bool json = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

uint64_t peak_rss_bytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

int run_train_bench(TrainBenchArgs& a) {
  if (a.rank < 1 || a.seq < 2 || a.reps < 1) throw Error("bench train: --rank >= 1, --seq >= 2 and --reps >= 1");
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const int64_t nv = engine->config().n_vocab;
  std::mt19937 rng(11);
  auto random_tokens = [&] {
    std::vector<int32_t> t(static_cast<size_t>(a.seq));
    for (int32_t& x : t) x = static_cast<int32_t>(1 + rng() % static_cast<uint32_t>(nv - 1));
    return t;
  };
  // One sample per rep (and one for the warm-up), each its own step.
  std::vector<TrainSample> samples;
  for (int64_t r = 0; r <= a.reps; ++r) {
    TrainSample s;
    s.tokens = random_tokens();
    s.weights.assign(s.tokens.size(), 1.0f);
    samples.push_back(std::move(s));
  }
  TrainerOptions o;
  o.init.rank = a.rank;
  o.init.alpha = static_cast<float>(2 * a.rank);
  try {
    o.init.targets = parse_lora_targets(a.targets);
  } catch (const Error& e) {
    throw UsageError(std::string("--targets: ") + e.what());
  }
  if (a.recompute == "never") {
    o.recompute = TrainerOptions::Recompute::kNever;
  } else if (a.recompute == "always") {
    o.recompute = TrainerOptions::Recompute::kAlways;
  } else if (a.recompute == "auto") {
    o.recompute = TrainerOptions::Recompute::kAuto;
  } else {
    throw UsageError("--recompute '" + a.recompute + "' is not one of auto, always, never");
  }
  o.adamw.lr = 1e-4f;
  o.batch = 1;
  o.phase_layers = a.phase_layers;
  o.phase_head_rows = a.phase_head_rows;
  o.phase_target_s = a.phase_seconds;
  Trainer trainer(*engine, samples, o);
  SessionOptions so = session_options(a.model);
  so.n_ctx = a.seq + 1;
  so.use_prefix_cache = false;

  std::vector<double> train_tok_s, prefill_tok_s, phase_s[3];  // phase_s: per rep, the kind's total in the step
  std::vector<double> piece_s[3];                                // every phase's own duration
  for (int64_t r = 0; r <= a.reps; ++r) {  // r == 0: warm-up
    std::fprintf(stderr, "bench train: %s\n", r == 0 ? "warm-up" : ("rep " + std::to_string(r)).c_str());
    double step_s = 0, ph[3] = {0, 0, 0};
    for (bool done = false; !done;) {
      const PhaseResult p = trainer.run_phase();
      step_s += p.seconds;
      ph[static_cast<int>(p.kind)] += p.seconds;
      if (r > 0) piece_s[static_cast<int>(p.kind)].push_back(p.seconds);
      done = p.step_done;
    }
    double pre_s = 0;
    {
      Session s(*engine, so);
      const std::vector<int32_t> t = random_tokens();
      const Stopwatch sw;
      s.feed(t);
      pre_s = sw.seconds();
    }
    if (r == 0) continue;
    train_tok_s.push_back(static_cast<double>(a.seq) / step_s);
    prefill_tok_s.push_back(static_cast<double>(a.seq) / pre_s);
    for (int k = 0; k < 3; ++k) phase_s[k].push_back(ph[k]);
  }
  const double train = median(train_tok_s), prefill = median(prefill_tok_s);
  const double ratio = prefill > 0 ? train / prefill : 0;
  const char* names[3] = {phase_name(PhaseKind::kForward), phase_name(PhaseKind::kBackward),
                          phase_name(PhaseKind::kCommit)};
  const std::string model_name = engine->config().name.empty() ? engine->config().arch_name : engine->config().name;
  const int threads = engine->pool().size();
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["model_name"] = model_name;
    j["threads"] = threads;
    j["rank"] = a.rank;
    j["seq"] = a.seq;
    j["reps"] = a.reps;
    j["targets"] = trainer.params().targets_summary();
    j["recompute"] = a.recompute;
    j["phase_layers"] = a.phase_layers;
    j["phase_head_rows"] = a.phase_head_rows;
    j["phase_seconds"] = a.phase_seconds;
    j["train_tok_s"] = train;
    j["prefill_tok_s"] = prefill;
    j["train_tok_s_reps"] = train_tok_s;
    j["prefill_tok_s_reps"] = prefill_tok_s;
    j["ratio"] = ratio;
    j["bound_full_backward"] = 1.0 / 3.0;
    j["bound_frozen_base"] = 0.5;
    for (int k = 0; k < 3; ++k) {
      j["phases"][names[k]] = {{"per_step_p50_s", median(phase_s[k])},
                               {"p50_s", median(piece_s[k])},
                               {"max_s", max_of(piece_s[k])},
                               {"count", piece_s[k].size()}};
    }
    j["trainer_peak_bytes"] = trainer.peak_bytes();
    j["engine_bytes"] = engine->footprint().total();
    j["peak_rss_bytes"] = peak_rss_bytes();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("ebb bench train: %s (%s)\n", model_name.c_str(), a.model.model.c_str());
    std::printf("  %-24s rank %lld on %s, seq %lld, %d threads, recompute %s, %lld reps (+1 warm-up)\n", "run",
                static_cast<long long>(a.rank), trainer.params().targets_summary().c_str(),
                static_cast<long long>(a.seq), threads, a.recompute.c_str(), static_cast<long long>(a.reps));
    std::printf("  %-24s %s\n", "phases",
                a.phase_layers > 0 ? ("pieces of " + std::to_string(a.phase_layers) + " layers, head rows " +
                                      (a.phase_head_rows > 0 ? std::to_string(a.phase_head_rows) : std::string("all")))
                                         .c_str()
                : a.phase_seconds > 0 ? ("pieces sized to about " + std::to_string(a.phase_seconds).substr(0, 4) +
                                         " s from measured costs (as ebb serve's training jobs)")
                                            .c_str()
                                      : "one forward and one backward per sample");
    std::printf("\n  %-24s %12s   %s\n", "metric", "median", "per rep");
    auto reps = [](const std::vector<double>& v, const char* fmt) {
      std::string s;
      for (double x : v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, fmt, x);
        s += (s.empty() ? "" : " ") + std::string(buf);
      }
      return s;
    };
    std::printf("  %-24s %12.1f   %s\n", "train tok/s", train, reps(train_tok_s, "%.1f").c_str());
    std::printf("  %-24s %12.1f   %s\n", "prefill tok/s", prefill, reps(prefill_tok_s, "%.1f").c_str());
    std::printf("  %-24s %11.3fx   bound 0.333x (backward = 2x forward FLOPs), 0.5x (frozen base: no dW)\n",
                "train / prefill", ratio);
    for (int k = 0; k < 3; ++k) {
      std::printf("  %-24s %12.4f   max %.4f s, %zu phases (%.4f s per step)\n",
                  (std::string(names[k]) + " phase p50 s").c_str(), median(piece_s[k]), max_of(piece_s[k]),
                  piece_s[k].size(), median(phase_s[k]));
    }
    std::printf("  %-24s %12s   engine total %s, process peak RSS %s\n", "trainer peak memory",
                format_bytes(trainer.peak_bytes()).c_str(), format_bytes(engine->footprint().total()).c_str(),
                format_bytes(peak_rss_bytes()).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_bench_train_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<TrainBenchArgs>();
  CLI::App* sub = bench->add_subcommand("train", "LoRA training tok/s (forward + backward + optimizer) beside prefill tok/s");
  add_model_options(sub, a->model);
  sub->add_option("--rank", a->rank, "Rank of the adapter trained")->capture_default_str();
  sub->add_option("--seq", a->seq, "Tokens per sample (one sample per step), and of the prefill")->capture_default_str();
  sub->add_option("--reps", a->reps, "Timed reps (after one warm-up); medians are reported")->capture_default_str();
  sub->add_option("--targets", a->targets, "Projections adapted, comma-separated")->capture_default_str();
  sub->add_option("--recompute", a->recompute, "Activations: never (kept), always (recomputed per layer), auto")
      ->capture_default_str();
  sub->add_option("--phase-layers", a->phase_layers, "Layers per forward/backward phase (0: a whole sample)")
      ->capture_default_str();
  sub->add_option("--phase-rows", a->phase_head_rows, "Output-head rows per phase (0: all, with --phase-layers)")
      ->capture_default_str();
  sub->add_option("--phase-seconds", a->phase_seconds,
                  "With --phase-layers 0: phases sized from measured costs to take about this long (0: a whole sample "
                  "per phase)")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_train_bench(*a); });
}

}  // namespace ebb::cli
