// One aligned allocator for every byte the LLM owns (STYLE habit 6). Each
// allocation is tagged with a category and recorded in a Ledger, so the
// engine's footprint() can be checked against what really went through here.
//
// Large blocks come straight from mmap and go back with munmap, so freeing a
// unit returns its pages to the OS (the elastic-memory work depends on that);
// small blocks use aligned operator new.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace ebb {

enum class MemCategory : uint8_t {
  kWeights,     // per-layer weight units
  kGlobals,     // token embedding, output norm, output head
  kKvCache,     // resident KV chunks
  kScratch,     // activations and planned work buffers
  kIoBuffer,    // direct-I/O staging
  kCompressed,  // compressed swap stack segments
  kAdapter,     // LoRA adapter tensors
  kTrainActivations,  // training: saved activations and work buffers
  kTrainGrads,        // training: gradients
  kTrainOptimizer,    // training: parameters' private copy and optimizer moments
  kOther,
  kCount,
};

std::string_view mem_category_name(MemCategory c);

// Bytes currently held per category. Thread-safe.
class Ledger {
 public:
  void add(MemCategory c, int64_t bytes) {
    bytes_[static_cast<size_t>(c)].fetch_add(bytes, std::memory_order_relaxed);
  }
  int64_t bytes(MemCategory c) const {
    return bytes_[static_cast<size_t>(c)].load(std::memory_order_relaxed);
  }
  int64_t total() const;

 private:
  std::array<std::atomic<int64_t>, static_cast<size_t>(MemCategory::kCount)> bytes_{};
};

// An owning, move-only aligned block. Destroying it frees the memory and
// credits the ledger.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  MemCategory category() const { return category_; }
  void reset();

 private:
  friend class Allocator;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // > 0 when the block came from mmap
  MemCategory category_ = MemCategory::kOther;
  Ledger* ledger_ = nullptr;
};

class Allocator {
 public:
  static constexpr size_t kDefaultAlignment = 64;
  static constexpr size_t kMmapThreshold = 64 * 1024;

  explicit Allocator(Ledger* ledger) : ledger_(ledger) {}

  // Throws ebb::Error when the system is out of memory or bytes overflows.
  // alignment must be a power of two <= 4096. A zero-byte request returns an
  // empty buffer.
  Buffer allocate(size_t bytes, MemCategory category, size_t alignment = kDefaultAlignment);
  // `count` page-aligned buffers of `bytes` each, laid out back to back in
  // one mapping (so a group of 2 MiB or more gets transparent huge pages and
  // its first touch costs one fault per 2 MiB, not one per 4 KiB). Each buffer
  // is still freed on its own: its pages go back to the system when it is.
  // `populate`: fault every page in now (by huge pages where the group has
  // them, several times faster than 4 KiB pages), so the memory is in the
  // process's RSS from the start, as with the smaller blocks of allocate().
  std::vector<Buffer> allocate_group(size_t count, size_t bytes, MemCategory category, bool populate = false);

  Ledger* ledger() const { return ledger_; }

 private:
  Ledger* ledger_;
};

// Overflow-checked size arithmetic for sizes read from untrusted files.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out);
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out);

}  // namespace ebb
