// safetensors reader and writer (Hugging Face's tensor file format, as PEFT
// adapters are saved). Layout:
//   u64 N (little-endian)            the header's length
//   N bytes of JSON                  { "NAME": {"dtype": "F32", "shape": [d0, d1, ...],
//                                               "data_offsets": [begin, end]}, ...,
//                                      "__metadata__": {"key": "value", ...} (optional) }
//   the data section                 offsets are relative to its start, 8 + N
// Shapes are row-major, outermost dimension first (PyTorch's order, the
// reverse of GGUF's ne0-first dims).
//
// The file is hostile input (STYLE habit 10): the header length is bounded,
// the JSON is read by a strict state machine (no nesting, field or value of
// an unexpected type is accepted; duplicate names are errors), every shape's
// element count and byte size is overflow-checked and must match its
// offsets, every tensor lies inside the data section, and no two overlap.
// Errors throw ebb::Error naming the file, the tensor and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"

namespace ebb {

inline constexpr uint64_t kSafetensorsMaxHeader = 100ull << 20;  // 100 MiB, as the reference reader
inline constexpr size_t kSafetensorsMaxDims = 16;

// Bytes per element of a safetensors dtype name ("F32" 4, "BF16" 2, "U8" 1,
// ...); 0 for a name the format does not define.
size_t safetensors_dtype_size(std::string_view dtype);
// ebb's DType for "F32", "F16" and "BF16"; nullopt for the others.
std::optional<DType> safetensors_dtype(std::string_view dtype);

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;            // as stored: "F32", "F16", "BF16", "I64", ...
  std::optional<DType> type;    // F32/F16/BF16 as ebb's DType; nullopt for other dtypes
  std::vector<int64_t> shape;   // outermost first; [] is a scalar
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t file_offset = 0;     // absolute offset in the file
};

class SafetensorsFile {
 public:
  // Reads and validates the header. Throws ebb::Error.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + N
  // In order of their data (file offset).
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads the tensor's n_bytes into dst (pread; throws on a short read, as
  // when the file shrank after it was opened).
  void read(const SafetensorsTensorInfo& t, void* dst) const;
  std::vector<uint8_t> read(const SafetensorsTensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;  // owned: closed by the destructor
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> index into tensors_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `data` (n_elements × dtype size bytes, row-major)
// must stay alive until write_safetensors returns.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", ... (safetensors_dtype_size > 0)
  std::vector<int64_t> shape;  // outermost first
  std::span<const uint8_t> data;
};

// Writes the tensors back to back in the given order, the header padded
// with spaces to a multiple of 8 bytes (as the reference writer does).
// Throws ebb::Error naming the path on an I/O failure, and naming the tensor
// for a duplicate or reserved name, an unknown dtype, a negative dim or a
// data size that does not match the shape.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ebb
