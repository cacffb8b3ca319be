#include "backend/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "platform/allocator.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

class CpuBuffer final : public BackendBuffer {
 public:
  CpuBuffer(Buffer b, uint64_t size, MemoryPlace place) : b_(std::move(b)), size_(size), place_(place) {}
  uint64_t size() const override { return size_; }
  MemoryPlace place() const override { return place_; }
  void* host_data() override { return b_.data(); }
  void write(uint64_t offset, const void* src, uint64_t n) override {
    check("write", offset, n);
    if (n) std::memcpy(static_cast<uint8_t*>(b_.data()) + offset, src, n);
  }
  void read(uint64_t offset, void* dst, uint64_t n) override {
    check("read", offset, n);
    if (n) std::memcpy(dst, static_cast<const uint8_t*>(b_.data()) + offset, n);
  }

 private:
  void check(const char* what, uint64_t offset, uint64_t n) const {
    if (offset > size_ || n > size_ - offset)
      throw Error(std::string("cpu buffer ") + what + ": bytes [" + std::to_string(offset) + ", " +
                  std::to_string(offset + n) + ") outside the buffer's " + std::to_string(size_));
  }
  Buffer b_;
  uint64_t size_;
  MemoryPlace place_;
};

// The host address of `bytes` bytes of tensor t, checked to lie in its buffer.
template <typename T>
T* at(const char* op, const char* field, const TensorRef& t, uint64_t bytes) {
  auto* b = dynamic_cast<CpuBuffer*>(t.buf);
  if (!b) throw Error(std::string(op) + ": " + field + " is not a CPU buffer");
  if (t.offset % alignof(T) != 0)
    throw Error(std::string(op) + ": " + field + " starts at byte " + std::to_string(t.offset) + ", misaligned");
  if (t.offset > b->size() || bytes > b->size() - t.offset)
    throw Error(std::string(op) + ": " + field + " needs bytes [" + std::to_string(t.offset) + ", " +
                std::to_string(t.offset + bytes) + ") of a " + std::to_string(b->size()) + "-byte buffer");
  return reinterpret_cast<T*>(static_cast<uint8_t*>(b->host_data()) + t.offset);
}

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(std::string(op) + ": " + what);
}

class CpuBackend;

class CpuStream final : public BackendStream {
 public:
  explicit CpuStream(CpuBackend& be) : be_(be) {}
  void matmul(const MatmulOp& op) override;
  void rms_norm(const RmsNormOp& op) override;
  void rope(const RopeOp& op) override;
  void kv_store(const KvStoreOp& op) override;
  void attention(const AttentionOp& op) override;
  void swiglu(const SwigluOp& op) override;
  void add(const AddOp& op) override;
  void low_rank_up(const LowRankUpOp& op) override;
  void copy(const CopyOp& op) override;
  void submit() override {}  // every op ran when it was recorded
  void wait() override {}
  int64_t n_recorded() const override { return 0; }
  int64_t n_submitted() const override { return 0; }

 private:
  // Scratch grown to the largest op's need and kept (nothing allocated per
  // op once the stream has seen each shape).
  void* scratch(uint64_t bytes);
  CpuBackend& be_;
  Buffer scratch_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& opts)
      : isa_(opts.isa), pool_(ThreadPoolOptions{std::max(1, opts.n_threads)}), alloc_(&ledger_) {
    require(isa_supported(opts.isa), "cpu backend", "instruction set " + std::string(isa_name(opts.isa)) +
                                                        " not supported on this CPU");
    info_.id = "cpu";
    info_.name = "CPU (" + std::string(isa_name(isa_)) + ", " + std::to_string(pool_.size()) + " threads)";
    info_.kind = DeviceKind::kCpu;
    info_.caps.unified_memory = true;
    info_.caps.max_buffer_range = UINT64_MAX;
    info_.caps.max_allocations = UINT32_MAX;
  }
  const DeviceInfo& info() const override { return info_; }
  bool supports(OpKind op, DType type) const override {
    if (op == OpKind::kMatmul) return kernel_set(isa_).format(type) != nullptr;
    if (op == OpKind::kLowRankUp) return type == DType::kF16 || type == DType::kF32;
    return type == DType::kF32;
  }
  std::unique_ptr<BackendBuffer> alloc(uint64_t bytes, MemoryPlace place) override {
    if (bytes == 0) throw Error("cpu backend: a buffer of 0 bytes");
    auto b = std::make_unique<CpuBuffer>(alloc_.allocate(bytes, MemCategory::kOther), bytes, place);
    return b;
  }
  MemoryLedger ledger(MemoryPlace place) const override {
    // One ledger for both places (they are the same memory); no slabs.
    const uint64_t held = static_cast<uint64_t>(ledger_.total());
    MemoryLedger l;
    if (place == MemoryPlace::kDevice) l.slab_bytes = l.buffer_bytes = held;
    return l;
  }
  std::unique_ptr<BackendStream> new_stream() override { return std::make_unique<CpuStream>(*this); }

  Isa isa() const { return isa_; }
  ThreadPool& pool() { return pool_; }
  Allocator& allocator() { return alloc_; }

 private:
  Isa isa_;
  DeviceInfo info_;
  ThreadPool pool_;
  Ledger ledger_;
  Allocator alloc_;
};

void* CpuStream::scratch(uint64_t bytes) {
  if (bytes > scratch_.size()) scratch_ = be_.allocator().allocate(bytes, MemCategory::kScratch);
  return scratch_.data();
}

void CpuStream::matmul(const MatmulOp& op) {
  const char* name = "cpu matmul";
  const FormatKernels* fk = kernel_set(be_.isa()).format(op.w_type);
  require(fk != nullptr, name, "weight format " + std::string(dtype_name(op.w_type)) + " has no kernels");
  require(op.rows > 0 && op.cols > 0 && op.n_tokens > 0, name, "rows, cols and n_tokens must be positive");
  require(op.cols % type_info(op.w_type).block_size == 0, name, "cols is not a multiple of the block size");
  const int64_t xs = op.x_stride ? op.x_stride : op.cols, ys = op.y_stride ? op.y_stride : op.rows;
  require(xs >= op.cols && ys >= op.rows, name, "x_stride < cols or y_stride < rows");
  const uint64_t rb = row_bytes(op.w_type, op.cols);
  WeightView w{op.w_type, op.cols, op.rows, at<const uint8_t>(name, "w", op.w, rb * op.rows), rb};
  MatmulArgs a;
  a.w = &w;
  a.x = at<const float>(name, "x", op.x, 4 * ((op.n_tokens - 1) * xs + op.cols));
  a.x_stride = xs;
  a.n_tokens = op.n_tokens;
  a.y = at<float>(name, "y", op.y, 4 * ((op.n_tokens - 1) * ys + op.rows));
  a.y_stride = ys;
  a.scratch = scratch(std::max<uint64_t>(64, matmul_scratch_bytes(op.w_type, op.cols, op.n_tokens)));
  ebb::matmul(kernel_set(be_.isa()), a, be_.pool());
}

void CpuStream::rms_norm(const RmsNormOp& op) {
  const char* name = "cpu rms_norm";
  require(op.n > 0 && op.n_rows > 0, name, "n and n_rows must be positive");
  const float* x = at<const float>(name, "x", op.x, 4ull * op.n * op.n_rows);
  const float* w = at<const float>(name, "w", op.w, 4ull * op.n);
  float* y = at<float>(name, "y", op.y, 4ull * op.n * op.n_rows);
  const OpsKernels& k = ops_kernels(be_.isa());
  for (int64_t r = 0; r < op.n_rows; ++r) k.rmsnorm(x + r * op.n, w, y + r * op.n, op.n, op.eps);
}

void CpuStream::rope(const RopeOp& op) {
  const char* name = "cpu rope";
  require(op.n_tokens > 0 && op.n_heads > 0 && op.head_dim > 0, name, "n_tokens, n_heads, head_dim must be positive");
  require(op.rot_dim > 0 && op.rot_dim % 2 == 0 && op.rot_dim <= op.head_dim, name, "rot_dim must be even, <= head_dim");
  const int64_t row = op.n_heads * op.head_dim;
  float* x = at<float>(name, "x", op.x, 4ull * op.n_tokens * row);
  const float* cs = at<const float>(name, "cos_sin", op.cos_sin, 4ull * op.n_tokens * op.rot_dim);
  const OpsKernels& k = ops_kernels(be_.isa());
  for (int64_t t = 0; t < op.n_tokens; ++t)
    k.rope(x + t * row, op.n_heads, op.head_dim, op.rot_dim, cs + t * op.rot_dim, op.style);
}

// The chunk table's entries, each chunk checked to lie in a KV buffer of
// kv_bytes bytes.
const uint32_t* chunk_table(const char* name, const TensorRef& t, int64_t n_chunks, uint64_t chunk_halves,
                            uint64_t kv_bytes) {
  const uint32_t* table = at<const uint32_t>(name, "chunk_offsets", t, 4ull * n_chunks);
  for (int64_t c = 0; c < n_chunks; ++c)
    require(2ull * (table[c] + chunk_halves) <= kv_bytes, name, "chunk " + std::to_string(c) + " lies outside the KV");
  return table;
}

void CpuStream::kv_store(const KvStoreOp& op) {
  const char* name = "cpu kv_store";
  require(op.n_tokens > 0 && op.pos0 >= 0 && op.chunk_size > 0 && op.row_len > 0, name, "bad shape");
  const int64_t n_chunks = (op.pos0 + op.n_tokens + op.chunk_size - 1) / op.chunk_size;
  auto* dst_buf = dynamic_cast<CpuBuffer*>(op.dst.buf);
  require(dst_buf != nullptr && op.dst.offset <= dst_buf->size(), name, "dst is not a CPU buffer");
  const uint64_t kv_bytes = dst_buf->size() - op.dst.offset;
  const uint32_t* table = chunk_table(name, op.chunk_offsets, n_chunks, op.chunk_size * op.row_len, kv_bytes);
  const float* src = at<const float>(name, "src", op.src, 4ull * op.n_tokens * op.row_len);
  uint16_t* dst = at<uint16_t>(name, "dst", op.dst, kv_bytes);
  for (int64_t t = 0; t < op.n_tokens; ++t) {
    const int64_t pos = op.pos0 + t;
    uint16_t* row = dst + table[pos / op.chunk_size] + (pos % op.chunk_size) * op.row_len;
    for (int64_t i = 0; i < op.row_len; ++i) row[i] = fp32_to_fp16(src[t * op.row_len + i]);
  }
}

void CpuStream::attention(const AttentionOp& op) {
  const char* name = "cpu attention";
  require(op.n_q > 0 && op.n_heads > 0 && op.n_kv_heads > 0 && op.pos0 >= 0 && op.chunk_size > 0, name, "bad shape");
  require(op.n_heads % op.n_kv_heads == 0, name, "n_heads is not a multiple of n_kv_heads");
  const int64_t n_chunks = (op.pos0 + op.n_q + op.chunk_size - 1) / op.chunk_size;
  auto kv_bytes = [&](const TensorRef& t) {
    auto* b = dynamic_cast<CpuBuffer*>(t.buf);
    require(b != nullptr && t.offset <= b->size(), name, "k or v is not a CPU buffer");
    return b->size() - t.offset;
  };
  const uint64_t halves = static_cast<uint64_t>(op.chunk_size) * op.n_kv_heads * op.head_dim;
  const uint64_t kb = kv_bytes(op.k), vb = kv_bytes(op.v);
  const uint32_t* table = chunk_table(name, op.chunk_offsets, n_chunks, halves, std::min(kb, vb));
  const uint16_t* k = at<const uint16_t>(name, "k", op.k, kb);
  const uint16_t* v = at<const uint16_t>(name, "v", op.v, vb);
  std::vector<KvChunkRef> chunks(static_cast<size_t>(n_chunks));
  for (int64_t c = 0; c < n_chunks; ++c) chunks[c] = {k + table[c], v + table[c]};
  const uint64_t qbytes = 4ull * op.n_q * op.n_heads * op.head_dim;
  AttentionArgs a;
  a.q = at<const float>(name, "q", op.q, qbytes);
  a.out = at<float>(name, "out", op.out, qbytes);
  a.n_q = op.n_q;
  a.n_heads = op.n_heads;
  a.n_kv_heads = op.n_kv_heads;
  a.head_dim = op.head_dim;
  a.pos0 = op.pos0;
  a.chunks = chunks.data();
  a.chunk_size = op.chunk_size;
  a.kv_type = DType::kF16;
  a.scale = op.scale;
  a.scratch = static_cast<float*>(
      scratch(4 * attention_scratch_floats(be_.pool().size(), op.head_dim, op.chunk_size)));
  ebb::attention(be_.isa(), a, be_.pool());
}

void CpuStream::swiglu(const SwigluOp& op) {
  const char* name = "cpu swiglu";
  require(op.n > 0, name, "n must be positive");
  ops_kernels(be_.isa())
      .swiglu(at<const float>(name, "gate", op.gate, 4ull * op.n), at<const float>(name, "up", op.up, 4ull * op.n),
              at<float>(name, "y", op.y, 4ull * op.n), op.n);
}

void CpuStream::add(const AddOp& op) {
  const char* name = "cpu add";
  require(op.n > 0, name, "n must be positive");
  float* y = at<float>(name, "y", op.y, 4ull * op.n);
  const float* x = at<const float>(name, "x", op.x, 4ull * op.n);
  if (op.alpha == 1.0f) {
    ops_kernels(be_.isa()).add(y, x, op.n);
  } else {
    for (int64_t i = 0; i < op.n; ++i) y[i] += op.alpha * x[i];
  }
}

// The scalar reference: each output's sum over the rank in F32, in order.
void CpuStream::low_rank_up(const LowRankUpOp& op) {
  const char* name = "cpu low_rank_up";
  require(op.b_type == DType::kF16 || op.b_type == DType::kF32, name,
          "B's type " + std::string(dtype_name(op.b_type)) + " (F16 or F32 only)");
  require(op.n_out > 0 && op.rank > 0 && op.n_tokens > 0, name, "n_out, rank and n_tokens must be positive");
  const int64_t ts = op.t_stride ? op.t_stride : op.rank, ys = op.y_stride ? op.y_stride : op.n_out;
  require(ts >= op.rank && ys >= op.n_out, name, "t_stride < rank or y_stride < n_out");
  const uint64_t nb = static_cast<uint64_t>(op.n_out * op.rank);
  const float* t = at<const float>(name, "t", op.t, 4ull * ((op.n_tokens - 1) * ts + op.rank));
  float* y = at<float>(name, "y", op.y, 4ull * ((op.n_tokens - 1) * ys + op.n_out));
  const uint16_t* bh = op.b_type == DType::kF16 ? at<const uint16_t>(name, "b", op.b, 2 * nb) : nullptr;
  const float* bf = op.b_type == DType::kF32 ? at<const float>(name, "b", op.b, 4 * nb) : nullptr;
  for (int64_t r = 0; r < op.n_tokens; ++r)
    for (int64_t o = 0; o < op.n_out; ++o) {
      float acc = 0.0f;
      for (int64_t j = 0; j < op.rank; ++j)
        acc += (bh ? fp16_to_fp32(bh[o * op.rank + j]) : bf[o * op.rank + j]) * t[r * ts + j];
      y[r * ys + o] += op.alpha * acc;
    }
}

void CpuStream::copy(const CopyOp& op) {
  const char* name = "cpu copy";
  if (op.bytes == 0) return;
  uint8_t* d = at<uint8_t>(name, "dst", op.dst, op.bytes);
  const uint8_t* s = at<const uint8_t>(name, "src", op.src, op.bytes);
  require(d + op.bytes <= s || s + op.bytes <= d, name, "src and dst overlap");
  std::memcpy(d, s, op.bytes);
}

}  // namespace

std::unique_ptr<Backend> open_cpu_backend(const CpuBackendOptions& opts) { return std::make_unique<CpuBackend>(opts); }

}  // namespace ebb
