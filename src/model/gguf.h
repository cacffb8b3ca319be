// GGUF v2/v3 reader. The file is hostile input (STYLE habit 10): every count,
// length, offset and size is checked; a bad file throws ebb::Error whose
// message names the file, the field and the problem. Tensor data is not
// mapped: callers read the byte ranges they need into their own units.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"

namespace ebb {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// The name of a general.file_type value (llama.cpp's llama_ftype):
// "MOSTLY_Q4_K_M", "ALL_F32", ...; empty for a value no engine assigns.
std::string_view gguf_file_type_name(uint64_t file_type);

// A metadata value. Scalars are widened (integers to int64/uint64, floats to
// double); arrays keep their element type and may nest.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u = 0;     // unsigned integers and bool
  int64_t i = 0;      // signed integers
  double f = 0;       // floats
  std::string str;    // kString
  GgufType elem_type = GgufType::kUint8;  // kArray: element type
  std::vector<GgufValue> items;           // kArray of non-strings, nested arrays
  std::vector<std::string> strings;       // kArray of strings

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }
  size_t array_size() const { return elem_type == GgufType::kString ? strings.size() : items.size(); }
  // Numeric value of a scalar integer/float/bool, as double. Calling it on a
  // string or array is a bug (EBB_CHECK); test the type first.
  double as_double() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne0 (fastest varying) first
  DType type = DType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t file_offset = 0;  // absolute offset in the file
};

// Identity of the file on disk, recorded at open; weights are restored from
// the file later only if it is unchanged.
struct FileIdentity {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  bool operator==(const FileIdentity&) const = default;
};

class GgufFile {
 public:
  // Parses header, metadata and tensor infos; validates that every tensor lies
  // inside the file. Throws ebb::Error.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return identity_.size; }
  const FileIdentity& identity() const { return identity_; }
  // The file's status change time (ctime, ns) when it was opened. Every
  // write, truncate or utimensat moves it, and user space cannot set it back,
  // so a descriptor that still shows it holds the bytes as they were then.
  int64_t ctime_ns() const { return ctime_ns_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;

  // Typed look-ups. Missing key: nullopt. Present with an incompatible type:
  // throws naming the key and both types. Integers convert between widths
  // when the value fits.
  std::optional<uint64_t> get_uint(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // accepts integer values too
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  std::optional<std::vector<float>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Reads [offset, offset + bytes) of the file (absolute offsets). Throws on
  // a short read or a range outside the file. Thread-safe (pread).
  void read(uint64_t offset, void* dst, uint64_t bytes) const;
  int fd() const { return fd_; }
  // Checks that the file on disk still has the identity recorded at open
  // (re-stats the path; false when it is gone or cannot be stat'ed).
  bool unchanged_on_disk() const;

 private:
  GgufFile() = default;
  std::string path_;
  int fd_ = -1;  // owned: closed by the destructor
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  FileIdentity identity_;
  int64_t ctime_ns_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  // Name -> index into metadata_ / tensors_; built while parsing, which is
  // also how duplicates are found in O(n log n) on hostile counts.
  std::map<std::string, size_t, std::less<>> key_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class GgufParser;
};

// Writes GGUF v3 files (used by `ebb synth`, tests and tools). Metadata is
// written in insertion order (setting a key again replaces its value in
// place); `general.alignment` is added when `alignment` is not the default.
// Tensor data is streamed through a bounded staging buffer, so a 1 GB model
// never sits in memory whole (only the largest single tensor may).
class GgufWriter {
 public:
  // Throws ebb::Error when the value is inconsistent (array items whose type
  // is not elem_type, nesting deeper than the reader accepts).
  void set(std::string key, GgufValue value);
  void set_string(std::string key, std::string v);
  void set_uint32(std::string key, uint32_t v);
  void set_int32(std::string key, int32_t v);
  void set_float32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_float32_array(std::string key, std::vector<float> v);
  void set_int32_array(std::string key, std::vector<int32_t> v);
  // Declares a tensor; its bytes are produced later by write()'s callback.
  // Throws ebb::Error for a duplicate name, 0 or more than 4 dims, a dim
  // <= 0, or ne0 not a multiple of the type's block size.
  void add_tensor(std::string name, std::vector<int64_t> dims, DType type);
  // Writes the file. fill(i, dst) must write the n_bytes of tensor i into
  // dst. progress(done_bytes, total_bytes) is called as data is written
  // (bytes of the whole file; the last call has done == total). Throws
  // ebb::Error naming the path when the file cannot be created or written
  // (a partial file is left behind), or when alignment is not a power of two.
  // The fill callback's exceptions propagate.
  void write(const std::string& path,
             const std::function<void(size_t index, uint8_t* dst)>& fill,
             const std::function<void(uint64_t, uint64_t)>& progress = nullptr) const;
  uint64_t alignment = 32;

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;  // key -> index into kv_
  struct Pending {
    std::string name;
    std::vector<int64_t> dims;
    DType type;
    uint64_t n_bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace ebb
