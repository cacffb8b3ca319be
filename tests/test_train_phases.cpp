// Phases finer than a sample (TrainerOptions::phase_layers, phase_head_rows):
// a sample's forward and backward in layer ranges and the output head in row
// ranges give the parameters of whole-sample phases bit for bit, with the
// number of phases the plan says, shorter phases, and a checkpoint resumed
// with another split continuing bit-exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
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

}  // namespace
}  // namespace ebb
