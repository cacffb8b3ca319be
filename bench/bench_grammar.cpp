// Cost of grammar-constrained decoding per token: the token mask over a
// 151,936-token vocabulary (Qwen's logits width), the allows() fast path,
// and sampler steps with and without the grammar stage.
// Built with -DEBB_BENCH=ON (build/bench_grammar).
// Usage: bench_grammar [vocab.gguf ...]
// The vocabulary is the union of the token pieces of the given vocab-only
// GGUFs, in order and without duplicates, cut or padded with the remaining
// pieces to 151,936 ids (default: the real byte-level BPE vocabularies in
// ../shared/golden/tokenizer, deepseek-llm first, as that folder has no
// Qwen2 vocab). The text generated is a fixed JSON document valid for a
// tool-call-like schema, tokenized by the first vocabulary; every step is
// timed cold (a fresh matcher: its DFA is built while masking) and warm (the
// same document again: the steady state of a long generation). Times are
// the thread's CPU time (one core).
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/sampler.h"

using namespace ebb;
using namespace ebb::grammar;

namespace {

// This thread's CPU time: the cost on one core, unaffected by time spent
// descheduled on a busy machine.
double now_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct Stats {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double pct(double p) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  }
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
};

void report(const char* name, Stats& s) {
  std::printf("%-34s mean %8.1f us  p50 %8.1f  p90 %8.1f  max %8.1f  (%zu steps)\n", name, s.mean(), s.pct(0.5),
              s.pct(0.9), s.pct(1.0), s.v.size());
}


bool measure(const char* title, const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenTrie>& vocab,
             const char* doc, const std::vector<TokenId>& ids) {
  std::printf("\n%s: %zu rules; document of %zu bytes, %zu tokens\n", title, g->n_rules(), std::string(doc).size(),
              ids.size());
  std::vector<uint8_t> mask(static_cast<size_t>(vocab->n_vocab()));
  const size_t wide = mask.size() / 2;
  Stats cold, warm, fast, allowed, walk_narrow, walk_wide;
  for (int pass = 0; pass < 2; ++pass) {
    GrammarConstraint con(g, vocab);
    for (int rep = 0; rep < (pass ? 5 : 1); ++rep) {
      con.reset();
      for (const TokenId t : ids) {
        double a = now_us();
        const size_t n = con.fill_mask(mask);
        const bool is_warm = pass && rep > 0;  // pass 1, rep 0 builds the DFA again
        if (!pass) cold.add(now_us() - a);
        if (is_warm) warm.add(now_us() - a);
        if (is_warm) allowed.add(static_cast<double>(n));
        if (!mask[static_cast<size_t>(t)]) {
          std::fprintf(stderr, "token %d refused: the document does not fit the grammar\n", t);
          return false;
        }
        a = now_us();
        const bool ok = con.allows(t);
        if (is_warm) fast.add(now_us() - a);
        if (!ok) return false;
        con.accept(t);
      }
    }
    if (pass) std::printf("DFA states after the document: %zu\n", con.matcher().n_states());
  }
  {  // the trie walk itself: warm DFA, mask cache off
    ConstraintOptions no_cache;
    no_cache.mask_cache_entries = 0;
    GrammarConstraint con(g, vocab, no_cache);
    for (int rep = 0; rep < 3; ++rep) {
      con.reset();
      for (const TokenId t : ids) {
        const double a = now_us();
        const size_t n = con.fill_mask(mask);
        if (rep > 0) (n > wide ? walk_wide : walk_narrow).add(now_us() - a);
        con.accept(t);
      }
    }
  }
  report("mask, cold (fresh matcher)", cold);
  report("mask, walk, narrow states", walk_narrow);
  report("mask, walk, wide states (>50%)", walk_wide);
  report("mask, steady state (with cache)", warm);
  report("allows(sampled token)", fast);
  std::printf("%-34s mean %8.0f      p50 %8.0f  p90 %8.0f  max %8.0f\n", "allowed tokens per step", allowed.mean(),
              allowed.pct(0.5), allowed.pct(0.9), allowed.pct(1.0));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int32_t kVocab = 151936;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) paths.push_back(argv[i]);
  if (paths.empty()) {
    // ../shared from the repository root or from a build directory in it.
    std::string shared = "../shared";
    for (const char* d : {"../shared", "../../shared", "/work/shared"})
      if (std::filesystem::exists(std::string(d) + "/golden/tokenizer")) {
        shared = d;
        break;
      }
    const std::string dir = shared + "/golden/tokenizer/ggml-vocab-";
    for (const char* v : {"deepseek-llm", "falcon", "gpt-2", "starcoder", "mpt"}) paths.push_back(dir + v + ".gguf");
  }
  std::vector<std::unique_ptr<Tokenizer>> toks;
  for (const std::string& p : paths) toks.push_back(Tokenizer::from_gguf(*GgufFile::open(p)));
  // Union of pieces; the first tokenizer keeps its ids.
  std::vector<std::string> pieces;
  std::vector<uint8_t> eog;
  std::set<std::string> seen;
  for (size_t t = 0; t < toks.size() && pieces.size() < kVocab; ++t) {
    for (int32_t id = 0; id < toks[t]->n_vocab() && pieces.size() < kVocab; ++id) {
      std::string p = toks[t]->token_to_piece(id, false);
      const bool end = toks[t]->is_eog(id);
      if (t > 0 && (p.empty() || end || seen.count(p))) continue;
      seen.insert(p);
      pieces.push_back(std::move(p));
      eog.push_back(t == 0 && end);
    }
  }
  const size_t real = pieces.size();
  while (pieces.size() < kVocab) pieces.push_back("");  // padding ids: control-like, empty
  eog.resize(pieces.size(), 0);
  double t0 = now_us();
  auto vocab = std::make_shared<const TokenTrie>(pieces, eog);
  std::printf("vocabulary: %zu ids (%zu distinct real BPE pieces from %zu files), trie %zu nodes, max depth %zu, built in %.0f ms\n",
              pieces.size(), real, paths.size(), vocab->nodes().size(), vocab->max_depth(), (now_us() - t0) / 1000);

  const char* schema = R"({"type":"object","properties":{
      "name":{"type":"string","enum":["get_weather","search","book_table"]},
      "arguments":{"type":"object","properties":{
        "city":{"type":"string","maxLength":40},
        "days":{"type":"integer","minimum":1,"maximum":14},
        "units":{"enum":["metric","imperial"]},
        "tags":{"type":"array","items":{"type":"string"},"maxItems":8},
        "when":{"type":"string","format":"date-time"}},
        "required":["city"]}},
      "required":["name","arguments"]})";
  const char* doc = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich, Schweiz — Altstadt\", \"days\": 7, "
                    "\"units\": \"metric\", \"tags\": [\"rain\", \"wind speed\", \"überall\"], "
                    "\"when\": \"2026-12-04T19:30:00Z\"}}";
  t0 = now_us();
  const auto g = Grammar::parse(json_schema_to_gbnf(std::string_view(schema)));
  std::printf("schema compiled to %zu rules in %.2f ms\n", g->n_rules(), (now_us() - t0) / 1000);

  EncodeOptions eo;
  eo.add_bos = false;
  const std::vector<TokenId> ids = toks[0]->encode(doc, eo);
  if (!measure("tool-call-like schema (bounded strings)", g, vocab, doc, ids)) return 1;
  const char* doc2 = "{\"note\": \"The grammar engine walks the token trie once per step, skipping every subtree "
                     "whose prefix the grammar refuses; inside a string almost every token is allowed, which is the "
                     "widest state a JSON grammar has.\", \"n\": [1, 2, 3]}";
  if (!measure("any JSON object (unbounded strings)", Grammar::parse(json_object_gbnf()), vocab, doc2,
               toks[0]->encode(doc2, eo)))
    return 1;

  // Sampler steps on random logits: unconstrained, and with the grammar
  // (warm), greedy and at temperature 0.8 (top-k 40, top-p 0.95, min-p 0.05).
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = nd(rng);
  for (const float temp : {0.0f, 0.8f}) {
    SamplerOptions o;
    o.temperature = temp;
    o.seed = 1;
    Sampler plain(o, kVocab);
    Stats s_plain, s_con;
    for (int i = 0; i < 200; ++i) {
      const double a = now_us();
      plain.sample(logits);
      s_plain.add(now_us() - a);
    }
    Sampler con_s(o, kVocab);
    auto con = std::make_shared<GrammarConstraint>(g, vocab);
    con_s.set_constraint(con);
    for (int rep = 0; rep < 3; ++rep) {
      con_s.reset();
      for (const TokenId t : ids) {
        // Make the document's token the favourite, as a model following it would.
        const float keep = logits[static_cast<size_t>(t)];
        logits[static_cast<size_t>(t)] = 30.0f;
        const double a = now_us();
        const int32_t got = con_s.sample(logits);
        if (rep) s_con.add(now_us() - a);
        logits[static_cast<size_t>(t)] = keep;
        (void)got;
        con_s.accept(t);
      }
    }
    char name[64];
    std::snprintf(name, sizeof name, "sampler t=%.1f, unconstrained", temp);
    report(name, s_plain);
    std::snprintf(name, sizeof name, "sampler t=%.1f, with grammar", temp);
    report(name, s_con);
  }
  return 0;
}
