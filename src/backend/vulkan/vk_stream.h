// Compute pipelines built from the embedded shaders, and a recorder of
// dispatches into one command buffer: recorded, submitted, fenced.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/vulkan/vk_util.h"

namespace ebb::vk {

class Context;

// Push constants of every shader begin with off[6] (shaders/common.glsl).
inline constexpr int kMaxBindings = 6;
inline constexpr uint32_t kPushBytes = 128;  // the minimum every device offers

// One shader's pipeline: n storage-buffer bindings 0..n-1, kPushBytes of push constants.
struct Kernel {
  std::string name;
  int n_bindings = 0;
  DescriptorSetLayout set_layout;
  PipelineLayout layout;
  Pipeline pipeline;
};

// Pipelines by shader name, built on first use (thread-safe).
class Kernels {
 public:
  explicit Kernels(Context& ctx) : ctx_(ctx) {}
  // Throws ebb::Error when the binary has no such shader.
  const Kernel& get(const std::string& name, int n_bindings);

 private:
  Context& ctx_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Kernel>> kernels_;
};

// One binding of a dispatch: a tensor at byte `offset` of a buffer whose
// valid bytes end at `end`, addressed by the shader in elements of
// elem_bytes (1: byte-addressed words, 2: halves, 4: floats or words).
struct Binding {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0;
  uint64_t end = 0;
  uint32_t elem_bytes = 4;
};

class Recorder {
 public:
  Recorder(Context& ctx, Kernels& kernels);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  ~Recorder();

  // Records one dispatch and a barrier after it (each op sees the results of
  // the ones before). push: the shader's push constants, whose first
  // kMaxBindings words this fills with the bindings' offsets.
  void dispatch(const Kernel& k, std::span<const Binding> bindings, void* push, uint32_t push_bytes, uint32_t gx,
                uint32_t gy = 1, uint32_t gz = 1);
  // Records a copy between two buffers' byte ranges, ordered after the ops
  // before it (and before the ones after it).
  void copy(VkBuffer src, uint64_t src_offset, VkBuffer dst, uint64_t dst_offset, uint64_t bytes);
  // Ends the command buffer being recorded and submits it as one segment
  // (no fence), and makes the next segment wait on the device until the
  // timeline semaphore `sem` reaches `value` (then a barrier makes host
  // writes visible to its ops). The host does not block; submit() and wait()
  // still cover every segment.
  void segment(VkSemaphore sem, uint64_t value);
  void submit();
  void wait();
  int64_t n_recorded() const { return n_recorded_; }
  int64_t n_submitted() const { return n_submitted_; }
  bool in_flight() const { return submitted_ || n_submitted_ > 0; }

 private:
  void begin();
  // Ends cmd_ and submits it with the pending timeline wait, signalling
  // `fence` (VK_NULL_HANDLE for a segment).
  void submit_current(VkFence fence);
  VkDescriptorSet allocate_set(const Kernel& k);

  Context& ctx_;
  Kernels& kernels_;
  CommandPool pool_;
  std::vector<VkCommandBuffer> cmds_;  // one per segment since the last wait(), freed with the pool
  size_t cur_ = 0;                     // cmds_[cur_] is being recorded
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkSemaphore wait_sem_ = VK_NULL_HANDLE;  // the current segment waits for it to reach wait_value_
  uint64_t wait_value_ = 0;
  int64_t n_submitted_ = 0;
  Fence fence_;
  std::vector<DescriptorPool> desc_pools_;
  bool recording_ = false;
  bool submitted_ = false;
  int64_t n_recorded_ = 0;
};

}  // namespace ebb::vk
