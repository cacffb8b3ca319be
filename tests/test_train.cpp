// LoRA training over a frozen base: gradients against finite differences
// (llama, qwen3; F32, F16 and quantized bases), real learning, phases that
// stop and resume bit-exactly, checkpoints, staged versions, and evictions
// and weight streaming between phases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"
#include "train/train_pass.h"
#include "train/trainer.h"

namespace ebb {
namespace {

std::unique_ptr<Engine> make_engine(const std::string& model, int threads = 2) {
  EngineOptions o;
  o.model_path = test::model_path(model + ".gguf");
  o.n_threads = threads;
  return std::make_unique<Engine>(o);
}

TrainSample sample_of(const Engine& e, int n, uint32_t seed, float w = 1.0f) {
  TrainSample s;
  uint32_t x = seed * 2654435761u + 7;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s.tokens.push_back(static_cast<int32_t>(1 + (x >> 8) % static_cast<uint32_t>(e.config().n_vocab - 1)));
    s.weights.push_back(w);
  }
  return s;
}

double loss_of(TrainPass& pass, const TrainSample& s, const LoraAdapter& ad) {
  const double l = pass.forward(s.tokens, s.weights, ad);
  pass.release();
  return l;
}

// A copy of a model file with its F16 matrices widened to F32: on F32
// weights the forward is a smooth function of the adapter (no activation is
// rounded to F16 or 8 bits on the way), so finite differences can check the
// backward to a tight bound.
std::string widen_to_f32(const std::string& model, const test::TempDir& dir) {
  auto file = GgufFile::open(test::model_path(model + ".gguf"));
  GgufWriter w;
  for (const auto& [k, v] : file->metadata())
    if (k != "general.alignment" && k != "general.file_type") w.set(k, v);
  for (const GgufTensorInfo& t : file->tensors()) {
    EXPECT_TRUE(t.type == DType::kF16 || t.type == DType::kF32) << t.name;
    w.add_tensor(t.name, t.dims, DType::kF32);
  }
  const std::string out = dir.file(model + "-f32.gguf");
  std::vector<uint8_t> raw;
  w.write(out, [&](size_t i, uint8_t* dst) {
    const GgufTensorInfo& t = file->tensors()[i];
    raw.resize(t.n_bytes);
    file->read(t.file_offset, raw.data(), t.n_bytes);
    auto* o = reinterpret_cast<float*>(dst);
    if (t.type == DType::kF32) {
      std::memcpy(o, raw.data(), t.n_bytes);
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(raw.data());
      for (uint64_t k = 0; k < t.n_elements; ++k) o[k] = fp16_to_fp32(h[k]);
    }
  });
  return out;
}

struct GradCase {
  std::string model;  // F32 weights (stories260K) or an F16 file widened to F32
  bool widen;
};

class TrainGradients : public testing::TestWithParam<GradCase> {};

// The derivative of forward()'s loss along a random direction of all the
// adapter's parameters equals backward()'s gradient dotted with it (central
// differences), for each of the seven targets alone and all together.
// Weights mix 1, 0 and a negative advantage. (On F16 or quantized bases the
// forward rounds activations, so finite differences there measure the
// rounding; matmul_t, the one part that differs, is checked against double
// for every format in test_train_lora.)
TEST_P(TrainGradients, MatchFiniteDifferencesAlongRandomDirections) {
  test::TempDir dir;
  EngineOptions eo;
  eo.model_path = GetParam().widen ? widen_to_f32(GetParam().model, dir) : test::model_path(GetParam().model + ".gguf");
  eo.n_threads = 2;
  Engine engine(eo);
  TrainSample s = sample_of(engine, 12, 1);
  s.weights[3] = 0.0f;
  s.weights[7] = -0.5f;
  TrainPass pass(engine.model(), engine.isa(), engine.pool(), engine.allocator());
  for (int target = -1; target < kLoraLayerTargets; ++target) {
    LoraInitOptions io;
    io.rank = 3;
    io.alpha = 6;
    io.b_std = 0.05f;  // B != 0, so A has a gradient
    io.seed = 3;
    if (target >= 0) io.targets = {static_cast<LoraTarget>(target)};
    auto ad = init_lora(engine.config(), io, engine.allocator());
    LoraGrads g = make_grads(*ad, engine.allocator());
    pass.forward(s.tokens, s.weights, *ad);
    pass.backward(*ad, 1.0f, g);
    pass.release();
    std::mt19937 rng(11 + target);
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> u;
    double gu = 0;
    for (size_t i = 0; i < ad->pairs.size(); ++i) {
      for (int h = 0; h < 2; ++h) {
        const Buffer& gb = h ? g.dbt[i] : g.da[i];
        std::vector<float> d(gb.size() / sizeof(float));
        for (size_t k = 0; k < d.size(); ++k) {
          d[k] = normal(rng);
          gu += double(gb.as<const float>()[k]) * d[k];
        }
        u.push_back(std::move(d));
      }
    }
    auto shift = [&](float by) {
      size_t q = 0;
      for (LoraPair& p : ad->pairs) {
        for (Buffer* b : {&p.a, &p.bt}) {
          float* x = b->as<float>();
          for (size_t k = 0; k < u[q].size(); ++k) x[k] += by * u[q][k];
          ++q;
        }
      }
    };
    const float eps = 1e-3f;
    shift(eps);
    const double lp = loss_of(pass, s, *ad);
    shift(-2 * eps);
    const double lm = loss_of(pass, s, *ad);
    shift(eps);
    const double fd = (lp - lm) / (2.0 * eps);
    EXPECT_NEAR(fd, gu, 5e-3 * std::fabs(gu) + 1e-2)
        << GetParam().model << ", target " << (target < 0 ? "all" : std::string(lora_target_name(static_cast<LoraTarget>(target))));
    EXPECT_GT(std::fabs(gu), 1e-2);  // a real gradient, not zero against zero
  }
}
INSTANTIATE_TEST_SUITE_P(Models, TrainGradients,
                         testing::Values(GradCase{"stories260K", false}, GradCase{"tiny-llama-f16", true},
                                         GradCase{"tiny-qwen3-f16", true}),
                         [](const testing::TestParamInfo<GradCase>& p) {
                           std::string s = p.param.model;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// On a quantized base (gradients through frozen Q4_K / Q6_K weights as
// Wᵀ dy from dequantized tiles) training still lowers the loss.
// Inference and training run the same layer blocks (runtime/layer_blocks.h)
// and differ only in their products and attention: the training loss of a
// sample equals the cross-entropy of the logits a session gives for it with
// the same adapter bound (F32 KV, so only summation order differs), on a
// model with Q/K norms (qwen3), one with q/k/v biases (qwen2) and a llama.
TEST(Train, LossMatchesTheInferenceLogitsWithTheAdapterBound) {
  for (const char* model : {"tiny-qwen3-f16", "tiny-qwen2-f16", "stories260K"}) {
    SCOPED_TRACE(model);
    auto engine = make_engine(model);
    const TrainSample s = sample_of(*engine, 24, 5);
    LoraInitOptions io;
    io.rank = 4;
    io.b_std = 0.05f;  // B != 0: every projection's adapter changes the result
    io.seed = 9;
    auto ad = init_lora(engine->config(), io, engine->allocator());
    TrainPass pass(engine->model(), engine->isa(), engine->pool(), engine->allocator());
    const double train_loss = loss_of(pass, s, *ad);

    test::TempDir dir;
    write_lora_gguf(*ad, dir.file("a.gguf"));
    const std::string name = engine->adapters().load(dir.file("a.gguf")).name;
    SessionOptions so;
    so.kv_type = DType::kF32;
    Session sess(*engine, so);
    sess.set_adapters({{name, 1.0f}});
    std::vector<float> logits;  // [T, n_vocab]
    sess.feed(s.tokens, &logits);
    const int64_t V = engine->config().n_vocab;
    ASSERT_EQ(logits.size(), s.tokens.size() * static_cast<size_t>(V));
    double infer_loss = 0;
    for (size_t i = 1; i < s.tokens.size(); ++i) {
      const float* z = logits.data() + (i - 1) * static_cast<size_t>(V);  // predicts token i
      double mx = z[0];
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, double(z[j]));
      double sum = 0;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(double(z[j]) - mx);
      infer_loss += s.weights[i] * (mx + std::log(sum) - z[s.tokens[i]]);
    }
    EXPECT_GT(infer_loss, 0.0);
    EXPECT_NEAR(train_loss, infer_loss, 1e-4 * infer_loss) << "training " << train_loss << ", inference " << infer_loss;
  }
}

TEST(Train, LearnsOnAQuantizedBase) {
  auto engine = make_engine("tiny-qwen3-q4_k_m");
  TrainerOptions o;
  o.init.rank = 8;
  o.adamw.lr = 1e-2f;
  o.adamw.total_steps = 15;
  Trainer t(*engine, {sample_of(*engine, 24, 4)}, o);
  double first = -1, last = 0;
  t.run_steps(15, [&](const PhaseResult& r) {
    if (!r.step_done) return;
    if (first < 0) first = r.loss;
    last = r.loss;
  });
  EXPECT_LT(last, 0.7 * first) << first << " -> " << last;
}

// The head's block of rows follows its format: a quantized head (the Q6_K
// token embedding of tiny-qwen3-q4_0, tied) in blocks of 32, as its
// backward dequantizes it once per block; F16 and F32 heads in 16. A pass
// made with the default options uses that block, and an explicit one wins.
TEST(Train, HeadRowsFollowTheHeadsFormat) {
  for (const auto& [model, rows] : std::vector<std::pair<std::string, int64_t>>{
           {"tiny-qwen3-q4_0", 32}, {"tiny-qwen3-f16", 16}, {"stories260K", 16}}) {
    auto engine = make_engine(model);
    EXPECT_EQ(default_head_rows(engine->model()), rows) << model;
    TrainPass pass(engine->model(), engine->isa(), engine->pool(), engine->allocator());
    EXPECT_EQ(pass.head_rows(), rows) << model;
    TrainPassOptions po;
    po.head_rows = 8;
    TrainPass eight(engine->model(), engine->isa(), engine->pool(), engine->allocator(), po);
    EXPECT_EQ(eight.head_rows(), 8) << model;
  }
}

// Recomputing each layer's activations in the backward (checkpointing)
// gives the same gradients bit for bit, with less activation memory.
TEST(Train, RecomputeGivesTheSameGradients) {
  auto engine = make_engine("tiny-qwen3-f16");
  LoraInitOptions io;
  io.rank = 4;
  io.b_std = 0.02f;
  auto ad = init_lora(engine->config(), io, engine->allocator());
  const TrainSample s = sample_of(*engine, 20, 2);
  LoraGrads keep = make_grads(*ad, engine->allocator()), rec = make_grads(*ad, engine->allocator());
  TrainPass a(engine->model(), engine->isa(), engine->pool(), engine->allocator());
  TrainPassOptions ro;
  ro.recompute = true;
  TrainPass b(engine->model(), engine->isa(), engine->pool(), engine->allocator(), ro);
  const double la = a.forward(s.tokens, s.weights, *ad);
  a.backward(*ad, 0.1f, keep);
  const double lb = b.forward(s.tokens, s.weights, *ad);
  b.backward(*ad, 0.1f, rec);
  EXPECT_EQ(la, lb);
  for (size_t i = 0; i < keep.da.size(); ++i) {
    EXPECT_EQ(std::memcmp(keep.da[i].data(), rec.da[i].data(), keep.da[i].size()), 0) << i;
    EXPECT_EQ(std::memcmp(keep.dbt[i].data(), rec.dbt[i].data(), keep.dbt[i].size()), 0) << i;
  }
  EXPECT_LT(b.activation_bytes(20, 4), a.activation_bytes(20, 4));
}

// A pass keeps its buffers from one sample to the next: a sample after a
// longer one (whose values are still in them) gets the loss and gradients of
// a pass that never held anything, in both modes; and they show in
// held_bytes() until release().
TEST(Train, BuffersKeptBetweenSamplesChangeNothing) {
  auto engine = make_engine("tiny-qwen3-f16");
  LoraInitOptions io;
  io.rank = 4;
  io.b_std = 0.02f;
  auto ad = init_lora(engine->config(), io, engine->allocator());
  const TrainSample longer = sample_of(*engine, 40, 5), s = sample_of(*engine, 23, 6);
  for (bool recompute : {false, true}) {
    TrainPassOptions po;
    po.recompute = recompute;
    TrainPass reused(engine->model(), engine->isa(), engine->pool(), engine->allocator(), po);
    TrainPass fresh(engine->model(), engine->isa(), engine->pool(), engine->allocator(), po);
    LoraGrads g0 = make_grads(*ad, engine->allocator()), g1 = make_grads(*ad, engine->allocator());
    reused.forward(longer.tokens, longer.weights, *ad);
    reused.backward(*ad, 0.5f, g0);
    const uint64_t held = reused.held_bytes();
    EXPECT_GE(held, reused.activation_bytes(40, 4) / 2);
    g0.zero();
    const double l0 = reused.forward(s.tokens, s.weights, *ad);
    EXPECT_EQ(reused.held_bytes(), held) << "the shorter sample re-allocated";
    reused.backward(*ad, 0.5f, g0);
    const double l1 = fresh.forward(s.tokens, s.weights, *ad);
    fresh.backward(*ad, 0.5f, g1);
    EXPECT_EQ(l0, l1) << "recompute=" << recompute;
    for (size_t i = 0; i < g0.da.size(); ++i) {
      ASSERT_EQ(std::memcmp(g0.da[i].data(), g1.da[i].data(), g0.da[i].size()), 0) << i;
      ASSERT_EQ(std::memcmp(g0.dbt[i].data(), g1.dbt[i].data(), g0.dbt[i].size()), 0) << i;
    }
    reused.release();
    EXPECT_EQ(reused.held_bytes(), 0u);
  }
}

std::vector<TrainSample> story_samples(const Engine& e) {
  // Supervised: the prompt's tokens weigh 0, the answer's 1.
  EncodeOptions eo;
  eo.add_bos = true;
  std::vector<TrainSample> v;
  for (const char* text : {"Once upon a time, there was a red fox named Zed. Zed liked to dance in the rain.",
                           "One day, a small blue bird sang a song to the moon, and the moon smiled."}) {
    TrainSample s;
    s.tokens = e.tokenizer().encode(text, eo);
    s.weights.assign(s.tokens.size(), 1.0f);
    for (size_t i = 0; i < 4 && i < s.weights.size(); ++i) s.weights[i] = 0.0f;
    v.push_back(std::move(s));
  }
  return v;
}

// Training reduces the loss of its data, and the staged adapter, bound in
// a session, makes the data more likely than the base model does.
TEST(Train, LearnsItsDataAndStagesAVersion) {
  auto engine = make_engine("stories260K");
  std::vector<TrainSample> data = story_samples(*engine);
  TrainerOptions o;
  o.init.rank = 8;
  o.init.alpha = 16;
  o.adamw.lr = 1e-2f;
  o.adamw.warmup_steps = 2;
  o.adamw.total_steps = 40;
  o.batch = 2;
  Trainer t(*engine, data, o);
  double first = -1, last = 0;
  t.run_steps(40, [&](const PhaseResult& r) {
    if (!r.step_done) return;
    if (first < 0) first = r.loss;
    last = r.loss;
  });
  EXPECT_EQ(t.step(), 40);
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
  EXPECT_GT(t.peak_bytes(), 0u);
  EXPECT_EQ(engine->footprint().training, t.bytes_now());

  const AdapterInfo v = t.stage("stories-fox");
  EXPECT_FALSE(engine->adapters().list().empty());
  EXPECT_EQ(v.version, 1u);
  auto nll = [&](std::vector<AdapterBinding> set) {
    Session s(*engine);
    s.set_adapters(std::move(set));
    std::vector<float> l;
    s.feed(data[0].tokens, &l);
    const int64_t V = engine->config().n_vocab;
    double sum = 0;
    for (size_t i = 4; i + 1 < data[0].tokens.size(); ++i) {
      const float* z = l.data() + i * V;
      double m = z[0];
      for (int64_t k = 1; k < V; ++k) m = std::max(m, double(z[k]));
      double e = 0;
      for (int64_t k = 0; k < V; ++k) e += std::exp(z[k] - m);
      sum += m + std::log(e) - z[data[0].tokens[i + 1]];
    }
    return sum;
  };
  EXPECT_LT(nll({{"stories-fox", 1.0f}}), 0.5 * nll({}));
}

// A step interrupted between phases and continued gives the parameters of
// an uninterrupted run bit for bit; so does a checkpoint resumed in a new
// trainer.
TEST(Train, InterruptedAndResumedRunsAreBitExact) {
  auto engine = make_engine("tiny-llama-f16");
  std::vector<TrainSample> data = {sample_of(*engine, 12, 1), sample_of(*engine, 9, 2), sample_of(*engine, 15, 3)};
  TrainerOptions o;
  o.init.rank = 4;
  o.adamw.lr = 5e-3f;
  o.adamw.warmup_steps = 1;
  o.adamw.total_steps = 6;
  o.batch = 2;
  Trainer straight(*engine, data, o);
  straight.run_steps(4);
  auto snap = straight.snapshot();

  Trainer stopped(*engine, data, o);
  stopped.run_steps(1);
  test::TempDir dir;
  stopped.save_checkpoint(dir.path());
  // Into step 2: forward, backward, forward ... then a stop between phases.
  std::vector<PhaseKind> kinds;
  for (int i = 0; i < 3; ++i) kinds.push_back(stopped.run_phase().kind);
  EXPECT_EQ(kinds, (std::vector<PhaseKind>{PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kForward}));
  EXPECT_FALSE(stopped.at_step_boundary());
  EXPECT_EQ(stopped.step(), 1);  // nothing of step 2 is exposed
  EXPECT_THROW(stopped.save_checkpoint(dir.file("mid")), Error);
  stopped.run_steps(3);
  auto b = stopped.snapshot();
  ASSERT_EQ(b->pairs.size(), snap->pairs.size());
  for (size_t i = 0; i < b->pairs.size(); ++i) {
    EXPECT_EQ(std::memcmp(b->pairs[i].a.data(), snap->pairs[i].a.data(), b->pairs[i].a.size()), 0) << i;
    EXPECT_EQ(std::memcmp(b->pairs[i].bt.data(), snap->pairs[i].bt.data(), b->pairs[i].bt.size()), 0) << i;
  }
  EXPECT_EQ(b->digest, snap->digest);

  std::unique_ptr<Trainer> resumed = Trainer::resume(*engine, data, dir.path());
  EXPECT_EQ(resumed->step(), 1);
  resumed->run_steps(3);
  EXPECT_EQ(resumed->snapshot()->digest, snap->digest);

  // A step discarded midway leaves the parameters as they were.
  Trainer d(*engine, data, o);
  d.run_steps(1);
  const uint64_t before = d.snapshot()->digest;
  d.run_phase();
  d.run_phase();
  d.discard_step();
  EXPECT_TRUE(d.at_step_boundary());
  EXPECT_EQ(d.snapshot()->digest, before);

  // The checkpoint's adapter loads in llama.cpp's format, and a corrupt
  // checkpoint is refused.
  auto from_gguf = load_lora_gguf(dir.file("adapter.gguf"), engine->config(), engine->allocator());
  EXPECT_EQ(from_gguf->pairs.size(), snap->pairs.size());
  {
    std::FILE* f = std::fopen(dir.file("trainer.ebbt").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 200, SEEK_SET);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  try {
    Trainer::resume(*engine, data, dir.path());
    FAIL() << "a corrupt checkpoint was resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
  }
}

// phase_target_s sizes the pieces from what was measured: the first step in
// the finest pieces (one layer, one block of head rows), then a target far
// below any layer's cost keeps them, one far above it makes whole samples;
// the parameters are those of whole-sample phases bit for bit.
TEST(Train, PhasesSizedToATarget) {
  auto engine = make_engine("stories260K");
  const int64_t L = engine->config().n_layer, T = 40;
  const std::vector<TrainSample> samples = {sample_of(*engine, T, 1), sample_of(*engine, T, 2)};
  auto phases_of_steps = [&](double target, std::vector<int>& per_step) {
    TrainerOptions o;
    o.phase_target_s = target;
    o.init.b_std = 0.02f;
    Trainer t(*engine, samples, o);
    int n = 0;
    while (t.step() < 3) {
      ++n;
      if (t.run_phase().step_done) per_step.push_back(std::exchange(n, 0));
    }
    return t.params().digest;
  };
  std::vector<int> whole, fine, coarse;
  const uint64_t d0 = phases_of_steps(0, whole), d1 = phases_of_steps(1e-12, fine), d2 = phases_of_steps(1e3, coarse);
  const int64_t hr = default_head_rows(engine->model());
  const int finest = static_cast<int>(2 * L + (T + hr - 1) / hr + 1);  // head rows in the pass's blocks
  EXPECT_EQ(whole, (std::vector<int>{3, 3, 3}));
  EXPECT_EQ(fine, (std::vector<int>{finest, finest, finest}));
  EXPECT_EQ(coarse, (std::vector<int>{finest, 3, 3}));
  EXPECT_EQ(d1, d0);
  EXPECT_EQ(d2, d0);
  TrainerOptions bad;
  bad.phase_target_s = -1;
  EXPECT_THROW(Trainer(*engine, samples, bad), Error);
}

// Each phase reports its kind; estimates are exponential moving averages
// of what was measured; the forward's memory estimate is its activations.
TEST(Train, PhasesCarryEstimates) {
  auto engine = make_engine("stories260K");
  TrainerOptions o;
  o.batch = 2;
  Trainer t(*engine, {sample_of(*engine, 10, 1), sample_of(*engine, 30, 2)}, o);
  PhaseEstimate e = t.next_phase();
  EXPECT_EQ(e.kind, PhaseKind::kForward);
  EXPECT_EQ(e.seconds, 0.0);
  EXPECT_GT(e.bytes, 0u);
  std::vector<PhaseKind> kinds;
  for (int i = 0; i < 5; ++i) kinds.push_back(t.run_phase().kind);
  EXPECT_EQ(kinds, (std::vector<PhaseKind>{PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kForward,
                                           PhaseKind::kBackward, PhaseKind::kCommit}));
  e = t.next_phase();
  EXPECT_GT(e.seconds, 0.0);
  EXPECT_EQ(t.step(), 1);
}

TEST(Train, BadInputIsRefusedWithAMessage) {
  auto engine = make_engine("stories260K");
  TrainerOptions o;
  TrainSample bad;
  bad.tokens = {1, 2, 3};
  bad.weights = {1, 1};
  EXPECT_THROW(Trainer(*engine, {bad}, o), Error);
  bad.weights = {1, 1, 1};
  bad.tokens[1] = 1 << 20;
  try {
    Trainer t(*engine, {bad}, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Trainer(*engine, {}, o), Error);
  o.adamw.lr = -1;
  EXPECT_THROW(Trainer(*engine, {sample_of(*engine, 5, 1)}, o), Error);
}

// ebb train: JSONL in, an adapter llama.cpp's format out, checkpoints that
// --resume continues, errors that name the line.
TEST(TrainCli, TrainsWritesAndResumes) {
  test::TempDir dir;
  {
    std::FILE* f = std::fopen(dir.file("data.jsonl").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"text\": \"Once upon a time, there was a red fox named Zed.\"}\n"
               "{\"prompt\": \"Lily saw\", \"completion\": \" a big red ball in the park.\", \"weight\": 0.5}\n"
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello there.\"}]}\n",
               f);
    std::fclose(f);
  }
  const std::string base = "train -m " + test::model_path("stories260K.gguf") + " --data " + dir.file("data.jsonl") +
                           " --rank 4 --lr 1e-2 --batch-size 3 --threads 2 --checkpoint " + dir.file("ck");
  const test::CliResult r = test::run_cli(base + " --steps 6 -o " + dir.file("a.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step 6/6 | loss "), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("peak training memory"), std::string::npos) << r.err;
  const test::CliResult run = test::run_cli("run -m " + test::model_path("stories260K.gguf") +
                                            " -p 'Once upon a time' -n 8 --temp 0 --lora " + dir.file("a.gguf"));
  EXPECT_EQ(run.status, 0) << run.err;
  const test::CliResult more = test::run_cli(base + " --steps 8 --resume " + dir.file("ck"));
  ASSERT_EQ(more.status, 0) << more.err;
  EXPECT_NE(more.err.find("at step 6"), std::string::npos) << more.err;
  EXPECT_NE(more.out.find("step 8/8"), std::string::npos) << more.out;
  EXPECT_EQ(more.out.find("step 6/8"), std::string::npos) << more.out;  // steps 1-6 are not run again

  {
    std::FILE* f = std::fopen(dir.file("bad.jsonl").c_str(), "w");
    std::fputs("{\"text\": \"fine\"}\n{not json\n", f);
    std::fclose(f);
  }
  const test::CliResult bad = test::run_cli("train -m " + test::model_path("stories260K.gguf") + " --data " +
                                            dir.file("bad.jsonl") + " --steps 1");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("bad.jsonl:2: not valid JSON"), std::string::npos) << bad.err;
}

// Real learning on the real model: stories260K's own stories with "Lily"
// renamed "Zorba" (a name it never writes). A rank-8 adapter trained on 180
// of them lowers the held-out 20's loss by at least 30%, and with it at
// least half the stories it tells from "Once upon a time" (temperature 0.8)
// name Zorba, against none without it.
TEST(Train, LearnsANewNameFromItsOwnStories) {
  auto engine = make_engine("stories260K");
  const Tokenizer& tok = engine->tokenizer();
  EncodeOptions eo;
  eo.add_bos = true;
  const std::vector<TokenId> prompt = tok.encode("Once upon a time", eo);
  auto tell = [&](uint64_t seed, std::vector<AdapterBinding> set) {
    Session s(*engine);
    s.set_adapters(std::move(set));
    GenerateOptions go;
    go.max_tokens = 100;
    go.sampling.temperature = 0.8f;
    go.sampling.seed = seed;
    return "Once upon a time" + generate(s, prompt, go, nullptr).text;
  };
  std::vector<TrainSample> train, held;
  for (uint64_t i = 0; train.size() + held.size() < 200; ++i) {
    std::string story = tell(1000 + i, {});
    if (story.find("Lily") == std::string::npos) continue;
    for (size_t at; (at = story.find("Lily")) != std::string::npos;) story.replace(at, 4, "Zorba");
    TrainSample x;
    x.tokens = tok.encode(story, eo);
    if (x.tokens.size() > 128) x.tokens.resize(128);  // the model's context
    x.weights.assign(x.tokens.size(), 1.0f);
    (train.size() < 180 ? train : held).push_back(std::move(x));
  }
  TrainerOptions o;
  o.init.rank = 8;
  o.init.alpha = 16;
  o.adamw.lr = 5e-3f;
  o.adamw.warmup_steps = 5;
  o.adamw.total_steps = 90;
  o.batch = 8;
  Trainer t(*engine, train, o);
  t.run_steps(90);
  t.stage("zorba");
  auto held_loss = [&](std::vector<AdapterBinding> set) {
    double sum = 0, n = 0;
    const int64_t V = engine->config().n_vocab;
    for (const TrainSample& x : held) {
      Session s(*engine);
      s.set_adapters(set);
      std::vector<float> l;
      s.feed(x.tokens, &l);
      for (size_t i = 0; i + 1 < x.tokens.size(); ++i) {
        const float* z = l.data() + i * V;
        double m = z[0], e = 0;
        for (int64_t k = 1; k < V; ++k) m = std::max(m, double(z[k]));
        for (int64_t k = 0; k < V; ++k) e += std::exp(z[k] - m);
        sum += m + std::log(e) - z[x.tokens[i + 1]];
        ++n;
      }
    }
    return sum / n;
  };
  const double before = held_loss({}), after = held_loss({{"zorba", 1.0f}});
  int named = 0, named_base = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    named += tell(5000 + i, {{"zorba", 1.0f}}).find("Zorba") != std::string::npos;
    named_base += tell(5000 + i, {}).find("Zorba") != std::string::npos;
  }
  std::printf("held-out loss %.4f -> %.4f (%.1f%% lower); stories naming Zorba: %d/20 with the adapter, %d/20 without\n",
              before, after, 100 * (1 - after / before), named, named_base);
  EXPECT_LE(after, 0.7 * before);
  EXPECT_GE(named, 10);
  EXPECT_EQ(named_base, 0);
}

// Evictions at random phase boundaries (seeded) on a quantized base with
// Q/K norms (packed matrices where the target packs), the backward
// recomputing each layer's forward (checkpointing: a backward phase reads
// its layers' frozen weights twice): every step's loss and the parameters
// equal the un-evicted run's bit for bit. Then under a memory limit that
// keeps some layers out of RAM, where the phases stream those layers through
// elastic memory's window (the backward downwards): the same again. Phases
// used to read the units directly and aborted on the first dropped one.
TEST(Train, EvictionsAndStreamingBetweenPhasesChangeNothing) {
  auto engine = make_engine("tiny-qwen3-q4_k_m");
  ASSERT_NE(engine->elastic(), nullptr);
  ASSERT_TRUE(engine->model().layer_unit(0).slots().size() > 0 && engine->config().n_layer >= 2);
  const std::vector<TrainSample> data = {sample_of(*engine, 24, 4), sample_of(*engine, 37, 5)};
  TrainerOptions o;
  o.init.rank = 4;
  o.adamw.lr = 1e-2f;
  o.adamw.total_steps = 3;
  o.batch = 2;
  o.recompute = TrainerOptions::Recompute::kAlways;
  o.phase_layers = 1;
  o.phase_head_rows = 32;
  auto same = [](const LoraAdapter& a, const LoraAdapter& b) {
    for (size_t i = 0; i < a.pairs.size(); ++i) {
      if (std::memcmp(a.pairs[i].a.data(), b.pairs[i].a.data(), a.pairs[i].a.size()) != 0) return false;
      if (std::memcmp(a.pairs[i].bt.data(), b.pairs[i].bt.data(), a.pairs[i].bt.size()) != 0) return false;
    }
    return a.pairs.size() == b.pairs.size();
  };
  Trainer ref(*engine, data, o);
  std::vector<double> ref_loss;
  ref.run_steps(3, [&](const PhaseResult& r) {
    if (r.step_done) ref_loss.push_back(r.loss);
  });

  std::mt19937 rng(7);
  Trainer evicted(*engine, data, o);
  std::vector<double> loss;
  int evictions = 0;
  while (evicted.step() < 3) {
    if (rng() % 4 == 0) {
      const uint64_t total = engine->footprint().total();
      const double share = rng() % 2 ? 1.0 : 0.1 * static_cast<double>(1 + rng() % 5);
      engine->evict(static_cast<uint64_t>(share * static_cast<double>(total)) + 1);
      EXPECT_GT(engine->footprint().weights_stored, 0u);
      ++evictions;
    }
    const PhaseResult r = evicted.run_phase();
    if (r.step_done) loss.push_back(r.loss);
  }
  EXPECT_GE(evictions, 5);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_TRUE(same(ref.params(), evicted.params()));

  // Three fifths of the weights in RAM: the rest streams, phase after phase.
  engine->restore();  // what the last evictions took (before a commit, which reads none)
  const uint64_t weights = engine->elastic()->footprint().weights_resident;
  ASSERT_EQ(engine->elastic()->footprint().weights_stored, 0u);
  engine->set_memory_limit(weights * 3 / 5);
  Trainer streamed(*engine, data, o);
  loss.clear();
  bool streaming = false;
  while (streamed.step() < 3) {
    const PhaseResult r = streamed.run_phase();
    streaming = streaming || engine->elastic()->streaming();
    if (r.step_done) loss.push_back(r.loss);
  }
  EXPECT_TRUE(streaming) << "no layer was streamed";
  EXPECT_GT(engine->footprint().weights_stored, 0u);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_TRUE(same(ref.params(), streamed.params()));
  engine->set_memory_limit(0);
}

// Budget mode streams weights through a forward-only window and the head in
// row ranges: training there is refused with an error that says so.
TEST(Train, BudgetModeRefusesTrainingWithAClearError) {
  EngineOptions eo;
  eo.model_path = test::model_path("stories260K.gguf");
  eo.n_threads = 2;
  eo.budget.budget = uint64_t{1} << 40;
  Engine engine(eo);
  ASSERT_NE(engine.budget_source(), nullptr);
  TrainerOptions o;
  o.init.rank = 4;
  try {
    Trainer t(engine, {sample_of(engine, 12, 1)}, o);
    FAIL() << "training ran in budget mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget mode"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ebb
