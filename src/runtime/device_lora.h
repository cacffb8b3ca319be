// LoRA adapters on a compute device (runtime/device_forward.h's steps):
// what Forward::apply_lora computes on the CPU, recorded on the step's
// stream. For every adapted projection y = W x of a sequence that binds
// adapters, each adapter adds its own term to that sequence's rows:
//
//   t = A x              matmul: A [rank_p, n_in], t [rows, rank_p]
//   y += s B t           low_rank_up: B [n_out, rank_p], straight into y's
//                        rows at their stride; s = user scale * the pair's
//                        alpha / rank
//
// Two dispatches per adapter per projection per group of rows.
// with the pair's own type (F16 or F32, as the host keeps it; the shaders
// widen F16 exactly and sum in F32). rank_p is the rank rounded up to even
// (the matmul shaders' column step), the padding zero rows of A and zero
// columns of B. token_embd's adapters stay on the host, added to the
// embedding row there (the lookup is a host row copy on a device too).
//
// Uploads: the pairs of an adapter version are uploaded into one device
// buffer (through the backend's ledger) on the first step that binds the
// version, keyed by the version's name and number and by the version object
// itself (a version evicted and re-read, or a name reloaded under a number
// seen before in another registry, is uploaded anew: never another
// version's tensors). An upload is freed when its version is gone (unloaded,
// or its tensors evicted, and no session or turn holds it: collect(), which
// the engine calls when the registry drops a version, and every step), and
// when a step binds another version of its name and not it (a new version
// published by a trainer replaces the old one on the device at the next
// step). So the device holds at most the versions a step binds plus one per
// name.
//
// Not thread-safe: the owner (DeviceForward) serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu.h"
#include "kernels/lora.h"
#include "model/config.h"
#include "runtime/adapters.h"

namespace ebb {

struct StepSeq;

class DeviceLora {
 public:
  DeviceLora(Backend& be, const ModelConfig& cfg, int64_t max_batch, Isa isa);
  DeviceLora(const DeviceLora&) = delete;
  DeviceLora& operator=(const DeviceLora&) = delete;

  // Before a step is recorded: uploads the versions the step binds that the
  // device does not hold, frees the ones replaced or gone, and grows the
  // scratch to the step's largest rank and output. Returns whether any
  // sequence binds an adapter (else record() records nothing). Throws
  // ebb::Error naming the adapter when the device cannot hold or run it.
  bool prepare(std::span<const StepSeq> seqs);

  // Adds token_embd's adapters of `set` to the embedding row of `token`
  // (host memory, as the CPU path does: Forward::run_batch).
  void add_token_embd(const AdapterSet& set, int32_t token, float* x_row) const;  // x_row: [n_embd]

  // Records y += s B (A x) of (layer, target) on the rows of every sequence
  // that binds adapters for it (sequences in step order; consecutive ones
  // binding the same versions at the same scales share one product).
  //   x: [rows, x_stride] F32   y: [rows, y_stride] F32 (y_stride >= n_out)
  // out_rows: the rows are the output head's gathered ones (all_logits ?
  // tokens : 1 per sequence), else every token's.
  void record(BackendStream& s, std::span<const StepSeq> seqs, int layer, LoraTarget target, TensorRef x,
              int64_t x_stride, TensorRef y, int64_t y_stride, bool out_rows = false);

  // Frees the uploads whose version nobody holds any more.
  void collect();

  uint64_t adapter_bytes() const;  // uploads
  uint64_t scratch_bytes() const;  // t
  // Ops recorded for the step last prepared (2 per adapter, projection and
  // group of sequences sharing terms).
  int64_t n_ops_last_step() const { return n_ops_; }
  int64_t n_uploads() const { return static_cast<int64_t>(uploads_.size()); }

 private:
  struct PairAt {  // a pair's place in its version's buffer
    uint64_t a = 0, b = 0;  // byte offsets of A [rank_p, n_in] and B [n_out, rank_p]
    int64_t rank_p = 0;
    bool present = false;  // token_embd pairs are not uploaded
  };
  struct Upload {
    std::weak_ptr<const AdapterVersion> owner;
    std::unique_ptr<BackendBuffer> buf;
    std::vector<PairAt> pairs;  // indexed as the version's lora->pairs
  };
  using Key = std::pair<std::string, uint64_t>;  // name, version
  Upload make_upload(const std::shared_ptr<const AdapterVersion>& v);
  void ensure_scratch(int64_t rank_p);

  Backend& be_;
  const ModelConfig& cfg_;
  int64_t max_batch_;
  const LoraKernels& lk_;
  std::map<Key, Upload> uploads_;
  std::unique_ptr<BackendBuffer> t_;  // [B, rank_cap] F32
  int64_t rank_cap_ = 0;
  int64_t n_ops_ = 0;  // recorded since prepare()
  bool active_ = false;  // the prepared step binds adapters
};

}  // namespace ebb
