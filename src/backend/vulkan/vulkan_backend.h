// The Vulkan compute backend: Backend over one Vulkan device (backend.h).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace ebb::vk {

// Opens device `index` of the list physical_devices() gives. Throws
// ebb::Error naming the index and how many devices there are.
std::unique_ptr<Backend> open_vulkan_backend(int index);

// The Vulkan devices, or none with the reason in *why_none.
std::vector<DeviceInfo> list_vulkan_devices(std::string* why_none);

}  // namespace ebb::vk
