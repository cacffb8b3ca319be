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
  void submit();
  void wait();
  int64_t n_recorded() const { return n_recorded_; }
  bool in_flight() const { return submitted_; }

 private:
  void begin();
  VkDescriptorSet allocate_set(const Kernel& k);

  Context& ctx_;
  Kernels& kernels_;
  CommandPool pool_;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  Fence fence_;
  std::vector<DescriptorPool> desc_pools_;
  bool recording_ = false;
  bool submitted_ = false;
  int64_t n_recorded_ = 0;
};

}  // namespace ebb::vk
