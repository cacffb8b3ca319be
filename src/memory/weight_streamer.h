// Budget mode's WeightSource (FlexInfer §3.2-3.3): the tensors a BudgetPlan
// preserves are read once into resident buffers; the others are streamed with
// direct I/O, one request per tensor, into a window of k reused slots.
//
// A pass is a sequence of steps: layer 0 .. layer N-1, then the row ranges of
// a streamed output head. Step g lives in slot g % k. While the forward pass
// computes step g, the reads of steps g+1 .. g+k-1 are in flight; releasing a
// step issues the read of step g+k, which past the head is the next pass's
// layer 0 (weights do not depend on the tokens), so the window wraps.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "memory/budget_plan.h"
#include "model/weight_source.h"
#include "platform/allocator.h"
#include "platform/direct_io.h"

namespace ebb {

class Model;

struct StreamerOptions {
  bool use_uring = true;  // false: I/O threads
  int queue_depth = 8;    // requests in flight
};

class WeightStreamer final : public WeightSource {
 public:
  // Reads the preserved tensors now (throws Error on I/O failure).
  WeightStreamer(const Model& model, const BudgetPlan& plan, Allocator& alloc, StreamerOptions opts = {});
  ~WeightStreamer() override;  // waits for reads in flight
  WeightStreamer(const WeightStreamer&) = delete;
  WeightStreamer& operator=(const WeightStreamer&) = delete;

  void begin_pass(std::span<const int32_t> tokens) override;
  void end_pass() override;
  LayerWeights acquire_layer(int l) override;
  void release_layer(int l) override;
  MatrixRow embedding_row(int32_t t) override;
  // A streamed head is served in parts: each call returns the next row range
  // (GlobalWeights::output.rows < n_vocab), in order.
  GlobalWeights acquire_head() override;
  void release_head() override;

  const BudgetPlan& plan() const { return plan_; }
  uint64_t bytes_streamed() const { return bytes_streamed_; }  // read by the window so far
  uint64_t held_bytes() const;                                 // every buffer this streamer owns
  double io_wait_seconds() const { return io_wait_s_; }        // time the forward pass waited on reads

 private:
  struct Piece {        // one streamed tensor (or head row range) of a step
    int slot = -1;      // layer unit slot; -1 for a head part
    uint64_t file_offset = 0, span_offset = 0, span = 0, dest = 0;  // dest: offset in the window slot
  };
  struct Step {
    std::vector<Piece> pieces;
    int64_t head_row0 = 0, head_rows = 0;  // head parts
  };
  struct SlotState {
    std::optional<uint64_t> ticket;
    int64_t step = -1;  // global step index held by this slot
  };

  void build_steps();
  void load_resident();
  void issue(int64_t g);  // submits step g's reads into slot g % k
  void top_up();          // issues steps up to released_ + k
  uint8_t* wait_step(int64_t g);
  void release_step(int64_t g);
  void drain();  // waits (and forgets) everything in flight

  const Model& model_;
  BudgetPlan plan_;
  Allocator& alloc_;
  DirectFile file_;
  IoEngine io_;
  int k_ = 1;
  std::vector<Step> steps_;  // [steps per pass]
  std::vector<Buffer> resident_;                       // per layer: preserved tensors and norms
  std::vector<std::vector<uint64_t>> resident_off_;    // [layer][slot] offset of the data in resident_[layer]
  Buffer head_, embd_, norm_, rows_, window_;
  uint64_t head_off_ = 0, embd_off_ = 0;
  std::vector<SlotState> slots_;
  int64_t pass_base_ = 0;     // global step of this pass's layer 0
  int64_t next_issue_ = 0;    // global step not yet issued
  int64_t released_ = 0;      // global steps before this are released
  int head_part_ = 0;
  // Embedding rows of the current pass.
  std::vector<int32_t> pass_tokens_;
  std::optional<uint64_t> rows_ticket_;
  size_t row_index_ = 0;
  uint64_t row_slot_bytes_ = 0;
  uint64_t bytes_streamed_ = 0;
  double io_wait_s_ = 0;
};

}  // namespace ebb
