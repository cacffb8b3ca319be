// ebb bench batch --choices N: one request of N choices through the
// scheduler (the prompt prefilled once, the choices forked from its session
// and decoded together, as ebb serve runs `n`), against the same request of
// one choice, interleaved in one run. Aggregate decode tok/s: the tokens
// sampled after the first, over the time from the first token to the last
// choice's end. KV: the pool's peak resident bytes during the request, with
// N choices against one, beside what N copies of one would take.
// The bound is bench batch's: a step reads the weights once (one choice's
// step time t1) and computes each row at about the prefill rate, so N
// choices take at least max(t1, N / prefill tok/s) per step.
#include "bench/bench_choices.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/scheduler.h"
#include "runtime/stats.h"

namespace ebb::cli {
namespace {

struct ChoicesRep {
  double decode_tok_s = 0, prefill_tok_s = 0;
  uint64_t kv_bytes = 0;  // the pool's peak resident KV during the request
};

ChoicesRep run_rep(Engine& e, Scheduler& sched, int n, int64_t prompt, int64_t gen, int64_t kv_chunk, uint32_t seed) {
  std::mt19937 rng(seed);
  GenerationRequest r;
  r.prompt.resize(static_cast<size_t>(prompt));
  for (TokenId& t : r.prompt) t = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(e.config().n_vocab - 1));
  r.options.max_tokens = gen;
  r.options.stop_at_eog = false;
  r.options.sampling.seed = seed + 1;  // ebb serve's default sampling otherwise
  r.session.n_ctx = prompt + gen + 8;
  r.session.kv_chunk_size = kv_chunk;
  r.session.use_prefix_cache = false;
  r.n_choices = n;
  // The peak, not a census taken when the client sees every choice running:
  // a short generation may have ended (and freed its KV) by then.
  sched.call([](Engine& en) {
         en.kv_pool().reset_peak();
         return 0;
       })
      .get();
  auto stream = sched.submit_generation(std::move(r));
  int done = 0;
  int64_t tokens = 0;
  double prefill_tok_s = 0;
  ChoicesRep out;
  while (done < n) {
    std::optional<GenerationEvent> ev = stream->next(60.0);
    if (!ev) throw Error("bench batch --choices: no event within 60 s");
    if (ev->kind == GenerationEvent::Kind::kError) throw Error("bench batch --choices: " + ev->error);
    if (ev->kind != GenerationEvent::Kind::kDone) continue;
    ++done;
    tokens += ev->stats.generated_tokens;
    if (ev->choice == 0) prefill_tok_s = ev->stats.prefill_tok_s();
  }
  const double end = now_seconds();
  out.kv_bytes = sched.call([](Engine& en) { return en.kv_pool().peak_bytes(); }).get();
  out.decode_tok_s = static_cast<double>(tokens - 1) / (end - stream->first_token_at());
  out.prefill_tok_s = prefill_tok_s;
  return out;
}

}  // namespace

int run_choices_bench(const ChoicesBenchArgs& a) {
  if (a.choices < 2) throw Error("bench batch: --choices takes a count of at least 2");
  if (a.prompt < 1 || a.gen < 3 || a.reps < 1) throw Error("bench batch --choices: -p >= 1, -n >= 3 and --reps >= 1");
  std::unique_ptr<Engine> e = make_engine(a.model);
  SchedulerOptions so;
  so.max_batch = std::max(8, a.choices);
  Scheduler sched(e.get(), so);
  const int counts[2] = {1, a.choices};
  std::vector<double> decode[2], prefill[2], kv[2];
  // Reps interleave one choice and N, so drift of a shared machine falls on both.
  for (int64_t r = 0; r <= a.reps; ++r) {  // r == 0: warm-up
    for (int i = 0; i < 2; ++i) {
      std::fprintf(stderr, "bench batch --choices: %s, %d choice%s\n",
                   r == 0 ? "warm-up" : ("rep " + std::to_string(r)).c_str(), counts[i], counts[i] > 1 ? "s" : "");
      const ChoicesRep rep = run_rep(*e, sched, counts[i], a.prompt, a.gen, a.model.kv_chunk,
                                     static_cast<uint32_t>(1000 * r + 10 * i + 1));
      if (r == 0) continue;
      decode[i].push_back(rep.decode_tok_s);
      prefill[i].push_back(rep.prefill_tok_s);
      kv[i].push_back(static_cast<double>(rep.kv_bytes));
    }
  }
  sched.shutdown();
  const double one = median(decode[0]), many = median(decode[1]), pre = median(prefill[0]);
  // The ratio within each rep (one choice, then N, back to back), whose
  // median is steadier than the ratio of medians on a busy machine.
  std::vector<double> ratios;
  for (size_t r = 0; r < decode[0].size(); ++r) ratios.push_back(decode[0][r] > 0 ? decode[1][r] / decode[0][r] : 0);
  const double ratio = median(ratios);
  const double t1 = one > 0 ? 1.0 / one : 0;
  const double step = std::max(t1, pre > 0 ? a.choices / pre : 0);
  const double bound = step > 0 ? a.choices / step : 0;
  const double kv_one = median(kv[0]), kv_many = median(kv[1]);
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["threads"] = e->pool().size();
    j["isa"] = std::string(isa_name(e->isa()));
    j["prompt_tokens"] = a.prompt;
    j["gen_tokens"] = a.gen;
    j["reps"] = a.reps;
    j["choices"] = a.choices;
    j["one_choice_decode_tok_s"] = one;
    j["one_choice_decode_tok_s_reps"] = decode[0];
    j["choices_decode_tok_s"] = many;
    j["choices_decode_tok_s_reps"] = decode[1];
    j["ratio_to_one_choice"] = ratio;  // median of the reps' ratios
    j["ratio_to_one_choice_reps"] = ratios;
    j["prefill_tok_s"] = pre;
    j["bound_tok_s"] = bound;
    j["bound_ratio_to_one_choice"] = one > 0 ? bound / one : 0;
    j["kv_bytes_one_choice"] = kv_one;
    j["kv_bytes_choices"] = kv_many;
    j["kv_bytes_choices_unshared"] = kv_one * a.choices;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("ebb bench batch --choices %d: %s, %d threads, %s, prompt %lld, %lld decoded per choice, median of "
                "%lld reps\n",
                a.choices, a.model.model.c_str(), e->pool().size(), std::string(isa_name(e->isa())).c_str(),
                static_cast<long long>(a.prompt), static_cast<long long>(a.gen), static_cast<long long>(a.reps));
    std::printf("bound: a step reads the weights once (one choice's step) and computes each row at the prefill rate\n");
    std::printf("%8s %14s %10s %14s %10s %14s\n", "choices", "decode tok/s", "x one", "bound tok/s", "x bound",
                "KV MiB held");
    std::printf("%8d %14.1f %10.2f %14.1f %10.2f %14.1f\n", 1, one, 1.0, one, 1.0, kv_one / (1 << 20));
    std::printf("%8d %14.1f %10.2f %14.1f %10.2f %14.1f  (%d unshared copies: %.1f)\n", a.choices, many, ratio,
                bound, one > 0 ? bound / one : 0, kv_many / (1 << 20), a.choices,
                kv_one * a.choices / (1 << 20));
  }
  return 0;
}

}  // namespace ebb::cli
