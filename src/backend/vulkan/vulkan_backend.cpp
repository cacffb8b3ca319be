#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/vulkan/vk_context.h"
#include "backend/vulkan/vk_memory.h"
#include "backend/vulkan/vk_stream.h"
#include "platform/error.h"

namespace ebb::vk {
namespace {

// One row per weight format with a matmul shader (mul_mat.glsl): the
// shader, and the column multiple it needs (its block: a K-quant's
// 256-element super-block, 32 elements, or an element pair for the plain
// formats). Adding a format is adding a row and its mul_mat_*.comp.
struct MatmulKernel {
  DType type;
  const char* shader;
  int64_t cols_multiple;
};
constexpr MatmulKernel kMatmulKernels[] = {
    {DType::kF32, "mul_mat_f32", 2},      {DType::kF16, "mul_mat_f16", 2},
    {DType::kBF16, "mul_mat_bf16", 2},    {DType::kQ8_0, "mul_mat_q8_0", 32},
    {DType::kQ4_0, "mul_mat_q4_0", 32},   {DType::kQ4_K, "mul_mat_q4_k", 256},
    {DType::kQ5_K, "mul_mat_q5_k", 256},  {DType::kQ6_K, "mul_mat_q6_k", 256},
};

// The row of format t; nullptr when it has no shader.
const MatmulKernel* matmul_kernel(DType t) {
  for (const MatmulKernel& k : kMatmulKernels)
    if (k.type == t) return &k;
  return nullptr;
}

class VulkanBackend;

class VulkanBuffer final : public BackendBuffer {
 public:
  VulkanBuffer(VulkanBackend& be, SlabAllocator& alloc, MemoryPlace place, Allocation a)
      : be_(be), alloc_(alloc), place_(place), a_(a) {}
  ~VulkanBuffer() override { alloc_.free(a_); }
  uint64_t size() const override { return a_.size; }
  MemoryPlace place() const override { return place_; }
  void* host_data() override { return a_.mapped; }
  void write(uint64_t offset, const void* src, uint64_t n) override;
  void read(uint64_t offset, void* dst, uint64_t n) override;
  const Allocation& allocation() const { return a_; }

 private:
  void check_range(const char* what, uint64_t offset, uint64_t n) const {
    if (offset > a_.size || n > a_.size - offset)
      throw Error(std::string("Vulkan buffer ") + what + ": bytes [" + std::to_string(offset) + ", " +
                  std::to_string(offset + n) + ") outside the buffer's " + std::to_string(a_.size));
  }
  VulkanBackend& be_;
  SlabAllocator& alloc_;
  MemoryPlace place_;
  Allocation a_;
};

class VulkanStream final : public BackendStream {
 public:
  VulkanStream(VulkanBackend& be);
  void matmul(const MatmulOp& op) override;
  void rms_norm(const RmsNormOp& op) override;
  void rope(const RopeOp& op) override;
  void kv_store(const KvStoreOp& op) override;
  void attention(const AttentionOp& op) override;
  void swiglu(const SwigluOp& op) override;
  void add(const AddOp& op) override;
  void low_rank_up(const LowRankUpOp& op) override;
  void copy(const CopyOp& op) override;
  void submit() override { rec_.submit(); }
  void wait() override { rec_.wait(); }
  int64_t n_recorded() const override { return rec_.n_recorded(); }
  bool supports_timeline() const override;
  void wait_for(BackendTimeline& t, uint64_t value) override;
  int64_t n_submitted() const override { return rec_.n_submitted(); }

 private:
  VulkanBackend& be_;
  Recorder rec_;
};

// A timeline semaphore (Vulkan 1.2), signalled from the host.
class VulkanTimeline final : public BackendTimeline {
 public:
  explicit VulkanTimeline(Context& ctx) : ctx_(ctx) {
    auto type = make<VkSemaphoreTypeCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO);
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    type.initialValue = 0;
    VkSemaphoreCreateInfo ci = make<VkSemaphoreCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO);
    ci.pNext = &type;
    VkSemaphore sem = VK_NULL_HANDLE;
    EBB_VK(vkCreateSemaphore(ctx.device(), &ci, nullptr, &sem));
    sem_ = Semaphore(ctx.device(), sem);
  }
  void signal(uint64_t value) override {
    if (value <= this->value()) return;
    auto si = make<VkSemaphoreSignalInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO);
    si.semaphore = sem_.get();
    si.value = value;
    EBB_VK(vkSignalSemaphore(ctx_.device(), &si));
  }
  uint64_t value() const override {
    uint64_t v = 0;
    EBB_VK(vkGetSemaphoreCounterValue(ctx_.device(), sem_.get(), &v));
    return v;
  }
  VkSemaphore handle() const { return sem_.get(); }

 private:
  Context& ctx_;
  Semaphore sem_;
};

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(std::unique_ptr<Context> ctx)
      : ctx_(std::move(ctx)),
        device_mem_(*ctx_, MemoryPlace::kDevice),
        host_mem_(*ctx_, MemoryPlace::kHost),
        kernels_(*ctx_) {}
  ~VulkanBackend() override = default;
  const DeviceInfo& info() const override { return ctx_->info(); }
  bool supports(OpKind op, DType type) const override {
    if (op == OpKind::kMatmul) return matmul_kernel(type) != nullptr;
    if (op == OpKind::kLowRankUp) return type == DType::kF16 || type == DType::kF32;
    return type == DType::kF32;
  }
  std::unique_ptr<BackendBuffer> alloc(uint64_t bytes, MemoryPlace place) override {
    SlabAllocator& a = place == MemoryPlace::kDevice ? device_mem_ : host_mem_;
    return std::make_unique<VulkanBuffer>(*this, a, place, a.allocate(bytes));
  }
  MemoryLedger ledger(MemoryPlace place) const override {
    return (place == MemoryPlace::kDevice ? device_mem_ : host_mem_).ledger();
  }
  std::unique_ptr<BackendStream> new_stream() override { return std::make_unique<VulkanStream>(*this); }
  std::unique_ptr<BackendTimeline> new_timeline() override {
    if (!ctx_->physical().timeline_semaphore) return nullptr;
    return std::make_unique<VulkanTimeline>(*ctx_);
  }

  Context& ctx() { return *ctx_; }
  Kernels& kernels() { return kernels_; }
  // Synchronous copy between two buffers' ranges on the queue (staging for
  // memory the host cannot map).
  void copy(VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t n);
  SlabAllocator& host_memory() { return host_mem_; }

 private:
  std::unique_ptr<Context> ctx_;
  SlabAllocator device_mem_;
  SlabAllocator host_mem_;
  Kernels kernels_;
  std::mutex copy_mu_;  // one staging copy at a time
};

void VulkanBackend::copy(VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t n) {
  std::lock_guard<std::mutex> lock(copy_mu_);
  VkCommandPoolCreateInfo pci = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pci.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pci.queueFamilyIndex = ctx_->physical().compute_family;
  VkCommandPool raw_pool = VK_NULL_HANDLE;
  VkDevice dev = ctx_->device();
  EBB_VK(vkCreateCommandPool(dev, &pci, nullptr, &raw_pool));
  CommandPool pool(dev, raw_pool);
  VkCommandBufferAllocateInfo cai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  cai.commandPool = raw_pool;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  EBB_VK(vkAllocateCommandBuffers(dev, &cai, &cmd));
  VkCommandBufferBeginInfo bi = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  EBB_VK(vkBeginCommandBuffer(cmd, &bi));
  VkBufferCopy region{src_off, dst_off, n};
  vkCmdCopyBuffer(cmd, src, dst, 1, &region);
  VkMemoryBarrier mb = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0,
                       nullptr);
  EBB_VK(vkEndCommandBuffer(cmd));
  VkFenceCreateInfo fci = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  VkFence raw_fence = VK_NULL_HANDLE;
  EBB_VK(vkCreateFence(dev, &fci, nullptr, &raw_fence));
  Fence fence(dev, raw_fence);
  VkSubmitInfo si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  {
    std::lock_guard<std::mutex> qlock(ctx_->queue_mutex());
    EBB_VK(vkQueueSubmit(ctx_->queue(), 1, &si, raw_fence));
  }
  EBB_VK(vkWaitForFences(dev, 1, &raw_fence, VK_TRUE, UINT64_MAX));
}

void VulkanBuffer::write(uint64_t offset, const void* src, uint64_t n) {
  check_range("write", offset, n);
  if (n == 0) return;
  if (a_.mapped) {
    std::memcpy(static_cast<uint8_t*>(a_.mapped) + offset, src, n);
    return;
  }
  // Through a host-visible staging range.
  SlabAllocator& host = be_.host_memory();
  Allocation st = host.allocate(n);
  std::memcpy(st.mapped, src, n);
  try {
    be_.copy(st.buffer, st.offset, a_.buffer, a_.offset + offset, n);
  } catch (...) {
    host.free(st);
    throw;
  }
  host.free(st);
}

void VulkanBuffer::read(uint64_t offset, void* dst, uint64_t n) {
  check_range("read", offset, n);
  if (n == 0) return;
  if (a_.mapped) {
    std::memcpy(dst, static_cast<const uint8_t*>(a_.mapped) + offset, n);
    return;
  }
  SlabAllocator& host = be_.host_memory();
  Allocation st = host.allocate(n);
  try {
    be_.copy(a_.buffer, a_.offset + offset, st.buffer, st.offset, n);
    std::memcpy(dst, st.mapped, n);
  } catch (...) {
    host.free(st);
    throw;
  }
  host.free(st);
}

// ---- ops ----

// The binding of tensor `t` of `bytes` bytes for op `op`'s field `field`:
// checks that it is a Vulkan buffer of this backend and that the tensor
// lies inside it.
Binding bind(const char* op, const char* field, const TensorRef& t, uint64_t bytes, uint32_t elem_bytes) {
  auto* b = dynamic_cast<VulkanBuffer*>(t.buf);
  if (!b) throw Error(std::string(op) + ": " + field + " is not a Vulkan buffer");
  if (t.offset % 4 != 0)
    throw Error(std::string(op) + ": " + field + " starts at byte " + std::to_string(t.offset) +
                ", not a multiple of 4");
  if (t.offset > b->size() || bytes > b->size() - t.offset)
    throw Error(std::string(op) + ": " + field + " needs bytes [" + std::to_string(t.offset) + ", " +
                std::to_string(t.offset + bytes) + ") of a " + std::to_string(b->size()) + "-byte buffer");
  const Allocation& a = b->allocation();
  // The range ends at a whole word: shaders read bytes as parts of 32-bit
  // words, and a word only partly inside the range would read as zeros. The
  // padding is inside the allocation (reserved is a multiple of 16).
  return Binding{a.buffer, a.offset + t.offset, a.offset + (a.size + 3) / 4 * 4, elem_bytes};
}

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(std::string(op) + ": " + what);
}

uint32_t u32(int64_t v, const char* op, const char* field) {
  if (v < 0 || v > 0xFFFFFFFFll) throw Error(std::string(op) + ": " + field + " = " + std::to_string(v) + " out of range");
  return static_cast<uint32_t>(v);
}

uint32_t ceil_div(uint64_t a, uint64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// Work groups for n items of WG = 64 invocations, spread over x and y so
// neither exceeds 65535 (the guaranteed maximum).
void groups_1d(uint64_t n, uint32_t& gx, uint32_t& gy) {
  const uint64_t groups = (n + 63) / 64;
  gx = static_cast<uint32_t>(std::min<uint64_t>(groups, 65535));
  gy = gx ? ceil_div(groups, gx) : 0;
}

// The end (in halves) of the furthest chunk a chunk table addresses. Every
// chunk must lie in its KV buffer: the table is read now (it is small, and
// written by the host) so a bad offset is an error here, not an access out
// of bounds on the device.
uint64_t chunk_table_end(const char* name, const TensorRef& t, int64_t n_chunks, uint64_t chunk_halves) {
  auto* tb = dynamic_cast<VulkanBuffer*>(t.buf);
  require(tb != nullptr, name, "chunk_offsets is not a Vulkan buffer");
  std::vector<uint32_t> table(static_cast<size_t>(n_chunks));
  if (t.offset > tb->size() || 4ull * n_chunks > tb->size() - t.offset)
    throw Error(std::string(name) + ": chunk_offsets holds fewer than the " + std::to_string(n_chunks) + " chunks");
  tb->read(t.offset, table.data(), 4ull * n_chunks);
  uint64_t max_end = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    require(table[c] % 2 == 0, name, "chunk " + std::to_string(c) + "'s offset is odd");
    max_end = std::max<uint64_t>(max_end, table[c] + chunk_halves);
  }
  return max_end;
}

VulkanStream::VulkanStream(VulkanBackend& be) : be_(be), rec_(be.ctx(), be.kernels()) {}

bool VulkanStream::supports_timeline() const { return be_.ctx().physical().timeline_semaphore; }

void VulkanStream::wait_for(BackendTimeline& t, uint64_t value) {
  auto* vt = dynamic_cast<VulkanTimeline*>(&t);
  if (!vt || !supports_timeline()) throw Error(be_.info().id + ": wait_for needs one of this device's timelines");
  rec_.segment(vt->handle(), value);
}

void VulkanStream::matmul(const MatmulOp& op) {
  const char* name = "vulkan matmul";
  const MatmulKernel* k = matmul_kernel(op.w_type);
  if (!k) {
    std::string have;
    for (const MatmulKernel& m : kMatmulKernels) have += (have.empty() ? "" : ", ") + std::string(dtype_name(m.type));
    throw Error(std::string(name) + ": weight format " + std::string(dtype_name(op.w_type)) +
                " has no Vulkan kernel (" + have + ")");
  }
  const char* shader = k->shader;
  require(op.rows > 0 && op.cols > 0 && op.n_tokens > 0, name, "rows, cols and n_tokens must be positive");
  const int64_t multiple = k->cols_multiple;
  require(op.cols % multiple == 0, name,
          "cols = " + std::to_string(op.cols) + " is not a multiple of " + std::to_string(multiple) + " for " +
              std::string(dtype_name(op.w_type)));
  const int64_t xs = op.x_stride ? op.x_stride : op.cols, ys = op.y_stride ? op.y_stride : op.rows;
  require(xs >= op.cols && ys >= op.rows, name, "x_stride < cols or y_stride < rows");
  const uint64_t rb = row_bytes(op.w_type, op.cols);
  const Binding b[3] = {
      bind(name, "w", op.w, rb * op.rows, 1),
      bind(name, "x", op.x, 4 * ((op.n_tokens - 1) * xs + op.cols), 4),
      bind(name, "y", op.y, 4 * ((op.n_tokens - 1) * ys + op.rows), 4),
  };
  struct {
    uint32_t off[6];
    uint32_t rows, cols, n_tokens, x_stride, y_stride, row_bytes, groups_x;
  } push{};
  push.rows = u32(op.rows, name, "rows");
  push.cols = u32(op.cols, name, "cols");
  push.n_tokens = u32(op.n_tokens, name, "n_tokens");
  push.x_stride = u32(xs, name, "x_stride");
  push.y_stride = u32(ys, name, "y_stride");
  push.row_bytes = u32(static_cast<int64_t>(rb), name, "row bytes");
  push.groups_x = static_cast<uint32_t>(std::min<int64_t>(op.rows, 65535));
  const uint32_t gy = ceil_div(static_cast<uint64_t>(op.rows), push.groups_x);
  const uint32_t gz = ceil_div(static_cast<uint64_t>(op.n_tokens), 4);  // TT tokens a workgroup
  rec_.dispatch(be_.kernels().get(shader, 3), b, &push, sizeof(push), push.groups_x, gy, gz);
}

void VulkanStream::rms_norm(const RmsNormOp& op) {
  const char* name = "vulkan rms_norm";
  require(op.n > 0 && op.n_rows > 0, name, "n and n_rows must be positive");
  const uint64_t bytes = 4ull * op.n * op.n_rows;
  const Binding b[3] = {bind(name, "x", op.x, bytes, 4), bind(name, "w", op.w, 4ull * op.n, 4),
                        bind(name, "y", op.y, bytes, 4)};
  struct {
    uint32_t off[6];
    uint32_t n, n_rows;
    float eps;
    uint32_t groups_x;
  } push{};
  push.n = u32(op.n, name, "n");
  push.n_rows = u32(op.n_rows, name, "n_rows");
  push.eps = op.eps;
  push.groups_x = std::min<uint32_t>(push.n_rows, 65535);
  rec_.dispatch(be_.kernels().get("rms_norm", 3), b, &push, sizeof(push), push.groups_x,
                ceil_div(push.n_rows, push.groups_x));
}

void VulkanStream::rope(const RopeOp& op) {
  const char* name = "vulkan rope";
  require(op.n_tokens > 0 && op.n_heads > 0 && op.head_dim > 0, name, "n_tokens, n_heads, head_dim must be positive");
  require(op.rot_dim > 0 && op.rot_dim % 2 == 0 && op.rot_dim <= op.head_dim, name,
          "rot_dim = " + std::to_string(op.rot_dim) + " must be even and at most head_dim");
  const Binding b[2] = {bind(name, "x", op.x, 4ull * op.n_tokens * op.n_heads * op.head_dim, 4),
                        bind(name, "cos_sin", op.cos_sin, 4ull * op.n_tokens * op.rot_dim, 4)};
  struct {
    uint32_t off[6];
    uint32_t n_tokens, n_heads, head_dim, rot_dim, style;
  } push{};
  push.n_tokens = u32(op.n_tokens, name, "n_tokens");
  push.n_heads = u32(op.n_heads, name, "n_heads");
  push.head_dim = u32(op.head_dim, name, "head_dim");
  push.rot_dim = u32(op.rot_dim, name, "rot_dim");
  push.style = op.style == RopeStyle::kNorm ? 0 : 1;
  const uint64_t n = static_cast<uint64_t>(op.n_tokens) * op.n_heads * (op.rot_dim / 2);
  require(n < (1ull << 32), name, "too many pairs for one dispatch");
  rec_.dispatch(be_.kernels().get("rope", 2), b, &push, sizeof(push), ceil_div(n, 64));
}

void VulkanStream::attention(const AttentionOp& op) {
  const char* name = "vulkan attention";
  require(op.n_q > 0 && op.n_heads > 0 && op.n_kv_heads > 0 && op.pos0 >= 0, name,
          "n_q, n_heads, n_kv_heads must be positive and pos0 non-negative");
  require(op.n_heads % op.n_kv_heads == 0, name, "n_heads is not a multiple of n_kv_heads");
  require(op.head_dim > 0 && op.head_dim % 2 == 0 && op.head_dim <= 256, name,
          "head_dim = " + std::to_string(op.head_dim) + " must be even and at most 256");
  require(op.chunk_size > 0, name, "chunk_size must be positive");
  require(op.n_q <= 65535 && op.n_heads <= 65535, name, "n_q or n_heads > 65535");
  const int64_t n_ctx = op.pos0 + op.n_q;
  const int64_t n_chunks = (n_ctx + op.chunk_size - 1) / op.chunk_size;
  const uint64_t qbytes = 4ull * op.n_q * op.n_heads * op.head_dim;
  const uint64_t chunk_halves = static_cast<uint64_t>(op.chunk_size) * op.n_kv_heads * op.head_dim;
  const uint64_t max_end = chunk_table_end(name, op.chunk_offsets, n_chunks, chunk_halves);
  const Binding b[5] = {
      bind(name, "q", op.q, qbytes, 4),         bind(name, "out", op.out, qbytes, 4),
      bind(name, "k", op.k, 2 * max_end, 2),    bind(name, "v", op.v, 2 * max_end, 2),
      bind(name, "chunk_offsets", op.chunk_offsets, 4ull * n_chunks, 4),
  };
  struct {
    uint32_t off[6];
    uint32_t n_q, n_heads, n_kv_heads, head_dim, pos0, chunk_size;
    float scale;
  } push{};
  push.n_q = u32(op.n_q, name, "n_q");
  push.n_heads = u32(op.n_heads, name, "n_heads");
  push.n_kv_heads = u32(op.n_kv_heads, name, "n_kv_heads");
  push.head_dim = u32(op.head_dim, name, "head_dim");
  push.pos0 = u32(op.pos0, name, "pos0");
  push.chunk_size = u32(op.chunk_size, name, "chunk_size");
  push.scale = op.scale;
  rec_.dispatch(be_.kernels().get("attention_f16", 5), b, &push, sizeof(push), push.n_q, push.n_heads);
}

void VulkanStream::kv_store(const KvStoreOp& op) {
  const char* name = "vulkan kv_store";
  require(op.n_tokens > 0 && op.pos0 >= 0 && op.chunk_size > 0, name,
          "n_tokens and chunk_size must be positive and pos0 non-negative");
  require(op.row_len > 0 && op.row_len % 2 == 0, name, "row_len = " + std::to_string(op.row_len) + " must be even");
  const int64_t n_chunks = (op.pos0 + op.n_tokens + op.chunk_size - 1) / op.chunk_size;
  const uint64_t max_end =
      chunk_table_end(name, op.chunk_offsets, n_chunks, static_cast<uint64_t>(op.chunk_size) * op.row_len);
  const Binding b[3] = {bind(name, "src", op.src, 4ull * op.n_tokens * op.row_len, 4),
                        bind(name, "dst", op.dst, 2 * max_end, 2),
                        bind(name, "chunk_offsets", op.chunk_offsets, 4ull * n_chunks, 4)};
  struct {
    uint32_t off[6];
    uint32_t n_tokens, row_len, pos0, chunk_size;
  } push{};
  push.n_tokens = u32(op.n_tokens, name, "n_tokens");
  push.row_len = u32(op.row_len, name, "row_len");
  push.pos0 = u32(op.pos0, name, "pos0");
  push.chunk_size = u32(op.chunk_size, name, "chunk_size");
  uint32_t gx, gy;
  groups_1d(static_cast<uint64_t>(op.n_tokens) * (op.row_len / 2), gx, gy);
  rec_.dispatch(be_.kernels().get("kv_store_f16", 3), b, &push, sizeof(push), gx, gy);
}

void VulkanStream::swiglu(const SwigluOp& op) {
  const char* name = "vulkan swiglu";
  require(op.n > 0, name, "n must be positive");
  const Binding b[3] = {bind(name, "gate", op.gate, 4ull * op.n, 4), bind(name, "up", op.up, 4ull * op.n, 4),
                        bind(name, "y", op.y, 4ull * op.n, 4)};
  struct {
    uint32_t off[6];
    uint32_t n;
  } push{};
  push.n = u32(op.n, name, "n");
  uint32_t gx, gy;
  groups_1d(push.n, gx, gy);
  rec_.dispatch(be_.kernels().get("swiglu", 3), b, &push, sizeof(push), gx, gy);
}

void VulkanStream::add(const AddOp& op) {
  const char* name = "vulkan add";
  require(op.n > 0, name, "n must be positive");
  const Binding b[2] = {bind(name, "y", op.y, 4ull * op.n, 4), bind(name, "x", op.x, 4ull * op.n, 4)};
  require(std::isfinite(op.alpha), name, "alpha must be finite");
  struct {
    uint32_t off[6];
    uint32_t n;
    float alpha;
  } push{};
  push.n = u32(op.n, name, "n");
  push.alpha = op.alpha;
  uint32_t gx, gy;
  groups_1d(push.n, gx, gy);
  rec_.dispatch(be_.kernels().get("add", 2), b, &push, sizeof(push), gx, gy);
}

void VulkanStream::low_rank_up(const LowRankUpOp& op) {
  const char* name = "vulkan low_rank_up";
  require(op.b_type == DType::kF16 || op.b_type == DType::kF32, name,
          "B's type " + std::string(dtype_name(op.b_type)) + " (F16 or F32 only)");
  require(op.n_out > 0 && op.rank > 0 && op.n_tokens > 0, name, "n_out, rank and n_tokens must be positive");
  require(std::isfinite(op.alpha), name, "alpha must be finite");
  const int64_t ts = op.t_stride ? op.t_stride : op.rank, ys = op.y_stride ? op.y_stride : op.n_out;
  require(ts >= op.rank && ys >= op.n_out, name, "t_stride < rank or y_stride < n_out");
  const uint32_t gx = ceil_div(static_cast<uint64_t>(op.n_out), 64);     // 64 outputs a workgroup
  const uint32_t gy = ceil_div(static_cast<uint64_t>(op.n_tokens), 8);  // TT = 8 rows a workgroup
  require(gx <= 65535 && gy <= 65535, name, "n_out > 65535 * 64 or n_tokens > 65535 * 8");
  const uint32_t esz = op.b_type == DType::kF16 ? 2 : 4;
  const Binding b[3] = {
      bind(name, "b", op.b, esz * static_cast<uint64_t>(op.n_out * op.rank), esz),
      bind(name, "t", op.t, 4 * static_cast<uint64_t>((op.n_tokens - 1) * ts + op.rank), 4),
      bind(name, "y", op.y, 4 * static_cast<uint64_t>((op.n_tokens - 1) * ys + op.n_out), 4),
  };
  struct {
    uint32_t off[6];
    uint32_t n_out, rank, n_tokens, t_stride, y_stride;
    float alpha;
  } push{};
  push.n_out = u32(op.n_out, name, "n_out");
  push.rank = u32(op.rank, name, "rank");
  push.n_tokens = u32(op.n_tokens, name, "n_tokens");
  push.t_stride = u32(ts, name, "t_stride");
  push.y_stride = u32(ys, name, "y_stride");
  push.alpha = op.alpha;
  rec_.dispatch(be_.kernels().get(esz == 2 ? "lora_up_add_f16" : "lora_up_add_f32", 3), b, &push, sizeof(push), gx, gy);
}

void VulkanStream::copy(const CopyOp& op) {
  const char* name = "vulkan copy";
  if (op.bytes == 0) return;
  auto range = [&](const char* field, const TensorRef& t) {
    auto* b = dynamic_cast<VulkanBuffer*>(t.buf);
    if (!b) throw Error(std::string(name) + ": " + field + " is not a Vulkan buffer");
    if (t.offset > b->size() || op.bytes > b->size() - t.offset)
      throw Error(std::string(name) + ": " + field + " needs bytes [" + std::to_string(t.offset) + ", " +
                  std::to_string(t.offset + op.bytes) + ") of a " + std::to_string(b->size()) + "-byte buffer");
    return b;
  };
  VulkanBuffer* s = range("src", op.src);
  VulkanBuffer* d = range("dst", op.dst);
  const uint64_t so = s->allocation().offset + op.src.offset, dof = d->allocation().offset + op.dst.offset;
  require(s->allocation().buffer != d->allocation().buffer || so + op.bytes <= dof || dof + op.bytes <= so, name,
          "src and dst overlap");
  rec_.copy(s->allocation().buffer, so, d->allocation().buffer, dof, op.bytes);
}

}  // namespace

std::vector<DeviceInfo> list_vulkan_devices(std::string* why_none) {
  std::vector<DeviceInfo> out;
  try {
    Instance inst = create_instance();
    for (const PhysicalDevice& pd : physical_devices(inst.get())) out.push_back(pd.info);
    if (out.empty() && why_none) *why_none = "the Vulkan loader found no device with Vulkan 1.1 and a compute queue";
  } catch (const Error& e) {
    if (why_none) *why_none = e.what();
  }
  return out;
}

std::unique_ptr<Backend> open_vulkan_backend(int index) {
  Instance inst = create_instance();
  std::vector<PhysicalDevice> pds = physical_devices(inst.get());
  if (index < 0 || index >= static_cast<int>(pds.size()))
    throw Error("vulkan:" + std::to_string(index) + ": no such device (" + std::to_string(pds.size()) +
                " Vulkan device" + (pds.size() == 1 ? "" : "s") + " found)");
  auto ctx = std::make_unique<Context>(std::move(inst), std::move(pds[static_cast<size_t>(index)]));
  return std::make_unique<VulkanBackend>(std::move(ctx));
}

}  // namespace ebb::vk
