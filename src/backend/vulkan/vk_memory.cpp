#include "backend/vulkan/vk_memory.h"

#include <algorithm>

#include "backend/vulkan/vk_context.h"
#include "platform/error.h"

namespace ebb::vk {
namespace {

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// The memory type for a place: the first type (drivers list them best first)
// with the required flags, preferring the extra ones.
//   kDevice: DEVICE_LOCAL; prefer also HOST_VISIBLE | HOST_COHERENT (unified
//            memory: writes go straight in).
//   kHost:   HOST_VISIBLE | HOST_COHERENT; prefer HOST_CACHED (reads back).
int pick_memory_type(const VkPhysicalDeviceMemoryProperties& mem, uint32_t allowed, MemoryPlace place) {
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const VkMemoryPropertyFlags need =
      place == MemoryPlace::kDevice ? VkMemoryPropertyFlags{VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT} : host;
  const VkMemoryPropertyFlags want =
      place == MemoryPlace::kDevice ? host : VkMemoryPropertyFlags{VK_MEMORY_PROPERTY_HOST_CACHED_BIT};
  int found = -1;
  for (uint32_t t = 0; t < mem.memoryTypeCount; ++t) {
    if (!(allowed & (1u << t))) continue;
    const VkMemoryPropertyFlags f = mem.memoryTypes[t].propertyFlags;
    if ((f & need) != need) continue;
    if ((f & want) == want) return static_cast<int>(t);
    if (found < 0) found = static_cast<int>(t);
  }
  return found;
}

const VkBufferUsageFlags kUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

}  // namespace

SlabAllocator::SlabAllocator(Context& ctx, MemoryPlace place) : ctx_(ctx), place_(place) {
  // The memory types a storage buffer may use: ask with a small buffer.
  VkBufferCreateInfo bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = 256;
  bci.usage = kUsage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer probe = VK_NULL_HANDLE;
  EBB_VK(vkCreateBuffer(ctx.device(), &bci, nullptr, &probe));
  Buffer owned(ctx.device(), probe);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx.device(), probe, &req);
  const int type = pick_memory_type(ctx.physical().memory, req.memoryTypeBits, place);
  if (type < 0)
    throw Error("Vulkan device " + ctx.info().id + " (" + ctx.info().name + ") has no " +
                (place == MemoryPlace::kDevice ? "device-local" : "host-visible coherent") +
                " memory type for storage buffers");
  memory_type_ = static_cast<uint32_t>(type);
  const VkMemoryPropertyFlags f = ctx.physical().memory.memoryTypes[memory_type_].propertyFlags;
  mapped_ = (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  // Every range starts where a descriptor may point (and at least at 16 bytes).
  alignment_ = std::max<uint64_t>({16, ctx.physical().limits.minStorageBufferOffsetAlignment, req.alignment});
}

SlabAllocator::~SlabAllocator() {
  // Buffers must not outlive the backend; a leak here is a bug in the caller.
  EBB_CHECK_MSG(ledger_.n_buffers == 0, "Vulkan buffers outlive their backend");
}

std::unique_ptr<SlabAllocator::Slab> SlabAllocator::new_slab(uint64_t size) {
  const auto& caps = ctx_.info().caps;
  if (ledger_.n_slabs + 1 > caps.max_allocations)
    throw Error("Vulkan device " + ctx_.info().id + ": " + std::to_string(ledger_.n_slabs) +
                " memory allocations, the driver's limit (maxMemoryAllocationCount " +
                std::to_string(caps.max_allocations) + ")");
  auto slab = std::make_unique<Slab>();
  VkDevice dev = ctx_.device();
  VkBufferCreateInfo bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = size;
  bci.usage = kUsage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buf = VK_NULL_HANDLE;
  EBB_VK(vkCreateBuffer(dev, &bci, nullptr, &buf));
  slab->buffer = Buffer(dev, buf);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buf, &req);
  VkMemoryAllocateInfo mai = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = memory_type_;
  VkDeviceMemory mem = VK_NULL_HANDLE;
  const VkResult r = vkAllocateMemory(dev, &mai, nullptr, &mem);
  if (r != VK_SUCCESS)
    throw Error("Vulkan device " + ctx_.info().id + ": vkAllocateMemory of a " + std::to_string(req.size) +
                "-byte slab failed: " + result_name(r) + " (" + std::to_string(ledger_.slab_bytes) +
                " bytes already held in " + std::to_string(ledger_.n_slabs) + " slabs)");
  slab->memory = Memory(dev, mem);
  EBB_VK(vkBindBufferMemory(dev, buf, mem, 0));
  if (mapped_) EBB_VK(vkMapMemory(dev, mem, 0, VK_WHOLE_SIZE, 0, &slab->mapped));
  slab->size = size;
  slab->free_ranges.emplace(0, size);
  ledger_.slab_bytes += size;
  ledger_.n_slabs += 1;
  return slab;
}

Allocation SlabAllocator::allocate(uint64_t bytes) {
  const auto& info = ctx_.info();
  if (bytes == 0) throw Error("Vulkan device " + info.id + ": a buffer of 0 bytes");
  if (bytes > info.caps.max_buffer_range)
    throw Error("Vulkan device " + info.id + ": a buffer of " + std::to_string(bytes) +
                " bytes exceeds the largest range a shader may address (maxStorageBufferRange " +
                std::to_string(info.caps.max_buffer_range) + ")");
  const uint64_t reserved = round_up(bytes, alignment_);
  std::lock_guard<std::mutex> lock(mu_);
  // First fit over the slabs, oldest first.
  for (auto& [id, slab] : slabs_) {
    for (auto it = slab->free_ranges.begin(); it != slab->free_ranges.end(); ++it) {
      if (it->second < reserved) continue;  // ranges start aligned, reserved is a multiple of it
      const uint64_t off = it->first, left = it->second - reserved;
      slab->free_ranges.erase(it);
      if (left) slab->free_ranges.emplace(off + reserved, left);
      slab->n_live += 1;
      ledger_.buffer_bytes += reserved;
      ledger_.n_buffers += 1;
      void* host = slab->mapped ? static_cast<uint8_t*>(slab->mapped) + off : nullptr;
      return Allocation{slab->buffer.get(), off, bytes, reserved, host, id};
    }
  }
  const uint64_t size = std::max(kSlabBytes, reserved);
  auto slab = new_slab(std::min<uint64_t>(size, std::max(reserved, info.caps.max_buffer_range)));
  const uint32_t id = next_id_++;
  const uint64_t left = slab->size - reserved;
  slab->free_ranges.clear();
  if (left) slab->free_ranges.emplace(reserved, left);
  slab->n_live = 1;
  ledger_.buffer_bytes += reserved;
  ledger_.n_buffers += 1;
  Allocation a{slab->buffer.get(), 0, bytes, reserved, slab->mapped, id};
  slabs_.emplace(id, std::move(slab));
  return a;
}

void SlabAllocator::free(const Allocation& a) {
  std::lock_guard<std::mutex> lock(mu_);
  auto sit = slabs_.find(a.slab_id);
  EBB_CHECK_MSG(sit != slabs_.end(), "SlabAllocator::free: not this allocator's range");
  Slab& slab = *sit->second;
  ledger_.buffer_bytes -= a.reserved;
  ledger_.n_buffers -= 1;
  if (--slab.n_live == 0) {  // the slab's last range: back to the driver
    ledger_.slab_bytes -= slab.size;
    ledger_.n_slabs -= 1;
    slabs_.erase(sit);
    return;
  }
  // Insert and coalesce with the neighbours.
  uint64_t off = a.offset, size = a.reserved;
  auto next = slab.free_ranges.lower_bound(off);
  if (next != slab.free_ranges.end() && off + size == next->first) {
    size += next->second;
    next = slab.free_ranges.erase(next);
  }
  if (next != slab.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      slab.free_ranges.erase(prev);
    }
  }
  slab.free_ranges.emplace(off, size);
}

MemoryLedger SlabAllocator::ledger() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_;
}

}  // namespace ebb::vk
