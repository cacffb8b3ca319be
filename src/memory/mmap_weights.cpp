#include "memory/mmap_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "model/model.h"
#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {
MmapWeights::MmapWeights(const Model& model, Allocator& alloc) : model_(model) {
  const std::string& path = model.file().path();
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(path + ": cannot open for mmap: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw Error(path + ": cannot stat: " + std::strerror(errno));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    ::close(fd_);
    throw Error(path + ": mmap of " + std::to_string(size_) + " bytes failed: " + std::strerror(errno));
  }
  map_ = static_cast<uint8_t*>(p);

  // Units: globals first, then the layers; 1-D tensors get an F32 copy.
  std::vector<const WeightUnit*> units{&model.globals_unit()};
  for (int l = 0; l < model.n_layers(); ++l) units.push_back(&model.layer_unit(l));
  small_off_.resize(units.size());
  uint64_t total = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const TensorSlot& s : units[u]->slots()) {
      if (s.dims.size() < 2) {
        small_off_[u].push_back(static_cast<int64_t>(total));
        total += (s.unit_bytes + 63) & ~uint64_t{63};
      } else {
        small_off_[u].push_back(-1);
      }
    }
  }
  small_ = alloc.allocate(total, MemCategory::kWeights);
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& slots = units[u]->slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (small_off_[u][i] < 0) continue;
      const TensorSlot& s = slots[i];
      if (s.file_offset + s.file_bytes > size_) throw Error(path + ": tensor '" + s.name + "' lies past the end");
      auto* dst = small_.as<uint8_t>() + small_off_[u][i];
      const uint8_t* src = map_ + s.file_offset;
      if (s.type == s.file_type) {
        std::memcpy(dst, src, s.file_bytes);
        continue;
      }
      auto* out = reinterpret_cast<float*>(dst);
      for (uint64_t k = 0; k < s.file_bytes / 2; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, 2);
        out[k] = s.file_type == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
    }
  }
}

MmapWeights::~MmapWeights() {
  if (map_) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

const uint8_t* MmapWeights::tensor(int layer, int slot) const {
  const int64_t off = small_off_[layer + 1][slot];
  if (off >= 0) return small_.as<uint8_t>() + off;
  const WeightUnit& u = layer < 0 ? model_.globals_unit() : model_.layer_unit(layer);
  return map_ + u.slots()[slot].file_offset;
}

LayerWeights MmapWeights::acquire_layer(int l) {
  const auto& slots = model_.layer_unit(l).slots();
  const LayerLayout& s = model_.layout().layer_slots[l];
  return layer_views(slots, s, [&](int i) { return tensor(l, i); });
}

MatrixRow MmapWeights::embedding_row(int32_t t) {
  const WeightLayout& lay = model_.layout();
  const TensorSlot& e = lay.globals.slots()[lay.token_embd];
  const uint64_t rb = row_bytes(e.type, e.dims[0]);
  return {slot_view(e, tensor(-1, lay.token_embd) + static_cast<uint64_t>(t) * rb, 1), 0};
}

GlobalWeights MmapWeights::acquire_head() {
  const WeightLayout& lay = model_.layout();
  GlobalWeights g;
  g.output = slot_view(lay.globals.slots()[lay.output], tensor(-1, lay.output));
  g.output_norm = reinterpret_cast<const float*>(tensor(-1, lay.output_norm));
  return g;
}

void MmapWeights::drop_pages() {
#ifdef MADV_PAGEOUT
  if (::madvise(map_, size_, MADV_PAGEOUT) != 0) ::madvise(map_, size_, MADV_DONTNEED);
#else
  ::madvise(map_, size_, MADV_DONTNEED);
#endif
  ::madvise(map_, size_, MADV_DONTNEED);
  ::posix_fadvise(fd_, 0, static_cast<off_t>(size_), POSIX_FADV_DONTNEED);
}

}  // namespace ebb
