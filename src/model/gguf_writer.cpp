// GGUF v3 writer. The header (metadata and tensor infos) is serialized in
// memory, it is small; tensor data is streamed: tensors are filled into a
// bounded staging buffer and written out in large chunks, so writing a 1 GB
// synthetic model needs memory for the staging buffer and the largest tensor,
// not for the file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "platform/error.h"

namespace ebb {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;       // what the reader accepts
constexpr size_t kStagingBytes = 16 << 20;  // small tensors are batched up to this

// Owns a file descriptor opened for writing; closes it on every path.
class WriteFd {
 public:
  explicit WriteFd(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot create: " + std::strerror(errno));
  }
  ~WriteFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  WriteFd(const WriteFd&) = delete;
  WriteFd& operator=(const WriteFd&) = delete;

  // Writes all n bytes, retrying on EINTR and short writes (a full disk shows
  // up as a short write followed by ENOSPC).
  void write(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
      const ssize_t put = ::write(fd_, p, want);
      if (put < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": write of " + std::to_string(want) + " bytes at offset " +
                    std::to_string(written_) + " failed: " + std::strerror(errno));
      }
      if (put == 0)
        throw Error(path_ + ": write at offset " + std::to_string(written_) + " made no progress");
      p += put;
      n -= static_cast<uint64_t>(put);
      written_ += static_cast<uint64_t>(put);
    }
  }
  uint64_t written() const { return written_; }

  // close() can report a deferred write error (NFS, quota), so it is checked.
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) throw Error(path_ + ": close failed: " + std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

// Little-endian serialization of the header into a byte vector.
class HeaderSink {
 public:
  template <class T>
  void scalar(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(v));
  }
  void string(std::string_view s) {
    scalar<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void value(const GgufValue& v) {
    switch (v.type) {
      case GgufType::kUint8: scalar(static_cast<uint8_t>(v.u)); break;
      case GgufType::kUint16: scalar(static_cast<uint16_t>(v.u)); break;
      case GgufType::kUint32: scalar(static_cast<uint32_t>(v.u)); break;
      case GgufType::kUint64: scalar(static_cast<uint64_t>(v.u)); break;
      case GgufType::kInt8: scalar(static_cast<int8_t>(v.i)); break;
      case GgufType::kInt16: scalar(static_cast<int16_t>(v.i)); break;
      case GgufType::kInt32: scalar(static_cast<int32_t>(v.i)); break;
      case GgufType::kInt64: scalar(static_cast<int64_t>(v.i)); break;
      case GgufType::kFloat32: scalar(static_cast<float>(v.f)); break;
      case GgufType::kFloat64: scalar(v.f); break;
      case GgufType::kBool: scalar(static_cast<uint8_t>(v.u != 0)); break;
      case GgufType::kString: string(v.str); break;
      case GgufType::kArray:
        scalar(static_cast<uint32_t>(v.elem_type));
        if (v.elem_type == GgufType::kString) {
          scalar<uint64_t>(v.strings.size());
          for (const auto& s : v.strings) string(s);
        } else {
          scalar<uint64_t>(v.items.size());
          for (const auto& item : v.items) value(item);
        }
        break;
    }
  }
  std::vector<uint8_t> bytes;
};

bool known_type(GgufType t) { return static_cast<uint32_t>(t) <= static_cast<uint32_t>(GgufType::kFloat64); }

// Rejects values the reader would refuse or that cannot be encoded.
void validate_value(const std::string& key, const GgufValue& v, int depth) {
  const auto fail = [&](const std::string& problem) {
    throw Error("gguf writer: metadata key " + gguf_quote(key) + ": " + problem);
  };
  if (!known_type(v.type)) fail("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  if (v.type != GgufType::kArray) return;
  if (depth >= kMaxArrayDepth) fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  if (!known_type(v.elem_type))
    fail("unknown array element type " + std::to_string(static_cast<uint32_t>(v.elem_type)));
  if (v.elem_type == GgufType::kString) {
    if (!v.items.empty()) fail("array of string has non-string items");
    return;
  }
  if (!v.strings.empty()) fail("array of " + std::string(gguf_type_name(v.elem_type)) + " has strings");
  for (const GgufValue& item : v.items) {
    if (item.type != v.elem_type)
      fail("array of " + std::string(gguf_type_name(v.elem_type)) + " has an item of type " +
           std::string(gguf_type_name(item.type)));
    validate_value(key, item, depth + 1);
  }
}

GgufValue scalar_value(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

GgufValue array_value(GgufType elem) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.elem_type = elem;
  return v;
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  validate_value(key, value, 0);
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(value);
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::set_string(std::string key, std::string v) {
  GgufValue g = scalar_value(GgufType::kString);
  g.str = std::move(v);
  set(std::move(key), std::move(g));
}

void GgufWriter::set_uint32(std::string key, uint32_t v) {
  GgufValue g = scalar_value(GgufType::kUint32);
  g.u = v;
  set(std::move(key), std::move(g));
}

void GgufWriter::set_int32(std::string key, int32_t v) {
  GgufValue g = scalar_value(GgufType::kInt32);
  g.i = v;
  set(std::move(key), std::move(g));
}

void GgufWriter::set_float32(std::string key, float v) {
  GgufValue g = scalar_value(GgufType::kFloat32);
  g.f = v;
  set(std::move(key), std::move(g));
}

void GgufWriter::set_bool(std::string key, bool v) {
  GgufValue g = scalar_value(GgufType::kBool);
  g.u = v ? 1 : 0;
  set(std::move(key), std::move(g));
}

void GgufWriter::set_string_array(std::string key, std::vector<std::string> v) {
  GgufValue g = array_value(GgufType::kString);
  g.strings = std::move(v);
  set(std::move(key), std::move(g));
}

void GgufWriter::set_float32_array(std::string key, std::vector<float> v) {
  GgufValue g = array_value(GgufType::kFloat32);
  g.items.reserve(v.size());
  for (float x : v) {
    g.items.push_back(scalar_value(GgufType::kFloat32));
    g.items.back().f = x;
  }
  set(std::move(key), std::move(g));
}

void GgufWriter::set_int32_array(std::string key, std::vector<int32_t> v) {
  GgufValue g = array_value(GgufType::kInt32);
  g.items.reserve(v.size());
  for (int32_t x : v) {
    g.items.push_back(scalar_value(GgufType::kInt32));
    g.items.back().i = x;
  }
  set(std::move(key), std::move(g));
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, DType type) {
  const auto fail = [&](const std::string& problem) {
    throw Error("gguf writer: tensor " + gguf_quote(name) + ": " + problem);
  };
  if (tensor_index_.count(name)) fail("duplicate tensor name");
  if (dims.empty() || dims.size() > 4) fail(std::to_string(dims.size()) + " dims (must be 1..4)");
  const TypeInfo* info = type_info(static_cast<uint32_t>(type));
  if (!info) fail("unknown type " + std::to_string(static_cast<uint32_t>(type)));
  uint64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0) fail("dimension " + std::to_string(d) + " is not positive");
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) fail("element count overflows");
  }
  if (dims[0] % info->block_size != 0)
    fail("ne0 = " + std::to_string(dims[0]) + " is not a multiple of the block size " +
         std::to_string(info->block_size));
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(n / info->block_size, uint64_t{info->block_bytes}, &n_bytes))
    fail("byte size overflows");
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), std::move(dims), type, n_bytes});
}

void GgufWriter::write(const std::string& path,
                       const std::function<void(size_t index, uint8_t* dst)>& fill,
                       const std::function<void(uint64_t, uint64_t)>& progress) const {
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > (1u << 30))
    throw Error(path + ": gguf writer: alignment " + std::to_string(alignment) +
                " is not a power of two in 1..2^30");

  // general.alignment must agree with the layout; it is added (last, so the
  // caller's order is kept) when the alignment is not the default.
  using KvList = std::vector<std::pair<std::string, GgufValue>>;
  KvList extra;
  if (auto it = kv_index_.find("general.alignment"); it != kv_index_.end()) {
    const GgufValue& v = kv_[it->second].second;
    if (v.type != GgufType::kUint32 || v.u != alignment)
      throw Error(path + ": gguf writer: metadata general.alignment (" + gguf_describe(v) +
                  ") disagrees with the writer's alignment " + std::to_string(alignment));
  } else if (alignment != kDefaultAlignment) {
    GgufValue v = scalar_value(GgufType::kUint32);
    v.u = alignment;
    extra.emplace_back("general.alignment", std::move(v));
  }

  // Layout: each tensor at an aligned offset of the data section; the data
  // section (and so the file) ends aligned too.
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  uint64_t data_bytes = 0;
  for (const Pending& t : tensors_) {
    offsets.push_back(data_bytes);
    data_bytes = align_up(data_bytes + t.n_bytes, alignment);
  }

  HeaderSink h;
  h.bytes.insert(h.bytes.end(), {'G', 'G', 'U', 'F'});
  h.scalar<uint32_t>(kVersion);
  h.scalar<uint64_t>(tensors_.size());
  h.scalar<uint64_t>(kv_.size() + extra.size());
  for (const KvList* list : {&kv_, static_cast<const KvList*>(&extra)}) {
    for (const auto& [key, value] : *list) {
      h.string(key);
      h.scalar(static_cast<uint32_t>(value.type));
      h.value(value);
    }
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Pending& t = tensors_[i];
    h.string(t.name);
    h.scalar<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) h.scalar<uint64_t>(static_cast<uint64_t>(d));
    h.scalar<uint32_t>(static_cast<uint32_t>(t.type));
    h.scalar<uint64_t>(offsets[i]);
  }
  h.bytes.resize(align_up(h.bytes.size(), alignment), 0);
  const uint64_t total = h.bytes.size() + data_bytes;

  WriteFd out(path);
  out.write(h.bytes.data(), h.bytes.size());
  h.bytes = {};
  if (progress) progress(out.written(), total);

  // Small tensors are gathered in `staging` and flushed when it would
  // overflow; a tensor larger than staging is filled into its own buffer
  // (reused for the next large one) and written directly.
  std::vector<uint8_t> staging;
  std::vector<uint8_t> large;
  staging.reserve(std::min<uint64_t>(kStagingBytes, data_bytes));
  const auto flush = [&] {
    if (staging.empty()) return;
    out.write(staging.data(), staging.size());
    staging.clear();
    if (progress) progress(out.written(), total);
  };
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t padded = (i + 1 < tensors_.size() ? offsets[i + 1] : data_bytes) - offsets[i];
    if (padded > kStagingBytes) {
      flush();
      large.assign(padded, 0);
      fill(i, large.data());
      out.write(large.data(), padded);
      if (progress) progress(out.written(), total);
      continue;
    }
    if (staging.size() + padded > kStagingBytes) flush();
    const size_t at = staging.size();
    staging.resize(at + padded, 0);
    fill(i, staging.data() + at);
  }
  flush();
  out.close();
}

}  // namespace ebb
