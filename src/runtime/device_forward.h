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
// A split of the layers (llama.cpp's -ngl N < n_layers): layers [0,
// first_layer) run on the CPU (Forward, with their weights and KV on the
// host), the rest and the output head here. Forward::run_batch runs the CPU
// layers, then hands the hidden rows to run_batch(seqs, x).
//
// LoRA adapters: each sequence's adapters apply to its own rows on the
// device (runtime/device_lora.h; token_embd's on the host's lookup).
//
// Elastic memory: evict() and restore() below move whole layers' weights
// (a step that finds layers dropped restores them while it runs:
// runtime/device_restore.h) and the sessions' device KV (read back to host
// memory, uploaded again by the session's next step).
#pragma once

#include <atomic>
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
#include "memory/weight_verify.h"
#include "model/model.h"
#include "platform/direct_io.h"
#include "runtime/device_lora.h"
#include "runtime/device_restore.h"
#include "runtime/device_stream.h"
#include "runtime/forward.h"

namespace ebb {

class KvCache;

// What the device holds for an engine, by category (bytes of the buffers
// handed out; the ledger adds the slabs they were cut from).
struct DeviceFootprint {
  std::string id;    // "vulkan:0"
  std::string name;  // the driver's name for the device
  std::vector<uint64_t> weights_per_layer;  // one buffer per layer unit
  uint64_t weights_dropped = 0;  // device bytes of the layers evict() (or a memory limit) dropped (not held)
  uint64_t globals = 0;  // output norm + output head
  uint64_t kv = 0;       // every session's KV chunks on the device
  uint64_t kv_parked = 0;  // host bytes of the sessions' device KV that evict() read back (not on the device)
  uint64_t adapters = 0; // LoRA adapter versions uploaded (runtime/device_lora.h)
  uint64_t scratch = 0;  // the step's activations, inputs and logits (and the adapters' A x, B A x)
  MemoryLedger ledger;   // the backend's device ledger (all of the above, exactly)
  uint64_t weights() const;
  uint64_t total() const { return weights() + globals + kv + adapters + scratch; }
};

struct DeviceForwardOptions {
  int64_t max_batch = 64;  // rows per step (all sequences together)
  Isa isa = Isa::kScalar;  // the host's kernels for the embedding lookup and format conversion
  // Layers [first_layer, n_layers) and the head run here; [0, first_layer)
  // on the CPU (their units stay resident on the host). 0: all here.
  int first_layer = 0;
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
  //   x: nullptr (the embeddings are looked up here), or in a split the
  //      hidden rows after the CPU's layers: [n rows of the step, n_embd].
  void run_batch(std::span<const StepSeq> seqs, const float* x = nullptr);
  // Before the CPU's layers of a split step: refuses what the device cannot
  // run (nothing has been computed yet), brings dropped layers back on both
  // sides and grows the sequences' device KV.
  void prepare(std::span<const StepSeq> seqs);
  int first_layer() const { return opts_.first_layer; }
  int n_device_layers() const { return model_.n_layers() - opts_.first_layer; }

  // Frees the device KV of a cache (its session is going away).
  void release(const KvCache* kv);

  // Elastic memory on the device: evict() frees whole layers' device
  // buffers, the last layer first, until at least `bytes` are given back
  // (the device ledger's delta is returned); then, still short, the
  // sessions' device KV: each session's rows are read back into host memory
  // (the engine's allocator, as KV) and its device buffers freed, one
  // session after another; then in a split the CPU layers' host units,
  // again the last first. A session's parked KV goes back up (one
  // submission) when a step, a transfer or restore() needs it; the parked
  // copy is then freed. restore() uploads every dropped device layer again
  // from the model file (straight into its mapped device buffer where the
  // file's bytes are the device's, else through a transient host copy),
  // every parked KV, and reads the CPU layers back. A step that finds
  // device layers dropped runs the layers before each dropped one while a
  // restore thread brings the dropped ones back, lowest first: with
  // timelines the whole step is submitted in segments that wait on the
  // device, else the host waits per layer (device_restore.h); a layer whose
  // read fails fails the step naming it and stays dropped. Reads are checked as the CPU path's are
  // (memory/weight_verify.h): a file changed on disk since load is refused.
  // Between steps only.
  struct Evicted {
    uint64_t freed = 0;  // device ledger bytes given back
    int64_t layers = 0;
    uint64_t host_freed = 0;  // host bytes of the CPU layers' units dropped
    int64_t host_layers = 0;
    uint64_t kv_freed = 0;     // device ledger bytes of that given back by parking sessions' KV
    int64_t kv_sessions = 0;   // sessions whose device KV was parked on the host
  };
  // park_kv false: weight layers only (a memory limit, whose ledger counts
  // parked KV on the host as much as on the device).
  Evicted evict(uint64_t bytes, bool park_kv = true);
  int64_t restore();  // layers uploaded (parked KV goes up too); under a memory limit, only what fits
  int64_t n_parked() const;  // sessions whose device KV is parked on the host
  int64_t n_dropped() const;

  // ---- A memory limit (runtime/device_limit.cpp; 0: none). It caps what
  // the engine holds on both sides (held()): every device buffer (weights,
  // output head, KV, adapter uploads, scratch), the host-visible staging of
  // KV transfers, a split's CPU layers and their KV (host_kv() counts the
  // host KV pool), and parked KV — the total, since a unified-memory device
  // (a phone) shares one memory between them; on a discrete GPU it is an
  // upper bound of each. Setting it evicts weight layers (the last first)
  // down to it now; a limit below what a step cannot do without (held()
  // less every device layer, plus the window one layer is streamed through:
  // its device buffer and its transient host copy) is refused naming the
  // sizes, unless everything fits under it anyway. While it holds, a step
  // restores the dropped layers that fit with what it needs (its KV growth,
  // the CPU layers coming back), lowest first; the rest stream: uploaded,
  // run and freed one at a time (the CPU path streams through its window
  // too); when even the window does not fit, resident device layers make
  // way (the last first), and then a step that still does not fit is
  // refused naming the sizes before anything grows. restore() brings back
  // only what fits. Not counted: transients of a KV doubling (one layer's
  // old buffer and its host copy), and adapter uploads a step binds.
  Evicted set_memory_limit(uint64_t bytes, std::function<uint64_t()> host_kv);
  uint64_t memory_limit() const;
  uint64_t held() const;
  int64_t n_streamed_last_step() const;  // layers the last step streamed (0 without a limit)
  int n_stream_windows() const;             // windows the last step streamed through (0, 1 or 2)
  int64_t n_stream_window_allocs() const;   // window buffers allocated so far (they are reused across steps)
  void set_stream_hooks(DeviceStreamHooks hooks);  // test hooks of the streaming (between steps)
  // Test hooks of the overlapped restore (set between steps).
  void set_restore_hooks(DeviceRestoreHooks hooks);
  // What the last step's (or restore()'s) restoration did.
  DeviceRestoreStats restore_stats() const;
  // Whether layer l's restore can read the file straight into its mapped
  // device buffer: every tensor's device bytes are its file bytes (matrices
  // in a format the device's matmul reads as stored, F32 vectors).
  bool layer_direct(int l) const;
  // A device layer's buffer as the device holds it (tests).
  std::vector<uint8_t> read_layer(int l);

  // Frees the device copies of adapter versions nobody holds any more (the
  // engine calls it when the registry drops a version; steps do it too).
  void collect_adapters();
  int64_t n_adapter_uploads() const;
  // The LoRA ops the last step recorded (2 per adapter term: DeviceLora).
  int64_t n_lora_ops_last_step() const;

  // ---- KV transfers (runtime/device_kv.cpp; device_kv.h has the host-side
  // helpers). A session's device KV holds position p of a layer at F16
  // element p * kv_dim of its K (and V) buffer, whatever its chunk size.
  // Rows go through a host-visible staging buffer (at most
  // opts.kv_staging_bytes, kept while the device holds any session's KV): each call records all layers'
  // copies on the step stream and submits once per staging-full of
  // positions (once for a chunk). Between steps only.
  //
  // On a split they move the device layers [first_layer, n_layers) only;
  // the CPU layers' rows are the host KvCache's (its chunks hold them).
  //
  // The caller's side of a block of rows: rows [p, p + n) of one layer's K
  // (v false) or V, [n, kv_dim] F16 in staging memory, read from after a
  // read-back or filled before an upload.
  using KvRows = std::function<void(int64_t layer, bool v, int64_t p, int64_t n, uint16_t* rows)>;
  // Reads positions [p0, p1) (p1 <= kv.n_tokens()) of every device layer; `take`
  // sees each block of rows once.
  void read_kv(const KvCache& kv, int64_t p0, int64_t p1, const KvRows& take);
  // Writes positions [p0, p1) of every device layer, `fill` providing each block;
  // kv's device KV grows to hold p1; kv.n_tokens() stays the caller's.
  void write_kv(KvCache& kv, int64_t p0, int64_t p1, const KvRows& fill);
  // The same with whole arrays: k, v: [n_layers, p1 - p0, kv_dim] F16 (a
  // split's CPU layers' slices are not touched).
  void read_kv(const KvCache& kv, int64_t p0, int64_t p1, uint16_t* k, uint16_t* v);
  void write_kv(KvCache& kv, int64_t p0, int64_t p1, const uint16_t* k, const uint16_t* v);
  // The first n positions of src's device KV copied into dst's on the
  // device (no host round trip): a fork (a split's CPU layers:
  // KvCache::share_from).
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
    // Parked by evict(): the device buffers above are freed and positions
    // [0, parked_tokens) of every device layer are here, [device layer]
    // [K, V][parked_tokens, kv_dim] F16; empty when on the device.
    bool is_parked = false;
    Buffer parked;
    int64_t parked_tokens = 0;
    uint64_t bytes() const;
  };

  // Upload helpers: `layout` collects (offset, bytes) of each piece in a
  // layer's buffer before it is allocated.
  struct Staged;
  Mat stage_matrix(Staged& st, const WeightView& w);
  Vec stage_vector(Staged& st, const float* v, int64_t n, int64_t copies = 1);
  std::unique_ptr<BackendBuffer> upload(Staged& st);

  // Layer l's unit must be resident on the host. into: the buffer (of
  // layer_bytes_[l]) to write, layers_[l] left as it is; else a new one.
  void upload_layer(int l, BackendBuffer* into = nullptr);
  void write_staged(const Staged& st, BackendBuffer& buf);
  int64_t restore_locked();
  int64_t restore_host_locked();  // a split's CPU layers only
  // Reads layer l from the file into a new buffer (restore_layer) or into
  // buf (any thread; throws, the layer staying dropped): straight into the
  // mapped buffer where direct_[l] allows, else through the host unit and
  // an upload. True when it took the direct path.
  bool restore_layer(int l);
  bool restore_layer_into(int l, BackendBuffer& buf);
  bool direct_restore(int l, BackendBuffer& buf) const;
  void read_direct(int l, uint8_t* dst);  // dst: the mapped buffer; checks the CRC as the host path does
  // One tensor of a directly restored layer: file bytes [file_offset, +
  // bytes) at dev_offset of the layer's buffer, `copies` times in a row.
  struct DirectPiece {
    uint64_t dev_offset = 0, file_offset = 0, bytes = 0;
    int64_t copies = 1;
  };
  void plan_direct(int l, const Staged& st);
  // Refuses a step the device cannot run; n, n_out: its rows and logits rows.
  void check_step(std::span<const StepSeq> seqs, int64_t& n, int64_t& n_out) const;
  // Grows kv's device KV to hold n positions (copying what it held; parked KV goes up first).
  SeqKv& kv_for(KvCache& kv, int64_t n);
  // Parking (evict) and its way back: rows through the staging buffer.
  void park(SeqKv& s, int64_t n_tokens);
  void unpark(SeqKv& s);
  void make_table(SeqKv& s, int64_t cap);  // the chunk table of cap chunks; s.cap_chunks = cap
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
  DeviceLora lora_;  // the adapters' uploads and their terms in a step
  mutable std::mutex mu_;  // steps, release() and footprint() from different threads
  std::map<const KvCache*, SeqKv> kv_;
  WeightChecksums crc_;        // the layers as loaded: restored reads are checked against them
  DeviceRestoreHooks hooks_;
  DeviceRestoreStats stats_;
  std::vector<std::vector<DirectPiece>> direct_;  // [n_layers] in slot order; empty: not direct
  DirectFile dfile_;                  // the model file for direct reads (opened at the first one)
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BackendTimeline> timeline_;  // null: the host waits per layer
  uint64_t timeline_value_ = 0;               // what timeline_ reaches once the last step's restorer is done
  // KV transfers' host-visible staging (device_kv.cpp), freed with the last KV.
  std::unique_ptr<BackendBuffer> staging_;
  BackendBuffer& staging(uint64_t bytes);
  // Copies rows [p0, p1) of every layer between s and the staging buffer,
  // one submission per block; `host` runs on each block's rows (after the
  // copies when reading, before them when writing).
  void transfer_kv(SeqKv& s, int64_t p0, int64_t p1, bool to_device, const KvRows& host);

  // The memory limit (device_limit.cpp).
  uint64_t limit_ = 0;
  std::function<uint64_t()> host_kv_;  // the host KV pool's bytes (a split's CPU layers)
  std::vector<uint64_t> layer_bytes_;  // [n_layers] device bytes of each layer's buffer, dropped or not
  std::vector<char> streamed_;         // [n_layers] the step uploads, runs and frees these (over the limit)
  int64_t n_streamed_ = 0;
  // Streaming windows (device_stream.h): each a device buffer of the
  // largest layer, reused across layers and steps; n_windows_ of them this step.
  std::vector<std::unique_ptr<BackendBuffer>> windows_;
  int n_windows_ = 0;
  int64_t n_window_allocs_ = 0;
  DeviceStreamHooks stream_hooks_;
  uint64_t stream_held_ = 0;                    // held_locked() as the reader started
  std::atomic<uint64_t> stream_host_live_{0};  // the host copy the reader holds now
  uint64_t windows_bytes_locked() const;
  void size_windows_locked(int n);  // n window buffers (0: none)
  // Marks streamed_ for a step that holds `held` and `windows` of windows (forward-in).
  void mark_streamed_locked(uint64_t held, uint64_t windows);
  void stream_read(int l, int window);  // the reader thread: layer l into windows_[window]
  // Before layer l of the step: starts the reader once l >= from and the
  // restorer (when there is one) has finished.
  void start_stream(LayerStreamer& st, int l, int from, LayerRestorer* restorer);
  DeviceFootprint footprint_locked() const;
  uint64_t held_locked() const;
  uint64_t window_bytes() const;
  // Bytes the dropped layers may take back with `extra` more held: all of
  // them (UINT64_MAX) when they fit with one layer's host copy, else what
  // is left after the streaming window.
  uint64_t restore_room_locked(uint64_t extra) const;  // one layer streamed: its device buffer and its host copy
  // Device KV bytes a step adds for kv to hold n positions (kv_for's growth).
  uint64_t kv_growth(const KvCache& kv, int64_t n) const;
  // Under the limit: frees resident layers the step has no room for, marks
  // the dropped layers it streams (streamed_), refuses a step that cannot fit.
  void plan_step_locked(std::span<const StepSeq> seqs);
  void evict_to_limit_locked(Evicted& e);
  // Runs streamed layer l: submits what is recorded while l is not read
  // yet, records l from its window, submits, waits, hands the window back.
  void stream_layer(BackendStream& s, LayerStreamer& st, int l, std::span<const StepSeq> seqs, int64_t n);
};

}  // namespace ebb
