// Weight layers read back from the model file are checked against the
// CRC-32C of the layer as it was first loaded (issue 21 item 7): a file
// rewritten in place with its size, inode and mtime kept (`rsync --inplace
// -t`) passes the identity check; its change time (ctime) does not, since
// user space cannot set it. A restore whose descriptor still shows the ctime
// of the open reads the bytes that were loaded and skips the CRC: the check
// is CPU on the restore's critical path, which on a machine whose cores the
// prefill keeps busy paces the restore more than the disk (qwen3-0.6b F16 at
// 4k context on 2 busy cores, 28 layers of 30 MiB: TTFT 1.00 s checked,
// 0.66 s not). Streamed layers (budget mode) are always checked.
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

// descriptor_unchanged() and the ctime recorded when `file` was opened: no
// write, truncate or time change reached the inode since, so what a read
// through `fd` returns are the bytes that were loaded. (ctimes come from the
// filesystem clock, which ticks every few ms: a write in the same tick as the
// last change before the open would keep it.)
bool bytes_unchanged(int fd, const GgufFile& file);

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
