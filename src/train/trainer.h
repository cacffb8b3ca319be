// The LoRA trainer (LOCAL §2.2, §4.2, §7.1): trains a private copy of an
// adapter over the engine's frozen base model, in phases a scheduler can
// interleave with serving. A step over `batch` samples is the phases
//
//   forward(sample 1), backward(sample 1), ..., forward(sample B), backward(sample B), commit
//
// (gradient accumulation: one sample per micro-batch), each with an
// estimated duration and memory kept as exponential moving averages of the
// measured ones (α = 0.2). run_phase() runs exactly one; a stop request is
// honoured between phases. An interrupted step exposes nothing: parameters
// change only at its commit phase. Its partial gradients are kept, and the
// next run_phase() continues the step (the result is bit-identical to an
// uninterrupted run); discard_step() drops them and starts the step again.
//
// Versions: the trainer never touches the engine's adapters; stage() adds
// its current parameters to the registry as a staged version (LoRA issue's
// versions), which serving publishes when it decides. Checkpoints hold the
// parameters, the optimizer's moments, the step, the schedule and the data
// position, so resuming is bit-exact; the adapter alone is also written in
// llama.cpp's GGUF adapter format for other engines.
//
// With phase_layers, a sample's forward and backward are themselves several
// phases (layer ranges, then row ranges of the output head; the backward's
// layer ranges from the top), so a phase can be made short enough for a
// scheduler's yield window.
//
// Thread model: one thread runs phases; request_stop() may come from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/lora.h"
#include "runtime/adapters.h"
#include "runtime/engine.h"
#include "train/optimizer.h"
#include "train/train_pass.h"

namespace ebb {

// One sample: tokens and a weight per token. weights[i] weighs the loss of
// predicting tokens[i] from tokens[0..i) (weights[0] is not used): 1 on the
// tokens to learn (a supervised answer), 0 on the rest, a reward or an
// advantage (REINFORCE with a baseline: negative pushes the tokens away).
struct TrainSample {
  std::vector<int32_t> tokens;
  std::vector<float> weights;
};

struct TrainerOptions {
  LoraInitOptions init;   // a new adapter: rank, alpha, targets, seed (B = 0)
  AdamWOptions adamw;
  int64_t batch = 1;      // samples per step (each one micro-batch)
  uint64_t data_seed = 1; // order of the samples, shuffled anew each epoch
  // Activations: kept for every layer, or recomputed layer by layer in the
  // backward (checkpointing). Auto: recompute when keeping a sample's
  // activations would pass memory_limit.
  enum class Recompute { kAuto, kAlways, kNever } recompute = Recompute::kAuto;
  // Bytes the engine and the trainer together may hold (0: the engine's own
  // memory limit if it has one, else no limit). A sample that does not fit
  // even with recomputation is refused with an error.
  uint64_t memory_limit = 0;
  // Phases finer than a sample (0: one forward and one backward phase per
  // sample): the forward and the backward in pieces of `phase_layers`
  // layers, and the output head (logits, loss, its gradient) in pieces of
  // `phase_head_rows` rows (rounded up to the pass's block of rows; 0: the
  // whole head in one phase). The parameters are the same bit for bit.
  int64_t phase_layers = 0;
  int64_t phase_head_rows = 0;
  // With phase_layers 0: phases of about this many seconds (0: off). At each
  // step's start the pieces are sized from measured costs, the EMA of
  // seconds per layer (forward or backward, the larger) and per head row;
  // the first step runs one layer and one block of head rows per phase to
  // measure them. What a scheduler's yield window wants (ebb serve: 0.15 s).
  double phase_target_s = 0;
};

enum class PhaseKind { kForward, kBackward, kCommit };
const char* phase_name(PhaseKind k);

struct PhaseEstimate {
  PhaseKind kind = PhaseKind::kForward;
  double seconds = 0;   // EMA of measured durations (0: never measured)
  uint64_t bytes = 0;   // memory the phase adds while it runs
};

struct PhaseResult {
  PhaseKind kind = PhaseKind::kForward;
  double seconds = 0;
  int64_t step = 0;         // the step it belongs to
  bool step_done = false;   // it was the step's commit
  double loss = 0;          // kCommit: the step's mean weighted loss
  double grad_norm = 0;     // kCommit: before clipping
  float lr = 0;             // kCommit: the learning rate applied
  int64_t tokens = 0;       // kForward: tokens of its sample
};

class Trainer {
 public:
  // A new adapter (init) or, with `start`, continuing an existing one (its
  // pairs are copied; the engine's adapters are never modified).
  Trainer(Engine& engine, std::vector<TrainSample> samples, TrainerOptions opts,
          const LoraAdapter* start = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The phase run_phase() would run next, with its estimate.
  PhaseEstimate next_phase() const;
  PhaseResult run_phase();
  // Runs phases until `steps` more steps are done or a stop is requested
  // (then returns between two phases). Returns the steps completed.
  int64_t run_steps(int64_t steps, const std::function<void(const PhaseResult&)>& on_phase = nullptr);
  void request_stop() { stop_.store(true); }
  void clear_stop() { stop_.store(false); }
  bool at_step_boundary() const { return phase_ == 0; }
  void discard_step();
  // Frees the activations kept between samples (the next sample allocates
  // them again); a job calls it when it ends.
  void release_buffers();

  int64_t step() const { return optimizer_.step(); }
  const LoraAdapter& params() const { return *params_; }
  double last_loss() const { return last_loss_; }
  // Peak bytes of the trainer's own allocations so far (activations, gradients,
  // optimizer state), and now.
  uint64_t peak_bytes() const { return peak_; }
  uint64_t bytes_now() const;

  // Adds the current parameters to the engine's registry under `name` as a
  // new version (staged unless publish). Between phases only.
  AdapterInfo stage(const std::string& name, bool publish = false);
  // A copy of the parameters as an adapter (its digest over the bytes).
  std::unique_ptr<LoraAdapter> snapshot() const;

  // Checkpoints, at a step boundary: DIR/adapter.gguf (llama.cpp's format)
  // and DIR/trainer.ebbt (parameters, moments, step, data position, the
  // optimizer's options and the batch; checksummed). resume() continues
  // bit-exactly with those; the samples must be the same (their digest is
  // checked). override_opts gives the rest (recompute, memory limit).
  void save_checkpoint(const std::string& dir) const;
  static std::unique_ptr<Trainer> resume(Engine& engine, std::vector<TrainSample> samples, const std::string& dir,
                                         const TrainerOptions* override_opts = nullptr);

 private:
  // One phase of the step: which sample of the step (its index in the
  // step) and which piece of its forward or backward.
  struct Piece {
    PhaseKind kind = PhaseKind::kCommit;
    int64_t sample = 0;       // in the step
    bool whole = false;       // forward() or backward() of the whole sample
    bool head = false;        // forward: head rows [a, b) (else layers [a, b))
    int64_t a = 0, b = 0;     // backward: layers b-1 down to a
    bool first = false, last = false;  // of the sample's forward or backward
  };
  Piece piece_at(int phase) const;
  int64_t pieces_of(int64_t T) const;  // a sample's phases (forward and backward)
  void begin_step();
  void plan_pieces();  // step_layers_, step_rows_ for the next step
  size_t sample_at(int64_t cursor) const;
  void track_peak();

  Engine& engine_;
  std::vector<TrainSample> samples_;
  TrainerOptions opts_;
  Allocator alloc_;  // on the engine's ledger
  std::unique_ptr<LoraAdapter> params_;
  LoraGrads grads_;
  AdamW optimizer_;
  std::unique_ptr<TrainPass> pass_;
  bool pass_recompute_ = false;
  std::atomic<bool> stop_{false};

  int64_t cursor_ = 0;            // samples consumed (over epochs) at the step's start
  int phase_ = 0;                 // index in the step's phases: pieces_of() per sample, then the commit
  double step_loss_ = 0;          // Σ w CE over the step's samples so far
  double step_weight_ = 0;        // count of weighted tokens of the whole step (normaliser)
  double last_loss_ = 0;
  double est_[3] = {0, 0, 0};     // EMA seconds per kind
  int64_t step_layers_ = 0;       // this step's layers per piece (0: whole samples)
  int64_t step_rows_ = 0;         // this step's head rows per piece (0: the whole head)
  double layer_s_[2] = {0, 0};    // EMA seconds per layer, forward and backward
  double row_s_ = 0;              // EMA seconds per head row
  uint64_t peak_ = 0;
  uint64_t samples_digest_ = 0;
};

}  // namespace ebb
