// Device memory for the Vulkan backend: buffers sub-allocated from slabs.
//
// Drivers cap the number of live allocations (maxMemoryAllocationCount, 4096
// on many) and make each one slow, so memory is taken from the driver in
// slabs (kSlabBytes, or one slab of its own for a larger buffer), each bound
// to one VkBuffer, and handed out as ranges of them. A slab is returned to
// the driver as soon as its last range is freed, so evicting weights or KV
// frees device memory. The ledger counts both, exactly.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/vulkan/vk_util.h"

namespace ebb::vk {

class Context;

// One range handed out: where it lives. Plain data; SlabAllocator::free
// returns it.
struct Allocation {
  VkBuffer buffer = VK_NULL_HANDLE;  // the slab's buffer
  uint64_t offset = 0;               // of the range in it, aligned
  uint64_t size = 0;                 // as asked
  uint64_t reserved = 0;             // as counted in the ledger (size rounded up to the alignment)
  void* mapped = nullptr;            // host address of the range, or nullptr
  uint32_t slab_id = 0;
};

class SlabAllocator {
 public:
  static constexpr uint64_t kSlabBytes = 64ull << 20;

  // place: which memory type to allocate from (see MemoryPlace).
  SlabAllocator(Context& ctx, MemoryPlace place);
  SlabAllocator(const SlabAllocator&) = delete;
  SlabAllocator& operator=(const SlabAllocator&) = delete;
  ~SlabAllocator();

  // Throws ebb::Error naming the device, the size and the limit.
  Allocation allocate(uint64_t bytes);
  void free(const Allocation& a);
  MemoryLedger ledger() const;
  bool host_mapped() const { return mapped_; }  // every range has a host address

 private:
  struct Slab {
    Memory memory;
    Buffer buffer;
    uint64_t size = 0;
    void* mapped = nullptr;
    std::map<uint64_t, uint64_t> free_ranges;  // offset -> size, disjoint, coalesced
    uint64_t n_live = 0;
  };
  std::unique_ptr<Slab> new_slab(uint64_t size);

  Context& ctx_;
  MemoryPlace place_;
  uint32_t memory_type_ = 0;
  bool mapped_ = false;
  uint64_t alignment_ = 256;
  mutable std::mutex mu_;
  std::map<uint32_t, std::unique_ptr<Slab>> slabs_;  // by id
  uint32_t next_id_ = 0;
  MemoryLedger ledger_;
};

}  // namespace ebb::vk
