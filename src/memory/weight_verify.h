// Weight layers read back from the model file are checked against the
// CRC-32C of the layer as it was first loaded (issue 21 item 7): a file
// rewritten in place with its size, inode and mtime kept (`rsync --inplace
// -t`) passes the identity check, so only the bytes can tell. CRC-32C runs
// far faster than the disk that delivers the bytes (SSE4.2: about 10-20 GB/s
// a core against 1-7 GB/s of storage), so each restored layer is checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ebb {

class GgufFile;
class Model;
class WeightUnit;

// Whether the weights can still be read through `fd`, a descriptor opened on
// the model file: it still shows the file as loaded (inode, device, size,
// mtime). True when the path was replaced (renamed over) or deleted but the
// descriptor holds the original inode unchanged; false when the file was
// rewritten in place (then only the checksums can tell, when the mtime was
// kept too).
bool descriptor_unchanged(int fd, const GgufFile& file);

// CRC-32C of a unit image (convert_slots() done): every slot's bytes
// [unit_offset, unit_offset + unit_bytes) in slot order, the bytes the
// layer's views read (widened norms and packed matrices included).
uint32_t unit_image_crc(const WeightUnit& u, const uint8_t* base);

// The load-time checksum of every layer unit of a model.
class WeightChecksums {
 public:
  WeightChecksums() = default;
  // Takes the checksum of each layer unit of `model` that is resident now
  // (all of them right after Model::load); other layers are not checked.
  explicit WeightChecksums(const Model& model);

  bool has(int layer) const { return layer >= 0 && layer < static_cast<int>(crc_.size()) && taken_[layer]; }
  uint32_t crc(int layer) const { return crc_[layer]; }
  // Checks a unit image of `layer` read back from the file at `path`; throws
  // Error naming the file, the layer and both checksums when they differ.
  void verify(int layer, const WeightUnit& u, const uint8_t* base, const std::string& path) const;

 private:
  std::vector<uint32_t> crc_;
  std::vector<bool> taken_;
};

// The message of a weight range whose bytes differ from those loaded.
std::string weights_changed_message(const std::string& path, const std::string& what, uint32_t got, uint32_t want);

}  // namespace ebb
