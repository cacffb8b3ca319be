// The compute-backend interface below the kernel layer (DESIGN.md: device
// code stays below it). Modelled on ggml's ggml-backend.h: a registry of
// devices ("cpu", "vulkan:N"), a device's capabilities probed at run time,
// buffers it allocates (sub-allocated from slabs, with an exact ledger per
// device), and a stream on which ops over whole batches of rows are
// recorded, submitted and waited for. A GPU backend records; the CPU backend
// (backend/cpu_backend.h) runs each op at once.
//
// Nothing in this header names a device API; the Vulkan backend lives in
// backend/vulkan/ and only backend.cpp's registry knows it exists.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"     // RopeStyle
#include "kernels/tensor.h"  // DType

namespace ebb {

// What a device can do, probed when it is opened or listed.
struct BackendCaps {
  bool unified_memory = false;      // device memory is the host's (integrated GPU, CPU driver): no staging copies
  bool f16_arithmetic = false;      // shaders compute in F16 (shaderFloat16)
  bool int8_arithmetic = false;     // shaders compute in 8-bit integers (shaderInt8)
  bool int8_dot_product = false;    // 8-bit integer dot products run in hardware (Vulkan 1.3 integer dot product)
  uint32_t subgroup_size = 0;       // invocations per subgroup (0: unknown)
  bool cooperative_matrix = false;  // VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix offered
  uint64_t device_memory_bytes = 0; // the largest device-local heap
  uint64_t max_buffer_range = 0;    // the largest range one op may address in one buffer
  uint32_t max_allocations = 0;     // the driver's cap on simultaneous device-memory allocations
};

enum class DeviceKind { kCpu, kIntegratedGpu, kDiscreteGpu, kVirtualGpu, kCpuDriver, kOther };
std::string_view device_kind_name(DeviceKind k);  // "cpu", "integrated-gpu", ...

struct DeviceInfo {
  std::string id;    // "cpu", "vulkan:0", ...
  std::string name;  // the driver's name for it ("llvmpipe (LLVM 15.0.6, 256 bits)")
  std::string driver;  // "Mesa 22.3.6 (LLVM 15.0.6)"; empty for the CPU
  DeviceKind kind = DeviceKind::kOther;
  BackendCaps caps;
};

// Where a buffer lives.
//   kDevice: the device's own memory (on a unified-memory device also
//            mapped, so writes go straight in; elsewhere through a copy).
//   kHost:   host-visible memory the device reads over the bus: staging,
//            logits read back.
enum class MemoryPlace : uint8_t { kDevice, kHost };

// A device's memory held by the process, exactly: slabs are what the driver
// allocated, buffers what was handed out of them.
struct MemoryLedger {
  uint64_t slab_bytes = 0;    // device memory allocated from the driver
  uint64_t buffer_bytes = 0;  // of which handed out as buffers (after alignment)
  uint64_t n_slabs = 0;
  uint64_t n_buffers = 0;
};

// Memory owned by a backend: freed (returned to its slab) when destroyed.
// The backend must outlive its buffers.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual uint64_t size() const = 0;
  virtual MemoryPlace place() const = 0;
  // The bytes, when the host can address them directly; else nullptr.
  virtual void* host_data() = 0;
  // Synchronous copies between host memory and [offset, offset + n).
  // Not ordered with ops in flight: wait for the stream first.
  virtual void write(uint64_t offset, const void* src, uint64_t n) = 0;
  virtual void read(uint64_t offset, void* dst, uint64_t n) = 0;
};

// A tensor's place: a buffer and a byte offset in it. Float tensors start at
// a multiple of 4 bytes, F16 ones at a multiple of 4 too (two halves).
struct TensorRef {
  BackendBuffer* buf = nullptr;
  uint64_t offset = 0;
};

// ---- Ops: each over a whole batch of rows; shapes as in kernels/. ----

// y[t][r] = sum_c W[r][c] * x[t][c], weights in GGUF's row layout (kRows).
struct MatmulOp {
  DType w_type = DType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // the reduction dimension: a multiple of the format's block (Vulkan: 256 for
                     // Q4_K, Q5_K, Q6_K; 32 for Q8_0, Q4_0; 2 for F32, F16, BF16)
  TensorRef w;       // [rows] rows of row_bytes(w_type, cols)
  TensorRef x;       // [n_tokens, x_stride] F32
  int64_t x_stride = 0;  // floats; 0 means cols
  int64_t n_tokens = 1;
  TensorRef y;           // [n_tokens, y_stride] F32
  int64_t y_stride = 0;  // floats; 0 means rows
};

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each of n_rows rows. y may alias x.
struct RmsNormOp {
  TensorRef x;  // [n_rows, n] F32
  TensorRef w;  // [n] F32
  TensorRef y;  // [n_rows, n] F32
  int64_t n_rows = 1;
  int64_t n = 0;
  float eps = 1e-5f;
};

// In place, each token's heads rotated by its position's table (ops.h's rope).
struct RopeOp {
  TensorRef x;        // [n_tokens, n_heads, head_dim] F32
  TensorRef cos_sin;  // [n_tokens, rot_dim / 2, 2] F32 (rope_cos_sin per token's position)
  int64_t n_tokens = 1;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t rot_dim = 0;  // even, <= head_dim
  RopeStyle style = RopeStyle::kNorm;
};

// Causal grouped-query attention over an F16 KV in chunks (attention.h's
// contract, F32 arithmetic). Chunk c of the layer's KV starts at F16 element
// chunk_offsets[c] of k and of v; a chunk is [chunk_size, n_kv_heads, head_dim].
struct AttentionOp {
  TensorRef q;              // [n_q, n_heads, head_dim] F32
  TensorRef out;            // [n_q, n_heads, head_dim] F32 (not aliasing q)
  TensorRef k;              // F16
  TensorRef v;              // F16
  TensorRef chunk_offsets;  // [ceil((pos0 + n_q) / chunk_size)] uint32, in F16 elements (even)
  int64_t n_q = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // even, <= 256
  int64_t pos0 = 0;        // query row i attends to positions [0, pos0 + i]
  int64_t chunk_size = 256;
  float scale = 1.0f;
};

// Stores a batch's K or V rows into the F16 KV chunks (the layout
// AttentionOp reads): row t at position pos0 + t. F32 rounded to F16 (to
// nearest where the device rounds so; within one F16 ulp elsewhere).
struct KvStoreOp {
  TensorRef src;            // [n_tokens, row_len] F32
  TensorRef dst;            // F16 chunks
  TensorRef chunk_offsets;  // [ceil((pos0 + n_tokens) / chunk_size)] uint32, F16 elements (even)
  int64_t n_tokens = 0;
  int64_t row_len = 0;  // n_kv_heads * head_dim, even
  int64_t pos0 = 0;
  int64_t chunk_size = 256;
};

// y[i] = silu(gate[i]) * up[i], i < n. y may alias gate.
struct SwigluOp {
  TensorRef gate, up, y;  // [n] F32
  int64_t n = 0;
};

// y[i] += alpha * x[i], i < n (alpha 1: the residual add, exactly y + x;
// else within one rounding of a fused multiply-add: a LoRA term's scale).
struct AddOp {
  TensorRef y, x;  // [n] F32
  int64_t n = 0;
  float alpha = 1.0f;
};

// y[r * y_stride + o] += alpha * sum_j B[o][j] * t[r][j] for rows r <
// n_tokens and outputs o < n_out: a LoRA term's up-projection and its
// accumulate into the projection's output in one op (u = B t, then y += s u,
// without u). B is F16 (widened exactly) or F32; sums in F32. Any rank (the
// Vulkan shader takes t in slices of 64 through shared memory).
struct LowRankUpOp {
  DType b_type = DType::kF32;  // kF16 or kF32
  int64_t n_out = 0;
  int64_t rank = 0;
  TensorRef b;  // [n_out, rank] b_type (F16: starts at an even element)
  TensorRef t;  // [n_tokens, t_stride] F32
  int64_t t_stride = 0;  // floats; 0 means rank
  int64_t n_tokens = 1;
  TensorRef y;           // [n_tokens, y_stride] F32, accumulated into
  int64_t y_stride = 0;  // floats; 0 means n_out
  float alpha = 1.0f;
};

// dst[0, bytes) = src[0, bytes): a transfer between two buffers of one
// backend (device and host-visible memory alike), ordered with the other
// ops of the stream. The ranges must not overlap.
struct CopyOp {
  TensorRef src, dst;
  uint64_t bytes = 0;
};

enum class OpKind { kMatmul, kRmsNorm, kRope, kKvStore, kAttention, kSwiglu, kAdd, kLowRankUp };

// A counter the device can wait on before it runs a stream's next ops (a
// Vulkan timeline semaphore): the host raises it when what those ops read is
// ready (a restored layer's bytes in its buffer). It only grows.
class BackendTimeline {
 public:
  virtual ~BackendTimeline() = default;
  // Raises the counter to `value` (> value(), else nothing happens) from the
  // host. Host writes to mapped buffers made before the call are visible to
  // the ops that waited for it.
  virtual void signal(uint64_t value) = 0;
  virtual uint64_t value() const = 0;
};

// Ops recorded in order; each sees the results of the ones before it.
// submit() hands them to the device, wait() blocks until they are done (and
// makes the stream ready to record again; it submits what is recorded if
// submit() was not called). Bad arguments throw ebb::Error naming the op and
// the field, and nothing of that op is recorded. The buffers an op names must
// live until the stream's wait(). One thread records on a stream at a time;
// several streams of one backend may be used from different threads.
class BackendStream {
 public:
  virtual ~BackendStream() = default;
  virtual void matmul(const MatmulOp& op) = 0;
  virtual void rms_norm(const RmsNormOp& op) = 0;
  virtual void rope(const RopeOp& op) = 0;
  virtual void kv_store(const KvStoreOp& op) = 0;
  virtual void attention(const AttentionOp& op) = 0;
  virtual void swiglu(const SwigluOp& op) = 0;
  virtual void add(const AddOp& op) = 0;
  virtual void low_rank_up(const LowRankUpOp& op) = 0;
  virtual void copy(const CopyOp& op) = 0;
  virtual void submit() = 0;
  virtual void wait() = 0;
  // Ops recorded since the last wait().
  virtual int64_t n_recorded() const = 0;
  // Segments (supports_timeline()): submits what is recorded since the last
  // segment, without a fence, and makes the ops recorded after this call
  // wait on the device until `t` reaches `value`; the host does not block.
  // wait() still waits for every segment (so `t` must reach the values
  // waited for, or it blocks). Ops recorded after a wait_for see host writes
  // made before the value was signalled.
  virtual bool supports_timeline() const { return false; }
  virtual void wait_for(BackendTimeline& t, uint64_t value);
  // Submissions made since the last wait() (segments and the final one).
  virtual int64_t n_submitted() const = 0;
};

// Runs record() on s, then submits and waits for it. When anything throws
// (recording, the submission, the device), what was recorded or submitted
// is waited out first, so nothing stays recorded for the stream's next
// user, and the first error goes on.
template <class F>
void run_on(BackendStream& s, F&& record) {
  try {
    record();
    s.submit();
    s.wait();
  } catch (...) {
    try {
      s.wait();
    } catch (...) {
    }
    throw;
  }
}

// A device. Its buffers and streams must be destroyed before it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const DeviceInfo& info() const = 0;
  // Whether the op runs here for this weight format (matmul; low_rank_up:
  // B's, F16 or F32; others: kF32).
  virtual bool supports(OpKind op, DType type) const = 0;
  // Throws ebb::Error naming the device, the size and the limit when the
  // device cannot hold it.
  virtual std::unique_ptr<BackendBuffer> alloc(uint64_t bytes, MemoryPlace place) = 0;
  virtual MemoryLedger ledger(MemoryPlace place) const = 0;
  virtual std::unique_ptr<BackendStream> new_stream() = 0;
  // A timeline its streams can wait on (BackendStream::wait_for), or nullptr
  // where the device has none (the CPU backend: its ops run at once; a Vulkan
  // device without timeline semaphores).
  virtual std::unique_ptr<BackendTimeline> new_timeline() { return nullptr; }
};

// Every device this build and machine offer: Vulkan devices ("vulkan:N", in
// the loader's order) when built with EBB_VULKAN and a driver is installed.
// Never throws: a missing loader or driver means no such device, and
// `why_none` (when given) says why.
std::vector<DeviceInfo> list_gpu_devices(std::string* why_none = nullptr);

// Opens "cpu" (the best CPU target, one thread; backend/cpu_backend.h for
// options), "vulkan" (the first Vulkan device) or "vulkan:N". Throws
// ebb::Error naming the id and what was found instead.
std::unique_ptr<Backend> open_backend(std::string_view id);

}  // namespace ebb
