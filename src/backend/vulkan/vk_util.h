// Vulkan errors and RAII handles for the Vulkan backend.
#pragma once

#include <vulkan/vulkan.h>

#include <utility>

namespace ebb::vk {

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ...
const char* result_name(VkResult r);

// Throws ebb::Error "Vulkan: <call> failed: <VkResult name>" unless r is VK_SUCCESS.
void check(VkResult r, const char* call);
#define EBB_VK(call) ::ebb::vk::check((call), #call)

// A Vulkan info or property struct, zeroed, with its sType.
template <typename T>
T make(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

// Owns a handle created from a VkDevice and destroys it with Destroy.
template <typename T, void (*Destroy)(VkDevice, T, const VkAllocationCallbacks*)>
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(VkDevice dev, T h) : dev_(dev), h_(h) {}
  DeviceHandle(DeviceHandle&& o) noexcept : dev_(o.dev_), h_(std::exchange(o.h_, VK_NULL_HANDLE)) {}
  DeviceHandle& operator=(DeviceHandle&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      h_ = std::exchange(o.h_, VK_NULL_HANDLE);
    }
    return *this;
  }
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  ~DeviceHandle() { reset(); }
  void reset() {
    if (h_ != VK_NULL_HANDLE) Destroy(dev_, h_, nullptr);
    h_ = VK_NULL_HANDLE;
  }
  T get() const { return h_; }

 private:
  VkDevice dev_ = VK_NULL_HANDLE;
  T h_ = VK_NULL_HANDLE;
};

using Buffer = DeviceHandle<VkBuffer, vkDestroyBuffer>;
using Memory = DeviceHandle<VkDeviceMemory, vkFreeMemory>;
using ShaderModule = DeviceHandle<VkShaderModule, vkDestroyShaderModule>;
using DescriptorSetLayout = DeviceHandle<VkDescriptorSetLayout, vkDestroyDescriptorSetLayout>;
using PipelineLayout = DeviceHandle<VkPipelineLayout, vkDestroyPipelineLayout>;
using Pipeline = DeviceHandle<VkPipeline, vkDestroyPipeline>;
using DescriptorPool = DeviceHandle<VkDescriptorPool, vkDestroyDescriptorPool>;
using CommandPool = DeviceHandle<VkCommandPool, vkDestroyCommandPool>;
using Fence = DeviceHandle<VkFence, vkDestroyFence>;
using Semaphore = DeviceHandle<VkSemaphore, vkDestroySemaphore>;

// Owns a VkInstance.
class Instance {
 public:
  Instance() = default;
  explicit Instance(VkInstance i) : i_(i) {}
  Instance(Instance&& o) noexcept : i_(std::exchange(o.i_, VK_NULL_HANDLE)) {}
  Instance& operator=(Instance&& o) noexcept {
    if (this != &o) {
      if (i_) vkDestroyInstance(i_, nullptr);
      i_ = std::exchange(o.i_, VK_NULL_HANDLE);
    }
    return *this;
  }
  ~Instance() {
    if (i_) vkDestroyInstance(i_, nullptr);
  }
  VkInstance get() const { return i_; }

 private:
  VkInstance i_ = VK_NULL_HANDLE;
};

// Owns a VkDevice (destroyed after everything created from it: declare it first).
class Device {
 public:
  Device() = default;
  explicit Device(VkDevice d) : d_(d) {}
  Device(Device&& o) noexcept : d_(std::exchange(o.d_, VK_NULL_HANDLE)) {}
  Device& operator=(Device&& o) noexcept {
    if (this != &o) {
      if (d_) vkDestroyDevice(d_, nullptr);
      d_ = std::exchange(o.d_, VK_NULL_HANDLE);
    }
    return *this;
  }
  ~Device() {
    if (d_) vkDestroyDevice(d_, nullptr);
  }
  VkDevice get() const { return d_; }

 private:
  VkDevice d_ = VK_NULL_HANDLE;
};

}  // namespace ebb::vk
