#include "memory/weight_verify.h"

#include <sys/stat.h>

#include <cstdio>

#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "model/model.h"
#include "platform/checksum.h"
#include "platform/error.h"

namespace ebb {

bool descriptor_unchanged(int fd, const GgufFile& file) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return false;
  return gguf_identity(st) == file.identity();
}

bool bytes_unchanged(int fd, const GgufFile& file) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return false;
  const int64_t ctime = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return gguf_identity(st) == file.identity() && ctime == file.ctime_ns();
}

uint32_t unit_image_crc(const WeightUnit& u, const uint8_t* base) {
  uint32_t c = 0;
  for (const TensorSlot& s : u.slots()) c = crc32c(base + s.unit_offset, s.unit_bytes, c);
  return c;
}

WeightChecksums::WeightChecksums(const Model& model) {
  crc_.assign(static_cast<size_t>(model.n_layers()), 0);
  taken_.assign(static_cast<size_t>(model.n_layers()), false);
  for (int l = 0; l < model.n_layers(); ++l) {
    const WeightUnit& u = model.layer_unit(l);
    if (!u.resident()) continue;
    crc_[l] = unit_image_crc(u, static_cast<const uint8_t*>(u.data(0)) - u.slots()[0].unit_offset);
    taken_[l] = true;
  }
}

void WeightChecksums::verify(int layer, const WeightUnit& u, const uint8_t* base, const std::string& path) const {
  if (!has(layer)) return;
  const uint32_t got = unit_image_crc(u, base);
  if (got != crc_[layer]) {
    throw Error(weights_changed_message(path, "layer " + std::to_string(layer), got, crc_[layer]));
  }
}

std::string weights_changed_message(const std::string& path, const std::string& what, uint32_t got, uint32_t want) {
  char sums[64];
  std::snprintf(sums, sizeof sums, "CRC-32C %08x, loaded %08x", got, want);
  return path + ": the model file changed on disk since it was loaded: " + what +
         " read back differs from the weights loaded (" + sums + "); reload the model";
}

}  // namespace ebb
