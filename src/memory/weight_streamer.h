// Budget mode's WeightSource (FlexInfer §3.2-3.3): the tensors a BudgetPlan
// preserves are read once into resident buffers; the others are streamed with
// direct I/O, one request per tensor, into a window of k reused slots.
//
// A pass is a sequence of steps: layer 0 .. layer N-1, then the row ranges of
// a streamed output head. Step g lives in slot g % k. While the forward pass
// computes step g, the reads of steps g+1 .. g+k-1 are in flight; releasing a
// step issues the read of step g+k, which past the head is the next pass's
// layer 0 (weights do not depend on the tokens), so the window wraps.
//
// Streamed reads are checked against the CRC-32C of each range's first read
// (budget mode loads no weights up front): every pass checks that the file
// descriptor still shows the file as loaded, and checks one step's ranges in
// rotation, so a model file rewritten in place even with its size, inode and
// mtime kept fails a pass within one rotation (steps_per_pass() passes)
// instead of being computed with for ever.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
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

// KV takes what it uses (issue 21 item 7): a plan holds KV for what is in
// use plus a margin, and is re-planned between passes as the KV (the
// allocator's kKvCache bytes, every session's) grows past it or falls far
// below it. Re-planning moves weights out of (or back into) the resident set
// at chunk granularity before the KV that needs the room is written.
struct KvReplan {
  std::function<BudgetPlan(uint64_t kv_bytes)> plan;  // the plan for that much KV (throws Error when impossible)
  uint64_t kv_step = 0;    // bytes of one KV chunk in every layer: the least the KV grows by
  uint64_t kv_margin = 0;  // KV bytes a plan holds beyond those in use (at least kv_step)
  uint64_t kv_cap = 0;     // KV bytes of the whole context: a plan never holds more than this and what is in use (0: no cap)
  bool enabled() const { return static_cast<bool>(plan); }
};

class WeightStreamer final : public WeightSource {
 public:
  // Reads the preserved tensors now (throws Error on I/O failure).
  // With `replan`, the plan follows the KV in use (see KvReplan).
  WeightStreamer(const Model& model, const BudgetPlan& plan, Allocator& alloc, StreamerOptions opts = {},
                 KvReplan replan = {});
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
  double verify_seconds() const { return verify_s_; }          // time spent checksumming streamed steps
  int replans() const { return replans_; }                     // plan changes as the KV grew or shrank

  // Changes the plan between passes: streamed tensors that become preserved
  // are read, preserved ones that become streamed are freed; the window is
  // resized. Throws Error on I/O failure (the streamer is then unusable).
  void set_plan(const BudgetPlan& plan);

 private:
  struct Piece {        // one streamed tensor (or head row range) of a step
    int slot = -1;      // layer unit slot; -1 for a head part
    uint64_t file_offset = 0, span_offset = 0, span = 0, dest = 0;  // dest: offset in the window slot
    uint64_t bytes = 0;  // the tensor's (or row range's) file bytes, from file_offset
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
  void load_resident(const BudgetPlan* old = nullptr);  // old: the plan whose buffers are in place
  void follow_kv();  // re-plans when the KV in use left the plan's range
  void issue(int64_t g);        // the next step: submits step g's reads into slot g % k
  void submit_step(int64_t g);  // submits step g's reads into slot g % k
  void top_up();          // issues steps up to released_ + k
  uint8_t* wait_step(int64_t g);
  // Checks step g's pieces in the window against their first read (takes
  // them on the first); throws Error when the file's bytes changed.
  void verify_step(int64_t g, const uint8_t* slot);
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
  KvReplan replan_;
  int replans_ = 0;
  // CRC-32C of each streamed range as first read, by (file offset, bytes):
  // kept across plan changes.
  std::unordered_map<uint64_t, std::pair<uint64_t, uint32_t>> first_crc_;
  uint64_t bytes_streamed_ = 0;
  double io_wait_s_ = 0;
  double verify_s_ = 0;
};

}  // namespace ebb
