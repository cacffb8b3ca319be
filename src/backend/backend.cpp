// The backend registry: which devices this build offers, and opening one.
#include "backend/backend.h"

#include <charconv>

#include "backend/cpu_backend.h"
#include "platform/error.h"
#if defined(EBB_HAVE_VULKAN)
#include "backend/vulkan/vulkan_backend.h"
#endif

namespace ebb {

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kIntegratedGpu: return "integrated-gpu";
    case DeviceKind::kDiscreteGpu: return "discrete-gpu";
    case DeviceKind::kVirtualGpu: return "virtual-gpu";
    case DeviceKind::kCpuDriver: return "cpu-driver";
    default: return "other";
  }
}

void BackendStream::wait_for(BackendTimeline&, uint64_t) {
  throw Error("this backend's streams cannot wait on a timeline (supports_timeline() is false)");
}

std::vector<DeviceInfo> list_gpu_devices(std::string* why_none) {
#if defined(EBB_HAVE_VULKAN)
  return vk::list_vulkan_devices(why_none);
#else
  if (why_none) *why_none = "this ebb was built without Vulkan (-DEBB_VULKAN=OFF)";
  return {};
#endif
}

std::unique_ptr<Backend> open_backend(std::string_view id) {
  if (id == "cpu") return open_cpu_backend(CpuBackendOptions{best_isa(), 1});
  std::string_view rest = id;
  if (rest.substr(0, 6) != "vulkan")
    throw Error("device '" + std::string(id) + "': unknown device (expected cpu, vulkan or vulkan:N)");
  rest.remove_prefix(6);
  int index = 0;
  if (!rest.empty()) {
    if (rest[0] != ':' || rest.size() == 1)
      throw Error("device '" + std::string(id) + "': expected vulkan or vulkan:N");
    rest.remove_prefix(1);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
    if (ec != std::errc() || p != rest.data() + rest.size() || index < 0)
      throw Error("device '" + std::string(id) + "': N in vulkan:N must be a device index");
  }
#if defined(EBB_HAVE_VULKAN)
  return vk::open_vulkan_backend(index);
#else
  throw Error("device '" + std::string(id) + "': this ebb was built without Vulkan (-DEBB_VULKAN=OFF)");
#endif
}

}  // namespace ebb
