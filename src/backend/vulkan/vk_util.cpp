#include "backend/vulkan/vk_util.h"

#include <string>

#include "platform/error.h"

namespace ebb::vk {

const char* result_name(VkResult r) {
  switch (r) {
#define EBB_VK_CASE(x) \
  case x: return #x;
    EBB_VK_CASE(VK_SUCCESS)
    EBB_VK_CASE(VK_NOT_READY)
    EBB_VK_CASE(VK_TIMEOUT)
    EBB_VK_CASE(VK_EVENT_SET)
    EBB_VK_CASE(VK_EVENT_RESET)
    EBB_VK_CASE(VK_INCOMPLETE)
    EBB_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    EBB_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    EBB_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    EBB_VK_CASE(VK_ERROR_DEVICE_LOST)
    EBB_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    EBB_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    EBB_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    EBB_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    EBB_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    EBB_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    EBB_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    EBB_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    EBB_VK_CASE(VK_ERROR_UNKNOWN)
    EBB_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    EBB_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    EBB_VK_CASE(VK_ERROR_FRAGMENTATION)
    EBB_VK_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
#undef EBB_VK_CASE
    default: return "VkResult (unnamed)";
  }
}

void check(VkResult r, const char* call) {
  if (r == VK_SUCCESS) return;
  throw Error("Vulkan: " + std::string(call) + " failed: " + result_name(r) + " (" +
              std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace ebb::vk
