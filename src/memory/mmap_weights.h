// Baseline `mmap` for budget mode and the OS-paging baseline of elastic
// memory: views served straight from a read-only mapping of the GGUF, so the
// kernel's page cache decides what is resident. Only the 1-D tensors (norms,
// biases), which the forward pass reads as F32, are copied into a small
// resident buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weight_source.h"
#include "platform/allocator.h"

namespace ebb {

class Model;

class MmapWeights final : public WeightSource {
 public:
  // Maps the model's file (throws Error naming it on failure).
  MmapWeights(const Model& model, Allocator& alloc);
  ~MmapWeights() override;
  MmapWeights(const MmapWeights&) = delete;
  MmapWeights& operator=(const MmapWeights&) = delete;

  LayerWeights acquire_layer(int l) override;
  MatrixRow embedding_row(int32_t t) override;
  GlobalWeights acquire_head() override;

  // Reclaims the mapping's pages (MADV_PAGEOUT, else MADV_DONTNEED) and drops
  // the file from the page cache (posix_fadvise DONTNEED), so the next pass
  // faults every page back in from storage.
  void drop_pages();
  uint64_t mapped_bytes() const { return size_; }
  uint64_t resident_copy_bytes() const { return small_.size(); }

 private:
  const uint8_t* tensor(int layer, int slot) const;  // layer -1: globals

  const Model& model_;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  Buffer small_;                             // 1-D tensors as F32
  std::vector<std::vector<int64_t>> small_off_;  // [layer + 1][slot]: offset in small_, -1 if mapped
};

}  // namespace ebb
