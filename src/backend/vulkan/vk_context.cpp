#include "backend/vulkan/vk_context.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "platform/error.h"

namespace ebb::vk {
namespace {

DeviceKind kind_of(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return DeviceKind::kIntegratedGpu;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return DeviceKind::kDiscreteGpu;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return DeviceKind::kVirtualGpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return DeviceKind::kCpuDriver;
    default: return DeviceKind::kOther;
  }
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, std::string_view name) {
  return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return name == e.extensionName; });
}

// Capabilities from the Vulkan 1.1+ property and feature chains; the chains
// only include what the device's API version defines.
BackendCaps probe_caps(VkPhysicalDevice pd, const VkPhysicalDeviceProperties& props,
                       const VkPhysicalDeviceMemoryProperties& mem) {
  BackendCaps caps;
  const uint32_t api = props.apiVersion;

  VkPhysicalDeviceSubgroupProperties subgroup = make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto dot = make<VkPhysicalDeviceShaderIntegerDotProductProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES);
  VkPhysicalDeviceProperties2 props2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  props2.pNext = &subgroup;
  if (api >= VK_API_VERSION_1_3) subgroup.pNext = &dot;
  vkGetPhysicalDeviceProperties2(pd, &props2);
  caps.subgroup_size = subgroup.subgroupSize;
  if (api >= VK_API_VERSION_1_3) caps.int8_dot_product = dot.integerDotProduct4x8BitPackedSignedAccelerated == VK_TRUE;

  VkPhysicalDeviceShaderFloat16Int8Features f16i8 = make<VkPhysicalDeviceShaderFloat16Int8Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  VkPhysicalDeviceFeatures2 feats2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  if (api >= VK_API_VERSION_1_2) feats2.pNext = &f16i8;
  vkGetPhysicalDeviceFeatures2(pd, &feats2);
  caps.f16_arithmetic = f16i8.shaderFloat16 == VK_TRUE;
  caps.int8_arithmetic = f16i8.shaderInt8 == VK_TRUE;

  uint32_t n_ext = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, exts.data());
  caps.cooperative_matrix =
      has_extension(exts, "VK_KHR_cooperative_matrix") || has_extension(exts, "VK_NV_cooperative_matrix");

  for (uint32_t h = 0; h < mem.memoryHeapCount; ++h)
    if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      caps.device_memory_bytes = std::max<uint64_t>(caps.device_memory_bytes, mem.memoryHeaps[h].size);
  // Unified: the host maps device-local memory (an integrated GPU, a CPU
  // driver), so weights and KV need no staging copy.
  caps.unified_memory = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
                        props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  caps.max_buffer_range = props.limits.maxStorageBufferRange;
  caps.max_allocations = props.limits.maxMemoryAllocationCount;
  return caps;
}

std::string version_string(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

}  // namespace

Instance create_instance() {
  VkApplicationInfo app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "ebb";
  // 1.2: timeline semaphores (core there) where the device offers 1.2; the
  // shaders still target 1.1, and a 1.1 device is used as one.
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  VkInstance inst = VK_NULL_HANDLE;
  EBB_VK(vkCreateInstance(&ci, nullptr, &inst));
  return Instance(inst);
}

std::vector<PhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t n = 0;
  EBB_VK(vkEnumeratePhysicalDevices(instance, &n, nullptr));
  std::vector<VkPhysicalDevice> handles(n);
  EBB_VK(vkEnumeratePhysicalDevices(instance, &n, handles.data()));
  std::vector<PhysicalDevice> out;
  for (VkPhysicalDevice h : handles) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(h, &props);
    if (props.apiVersion < VK_API_VERSION_1_1) continue;  // the shaders target Vulkan 1.1
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> fams(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, fams.data());
    // Prefer a compute-only family (an async compute queue), else any with compute.
    int family = -1;
    for (uint32_t f = 0; f < nq; ++f) {
      if (!(fams[f].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
      if (family < 0 || !(fams[f].queueFlags & VK_QUEUE_GRAPHICS_BIT)) family = static_cast<int>(f);
    }
    if (family < 0) continue;
    PhysicalDevice pd;
    pd.handle = h;
    pd.compute_family = static_cast<uint32_t>(family);
    pd.limits = props.limits;
    vkGetPhysicalDeviceMemoryProperties(h, &pd.memory);
    pd.info.id = "vulkan:" + std::to_string(out.size());
    pd.info.name = props.deviceName;
    pd.info.kind = kind_of(props.deviceType);
    pd.info.caps = probe_caps(h, props, pd.memory);
    pd.info.driver = "Vulkan " + version_string(props.apiVersion);
    if (props.apiVersion >= VK_API_VERSION_1_2) {
      auto tl = make<VkPhysicalDeviceTimelineSemaphoreFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES);
      VkPhysicalDeviceFeatures2 f2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
      f2.pNext = &tl;
      vkGetPhysicalDeviceFeatures2(h, &f2);
      pd.timeline_semaphore = tl.timelineSemaphore == VK_TRUE;
    }
    VkPhysicalDeviceDriverProperties drv = make<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
    if (props.apiVersion >= VK_API_VERSION_1_2) {
      VkPhysicalDeviceProperties2 p2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
      p2.pNext = &drv;
      vkGetPhysicalDeviceProperties2(h, &p2);
      pd.info.driver += std::string(", ") + drv.driverName + " " + drv.driverInfo;
    }
    out.push_back(std::move(pd));
  }
  return out;
}

Context::Context(Instance instance, PhysicalDevice pd) : instance_(std::move(instance)), pd_(std::move(pd)) {
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qci = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = pd_.compute_family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  auto tl = make<VkPhysicalDeviceTimelineSemaphoreFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES);
  tl.timelineSemaphore = VK_TRUE;
  if (pd_.timeline_semaphore) dci.pNext = &tl;  // the restore's per-layer waits (BackendTimeline)
  VkDevice dev = VK_NULL_HANDLE;
  EBB_VK(vkCreateDevice(pd_.handle, &dci, nullptr, &dev));
  device_ = Device(dev);
  vkGetDeviceQueue(dev, pd_.compute_family, 0, &queue_);
}

}  // namespace ebb::vk
