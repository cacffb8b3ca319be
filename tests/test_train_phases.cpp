// Phases finer than a sample (TrainerOptions::phase_layers, phase_head_rows):
// a sample's forward and backward in layer ranges and the output head in row
// ranges give the parameters of whole-sample phases bit for bit, with the
// number of phases the plan says, shorter phases, and a checkpoint resumed
// with another split continuing bit-exactly; and evictions between phases
// (everything, a trim's share, at random boundaries) change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "support.h"
#include "train/trainer.h"

namespace ebb {
namespace {

std::unique_ptr<Engine> make_engine() {
  EngineOptions o;
  o.model_path = test::model_path("stories260K.gguf");
  o.n_threads = 2;
  return std::make_unique<Engine>(o);
}

std::vector<TrainSample> samples_of(const Engine& e) {
  std::vector<TrainSample> out;
  for (int s = 0; s < 4; ++s) {
    TrainSample x;
    const int n = 40 + 13 * s;  // lengths that are not multiples of the head's block
    for (int i = 0; i < n; ++i) {
      x.tokens.push_back(static_cast<int32_t>(1 + (s * 977 + i * 31) % (e.config().n_vocab - 1)));
      x.weights.push_back(i % 5 == 0 ? 0.0f : 1.0f);
    }
    out.push_back(std::move(x));
  }
  return out;
}

TrainerOptions options(int64_t layers, int64_t rows) {
  TrainerOptions o;
  o.init.rank = 4;
  o.adamw.lr = 5e-3f;
  o.adamw.total_steps = 3;
  o.batch = 2;
  o.phase_layers = layers;
  o.phase_head_rows = rows;
  return o;
}

bool same_params(const LoraAdapter& a, const LoraAdapter& b) {
  if (a.pairs.size() != b.pairs.size()) return false;
  for (size_t i = 0; i < a.pairs.size(); ++i) {
    const LoraPair &p = a.pairs[i], &q = b.pairs[i];
    if (p.a.size() != q.a.size() || std::memcmp(p.a.data(), q.a.data(), p.a.size()) != 0) return false;
    if (p.bt.size() != q.bt.size() || std::memcmp(p.bt.data(), q.bt.data(), p.bt.size()) != 0) return false;
  }
  return true;
}

TEST(TrainPhases, LayerAndHeadPiecesGiveTheSameParameters) {
  auto engine = make_engine();
  const std::vector<TrainSample> data = samples_of(*engine);
  Trainer whole(*engine, data, options(0, 0));
  std::vector<double> whole_loss;
  int64_t whole_phases = 0;
  whole.run_steps(3, [&](const PhaseResult& r) {
    ++whole_phases;
    if (r.step_done) whole_loss.push_back(r.loss);
  });
  EXPECT_EQ(whole_phases, 3 * (2 * 2 + 1));

  const int64_t L = engine->config().n_layer;
  for (const auto& [layers, rows] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {2, 0}, {3, 20}}) {
    SCOPED_TRACE("phase_layers " + std::to_string(layers) + ", phase_head_rows " + std::to_string(rows));
    Trainer split(*engine, data, options(layers, rows));
    std::vector<double> loss;
    int64_t forwards = 0, backwards = 0, commits = 0, firsts = 0, tokens = 0;
    split.run_steps(3, [&](const PhaseResult& r) {
      forwards += r.kind == PhaseKind::kForward;
      backwards += r.kind == PhaseKind::kBackward;
      commits += r.kind == PhaseKind::kCommit;
      firsts += r.tokens > 0;
      tokens += r.tokens;
      if (r.step_done) loss.push_back(r.loss);
    });
    EXPECT_TRUE(same_params(whole.params(), split.params())) << "the split phases changed the parameters";
    EXPECT_EQ(loss, whole_loss);  // the same additions in the same order
    // Each of the 6 samples: its layers in pieces forward and backward, and
    // at least one head piece; its tokens counted once.
    const int64_t layer_pieces = (L + layers - 1) / layers;
    EXPECT_EQ(commits, 3);
    EXPECT_EQ(firsts, 6);
    EXPECT_EQ(backwards, 6 * layer_pieces);
    EXPECT_GE(forwards, 6 * (layer_pieces + 1));
    if (rows == 32) {
      EXPECT_GE(forwards, 6 * (layer_pieces + 2));  // 40+ tokens: 2+ blocks of 32
    }
    if (rows == 0) {
      EXPECT_EQ(forwards, 6 * (layer_pieces + 1));
    }
    EXPECT_GT(tokens, 6 * 40);
  }
}

// A step stopped in the middle of a sample's pieces and continued, and a
// checkpoint resumed with another split, end where the whole-sample run does.
TEST(TrainPhases, InterruptedPiecesAndResumedCheckpointsAreBitExact) {
  auto engine = make_engine();
  const std::vector<TrainSample> data = samples_of(*engine);
  Trainer straight(*engine, data, options(0, 0));
  straight.run_steps(3);

  test::TempDir dir;
  Trainer split(*engine, data, options(1, 32));
  split.run_steps(1);
  for (int i = 0; i < 3; ++i) split.run_phase();  // into the next step's first sample
  EXPECT_FALSE(split.at_step_boundary());
  while (!split.at_step_boundary()) split.run_phase();
  split.save_checkpoint(dir.path());
  EXPECT_EQ(split.step(), 2);
  const TrainerOptions other = options(2, 64);
  std::unique_ptr<Trainer> resumed = Trainer::resume(*engine, data, dir.path(), &other);
  resumed->run_steps(1);
  EXPECT_EQ(resumed->step(), 3);
  EXPECT_TRUE(same_params(straight.params(), resumed->params()));
}

TEST(TrainPhases, NegativeSplitsAreRefused) {
  auto engine = make_engine();
  EXPECT_THROW(Trainer(*engine, samples_of(*engine), options(-1, 0)), Error);
  EXPECT_THROW(Trainer(*engine, samples_of(*engine), options(1, -4)), Error);
}

// Evictions between training phases. A phase never keeps a weight unit past
// its end: it acquires each layer through the engine's weight source, which
// restores what an eviction took (training read a dropped unit directly
// before, and the server aborted: "weight unit used while not resident").

// Gives back `fraction` of the footprint total, as POST /v1/memory/evict
// {"fraction": f} and /v1/memory/trim (level 5 running_moderate: 0.10,
// level 80 complete: 1.0) do; returns the weight bytes then out of RAM.
uint64_t evict_share(Engine& e, double fraction) {
  const uint64_t total = e.footprint().total();
  e.evict(std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(fraction * static_cast<double>(total)))));
  return e.footprint().weights_stored;
}

// Everything evicted (fraction 1), or trim level 5's share, then a training
// step: it completes, and its loss and parameters equal those of the same
// step without the eviction bit for bit. Bit for bit because nothing differs
// but where the bytes came from: the restored units hold the file's bytes
// (checked against their checksums at load) in the same layout, and the step
// runs the same kernels in the same order on the same threads.
TEST(TrainPhases, AStepAfterAnEvictionEqualsOneWithout) {
  auto engine = make_engine();
  ASSERT_NE(engine->elastic(), nullptr);
  const std::vector<TrainSample> data = samples_of(*engine);
  Trainer ref(*engine, data, options(0, 0));
  ASSERT_EQ(ref.run_steps(1), 1);
  for (const double fraction : {1.0, 0.10}) {
    SCOPED_TRACE("evicted fraction " + std::to_string(fraction));
    Trainer t(*engine, data, options(0, 0));
    ASSERT_GT(evict_share(*engine, fraction), 0u) << "the eviction dropped no weight layer";
    EXPECT_EQ(t.run_steps(1), 1);
    EXPECT_EQ(t.last_loss(), ref.last_loss());
    EXPECT_TRUE(same_params(ref.params(), t.params()));
    EXPECT_EQ(engine->footprint().weights_stored, 0u) << "the step ran without restoring what it read";
  }
}

// Evictions at random phase boundaries (seeded): between two layer pieces of
// a sample's forward or backward, between its head pieces, between samples
// and before a commit, of random shares of the footprint up to all of it.
// Every step's loss and the parameters equal the un-evicted run's bit for bit.
TEST(TrainPhases, EvictionsAtRandomPhaseBoundariesChangeNothing) {
  auto engine = make_engine();
  const std::vector<TrainSample> data = samples_of(*engine);
  Trainer ref(*engine, data, options(1, 32));
  std::vector<double> ref_loss;
  ref.run_steps(3, [&](const PhaseResult& r) {
    if (r.step_done) ref_loss.push_back(r.loss);
  });
  for (const uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Trainer t(*engine, data, options(1, 32));
    std::vector<double> loss;
    int evictions = 0, mid_step = 0;
    uint64_t most_out = 0;
    while (t.step() < 3) {
      if (rng() % 3 == 0) {
        const double shares[] = {1.0, 0.10, 0.25, 0.5};
        most_out = std::max(most_out, evict_share(*engine, shares[rng() % 4]));
        ++evictions;
        mid_step += !t.at_step_boundary();
      }
      const PhaseResult r = t.run_phase();
      if (r.step_done) loss.push_back(r.loss);
    }
    EXPECT_GE(evictions, 5);
    EXPECT_GE(mid_step, 3);
    EXPECT_GT(most_out, 0u);
    EXPECT_EQ(loss, ref_loss);
    EXPECT_TRUE(same_params(ref.params(), t.params()));
  }
}

}  // namespace
}  // namespace ebb
