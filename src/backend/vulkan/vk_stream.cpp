#include "backend/vulkan/vk_stream.h"

#include <cstring>

#include "backend/vulkan/vk_context.h"
#include "backend/vulkan/vk_shaders.h"
#include "platform/error.h"

namespace ebb::vk {
namespace {
constexpr uint32_t kSetsPerPool = 512;
}  // namespace

const Kernel& Kernels::get(const std::string& name, int n_bindings) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kernels_.find(name);
  if (it != kernels_.end()) {
    EBB_CHECK(it->second->n_bindings == n_bindings);
    return *it->second;
  }
  const std::span<const uint32_t> words = spirv_shader(name);
  if (words.empty()) throw Error("Vulkan: no shader named '" + name + "' in this binary");
  EBB_CHECK(n_bindings > 0 && n_bindings <= kMaxBindings);
  VkDevice dev = ctx_.device();
  auto k = std::make_unique<Kernel>();
  k->name = name;
  k->n_bindings = n_bindings;

  VkDescriptorSetLayoutBinding b[kMaxBindings]{};
  for (int i = 0; i < n_bindings; ++i) {
    b[i].binding = static_cast<uint32_t>(i);
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo dl = make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  dl.bindingCount = static_cast<uint32_t>(n_bindings);
  dl.pBindings = b;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  EBB_VK(vkCreateDescriptorSetLayout(dev, &dl, nullptr, &set_layout));
  k->set_layout = DescriptorSetLayout(dev, set_layout);

  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
  VkPipelineLayoutCreateInfo pl = make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pcr;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  EBB_VK(vkCreatePipelineLayout(dev, &pl, nullptr, &layout));
  k->layout = PipelineLayout(dev, layout);

  VkShaderModuleCreateInfo sm = make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  sm.codeSize = words.size() * sizeof(uint32_t);
  sm.pCode = words.data();
  VkShaderModule module = VK_NULL_HANDLE;
  EBB_VK(vkCreateShaderModule(dev, &sm, nullptr, &module));
  ShaderModule owned_module(dev, module);

  VkComputePipelineCreateInfo cp = make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  cp.stage = make<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
  cp.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cp.stage.module = module;
  cp.stage.pName = "main";
  cp.layout = layout;
  VkPipeline pipeline = VK_NULL_HANDLE;
  EBB_VK(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cp, nullptr, &pipeline));
  k->pipeline = Pipeline(dev, pipeline);
  return *kernels_.emplace(name, std::move(k)).first->second;
}

Recorder::Recorder(Context& ctx, Kernels& kernels) : ctx_(ctx), kernels_(kernels) {
  VkDevice dev = ctx.device();
  VkCommandPoolCreateInfo pci = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = ctx.physical().compute_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  EBB_VK(vkCreateCommandPool(dev, &pci, nullptr, &pool));
  pool_ = CommandPool(dev, pool);
  VkCommandBufferAllocateInfo cai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  cai.commandPool = pool;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  EBB_VK(vkAllocateCommandBuffers(dev, &cai, &cmd_));  // freed with the pool
  cmds_.push_back(cmd_);
  VkFenceCreateInfo fci = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  VkFence fence = VK_NULL_HANDLE;
  EBB_VK(vkCreateFence(dev, &fci, nullptr, &fence));
  fence_ = Fence(dev, fence);
}

Recorder::~Recorder() {
  // Never destroy what the device may still be running (segments without
  // the final submission: one more, with the fence, covers them).
  if (!submitted_ && n_submitted_ > 0) {
    try {
      submit();
    } catch (...) {
      vkQueueWaitIdle(ctx_.queue());
      return;
    }
  }
  if (submitted_) {
    VkFence f = fence_.get();
    vkWaitForFences(ctx_.device(), 1, &f, VK_TRUE, UINT64_MAX);
  }
}

void Recorder::begin() {
  VkCommandBufferBeginInfo bi = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  EBB_VK(vkBeginCommandBuffer(cmd_, &bi));
  recording_ = true;
}

VkDescriptorSet Recorder::allocate_set(const Kernel& k) {
  VkDevice dev = ctx_.device();
  VkDescriptorSetLayout layout = k.set_layout.get();
  VkDescriptorSetAllocateInfo ai = make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (!desc_pools_.empty()) {
    ai.descriptorPool = desc_pools_.back().get();
    const VkResult r = vkAllocateDescriptorSets(dev, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) check(r, "vkAllocateDescriptorSets");
  }
  // A new pool: the last one is full (or there is none yet).
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
  VkDescriptorPoolCreateInfo pci = make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
  pci.maxSets = kSetsPerPool;
  pci.poolSizeCount = 1;
  pci.pPoolSizes = &size;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  EBB_VK(vkCreateDescriptorPool(dev, &pci, nullptr, &pool));
  desc_pools_.emplace_back(dev, pool);
  ai.descriptorPool = pool;
  EBB_VK(vkAllocateDescriptorSets(dev, &ai, &set));
  return set;
}

void Recorder::dispatch(const Kernel& k, std::span<const Binding> bindings, void* push, uint32_t push_bytes,
                        uint32_t gx, uint32_t gy, uint32_t gz) {
  EBB_CHECK_MSG(!submitted_, "Recorder: recording while submitted; wait() first");
  EBB_CHECK(static_cast<int>(bindings.size()) == k.n_bindings);
  EBB_CHECK(push_bytes >= kMaxBindings * 4 && push_bytes <= kPushBytes);
  const auto& lim = ctx_.physical().limits;
  if (gx == 0 || gy == 0 || gz == 0) return;  // nothing to do
  if (gx > lim.maxComputeWorkGroupCount[0] || gy > lim.maxComputeWorkGroupCount[1] ||
      gz > lim.maxComputeWorkGroupCount[2])
    throw Error("Vulkan: " + k.name + " needs " + std::to_string(gx) + " x " + std::to_string(gy) + " x " +
                std::to_string(gz) + " workgroups, beyond the device's maxComputeWorkGroupCount");
  if (!recording_) begin();
  const uint64_t align = lim.minStorageBufferOffsetAlignment;
  VkDescriptorBufferInfo infos[kMaxBindings]{};
  VkWriteDescriptorSet writes[kMaxBindings]{};
  uint32_t offs[kMaxBindings]{};
  const VkDescriptorSet set = allocate_set(k);
  for (size_t i = 0; i < bindings.size(); ++i) {
    const Binding& b = bindings[i];
    const uint64_t base = b.offset / align * align;
    EBB_CHECK((b.offset - base) % b.elem_bytes == 0 && b.end > b.offset);
    offs[i] = static_cast<uint32_t>((b.offset - base) / b.elem_bytes);
    infos[i] = VkDescriptorBufferInfo{b.buffer, base, b.end - base};
    writes[i] = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(ctx_.device(), static_cast<uint32_t>(bindings.size()), writes, 0, nullptr);
  std::memcpy(push, offs, sizeof(offs));
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline.get());
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout.get(), 0, 1, &set, 0, nullptr);
  vkCmdPushConstants(cmd_, k.layout.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  vkCmdDispatch(cmd_, gx, gy, gz);
  // Every later dispatch and copy sees this one's writes (ops form a chain;
  // finer barriers, by the buffers each op touches, are later work).
  VkMemoryBarrier mb = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr,
                       0, nullptr);
  ++n_recorded_;
}

void Recorder::copy(VkBuffer src, uint64_t src_offset, VkBuffer dst, uint64_t dst_offset, uint64_t bytes) {
  EBB_CHECK_MSG(!submitted_, "Recorder: recording while submitted; wait() first");
  if (bytes == 0) return;
  if (!recording_) begin();
  VkBufferCopy region{src_offset, dst_offset, bytes};
  vkCmdCopyBuffer(cmd_, src, dst, 1, &region);
  // Later dispatches and copies see the copied bytes.
  VkMemoryBarrier mb = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr,
                       0, nullptr);
  ++n_recorded_;
}

void Recorder::segment(VkSemaphore sem, uint64_t value) {
  EBB_CHECK_MSG(!submitted_, "Recorder: a segment after submit(); wait() first");
  if (recording_ || wait_sem_ != VK_NULL_HANDLE) {
    if (!recording_) begin();
    submit_current(VK_NULL_HANDLE);
    if (++cur_ == cmds_.size()) {
      VkCommandBufferAllocateInfo cai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
      cai.commandPool = pool_.get();
      cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
      cai.commandBufferCount = 1;
      VkCommandBuffer c = VK_NULL_HANDLE;
      EBB_VK(vkAllocateCommandBuffers(ctx_.device(), &cai, &c));
      cmds_.push_back(c);
    }
    cmd_ = cmds_[cur_];
  }
  wait_sem_ = sem;
  wait_value_ = value;
  begin();
  // The host wrote what these ops read (a mapped buffer) before it signalled
  // the semaphore.
  VkMemoryBarrier mb = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_HOST_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_HOST_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr,
                       0, nullptr);
}

void Recorder::submit_current(VkFence fence) {
  EBB_VK(vkEndCommandBuffer(cmd_));
  recording_ = false;
  VkSubmitInfo si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  auto tsi = make<VkTimelineSemaphoreSubmitInfo>(VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO);
  const VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
  if (wait_sem_ != VK_NULL_HANDLE) {
    tsi.waitSemaphoreValueCount = 1;
    tsi.pWaitSemaphoreValues = &wait_value_;
    si.pNext = &tsi;
    si.waitSemaphoreCount = 1;
    si.pWaitSemaphores = &wait_sem_;
    si.pWaitDstStageMask = &stage;
  }
  {
    std::lock_guard<std::mutex> lock(ctx_.queue_mutex());
    EBB_VK(vkQueueSubmit(ctx_.queue(), 1, &si, fence));
  }
  wait_sem_ = VK_NULL_HANDLE;
  ++n_submitted_;
}

void Recorder::submit() {
  EBB_CHECK_MSG(!submitted_, "Recorder: submitted twice without wait()");
  if (!recording_) begin();  // an empty submission still signals the fence
  // Host writes (mapped buffers) before the submission are visible to it
  // (vkQueueSubmit's implicit host-write ordering); make the shaders' writes
  // visible to host reads after the fence.
  VkMemoryBarrier mb = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  // The fence covers every segment submitted before (submission order).
  submit_current(fence_.get());
  submitted_ = true;
}

void Recorder::wait() {
  if (!submitted_) {
    if (recording_ || n_submitted_ > 0 || wait_sem_ != VK_NULL_HANDLE) submit();
    else return;
  }
  VkFence f = fence_.get();
  EBB_VK(vkWaitForFences(ctx_.device(), 1, &f, VK_TRUE, UINT64_MAX));
  EBB_VK(vkResetFences(ctx_.device(), 1, &f));
  for (size_t i = 0; i <= cur_; ++i) EBB_VK(vkResetCommandBuffer(cmds_[i], 0));
  cur_ = 0;
  cmd_ = cmds_[0];
  for (auto& p : desc_pools_) EBB_VK(vkResetDescriptorPool(ctx_.device(), p.get(), 0));
  submitted_ = false;
  n_recorded_ = 0;
  n_submitted_ = 0;
}

}  // namespace ebb::vk
