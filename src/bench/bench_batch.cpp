// ebb bench batch: aggregate decode tok/s of S concurrent streams decoded
// in one forward pass per step (runtime/batch.h), against one stream, in
// the same run. The bound: a step reads the weights once (one stream's step
// time t1) and computes each row at about the prefill rate, so S streams
// take at least max(t1, S / prefill tok/s) per step.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "bench/batch_rep.h"
#include "bench/bench_choices.h"
#include "runtime/batch.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb::cli {
namespace {

struct BatchArgs {
  ModelArgs model;
  std::vector<int64_t> streams = {1, 4, 8};
  int64_t prompt = 128;
  int64_t gen = 64;
  int64_t reps = 3;
  bool json = false;
  int choices = 0;  // > 0: n choices of one request instead (bench_choices.cpp)
};

struct BatchRow {
  int64_t streams = 0;
  double decode_tok_s = 0, prefill_tok_s = 0;
  std::vector<double> decode_reps, prefill_reps;
  double x_one = 0;        // decode_tok_s over one stream's
  double bound_tok_s = 0;  // S / max(t1, S / prefill)
};

int run_batch_bench(BatchArgs& a) {
  if (a.prompt < 1 || a.gen < 1 || a.reps < 1) throw Error("bench batch: -p, -n and -r must be at least 1");
  std::vector<int64_t> streams = a.streams;
  for (int64_t s : streams)
    if (s < 1) throw Error("bench batch: --streams takes positive counts, got " + std::to_string(s));
  if (std::find(streams.begin(), streams.end(), 1) == streams.end()) streams.insert(streams.begin(), 1);
  std::unique_ptr<Engine> e = make_engine(a.model);
  if (*std::max_element(streams.begin(), streams.end()) > e->forward().max_batch()) {
    throw Error("bench batch: more streams than the step's rows (--batch " +
                std::to_string(e->forward().max_batch()) + ")");
  }
  std::vector<BatchRow> rows(streams.size());
  // Reps interleave the stream counts, so drift of a shared machine falls on all.
  for (int64_t r = 0; r <= a.reps; ++r) {  // r == 0: warm-up
    for (size_t i = 0; i < streams.size(); ++i) {
      double p = 0, d = 0;
      std::fprintf(stderr, "bench batch: %s %lld streams\n", r == 0 ? "warm-up" : ("rep " + std::to_string(r)).c_str(),
                   static_cast<long long>(streams[i]));
      const BatchRep rep = run_batch_rep(*e, streams[i], a.prompt, a.gen, a.model.kv_chunk,
                                         static_cast<uint32_t>(1000 * r + i));
      p = rep.prefill_tok_s;
      d = rep.decode_tok_s;
      if (r == 0) continue;
      rows[i].streams = streams[i];
      rows[i].prefill_reps.push_back(p);
      rows[i].decode_reps.push_back(d);
    }
  }
  double one = 0, prefill = 0;
  for (BatchRow& row : rows) {
    row.decode_tok_s = median(row.decode_reps);
    row.prefill_tok_s = median(row.prefill_reps);
    if (row.streams == 1) one = row.decode_tok_s, prefill = row.prefill_tok_s;
  }
  const double t1 = one > 0 ? 1.0 / one : 0;
  for (BatchRow& row : rows) {
    row.x_one = one > 0 ? row.decode_tok_s / one : 0;
    const double step = std::max(t1, prefill > 0 ? static_cast<double>(row.streams) / prefill : 0);
    row.bound_tok_s = step > 0 ? static_cast<double>(row.streams) / step : 0;
  }
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["threads"] = e->pool().size();
    j["isa"] = std::string(isa_name(e->isa()));
    j["prompt_tokens"] = a.prompt;
    j["gen_tokens"] = a.gen;
    j["reps"] = a.reps;
    for (const BatchRow& row : rows) {
      j["rows"].push_back({{"streams", row.streams},
                           {"decode_tok_s", row.decode_tok_s},
                           {"prefill_tok_s", row.prefill_tok_s},
                           {"decode_tok_s_reps", row.decode_reps},
                           {"prefill_tok_s_reps", row.prefill_reps},
                           {"ratio_to_one_stream", row.x_one},
                           {"bound_tok_s", row.bound_tok_s},
                           {"bound_ratio_to_one_stream", one > 0 ? row.bound_tok_s / one : 0}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("ebb bench batch: %s, %d threads, %s, prompt %lld, %lld decoded per stream, median of %lld reps\n",
                a.model.model.c_str(), e->pool().size(), std::string(isa_name(e->isa())).c_str(),
                static_cast<long long>(a.prompt), static_cast<long long>(a.gen), static_cast<long long>(a.reps));
    std::printf("bound: a step reads the weights once (one stream's step) and computes each row at the prefill rate\n");
    std::printf("%8s %14s %10s %14s %10s %14s\n", "streams", "decode tok/s", "x one", "bound tok/s", "x bound", "prefill tok/s");
    for (const BatchRow& row : rows)
      std::printf("%8lld %14.1f %10.2f %14.1f %10.2f %14.1f\n", static_cast<long long>(row.streams), row.decode_tok_s,
                  row.x_one, row.bound_tok_s, one > 0 ? row.bound_tok_s / one : 0, row.prefill_tok_s);
  }
  return 0;
}

}  // namespace

void add_bench_batch_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<BatchArgs>();
  CLI::App* sub = bench->add_subcommand("batch", "Aggregate decode tok/s of concurrent streams batched per step");
  add_model_options(sub, a->model);
  sub->add_option("--streams", a->streams, "Stream counts to measure (one stream is always measured)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("-p,--prompt-tokens", a->prompt, "Prompt tokens per stream")->capture_default_str();
  sub->add_option("-n,--gen-tokens", a->gen, "Tokens decoded per stream")->capture_default_str();
  sub->add_option("-r,--reps", a->reps, "Timed repetitions (after one warm-up); medians are reported")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->add_option("--choices", a->choices,
                  "Instead: one request of this many choices (ebb serve's n) through the scheduler, against one "
                  "choice (the prompt prefilled once, the choices batched)");
  sub->callback([a, rc] {
    if (a->choices > 0) {
      ChoicesBenchArgs c;
      c.model = a->model;
      c.choices = a->choices;
      c.prompt = a->prompt;
      c.gen = a->gen;
      c.reps = a->reps;
      c.json = a->json;
      *rc = run_choices_bench(c);
      return;
    }
    *rc = run_batch_bench(*a);
  });
}

}  // namespace ebb::cli
