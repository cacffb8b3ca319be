// The forward pass on a compute device (backend/backend.h: Vulkan, or the
// CPU backend in tests): every layer's weights and the output head are
// uploaded once into device buffers (one buffer per layer unit, through the
// backend's ledger), each session's KV lives on the device as F16 chunks,
// and a step (prefill micro-batch or decode token, of one or several
// sequences) is recorded on one stream and submitted once. Only the
// embedding lookup (a row copy) and sampling stay on the host: the logits
// rows the callers want are read back.
//
// Forward::run_batch hands its steps here when the engine runs on a device
// (Forward::set_device), so Session, run_step and the scheduler are
// unchanged. The session's KvCache keeps the positions (bookkeeping); its
// rows live here, keyed by the KvCache, until release().
//
// Not yet on the device: LoRA adapters (a step that binds one is refused),
// a split of the layers between device and CPU (all or nothing), eviction
// of the KV and restoration overlapped with the step (evict() and restore()
// below move whole layers' weights, synchronously).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu.h"
#include "model/model.h"
#include "runtime/forward.h"

namespace ebb {

class KvCache;

// What the device holds for an engine, by category (bytes of the buffers
// handed out; the ledger adds the slabs they were cut from).
struct DeviceFootprint {
  std::string id;    // "vulkan:0"
  std::string name;  // the driver's name for the device
  std::vector<uint64_t> weights_per_layer;  // one buffer per layer unit
  uint64_t globals = 0;  // output norm + output head
  uint64_t kv = 0;       // every session's KV chunks
  uint64_t scratch = 0;  // the step's activations, inputs and logits
  MemoryLedger ledger;   // the backend's device ledger (all of the above, exactly)
  uint64_t weights() const;
  uint64_t total() const { return weights() + globals + kv + scratch; }
};

struct DeviceForwardOptions {
  int64_t max_batch = 64;  // rows per step (all sequences together)
  Isa isa = Isa::kScalar;  // the host's kernels for the embedding lookup and format conversion
  uint64_t kv_staging_bytes = 64ull << 20;  // KV transfers' host-visible staging, at most (at least one position)
};

class DeviceForward {
 public:
  // Uploads the model's resident weights. Matrices in a format the device
  // has no matmul for are dequantised to F16 on the way (`converted` lists
  // those formats, so the caller can say so once). Throws ebb::Error naming
  // the device and the limit when the model's shapes or memory do not fit.
  DeviceForward(Backend& be, Model& model, Allocator& alloc, DeviceForwardOptions opts);
  ~DeviceForward();
  DeviceForward(const DeviceForward&) = delete;
  DeviceForward& operator=(const DeviceForward&) = delete;

  // Forward::run_batch's contract (forward.h): each sequence's tokens at
  // positions [kv->n_tokens(), + tokens.size()), its K and V stored on the
  // device, kv->n_tokens() advanced, the wanted logits rows written to
  // seq.logits. One submission for the whole step.
  void run_batch(std::span<const StepSeq> seqs);

  // Frees the device KV of a cache (its session is going away).
  void release(const KvCache* kv);

  // Elastic memory on the device, weights only for now (the sessions' KV
  // stays): evict() frees whole layers' device buffers, the last layer
  // first, until at least `bytes` are given back (the device ledger's delta
  // is returned); restore() uploads every dropped layer again from the model
  // file (through a transient host copy). A step that finds a layer dropped
  // restores it first. Between steps only.
  struct Evicted {
    uint64_t freed = 0;  // device ledger bytes given back
    int64_t layers = 0;
  };
  Evicted evict(uint64_t bytes);
  int64_t restore();  // layers uploaded
  int64_t n_dropped() const;

  // ---- KV transfers (runtime/device_kv.cpp; device_kv.h has the host-side
  // helpers). A session's device KV holds position p of a layer at F16
  // element p * kv_dim of its K (and V) buffer, whatever its chunk size.
  // Rows go through a host-visible staging buffer (at most
  // opts.kv_staging_bytes, kept while the device holds any session's KV): each call records all layers'
  // copies on the step stream and submits once per staging-full of
  // positions (once for a chunk). Between steps only.
  //
  // The caller's side of a block of rows: rows [p, p + n) of one layer's K
  // (v false) or V, [n, kv_dim] F16 in staging memory, read from after a
  // read-back or filled before an upload.
  using KvRows = std::function<void(int64_t layer, bool v, int64_t p, int64_t n, uint16_t* rows)>;
  // Reads positions [p0, p1) (p1 <= kv.n_tokens()) of every layer; `take`
  // sees each block of rows once.
  void read_kv(const KvCache& kv, int64_t p0, int64_t p1, const KvRows& take);
  // Writes positions [p0, p1) of every layer, `fill` providing each block;
  // kv's device KV grows to hold p1; kv.n_tokens() stays the caller's.
  void write_kv(KvCache& kv, int64_t p0, int64_t p1, const KvRows& fill);
  // The same with whole arrays: k, v: [n_layers, p1 - p0, kv_dim] F16.
  void read_kv(const KvCache& kv, int64_t p0, int64_t p1, uint16_t* k, uint16_t* v);
  void write_kv(KvCache& kv, int64_t p0, int64_t p1, const uint16_t* k, const uint16_t* v);
  // The first n positions of src's device KV copied into dst's on the
  // device (no host round trip): a fork.
  void copy_kv(const KvCache& src, KvCache& dst, int64_t n);

  DeviceFootprint footprint() const;
  // The weight formats dequantised to F16 at load ("Q5_0", "IQ4_NL", ...), each once.
  const std::vector<std::string>& converted() const { return converted_; }
  const DeviceInfo& device() const { return be_.info(); }
  Backend& backend() { return be_; }

 private:
  struct Mat {  // a matrix in a layer's buffer
    DType type = DType::kF32;
    int64_t rows = 0, cols = 0;
    uint64_t offset = 0;
  };
  struct Vec {  // a float vector (a bias: replicated max_batch times)
    bool present = false;
    uint64_t offset = 0;
  };
  struct LayerBuf {
    std::unique_ptr<BackendBuffer> buf;
    Mat q, k, v, o, gate, up, down;
    Vec attn_norm, ffn_norm, q_norm, k_norm, q_bias, k_bias, v_bias;
  };
  // One session's KV: per layer a K and a V buffer of cap_chunks chunks
  // ([chunk_size, n_kv_heads, head_dim] F16 each), and the chunk table the
  // shaders read (chunk i at F16 element i * chunk_size * kv_dim).
  struct SeqKv {
    std::vector<std::unique_ptr<BackendBuffer>> k, v;  // [n_layers]
    std::unique_ptr<BackendBuffer> table;              // [cap_chunks] uint32
    int64_t chunk_size = 0;
    int64_t cap_chunks = 0;
    uint64_t bytes() const;
  };

  // Upload helpers: `layout` collects (offset, bytes) of each piece in a
  // layer's buffer before it is allocated.
  struct Staged;
  Mat stage_matrix(Staged& st, const WeightView& w);
  Vec stage_vector(Staged& st, const float* v, int64_t n, int64_t copies = 1);
  std::unique_ptr<BackendBuffer> upload(Staged& st);

  void upload_layer(int l);  // layer l's unit must be resident on the host
  int64_t restore_locked();
  // Grows kv's device KV to hold n positions (copying what it held).
  SeqKv& kv_for(KvCache& kv, int64_t n);
  void record_layer(BackendStream& s, const LayerBuf& w, int l, std::span<const StepSeq> seqs, int64_t n);
  void matmul(BackendStream& s, const LayerBuf& w, const Mat& m, BackendBuffer* x, uint64_t x_off,
              BackendBuffer* y, uint64_t y_off, int64_t n_tokens);

  Backend& be_;
  Model& model_;
  Allocator& alloc_;  // the host's, for a layer's transient copy while it is uploaded again
  const ModelConfig& cfg_;
  DeviceForwardOptions opts_;
  const KernelSet& ks_;
  std::vector<std::string> converted_;
  std::vector<LayerBuf> layers_;
  LayerBuf head_;  // output_norm (as attn_norm) and the output matrix (as o)
  // Step scratch on the device.
  std::unique_ptr<BackendBuffer> x_, xn_, q_, k_, v_, att_, gate_, up_, rope_, logits_;
  std::vector<float> x_host_, rope_host_, logits_host_;  // [B, n_embd], [B, rope_dim], [B, n_vocab]
  std::unique_ptr<BackendStream> stream_;
  mutable std::mutex mu_;  // steps, release() and footprint() from different threads
  std::map<const KvCache*, SeqKv> kv_;
  // KV transfers' host-visible staging (device_kv.cpp), freed with the last KV.
  std::unique_ptr<BackendBuffer> staging_;
  BackendBuffer& staging(uint64_t bytes);
  // Copies rows [p0, p1) of every layer between s and the staging buffer,
  // one submission per block; `host` runs on each block's rows (after the
  // copies when reading, before them when writing).
  void transfer_kv(SeqKv& s, int64_t p0, int64_t p1, bool to_device, const KvRows& host);
};

}  // namespace ebb
