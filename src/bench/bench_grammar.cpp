// ebb bench grammar: what a JSON-schema constraint costs in decode, and the
// first token's extra latency for compiling a schema and the first mask.
//
// Decode: the same prompt decoded unconstrained and with the --schema
// constraint, alternating rep by rep in one run (the machine is shared and
// noisy); each rep's decode tok/s (generated tokens / decode time, the mask
// work included), medians, and their ratio against its bound 1.0x (the
// mask is extra work on the same step).
//
// First token: compile (schema -> GBNF -> Grammar) + a fresh constraint +
// its first mask over the whole vocabulary, timed directly, for --schema
// and for --tools (a forced call of one of the tools, in the model's call
// syntax); and TTFT with each constraint against TTFT without, alternated.
// The vocabulary trie is built once per model (before any request) and
// reported apart.
#include <time.h>

#include <algorithm>
#include <random>
#include <utility>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/options.h"
#include "model/chat_parse.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"
#include "runtime/grammar/tool_grammar.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ebb::cli {
namespace {

struct GrammarBenchArgs {
  ModelArgs model;
  std::string schema_file;
  std::string tools_file;
  std::string prompt = "Here is the order as JSON:";
  int64_t n_tokens = 64;
  int64_t reps = 5;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Compiled {
  std::shared_ptr<const grammar::Grammar> grammar;
  std::vector<double> compile_ms, first_mask_ms, allowed;  // per rep
};

// Compiles `make_gbnf()` and masks once, reps times (each from scratch).
template <class F>
Compiled compile_reps(F make_gbnf, const std::shared_ptr<const grammar::TokenTrie>& trie, int64_t reps) {
  Compiled c;
  std::vector<uint8_t> mask(static_cast<size_t>(trie->n_vocab()));
  for (int64_t r = 0; r < reps; ++r) {
    const Stopwatch sw;
    c.grammar = grammar::Grammar::parse(make_gbnf());
    grammar::GrammarConstraint con(c.grammar, trie);
    const double compiled = sw.seconds();
    const size_t n = con.fill_mask(mask);
    c.compile_ms.push_back(compiled * 1e3);
    c.first_mask_ms.push_back((sw.seconds() - compiled) * 1e3);
    c.allowed.push_back(static_cast<double>(n));
  }
  return c;
}

struct Run {
  double decode_tok_s = 0, ttft_ms = 0;
  double decode_cpu_tok_s = 0;  // tokens per second of the process's CPU time
  int64_t tokens = 0;
  std::vector<TokenId> ids;  // the generated tokens
};

// This thread's CPU time: the mask's cost on one core, whatever else the
// machine runs.
double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// The constraint's work per generated token, replayed on one thread: a full
// mask over the vocabulary (what a sampled, non-greedy step computes) and
// the advance by the token; fresh (cold) constraints, as each request gets.
// Returns the per-token times in microseconds.
std::vector<double> replay_mask_us(const std::vector<Run>& runs, const std::shared_ptr<const grammar::Grammar>& g,
                                   const std::shared_ptr<const grammar::TokenTrie>& trie) {
  std::vector<double> us;
  std::vector<uint8_t> mask(static_cast<size_t>(trie->n_vocab()));
  for (const Run& r : runs) {
    grammar::GrammarConstraint con(g, trie);
    for (const TokenId t : r.ids) {
      const double t0 = thread_cpu_us();
      con.fill_mask(mask);
      if (!con.allows(t)) break;  // an end-of-generation token after the grammar completed
      con.accept(t);
      us.push_back(thread_cpu_us() - t0);
    }
  }
  return us;
}

// The process's CPU time (all threads): on a shared, busy machine it leaves
// out the time spent waiting for a core, which wall time does not.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Run run_once(Engine& engine, const ModelArgs& ma, const std::vector<TokenId>& prompt, int64_t n,
             const std::shared_ptr<const grammar::Grammar>& g, const std::shared_ptr<const grammar::TokenTrie>& trie,
             uint64_t seed) {
  Session s(engine, session_options(ma));
  GenerateOptions go;
  go.max_tokens = n;
  go.sampling.seed = seed;
  if (g) go.constraint = std::make_shared<grammar::GrammarConstraint>(g, trie);
  // CPU time from the first token's text (decode starts) to the end.
  double cpu_first = -1;
  const GenerateStats st = generate(s, prompt, go, [&cpu_first](std::string_view) {
    if (cpu_first < 0) cpu_first = process_cpu_seconds();
    return true;
  });
  const double cpu_end = process_cpu_seconds();
  Run r;
  r.tokens = st.generated_tokens;
  r.ids = st.tokens;
  if (cpu_first >= 0 && cpu_end > cpu_first && st.generated_tokens > 1)
    r.decode_cpu_tok_s = (st.generated_tokens - 1) / (cpu_end - cpu_first);
  r.ttft_ms = st.ttft_seconds * 1e3;
  r.decode_tok_s = st.decode_seconds > 0 && st.generated_tokens > 1 ? (st.generated_tokens - 1) / st.decode_seconds : 0;
  return r;
}

// A whole sampler step (the default options: top-k, top-p, min-p, a draw)
// with the constraint and without, on one core, replayed on the generated
// tokens over a fixed row of random logits: the constraint's whole cost per
// token (mask, dropping the refused candidates, advancing), as the decode
// loop pays it. Returns the means in microseconds {constrained, plain}.
std::pair<double, double> replay_sampler_us(const std::vector<Run>& runs, const std::shared_ptr<const grammar::Grammar>& g,
                                            const std::shared_ptr<const grammar::TokenTrie>& trie, int32_t n_vocab) {
  std::vector<float> logits(static_cast<size_t>(n_vocab));  // [n_vocab]
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float& x : logits) x = nd(rng);
  double with = 0, without = 0;
  size_t n = 0;
  for (const Run& r : runs) {
    SamplerOptions so;
    so.seed = 1;
    Sampler sc(so, n_vocab), su(so, n_vocab);
    sc.set_constraint(std::make_shared<grammar::GrammarConstraint>(g, trie));
    for (const TokenId t : r.ids) {
      if (!sc.constraint()->allows(t)) break;  // an end-of-generation token after the grammar completed
      double t0 = thread_cpu_us();
      sc.sample(logits);
      with += thread_cpu_us() - t0;
      t0 = thread_cpu_us();
      su.sample(logits);
      without += thread_cpu_us() - t0;
      ++n;
      sc.accept(t);
      su.accept(t);
    }
  }
  return n ? std::pair{with / static_cast<double>(n), without / static_cast<double>(n)} : std::pair{0.0, 0.0};
}

int run_grammar_bench(GrammarBenchArgs& a) {
  if (a.schema_file.empty()) throw UsageError("bench grammar: --schema FILE is required");
  if (a.reps < 1) throw UsageError("--reps must be >= 1");
  if (a.n_tokens < 2) throw UsageError("-n must be >= 2");
  const std::string schema = read_bounded_text(a.schema_file, 4u << 20, "--schema");
  const std::string tools = a.tools_file.empty() ? "" : read_bounded_text(a.tools_file, 4u << 20, "--tools");
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const Tokenizer& tok = engine->tokenizer();

  Stopwatch sw;
  const std::shared_ptr<const grammar::TokenTrie> trie = grammar::TokenTrie::from_tokenizer(tok);
  const double trie_ms = sw.seconds() * 1e3;

  // First token: compile + first mask, from scratch each rep.
  Compiled cs;
  try {
    cs = compile_reps([&] { return grammar::json_schema_to_gbnf(std::string_view(schema)); }, trie, a.reps);
  } catch (const Error& e) {
    throw Error("--schema '" + a.schema_file + "': " + e.what());
  }
  const ChatOutputFormat fmt = detect_chat_output_format(engine->model().chat_template(), engine->config().arch_name);
  Compiled ct;
  size_t n_tools = 0;
  if (!tools.empty()) {
    const nlohmann::ordered_json tj = nlohmann::ordered_json::parse(tools, nullptr, false);
    if (!tj.is_array()) throw Error("--tools '" + a.tools_file + "': not a JSON array of tools");
    n_tools = tj.size();
    grammar::ToolCallGrammarOptions to;
    to.prefix = fmt.call_prefix;
    to.suffix = fmt.call_suffix;
    try {
      ct = compile_reps([&] { return grammar::tool_call_gbnf(tj, to); }, trie, a.reps);
    } catch (const Error& e) {
      throw Error("--tools '" + a.tools_file + "': " + e.what());
    }
  }

  EncodeOptions eo;
  eo.add_bos = tok.add_bos_default();
  const std::vector<TokenId> prompt = tok.encode(a.prompt, eo);
  // Decode and TTFT, alternating: none, schema, (tools); a warm-up round first.
  std::vector<Run> free_runs, schema_runs, tool_runs;
  for (int64_t rep = -1; rep < a.reps; ++rep) {
    std::fprintf(stderr, "bench grammar: %s\n", rep < 0 ? "warm-up" : ("rep " + std::to_string(rep + 1) + "/" +
                                                                       std::to_string(a.reps)).c_str());
    const uint64_t seed = 1000 + static_cast<uint64_t>(std::max<int64_t>(rep, 0));
    const Run f = run_once(*engine, a.model, prompt, a.n_tokens, nullptr, trie, seed);
    const Run s = run_once(*engine, a.model, prompt, a.n_tokens, cs.grammar, trie, seed);
    Run t;
    if (ct.grammar) t = run_once(*engine, a.model, prompt, a.n_tokens, ct.grammar, trie, seed);
    if (rep < 0) continue;
    free_runs.push_back(f);
    schema_runs.push_back(s);
    if (ct.grammar) tool_runs.push_back(t);
  }
  auto med = [](const std::vector<Run>& v, double Run::*field) {
    std::vector<double> x;
    for (const Run& r : v) x.push_back(r.*field);
    return median(x);
  };
  auto med_tokens = [](const std::vector<Run>& v) {
    std::vector<double> x;
    for (const Run& r : v) x.push_back(static_cast<double>(r.tokens));
    return median(x);
  };
  const double free_tps = med(free_runs, &Run::decode_tok_s), schema_tps = med(schema_runs, &Run::decode_tok_s);
  const double free_ttft = med(free_runs, &Run::ttft_ms), schema_ttft = med(schema_runs, &Run::ttft_ms);
  const double tool_tps = tool_runs.empty() ? 0 : med(tool_runs, &Run::decode_tok_s);
  const double tool_ttft = tool_runs.empty() ? 0 : med(tool_runs, &Run::ttft_ms);
  const double ratio = free_tps > 0 ? schema_tps / free_tps : 0;
  const double free_cpu = med(free_runs, &Run::decode_cpu_tok_s), schema_cpu = med(schema_runs, &Run::decode_cpu_tok_s);
  const double tool_cpu = tool_runs.empty() ? 0 : med(tool_runs, &Run::decode_cpu_tok_s);
  const double cpu_ratio = free_cpu > 0 ? schema_cpu / free_cpu : 0;
  const double tool_cpu_ratio = free_cpu > 0 ? tool_cpu / free_cpu : 0;
  const double tool_ratio = free_tps > 0 ? tool_tps / free_tps : 0;
  const double schema_first = median(cs.compile_ms) + median(cs.first_mask_ms);
  // Paired: each rep's constrained rate over the unconstrained one run just
  // before it (a busy machine's load changes between reps, less within one).
  auto paired = [&free_runs](const std::vector<Run>& v) {
    std::vector<double> x;
    for (size_t i = 0; i < v.size() && i < free_runs.size(); ++i)
      if (free_runs[i].decode_tok_s > 0) x.push_back(v[i].decode_tok_s / free_runs[i].decode_tok_s);
    return median(x);
  };
  const double schema_paired = paired(schema_runs), tool_paired = paired(tool_runs);
  // The mask's cost per token on one core, against the unconstrained step:
  // the ratio it allows (step / (step + mask)), whatever the machine's load.
  const double step_us = free_tps > 0 ? 1e6 / free_tps : 0;
  // The mean, not the median: decode time is the sum of the steps.
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0.0 : t / static_cast<double>(v.size());
  };
  const std::vector<double> schema_us = replay_mask_us(schema_runs, cs.grammar, trie);
  const std::vector<double> tool_us = ct.grammar ? replay_mask_us(tool_runs, ct.grammar, trie) : std::vector<double>();
  const double schema_mask_us = mean(schema_us), tool_mask_us = mean(tool_us);
  const double schema_mask_max = schema_us.empty() ? 0 : *std::max_element(schema_us.begin(), schema_us.end());
  const double tool_mask_max = tool_us.empty() ? 0 : *std::max_element(tool_us.begin(), tool_us.end());
  auto mask_ratio = [step_us](double mask_us) { return step_us > 0 ? step_us / (step_us + mask_us) : 0; };
  const int32_t n_vocab = static_cast<int32_t>(engine->config().n_vocab);
  const auto [schema_samp_us, plain_samp_us] = replay_sampler_us(schema_runs, cs.grammar, trie, n_vocab);
  const auto [tool_samp_us, plain_samp_us_t] =
      ct.grammar ? replay_sampler_us(tool_runs, ct.grammar, trie, n_vocab) : std::pair{0.0, 0.0};
  // The decode ratio the sampler's extra work allows: step / (step + extra).
  auto extra_ratio = [step_us](double extra_us) {
    return step_us > 0 ? step_us / (step_us + std::max(0.0, extra_us)) : 0;
  };
  const double tool_first = ct.grammar ? median(ct.compile_ms) + median(ct.first_mask_ms) : 0;

  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["n_vocab"] = tok.n_vocab();
    j["threads"] = engine->pool().size();
    j["reps"] = a.reps;
    j["max_tokens"] = a.n_tokens;
    j["trie_build_ms"] = trie_ms;
    j["decode"] = {{"unconstrained_tok_s", free_tps},
                   {"schema_tok_s", schema_tps},
                   {"schema_ratio", ratio},
                   {"unconstrained_cpu_tok_s", free_cpu},
                   {"schema_cpu_tok_s", schema_cpu},
                   {"schema_cpu_ratio", cpu_ratio},
                   {"schema_paired_ratio", schema_paired},
                   {"schema_mask_us_per_token", schema_mask_us},
                   {"schema_mask_us_max", schema_mask_max},
                   {"sampler_us_unconstrained", plain_samp_us},
                   {"sampler_us_schema", schema_samp_us},
                   {"schema_sampler_extra_ratio", extra_ratio(schema_samp_us - plain_samp_us)},
                   {"schema_mask_ratio", mask_ratio(schema_mask_us)},
                   {"schema_tokens_median", med_tokens(schema_runs)},
                   {"unconstrained_tokens_median", med_tokens(free_runs)},
                   {"bound_ratio", 1.0},
                   {"target_ratio", 0.9}};
    if (ct.grammar) {
      j["decode"]["tools_tok_s"] = tool_tps;
      j["decode"]["tools_ratio"] = tool_ratio;
      j["decode"]["tools_cpu_ratio"] = tool_cpu_ratio;
      j["decode"]["tools_paired_ratio"] = tool_paired;
      j["decode"]["tools_mask_us_per_token"] = tool_mask_us;
      j["decode"]["tools_mask_us_max"] = tool_mask_max;
      j["decode"]["sampler_us_tools"] = tool_samp_us;
      j["decode"]["tools_sampler_extra_ratio"] = extra_ratio(tool_samp_us - plain_samp_us_t);
      j["decode"]["tools_mask_ratio"] = mask_ratio(tool_mask_us);
      j["decode"]["tools_tokens_median"] = med_tokens(tool_runs);
    }
    j["first_token"] = {{"schema_compile_ms", median(cs.compile_ms)},
                        {"schema_first_mask_ms", median(cs.first_mask_ms)},
                        {"schema_extra_ms", schema_first},
                        {"schema_first_mask_allowed", median(cs.allowed)},
                        {"ttft_unconstrained_ms", free_ttft},
                        {"ttft_schema_ms", schema_ttft},
                        {"target_extra_ms", 20.0}};
    if (ct.grammar) {
      j["first_token"]["tools"] = n_tools;
      j["first_token"]["tools_compile_ms"] = median(ct.compile_ms);
      j["first_token"]["tools_first_mask_ms"] = median(ct.first_mask_ms);
      j["first_token"]["tools_extra_ms"] = tool_first;
      j["first_token"]["tools_first_mask_allowed"] = median(ct.allowed);
      j["first_token"]["ttft_tools_ms"] = tool_ttft;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("ebb bench grammar: %s, vocabulary %d, %d threads, %lld reps of %lld tokens (alternated), medians\n",
              a.model.model.c_str(), tok.n_vocab(), engine->pool().size(), static_cast<long long>(a.reps),
              static_cast<long long>(a.n_tokens));
  std::printf("  vocabulary trie: %.1f ms, once per model\n\n", trie_ms);
  std::printf("  %-22s %9s %7s %7s %10s %7s %9s %7s %7s\n", "decode", "tok/s", "ratio", "paired", "tok/CPU-s",
              "ratio", "mask us", "ratio", "bound");
  std::printf("  %-22s %9.2f %6.2fx %6.2fx %10.2f %6.2fx %9s %7s %7s  %.0f tokens, a step %.0f us\n", "unconstrained",
              free_tps, 1.0, 1.0, free_cpu, 1.0, "", "", "", med_tokens(free_runs), step_us);
  std::printf("  %-22s %9.2f %6.2fx %6.2fx %10.2f %6.2fx %9.1f %6.3fx %6.2fx  %.0f tokens (target >= 0.90x)\n",
              "JSON schema", schema_tps, ratio, schema_paired, schema_cpu, cpu_ratio, schema_mask_us,
              mask_ratio(schema_mask_us), 1.0, med_tokens(schema_runs));
  if (ct.grammar)
    std::printf("  %-22s %9.2f %6.2fx %6.2fx %10.2f %6.2fx %9.1f %6.3fx %6.2fx  %.0f tokens\n",
                ("forced call, " + std::to_string(n_tools) + " tools").c_str(), tool_tps, tool_ratio, tool_paired,
                tool_cpu, tool_cpu_ratio, tool_mask_us, mask_ratio(tool_mask_us), 1.0, med_tokens(tool_runs));
  std::printf("  (schema: %s. ratio: of medians; paired: median of each rep's ratio to the run beside it; tok/CPU-s:\n"
              "   per second of the process's CPU time; mask us: a full mask and the advance per generated token on one\n"
              "   core, replayed on the tokens generated (mean; the slowest: schema %.0f us, tools %.0f us), and the\n"
              "   ratio step / (step + mask) it allows)\n",
              a.schema_file.c_str(), schema_mask_max, tool_mask_max);
  std::printf("\n  sampler step on one core (replayed, default options): unconstrained %.1f us, schema %.1f us (ratio it\n"
              "  allows %.4fx)", plain_samp_us, schema_samp_us, extra_ratio(schema_samp_us - plain_samp_us));
  if (ct.grammar)
    std::printf(", forced call %.1f us (%.4fx)", tool_samp_us, extra_ratio(tool_samp_us - plain_samp_us_t));
  std::printf("\n");
  std::printf("\n  %-28s %10s %11s %9s %12s\n", "first token", "compile ms", "1st mask ms", "extra ms", "TTFT ms");
  std::printf("  %-28s %10s %11s %9s %12.2f\n", "unconstrained", "", "", "", free_ttft);
  std::printf("  %-28s %10.2f %11.2f %9.2f %12.2f  (target extra <= 20 ms)\n", "schema", median(cs.compile_ms),
              median(cs.first_mask_ms), schema_first, schema_ttft);
  if (ct.grammar)
    std::printf("  %-28s %10.2f %11.2f %9.2f %12.2f  (target extra <= 20 ms)\n",
                ("forced call, " + std::to_string(n_tools) + " tools").c_str(), median(ct.compile_ms),
                median(ct.first_mask_ms), tool_first, tool_ttft);
  std::printf("  (TTFT with a constraint includes compiling it only in 'extra': the runs above reuse the compiled "
              "grammar, each with a fresh matcher)\n");
  return 0;
}

}  // namespace

void add_bench_grammar_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<GrammarBenchArgs>();
  CLI::App* sub = bench->add_subcommand(
      "grammar", "Constrained decoding: decode tok/s with a JSON-schema constraint against none, first-token latency");
  add_model_options(sub, a->model);
  sub->add_option("--schema", a->schema_file, "JSON Schema file the output is constrained to (required)");
  sub->add_option("--tools", a->tools_file, "OpenAI tools JSON file: a forced call's grammar (e.g. 16 tools)");
  sub->add_option("-p,--prompt", a->prompt, "Prompt text")->capture_default_str();
  sub->add_option("-n,--n-predict", a->n_tokens, "Tokens to decode per run at most")->capture_default_str();
  sub->add_option("--reps", a->reps, "Repetitions of each mode (alternated)")->capture_default_str();
  sub->add_flag("--json", a->json, "Print JSON instead of the table");
  sub->callback([a, rc] { *rc = run_grammar_bench(*a); });
}

}  // namespace ebb::cli
