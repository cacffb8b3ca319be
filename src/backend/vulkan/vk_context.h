// A Vulkan instance, one physical device's capabilities, and the logical
// device with its compute queue (the Vulkan backend's root object).
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/vulkan/vk_util.h"

namespace ebb::vk {

// A Vulkan 1.2 instance with no layers or extensions. Throws ebb::Error naming
// the call and result when the loader finds no driver.
Instance create_instance();

// One physical device that can run ebb's shaders (Vulkan 1.1, a compute queue).
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  uint32_t compute_family = 0;
  DeviceInfo info;  // id "vulkan:N", N its index in this list
  VkPhysicalDeviceLimits limits{};
  VkPhysicalDeviceMemoryProperties memory{};
  bool timeline_semaphore = false;  // Vulkan 1.2's timelineSemaphore feature (enabled on the device when offered)
};

// The usable devices of an instance, in the loader's order.
std::vector<PhysicalDevice> physical_devices(VkInstance instance);

// The logical device of one physical device and its compute queue.
// Submissions to the queue take queue_mutex (Vulkan requires external
// synchronisation of a queue).
class Context {
 public:
  Context(Instance instance, PhysicalDevice pd);
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkDevice device() const { return device_.get(); }
  VkQueue queue() const { return queue_; }
  std::mutex& queue_mutex() { return queue_mutex_; }
  const PhysicalDevice& physical() const { return pd_; }
  const DeviceInfo& info() const { return pd_.info; }

 private:
  Instance instance_;  // destroyed last
  PhysicalDevice pd_;
  Device device_;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::mutex queue_mutex_;
};

}  // namespace ebb::vk
