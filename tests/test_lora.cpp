// LoRA adapters on the engine: the reference engine's logits with adapters
// applied (../shared/golden/lora), on every kernel target; several adapters
// per engine bound per session; versions that the prefix cache respects;
// batched rows with different adapter sets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/lora.h"
#include "platform/error.h"
#include "runtime/batch.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

std::string lora_path(const std::string& name) { return test::shared_path("golden/lora/" + name); }

std::unique_ptr<Engine> make_engine(const std::string& model, Isa isa = best_isa(), bool prefix_cache = false) {
  EngineOptions o;
  o.model_path = test::model_path(model + ".gguf");
  o.n_threads = 2;
  o.isa = isa;
  o.prefix_cache = prefix_cache;
  return std::make_unique<Engine>(o);
}

// Logits after every token of prompt + greedy continuation, as the
// reference produced them (prompt as one prefill, then one decode step per
// token), with the reference's F16 attention arithmetic.
std::vector<float> all_logits(Session& s, const test::GoldenCase& c) {
  std::vector<float> out, step;
  s.feed(c.prompt_tokens, &out);
  const size_t steps = c.logits.size() - c.prompt_tokens.size();
  for (size_t i = 0; i < steps && i < c.greedy_tokens.size(); ++i) {
    const TokenId one[1] = {c.greedy_tokens[i]};
    s.feed(one, &step);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

double nmse(const float* got, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    err += d * d;
    norm += double(ref[i]) * ref[i];
  }
  return err / std::max(norm, 1e-30);
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

struct GoldenLora {
  std::string golden;  // file in golden/lora
  std::string model;   // base model in models/
  std::vector<std::pair<std::string, float>> adapters;
  double max_nmse;
  double min_top1;
};

struct Param {
  GoldenLora g;
  Isa isa;
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.g.golden << " on " << isa_name(p.isa); }

std::string param_name(const testing::TestParamInfo<Param>& p) {
  std::string s = p.param.g.golden + "_" + std::string(isa_name(p.param.isa));
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::vector<Param> golden_params() {
  const std::vector<GoldenLora> cases = {
      {"stories260K.lora-r4", "stories260K", {{"stories260K.lora-r4.gguf", 1.0f}}, 1e-5, 0.98},
      {"tiny-llama-f16.lora-r8", "tiny-llama-f16", {{"tiny-llama.lora-r8.gguf", 1.0f}}, 1e-5, 0.98},
      {"tiny-qwen3-q8_0.lora-r8-f16.s0.5", "tiny-qwen3-q8_0", {{"tiny-qwen3.lora-r8-f16.gguf", 0.5f}}, 4e-3, 0.90},
      {"tiny-qwen3-f16.two-adapters",
       "tiny-qwen3-f16",
       {{"tiny-qwen3.lora-r8-f16.gguf", 1.0f}, {"tiny-qwen3.lora-r4-qv.gguf", -0.7f}},
       1e-5,
       0.98},
  };
  std::vector<Param> p;
  for (Isa isa : supported_isas())
    for (const GoldenLora& g : cases) p.push_back({g, isa});
  return p;
}

class LoraGolden : public testing::TestWithParam<Param> {};

// The reference engine's logits with the adapters applied at the golden
// scales: normalised error per position and top-1 agreement, with the
// bounds the base models' golden tests hold (adapters in F32 here; the
// reference rounds the input of an F16 adapter's products to F16).
TEST_P(LoraGolden, LogitsMatchTheReference) {
  const GoldenLora& g = GetParam().g;
  auto engine = make_engine(g.model, GetParam().isa);
  std::vector<AdapterBinding> binds;
  for (const auto& [file, scale] : g.adapters) {
    const AdapterInfo info = engine->adapters().load(lora_path(file));
    binds.push_back({info.name, scale});
  }
  SessionOptions so;
  so.f16_attention = true;
  const int64_t V = engine->config().n_vocab;
  int agree = 0, total = 0;
  double worst = 0;
  for (const test::GoldenCase& c : test::load_golden_file(lora_path(g.golden + ".jsonl"))) {
    Session s(*engine, so);
    s.set_adapters(binds);
    const std::vector<float> got = all_logits(s, c);
    ASSERT_EQ(got.size(), c.logits.size() * V);
    for (size_t pos = 0; pos < c.logits.size(); ++pos) {
      const double e = nmse(&got[pos * V], c.logits[pos]);
      worst = std::max(worst, e);
      EXPECT_LE(e, g.max_nmse) << c.prompt << " position " << pos;
      agree += argmax(&got[pos * V], V) == argmax(c.logits[pos].data(), V);
      ++total;
    }
  }
  RecordProperty("worst_nmse", std::to_string(worst));
  std::printf("%s on %s: worst NMSE %.3g, top-1 %d/%d\n", g.golden.c_str(), std::string(isa_name(GetParam().isa)).c_str(),
              worst, agree, total);
  EXPECT_GE(agree, g.min_top1 * total) << agree << " of " << total << " positions agree on the top token";
}
INSTANTIATE_TEST_SUITE_P(Golden, LoraGolden, testing::ValuesIn(golden_params()), param_name);


// Without the adapters the same prompts are far from the golden logits: the
// test above would fail if the adapters were not applied.
TEST(Lora, TheAdaptersChangeTheLogitsWellPastTheBound) {
  auto engine = make_engine("tiny-llama-f16");
  SessionOptions so;
  so.f16_attention = true;
  const int64_t V = engine->config().n_vocab;
  const auto cases = test::load_golden_file(lora_path("tiny-llama-f16.lora-r8.jsonl"));
  Session s(*engine, so);
  std::vector<float> got;
  s.feed(cases[0].prompt_tokens, &got);
  double worst = 0;
  for (size_t pos = 0; pos < cases[0].prompt_tokens.size(); ++pos) worst = std::max(worst, nmse(&got[pos * V], cases[0].logits[pos]));
  EXPECT_GT(worst, 1e-3);
}

std::vector<TokenId> prompt_tokens(const Engine& e, int n, int seed = 1) {
  std::vector<TokenId> t;
  uint32_t x = 12345u * static_cast<uint32_t>(seed);
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<TokenId>(1 + (x >> 8) % static_cast<uint32_t>(e.config().n_vocab - 1)));
  }
  return t;
}

std::vector<float> logits_of(Session& s, std::span<const TokenId> toks) {
  const std::span<const float> l = s.feed(toks);
  return {l.begin(), l.end()};
}

// Scale 0 and no binding give the base model's logits bit for bit (base
// weights are never modified); a bound adapter changes them.
TEST(Lora, BaseLogitsAreUntouched) {
  auto engine = make_engine("tiny-qwen3-f16");
  const std::vector<TokenId> p = prompt_tokens(*engine, 40);
  Session base(*engine);
  const std::vector<float> want = logits_of(base, p);
  const std::string name = engine->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf")).name;
  Session zero(*engine);
  zero.set_adapters({{name, 0.0f}});
  EXPECT_EQ(logits_of(zero, p), want);
  Session unbound(*engine);
  EXPECT_EQ(logits_of(unbound, p), want);
  Session with(*engine);
  with.set_adapters({{name, 1.0f}});
  EXPECT_NE(logits_of(with, p), want);
  EXPECT_EQ(with.adapters().size(), 1u);
}

// An F16 file stays F16 in memory (half the bytes of its F32 form) and gives
// the logits of the same values stored as F32, bit for bit (widening is
// exact and the kernels' F16 variants do the F32 arithmetic), batched prefill
// and decode alike; an F32 file stays F32.
TEST(Lora, F16FileIsKeptAsF16WithTheLogitsOfF32) {
  auto engine = make_engine("tiny-qwen3-f16");
  auto f16 = load_lora_gguf(lora_path("tiny-qwen3.lora-r8-f16.gguf"), engine->config(), engine->allocator());
  for (const LoraPair& pr : f16->pairs) ASSERT_EQ(pr.dtype, DType::kF16);
  test::TempDir dir;
  write_lora_gguf(*f16, dir.file("f32.gguf"), DType::kF32);
  auto f32 = load_lora_gguf(dir.file("f32.gguf"), engine->config(), engine->allocator());
  for (const LoraPair& pr : f32->pairs) ASSERT_EQ(pr.dtype, DType::kF32);
  EXPECT_EQ(2 * f16->bytes(), f32->bytes());
  const std::string a = engine->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf"), "h").name;
  const std::string b = engine->adapters().load(dir.file("f32.gguf"), "f").name;
  const std::vector<TokenId> p = prompt_tokens(*engine, 24);
  Session sa(*engine), sb(*engine);
  sa.set_adapters({{a, 0.8f}});
  sb.set_adapters({{b, 0.8f}});
  EXPECT_EQ(logits_of(sa, p), logits_of(sb, p));
  const std::vector<TokenId> q = prompt_tokens(*engine, 3, 2);
  for (TokenId t : q) {
    const TokenId one[1] = {t};
    EXPECT_EQ(logits_of(sa, one), logits_of(sb, one));
  }
}

// A conversation that binds adapters between turns recomputes its KV under
// the new set: the next logits equal a conversation that ran under that set
// from the start.
TEST(Lora, RebindingBetweenTurnsRecomputesTheKv) {
  auto engine = make_engine("tiny-llama-f16");
  const std::string name = engine->adapters().load(lora_path("tiny-llama.lora-r8.gguf")).name;
  const std::vector<TokenId> p = prompt_tokens(*engine, 30), q = prompt_tokens(*engine, 5, 2);
  std::vector<TokenId> pq = p;
  pq.insert(pq.end(), q.begin(), q.end());
  Session fresh(*engine);
  fresh.set_adapters({{name, 1.0f}});
  const std::vector<float> want = logits_of(fresh, pq);

  Session s(*engine);
  s.feed(p);
  const int64_t run = s.tokens_run();
  s.set_adapters({{name, 1.0f}});
  EXPECT_EQ(logits_of(s, q), want);
  EXPECT_EQ(s.tokens_run() - run, static_cast<int64_t>(pq.size()));  // every token again
  EXPECT_EQ(s.tokens().size(), pq.size());
  // The same set again: only the new tokens run.
  const int64_t before = s.tokens_run();
  s.feed(q);
  EXPECT_EQ(s.tokens_run() - before, static_cast<int64_t>(q.size()));
}

// Rows of one batched step with different adapter sets each get what their
// session gets decoded alone.
TEST(Lora, BatchedRowsWithDifferentAdaptersMatchEachAlone) {
  auto engine = make_engine("tiny-qwen3-f16");
  const std::string a = engine->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf")).name;
  const std::string b = engine->adapters().load(lora_path("tiny-qwen3.lora-r4-qv.gguf")).name;
  const std::vector<std::vector<AdapterBinding>> sets = {{}, {{a, 1.0f}}, {{a, 1.0f}, {b, -0.7f}}, {{b, 0.5f}}};
  const std::vector<TokenId> p = prompt_tokens(*engine, 20);
  GenerateOptions go;
  go.max_tokens = 8;
  go.sampling.temperature = 0;
  // Alone.
  std::vector<std::vector<TokenId>> alone;
  for (const auto& set : sets) {
    Session s(*engine);
    s.set_adapters(set);
    alone.push_back(generate(s, p, go, nullptr).tokens);
  }
  // Together, one step for all four per token.
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::unique_ptr<Generation>> gens;
  for (const auto& set : sets) {
    sessions.push_back(std::make_unique<Session>(*engine));
    sessions.back()->set_adapters(set);
    gens.push_back(std::make_unique<Generation>(*sessions.back(), p, go, nullptr));
  }
  std::vector<Generation*> g;
  for (auto& x : gens) g.push_back(x.get());
  while (step_generations(*engine, g) > 0) {
  }
  for (size_t i = 0; i < sets.size(); ++i) EXPECT_EQ(gens[i]->stats().tokens, alone[i]) << "set " << i;
  // Different sets do give different answers (the rows are not all the base).
  EXPECT_NE(alone[0], alone[1]);
  EXPECT_NE(alone[1], alone[2]);
}

// The prefix cache never returns KV made under another adapter, another
// version of it or another scale; under the same ones reuse is bit-exact.
TEST(Lora, PrefixCacheRespectsAdaptersVersionsAndScales) {
  auto engine = make_engine("tiny-llama-f16", best_isa(), /*prefix_cache=*/true);
  AdapterRegistry& reg = engine->adapters();
  const AdapterInfo v1 = reg.load(lora_path("tiny-llama.lora-r8.gguf"), "agent");
  const std::vector<TokenId> p = prompt_tokens(*engine, 600);  // two full chunks of 256
  auto run = [&](std::vector<AdapterBinding> set, int64_t* reused) {
    Session s(*engine);
    s.set_adapters(std::move(set));
    std::vector<float> l = logits_of(s, p);
    *reused = s.reused_tokens();
    return l;
  };
  int64_t reused = -1;
  const std::vector<float> first = run({{"agent", 1.0f}}, &reused);
  EXPECT_EQ(reused, 0);
  EXPECT_EQ(run({{"agent", 1.0f}}, &reused), first);  // a hit, bit-exact
  EXPECT_EQ(reused, 512);
  run({}, &reused);  // the base model
  EXPECT_EQ(reused, 0);
  run({{"agent", 0.5f}}, &reused);  // another scale
  EXPECT_EQ(reused, 0);

  // A new version under the same name (other bytes): staged, then published.
  test::TempDir dir;
  {
    auto changed = load_lora_gguf(lora_path("tiny-llama.lora-r8.gguf"), engine->config(), engine->allocator());
    changed->pairs[0] = widen_lora_pair(changed->pairs[0], engine->allocator());
    changed->pairs[0].bt.as<float>()[0] += 0.25f;
    write_lora_gguf(*changed, dir.file("agent-v2.gguf"));
  }
  const AdapterInfo v2 = reg.load(dir.file("agent-v2.gguf"), "agent", /*publish=*/false);
  EXPECT_EQ(v2.version, v1.version + 1);
  EXPECT_NE(v2.digest, v1.digest);
  EXPECT_FALSE(v2.published);
  EXPECT_EQ(run({{"agent", 1.0f}}, &reused), first);  // by name: still version 1
  EXPECT_EQ(reused, 512);
  const std::vector<float> staged = run({{"agent", 1.0f, v2.version}}, &reused);  // by version
  EXPECT_EQ(reused, 0);
  EXPECT_NE(staged, first);
  reg.publish("agent", v2.version);
  EXPECT_EQ(run({{"agent", 1.0f}}, &reused), staged);  // published: version 2's KV
  EXPECT_EQ(reused, 512);
  // Loading the same bytes again is the same version, not a new one.
  EXPECT_EQ(reg.load(dir.file("agent-v2.gguf"), "agent").version, v2.version);
}

// A turn in flight finishes on the version it started with; the next turn
// takes the newly published one.
TEST(Lora, PublishingBetweenStepsLeavesTheRunningTurnOnItsVersion) {
  auto engine = make_engine("tiny-llama-f16");
  AdapterRegistry& reg = engine->adapters();
  const AdapterInfo v1 = reg.load(lora_path("tiny-llama.lora-r8.gguf"), "agent");
  test::TempDir dir;
  {
    auto changed = load_lora_gguf(lora_path("tiny-llama.lora-r8.gguf"), engine->config(), engine->allocator());
    for (LoraPair& pr : changed->pairs) {
      pr = widen_lora_pair(pr, engine->allocator());
      pr.bt.as<float>()[1] *= 2.0f;
    }
    write_lora_gguf(*changed, dir.file("v2.gguf"));
  }
  const std::vector<TokenId> p = prompt_tokens(*engine, 12);
  GenerateOptions go;
  go.max_tokens = 10;
  go.sampling.temperature = 0;
  std::vector<TokenId> want_v1;
  {
    Session s(*engine);
    s.set_adapters({{"agent", 1.0f}});
    want_v1 = generate(s, p, go, nullptr).tokens;
  }
  Session s(*engine);
  s.set_adapters({{"agent", 1.0f}});
  Generation g(s, p, go, nullptr);
  g.step();  // prefill
  g.step();
  const AdapterInfo v2 = reg.load(dir.file("v2.gguf"), "agent");  // published at once
  EXPECT_TRUE(v2.published);
  while (g.step()) {
  }
  EXPECT_EQ(g.stats().tokens, want_v1);
  EXPECT_EQ(s.adapters()[0].v->version, v1.version);
  const std::vector<TokenId> more = prompt_tokens(*engine, 3, 3);
  s.feed(more);
  EXPECT_EQ(s.adapters()[0].v->version, v2.version);

  // Unloading: a bound name can no longer start a turn, and says why.
  reg.unload("agent");
  try {
    s.feed(more);
    FAIL() << "a turn ran with an unloaded adapter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no adapter named 'agent'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.tokens().size(), p.size() + g.stats().tokens.size() + more.size());  // the failed turn added nothing
}

// An adapter is its own unit in the ledger: footprint() shows its bytes
// until the last version is unloaded and no turn holds it.
TEST(Lora, FootprintCountsAdapterBytes) {
  auto engine = make_engine("tiny-qwen3-f16");
  EXPECT_EQ(engine->footprint().adapters, 0u);
  const AdapterInfo a = engine->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf"));
  EXPECT_GT(a.bytes, 0u);
  EXPECT_EQ(engine->footprint().adapters, a.bytes);
  EXPECT_EQ(engine->footprint().total(), static_cast<uint64_t>(engine->ledger().total()));
  {
    Session s(*engine);
    s.set_adapters({{a.name, 1.0f}});
    s.feed(prompt_tokens(*engine, 4));
    engine->adapters().unload(a.name);
    EXPECT_EQ(engine->footprint().adapters, a.bytes);  // the session's turn still holds it
  }
  EXPECT_EQ(engine->footprint().adapters, 0u);
}

// A session file records the adapters its KV was made with: loaded into a
// session bound to others, its tokens are kept and its KV recomputed.
TEST(Lora, SessionFilesKeepAdapterKvApart) {
  auto engine = make_engine("tiny-llama-f16");
  const std::string name = engine->adapters().load(lora_path("tiny-llama.lora-r8.gguf")).name;
  const std::vector<TokenId> p = prompt_tokens(*engine, 20), q = prompt_tokens(*engine, 4, 5);
  test::TempDir dir;
  Session a(*engine);
  a.set_adapters({{name, 1.0f}});
  a.feed(p);
  a.save(dir.file("s.ebbs"));
  std::vector<float> want;
  {
    a.feed(q);
    const auto l = a.last_logits();
    want.assign(l.begin(), l.end());
  }
  Session same(*engine);
  same.set_adapters({{name, 1.0f}});
  same.load(dir.file("s.ebbs"));
  EXPECT_EQ(same.n_processed(), static_cast<int64_t>(p.size()));
  EXPECT_EQ(logits_of(same, q), want);
  Session base(*engine);
  base.load(dir.file("s.ebbs"));
  EXPECT_EQ(base.n_processed(), 0);
  EXPECT_EQ(base.tokens().size(), p.size());
}

std::string load_error(const std::string& model, const std::string& adapter) {
  auto engine = make_engine(model);
  try {
    engine->adapters().load(adapter);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Hostile or mismatched adapter files are refused with a message naming the
// file, the tensor and the expected and found shapes.
TEST(Lora, BadAdaptersAreRefusedWithAMessage) {
  std::string e = load_error("tiny-qwen3-f16", lora_path("stories260K.lora-r4.gguf"));
  EXPECT_NE(e.find("architecture 'llama'"), std::string::npos) << e;
  EXPECT_NE(e.find("'qwen3'"), std::string::npos) << e;
  // Same architecture, other shapes.
  e = load_error("stories260K", lora_path("tiny-llama.lora-r8.gguf"));
  EXPECT_NE(e.find("tiny-llama.lora-r8.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("has shape ["), std::string::npos) << e;
  EXPECT_NE(e.find("expected ["), std::string::npos) << e;
  // A model file is not an adapter.
  e = load_error("stories260K", test::model_path("stories260K.gguf"));
  EXPECT_NE(e.find("not an adapter"), std::string::npos) << e;
  e = load_error("stories260K", "/nonexistent/adapter.gguf");
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;

  // A missing half of a pair.
  test::TempDir dir;
  auto engine = make_engine("stories260K");
  const ModelConfig& c = engine->config();
  {
    GgufWriter w;
    w.set_string("general.type", "adapter");
    w.set_string("general.architecture", "llama");
    w.set_string("adapter.type", "lora");
    w.set_float32("adapter.lora.alpha", 8.0f);
    w.add_tensor("blk.0.attn_q.weight.lora_a", {c.n_embd, 4}, DType::kF32);
    w.write(dir.file("half.gguf"), [&](size_t, uint8_t* dst) { std::memset(dst, 0, c.n_embd * 4 * sizeof(float)); });
  }
  try {
    engine->adapters().load(dir.file("half.gguf"));
    FAIL() << "a half pair was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("'blk.0.attn_q.weight.lora_b' is missing"), std::string::npos) << err.what();
  }
  // NaN in a tensor.
  {
    GgufWriter w;
    w.set_string("general.type", "adapter");
    w.set_string("general.architecture", "llama");
    w.set_string("adapter.type", "lora");
    w.add_tensor("blk.0.attn_v.weight.lora_a", {c.n_embd, 2}, DType::kF32);
    w.add_tensor("blk.0.attn_v.weight.lora_b", {2, c.kv_dim()}, DType::kF32);
    w.write(dir.file("nan.gguf"), [&](size_t i, uint8_t* dst) {
      const size_t n = i == 0 ? c.n_embd * 2 : 2 * c.kv_dim();
      auto* f = reinterpret_cast<float*>(dst);
      for (size_t k = 0; k < n; ++k) f[k] = 0.01f;
      if (i == 1) f[3] = std::nanf("");
    });
  }
  try {
    engine->adapters().load(dir.file("nan.gguf"));
    FAIL() << "a NaN adapter was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("NaN"), std::string::npos) << err.what();
  }
  EXPECT_TRUE(engine->adapters().empty());
}

// The CLI: --lora and --lora-scaled on ebb run, /lora in ebb chat.
TEST(LoraCli, RunAppliesAdaptersAndScaleZeroIsTheBase) {
  const std::string m = " -m " + test::model_path("stories260K.gguf") + " -p 'Once upon a time' -n 16 --temp 0 ";
  const std::string ad = lora_path("stories260K.lora-r4.gguf");
  const test::CliResult base = test::run_cli("run" + m);
  ASSERT_EQ(base.status, 0) << base.err;
  const test::CliResult with = test::run_cli("run" + m + "--lora " + ad);
  ASSERT_EQ(with.status, 0) << with.err;
  EXPECT_NE(with.err.find("adapters "), std::string::npos) << with.err;  // the summary's memory
  const test::CliResult zero = test::run_cli("run" + m + "--lora-scaled " + ad + " 0");
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_EQ(zero.out, base.out);
  const test::CliResult strong = test::run_cli("run" + m + "--lora-scaled " + ad + " 8");
  ASSERT_EQ(strong.status, 0) << strong.err;
  EXPECT_NE(strong.out, base.out);  // a strong adapter changes the story
  const test::CliResult missing = test::run_cli("run" + m + "--lora /nonexistent/a.gguf");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("'/nonexistent/a.gguf' does not exist"), std::string::npos) << missing.err;
  const test::CliResult bad_scale = test::run_cli("run" + m + "--lora-scaled " + ad + " lots");
  EXPECT_EQ(bad_scale.status, 2) << bad_scale.err;
  EXPECT_NE(bad_scale.err.find("the scale must be a number"), std::string::npos) << bad_scale.err;
}

TEST(LoraCli, ChatBindsUnbindsAndScales) {
  const std::string ad = lora_path("stories260K.lora-r4.gguf");
  const test::CliResult r = test::run_cli(
      "chat -m " + test::model_path("stories260K.gguf") + " -n 4 --temp 0 --threads 1",
      "/lora\n/lora load " + ad + "\n/lora\n/lora bind stories260K.lora-r4 0.5\nLily\n/lora scale stories260K.lora-r4 2\n"
      "/lora bind nosuch\n/lora unbind all\n/lora frobnicate\n/quit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("no adapters loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loaded stories260K.lora-r4 v1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  stories260K.lora-r4 v1: q k v o gate up down, rank 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("adapters: stories260K.lora-r4 x0.5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("adapters: stories260K.lora-r4 x2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no adapter named 'nosuch' is loaded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("adapters: none (the base model)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("usage: /lora"), std::string::npos) << r.err;
}

// For F32 weights, merging s · k · B A into W gives the same logits as
// applying the adapter beside W (a check independent of the goldens).
TEST(Lora, MergedIntoF32WeightsGivesTheSameLogits) {
  const std::string model = test::model_path("stories260K.gguf");  // F32 weights
  auto engine = make_engine("stories260K");
  const std::string name = engine->adapters().load(lora_path("stories260K.lora-r4.gguf")).name;
  const std::vector<TokenId> p = prompt_tokens(*engine, 40);
  Session s(*engine);
  s.set_adapters({{name, 0.8f}});
  std::vector<float> want;
  s.feed(p, &want);

  auto file = GgufFile::open(model);
  Ledger ledger;
  Allocator alloc(&ledger);
  auto lora = load_lora_gguf(lora_path("stories260K.lora-r4.gguf"), engine->config(), alloc);
  GgufWriter w;
  for (const auto& [k, v] : file->metadata())
    if (k != "general.alignment") w.set(k, v);
  w.alignment = file->alignment();
  for (const GgufTensorInfo& t : file->tensors()) w.add_tensor(t.name, t.dims, t.type);
  test::TempDir dir;
  w.write(dir.file("merged.gguf"), [&](size_t i, uint8_t* dst) {
    const GgufTensorInfo& t = file->tensors()[i];
    file->read(t.file_offset, dst, t.n_bytes);
    for (const LoraPair& pr : lora->pairs) {
      if (lora_base_tensor_name(pr.layer, pr.target) != t.name) continue;
      ASSERT_EQ(t.type, DType::kF32);
      auto* W = reinterpret_cast<float*>(dst);  // [n_out rows, n_in]
      const float sc = 0.8f * pr.scale;
      for (int64_t o = 0; o < pr.n_out; ++o)
        for (int64_t k = 0; k < pr.n_in; ++k) {
          double d = 0;
          for (int64_t j = 0; j < pr.rank; ++j) d += double(pr.bt_at(j * pr.n_out + o)) * pr.a_at(j * pr.n_in + k);
          W[o * pr.n_in + k] += static_cast<float>(sc * d);
        }
    }
  });
  EngineOptions o;
  o.model_path = dir.file("merged.gguf");
  o.n_threads = 2;
  Engine merged(o);
  Session m(merged);
  std::vector<float> got;
  m.feed(p, &got);
  ASSERT_EQ(got.size(), want.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  EXPECT_LT(err / norm, 1e-9);
  // ... and differs from the base model by far more.
  Session b(*engine);
  std::vector<float> base;
  b.feed(p, &base);
  double db = 0;
  for (size_t i = 0; i < base.size(); ++i) db += (double(base[i]) - want[i]) * (double(base[i]) - want[i]);
  EXPECT_GT(db / norm, 1e-6);
}

// ---- eviction: an adapter is its own memory unit ------------------------------------

// Engine::evict drops the tensors of an adapter no turn holds (sessions
// between turns unpin theirs) before anything else; the next turn that
// binds it re-reads the file and gets the same logits bit for bit.
TEST(LoraEviction, EvictDropsIdleAdapterAndTheNextTurnRestoresItBitExact) {
  auto engine = make_engine("tiny-qwen3-f16");
  test::TempDir dir;
  std::filesystem::copy_file(lora_path("tiny-qwen3.lora-r8-f16.gguf"), dir.file("a.gguf"));
  const AdapterInfo info = engine->adapters().load(dir.file("a.gguf"), "a");
  const uint64_t bytes = engine->footprint().adapters;
  ASSERT_GT(bytes, 0u);
  EXPECT_EQ(bytes, info.bytes);
  const std::vector<TokenId> p = prompt_tokens(*engine, 20), q = prompt_tokens(*engine, 4, 3);
  Session s(*engine);
  s.set_adapters({{"a", 0.9f}});
  const std::vector<float> first = logits_of(s, p);
  const std::vector<float> next = logits_of(s, q);

  const EvictReport r = engine->evict(bytes);
  EXPECT_EQ(r.adapters_dropped, 1);
  EXPECT_GE(r.freed, bytes);
  EXPECT_EQ(r.weights_dropped, 0);  // the adapter alone was enough
  EXPECT_EQ(engine->footprint().adapters, 0u);
  EXPECT_EQ(engine->footprint().adapters_stored, bytes);
  const std::vector<AdapterInfo> l = engine->adapters().list();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_TRUE(l[0].evicted);
  EXPECT_EQ(l[0].bytes, 0u);
  EXPECT_EQ(l[0].version, info.version);
  EXPECT_TRUE(s.adapters().empty());  // unpinned between turns

  // The same session's next turn: restored, the same version, so its KV
  // (made under the same key) is kept and only the new tokens run.
  const int64_t run = s.tokens_run();
  const std::vector<float> again = logits_of(s, q);
  EXPECT_EQ(s.tokens_run() - run, static_cast<int64_t>(q.size()));
  EXPECT_EQ(engine->footprint().adapters, bytes);
  EXPECT_EQ(engine->footprint().adapters_stored, 0u);
  EXPECT_EQ(engine->adapters().list()[0].version, info.version);
  Session fresh(*engine);
  fresh.set_adapters({{"a", 0.9f}});
  EXPECT_EQ(logits_of(fresh, p), first);
  EXPECT_EQ(logits_of(fresh, q), next);
  EXPECT_EQ(logits_of(fresh, q), again);
}

// A version some turn holds, and a version made in memory (no file to come
// back from), stay resident.
TEST(LoraEviction, HeldAndInMemoryVersionsStayResident) {
  auto engine = make_engine("tiny-qwen3-f16");
  engine->adapters().load(lora_path("tiny-qwen3.lora-r8-f16.gguf"), "held");
  LoraInitOptions io;
  io.rank = 4;
  io.b_std = 0.01f;
  engine->adapters().add("trained", init_lora(engine->config(), io, engine->allocator()), true);
  const uint64_t bytes = engine->footprint().adapters;
  {
    const AdapterSet pinned = engine->adapters().resolve(std::vector<AdapterBinding>{{"held", 1.0f}});
    const EvictReport r = engine->evict(1);
    EXPECT_EQ(r.adapters_dropped, 0);
    EXPECT_EQ(engine->footprint().adapters, bytes);
  }
  engine->evict(1);  // now "held" is idle
  const uint64_t trained = engine->footprint().adapters;
  EXPECT_LT(trained, bytes);
  EXPECT_GT(trained, 0u);
  for (const AdapterInfo& a : engine->adapters().list()) EXPECT_EQ(a.evicted, a.name == "held") << a.name;
}

// A file changed on disk after its version was evicted is refused with a
// message naming it, never run as that version; loading it again makes a
// new version.
TEST(LoraEviction, ChangedFileIsDetectedOnRestore) {
  auto engine = make_engine("tiny-qwen3-f16");
  test::TempDir dir;
  std::filesystem::copy_file(lora_path("tiny-qwen3.lora-r8-f16.gguf"), dir.file("a.gguf"));
  const AdapterInfo v1 = engine->adapters().load(dir.file("a.gguf"), "a");
  engine->evict(engine->footprint().adapters);
  ASSERT_TRUE(engine->adapters().list()[0].evicted);
  {
    auto changed = load_lora_gguf(lora_path("tiny-qwen3.lora-r8-f16.gguf"), engine->config(), engine->allocator());
    changed->pairs[0] = widen_lora_pair(changed->pairs[0], engine->allocator());
    changed->pairs[0].bt.as<float>()[0] += 0.25f;
    write_lora_gguf(*changed, dir.file("a.gguf"), DType::kF16);
  }
  Session s(*engine);
  try {
    s.set_adapters({{"a", 1.0f}});
    FAIL() << "a changed file was restored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has changed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.file("a.gguf")), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine->adapters().list()[0].evicted);
  const AdapterInfo v2 = engine->adapters().load(dir.file("a.gguf"), "a");
  EXPECT_EQ(v2.version, v1.version + 1);
  s.set_adapters({{"a", 1.0f}});
  EXPECT_EQ(s.adapters().size(), 0u);  // pinned at the next turn
  s.feed(prompt_tokens(*engine, 5));
  ASSERT_EQ(s.adapters().size(), 1u);
  EXPECT_EQ(s.adapters()[0].v->version, v2.version);
}

}  // namespace
}  // namespace ebb
