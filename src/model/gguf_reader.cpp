// GGUF parsing: header, metadata, tensor infos. The file is hostile input, so
// every length and count is checked against the bytes that remain in the file
// BEFORE anything is allocated for it, and all size arithmetic is overflow
// checked. The layout (all little-endian):
//
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 type | value }
//   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] | u32 type | u64 offset }
//   padding to `general.alignment` | data section (tensor offsets are relative to it)
//
// where a string is { u64 length | bytes } and an array value is
// { u32 elem_type | u64 count | count x value }.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "platform/error.h"

namespace ebb {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields directly");

constexpr uint32_t kMinVersion = 2;
constexpr uint32_t kMaxVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;
// The header is read through a buffer: the first pread takes 64 KiB (the
// whole header of a small model), later ones double up to 1 MiB, so a large
// tokenizer costs a few dozen syscalls and a small file reads little data.
constexpr uint64_t kFirstReadChunk = 64 * 1024;
constexpr uint64_t kMaxReadChunk = 1024 * 1024;
// Counts are checked against the file's bytes, but a byte in the file can
// become a 120-byte GgufValue in memory; this cap on the parsed metadata and
// tensor infos keeps a hostile file of tiny entries from asking for many GB.
// Real vocabularies use tens of MB.
constexpr uint64_t kMaxMetadataMemory = 1ull << 30;

// Smallest encodings, used to bound counts by the remaining bytes.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // key length, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, 1 dim, type, offset

// Encoded size of one array element of a type, or its minimum for strings
// (the length field) and nested arrays (elem_type and count); 0 if unknown.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool: return 1;
    case GgufType::kUint16:
    case GgufType::kInt16: return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32: return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString: return 8;
    case GgufType::kArray: return 12;
  }
  return 0;
}

}  // namespace

// Reads the header region sequentially through a large buffer (one pread per
// kReadChunk, not one syscall per field). Every read first checks that the
// file holds the bytes, so a bad length fails before any allocation.
class GgufByteReader {
 public:
  GgufByteReader(int fd, uint64_t file_size, const GgufErrorContext& err)
      : fd_(fd), size_(file_size), err_(err) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void require(uint64_t n, const char* field) const {
    if (n > remaining())
      err_.fail(field, "truncated: needs " + std::to_string(n) + " bytes at offset " +
                           std::to_string(pos_) + ", but the file ends at " +
                           std::to_string(size_));
  }

  void read(void* dst, uint64_t n, const char* field) {
    require(n, field);
    auto* out = static_cast<uint8_t*>(dst);
    // Large blocks skip the buffer.
    if (n >= kMaxReadChunk) {
      gguf_pread_full(fd_, out, n, pos_, err_.path);
      pos_ += n;
      return;
    }
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_.size()) refill();
      const uint64_t avail = buf_start_ + buf_.size() - pos_;
      const uint64_t take = std::min(avail, n);
      std::memcpy(out, buf_.data() + (pos_ - buf_start_), take);
      out += take;
      pos_ += take;
      n -= take;
    }
  }

  template <class T>
  T scalar(const char* field) {
    T v;
    read(&v, sizeof(v), field);
    return v;
  }

  // A length-prefixed string; the length is checked before allocating.
  std::string string(const char* field) {
    const uint64_t len = scalar<uint64_t>(field);
    if (len > remaining())
      err_.fail(field, "string length " + std::to_string(len) + " exceeds the " +
                           std::to_string(remaining()) + " bytes left in the file (truncated or corrupt)");
    std::string s(len, '\0');
    read(s.data(), len, field);
    return s;
  }

 private:
  void refill() {
    buf_start_ = pos_;
    buf_.resize(std::min(chunk_, size_ - pos_));
    gguf_pread_full(fd_, buf_.data(), buf_.size(), pos_, err_.path);
    chunk_ = std::min(chunk_ * 2, kMaxReadChunk);
  }

  int fd_;
  uint64_t size_;
  const GgufErrorContext& err_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;  // bytes [buf_start_, buf_start_ + size)
  uint64_t buf_start_ = 0;
  uint64_t chunk_ = kFirstReadChunk;
};

// Fills a GgufFile from its fd. Owns the error context: `where` names the
// entry being parsed ("metadata key 'x'", "tensor 'y'") for messages.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& f)
      : f_(f), err_{f.path_, ""}, in_(f.fd_, f.identity_.size, err_) {}

  void parse() {
    parse_header();
    parse_metadata();
    parse_alignment();
    parse_tensor_infos();
    place_tensors();
  }

 private:
  void parse_header() {
    char magic[4];
    in_.read(magic, 4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0)
      err_.fail("magic", "bad magic " + gguf_quote(std::string_view(magic, 4)) +
                             " (expected 'GGUF'): not a GGUF file");
    const uint32_t version = in_.scalar<uint32_t>("version");
    if (version == 1)
      err_.fail("version", "GGUF version 1 is not supported (it predates 64-bit counts); "
                           "only versions 2 and 3 are read");
    if (version < kMinVersion || version > kMaxVersion) {
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= kMinVersion && swapped <= kMaxVersion)
        err_.fail("version", "version field reads " + std::to_string(version) +
                                 ": a big-endian GGUF, which is not supported");
      err_.fail("version", "unsupported GGUF version " + std::to_string(version) +
                               " (supported: 2 and 3)");
    }
    f_.version_ = version;
    n_tensors_ = in_.scalar<uint64_t>("tensor count");
    n_kv_ = in_.scalar<uint64_t>("metadata key count");
    check_count(n_kv_, kMinKvBytes, "metadata key count");
    check_count(n_tensors_, kMinTensorInfoBytes, "tensor count");
  }

  // Each entry takes at least `min_bytes`, so a count the rest of the file
  // cannot hold is rejected before anything is reserved for it.
  void check_count(uint64_t n, uint64_t min_bytes, const char* field) {
    if (n > in_.remaining() / min_bytes)
      err_.fail(field, std::to_string(n) + " entries need at least " + std::to_string(min_bytes) +
                           " bytes each, but only " + std::to_string(in_.remaining()) +
                           " bytes are left (truncated or corrupt)");
  }

  void parse_metadata() {
    charge_memory(n_kv_, sizeof(f_.metadata_[0]), "metadata key count");
    f_.metadata_.reserve(n_kv_);
    for (uint64_t i = 0; i < n_kv_; ++i) {
      err_.where = "metadata entry " + std::to_string(i);
      std::string key = in_.string("key");
      err_.where = "metadata key " + gguf_quote(key);
      if (f_.key_index_.count(key)) err_.fail("key", "duplicate key");
      const auto type = read_type("value type");
      GgufValue value = read_value(type, 0, "value");
      f_.key_index_.emplace(key, f_.metadata_.size());
      f_.metadata_.emplace_back(std::move(key), std::move(value));
    }
    err_.where.clear();
  }

  void parse_alignment() {
    f_.alignment_ = kDefaultAlignment;
    const GgufValue* v = f_.find("general.alignment");
    if (!v) return;
    err_.where = "metadata key 'general.alignment'";
    if (v->type != GgufType::kUint32)
      err_.fail("value", "expected uint32, got " + gguf_describe(*v));
    if (v->u == 0 || !std::has_single_bit(v->u))
      err_.fail("value", "alignment " + std::to_string(v->u) + " is not a nonzero power of two");
    f_.alignment_ = v->u;
    err_.where.clear();
  }

  void parse_tensor_infos() {
    charge_memory(n_tensors_, sizeof(GgufTensorInfo), "tensor count");
    f_.tensors_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      err_.where = "tensor info " + std::to_string(i);
      GgufTensorInfo t;
      t.name = in_.string("name");
      err_.where = "tensor " + gguf_quote(t.name);
      if (f_.tensor_index_.count(t.name)) err_.fail("name", "duplicate tensor name");

      const uint32_t n_dims = in_.scalar<uint32_t>("n_dims");
      if (n_dims == 0 || n_dims > kMaxDims)
        err_.fail("n_dims", "n_dims " + std::to_string(n_dims) + " is not in 1.." +
                                std::to_string(kMaxDims));
      uint64_t dims[kMaxDims];
      for (uint32_t d = 0; d < n_dims; ++d) dims[d] = in_.scalar<uint64_t>("dims");

      const uint32_t type_id = in_.scalar<uint32_t>("type");
      const TypeInfo* info = type_info(type_id);
      if (!info) err_.fail("type", "unknown tensor type " + std::to_string(type_id));
      t.type = info->type;
      t.offset = in_.scalar<uint64_t>("offset");
      size_tensor(t, dims, n_dims, *info);

      f_.tensor_index_.emplace(t.name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
    }
    err_.where.clear();
  }

  // Checks the dims and computes the element and byte counts without
  // overflow; the type's block size must divide ne0 (blocks run along rows).
  void size_tensor(GgufTensorInfo& t, const uint64_t* dims, uint32_t n_dims,
                   const TypeInfo& info) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (dims[d] == 0 || dims[d] > static_cast<uint64_t>(INT64_MAX))
        err_.fail("dims", "dimension " + std::to_string(d) + " is " + std::to_string(dims[d]) +
                              " (must be in 1..2^63-1)");
      if (__builtin_mul_overflow(n, dims[d], &n) || n > static_cast<uint64_t>(INT64_MAX))
        err_.fail("dims", "element count overflows 64 bits");
      t.dims.push_back(static_cast<int64_t>(dims[d]));
    }
    if (dims[0] % info.block_size != 0)
      err_.fail("dims", "ne0 = " + std::to_string(dims[0]) + " is not a multiple of " +
                            std::string(info.name) + "'s block size " +
                            std::to_string(info.block_size));
    t.n_elements = n;
    if (__builtin_mul_overflow(n / info.block_size, uint64_t{info.block_bytes}, &t.n_bytes))
      err_.fail("dims", "byte size overflows 64 bits");
  }

  // The data section starts at the first aligned offset after the tensor
  // infos; every tensor must be aligned within it and end inside the file.
  void place_tensors() {
    const uint64_t align = f_.alignment_;
    const uint64_t end_of_infos = in_.pos();
    uint64_t data = 0;
    if (__builtin_add_overflow(end_of_infos, align - 1, &data))
      err_.fail("general.alignment", "data section offset overflows 64 bits");
    data &= ~(align - 1);
    f_.data_offset_ = data;
    const uint64_t size = f_.identity_.size;
    for (GgufTensorInfo& t : f_.tensors_) {
      err_.where = "tensor " + gguf_quote(t.name);
      if (t.offset % align != 0)
        err_.fail("offset", "offset " + std::to_string(t.offset) + " is not a multiple of the " +
                                "alignment " + std::to_string(align));
      uint64_t start = 0, end = 0;
      const bool overflow = __builtin_add_overflow(data, t.offset, &start) ||
                            __builtin_add_overflow(start, t.n_bytes, &end);
      if (overflow || end > size)
        err_.fail_text("data [offset " + std::to_string(t.offset) + ", " +
                       std::to_string(t.n_bytes) + " bytes] extends past end of file (" +
                       std::to_string(size) + " bytes; data section starts at " +
                       std::to_string(data) + ")");
      t.file_offset = start;
    }
    err_.where.clear();
  }

  GgufType read_type(const char* field) {
    const uint32_t raw = in_.scalar<uint32_t>(field);
    const auto t = static_cast<GgufType>(raw);
    if (min_encoded_size(t) == 0) err_.fail(field, "unknown value type " + std::to_string(raw));
    return t;
  }

  // Accounts for `count` objects of `size` bytes before they are allocated.
  void charge_memory(uint64_t count, uint64_t size, const char* field) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(count, size, &bytes) || bytes > kMaxMetadataMemory - metadata_memory_)
      err_.fail(field, "metadata would need more than " +
                           std::to_string(kMaxMetadataMemory >> 20) + " MiB of memory");
    metadata_memory_ += bytes;
  }

  GgufValue read_value(GgufType type, int depth, const char* field) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::kUint8: v.u = in_.scalar<uint8_t>(field); break;
      case GgufType::kUint16: v.u = in_.scalar<uint16_t>(field); break;
      case GgufType::kUint32: v.u = in_.scalar<uint32_t>(field); break;
      case GgufType::kUint64: v.u = in_.scalar<uint64_t>(field); break;
      case GgufType::kInt8: v.i = in_.scalar<int8_t>(field); break;
      case GgufType::kInt16: v.i = in_.scalar<int16_t>(field); break;
      case GgufType::kInt32: v.i = in_.scalar<int32_t>(field); break;
      case GgufType::kInt64: v.i = in_.scalar<int64_t>(field); break;
      case GgufType::kFloat32: v.f = in_.scalar<float>(field); break;
      case GgufType::kFloat64: v.f = in_.scalar<double>(field); break;
      case GgufType::kBool: {
        const uint8_t b = in_.scalar<uint8_t>(field);
        if (b > 1) err_.fail(field, "bool value " + std::to_string(b) + " is not 0 or 1");
        v.u = b;
        break;
      }
      case GgufType::kString:
        v.str = in_.string(field);
        charge_memory(v.str.size(), 1, field);
        break;
      case GgufType::kArray: read_array(v, depth + 1); break;
    }
    return v;
  }

  void read_array(GgufValue& v, int depth) {
    if (depth > kMaxArrayDepth)
      err_.fail("array", "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    v.elem_type = read_type("array element type");
    const uint64_t n = in_.scalar<uint64_t>("array length");
    const uint64_t min_size = min_encoded_size(v.elem_type);
    if (n > in_.remaining() / min_size)
      err_.fail("array length", "array length " + std::to_string(n) + " of " +
                                    std::string(gguf_type_name(v.elem_type)) + " needs at least " +
                                    std::to_string(min_size) + " bytes each, but only " +
                                    std::to_string(in_.remaining()) +
                                    " bytes are left (truncated or corrupt)");
    charge_memory(n, v.elem_type == GgufType::kString ? sizeof(std::string) : sizeof(GgufValue),
                  "array length");
    if (v.elem_type == GgufType::kString) {
      v.strings.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        v.strings.push_back(in_.string("array element"));
        charge_memory(v.strings.back().size(), 1, "array element");
      }
    } else {
      v.items.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(v.elem_type, depth, "array element"));
    }
  }

  GgufFile& f_;
  GgufErrorContext err_;
  GgufByteReader in_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t metadata_memory_ = 0;
};

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  // O_NONBLOCK so that opening a FIFO by mistake cannot hang; it has no
  // effect on regular files, and anything else is rejected below.
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  f->identity_ = gguf_identity(st);
  f->ctime_ns_ = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  GgufParser(*f).parse();
  return f;
}

GgufFile::~GgufFile() {
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::read(uint64_t offset, void* dst, uint64_t bytes) const {
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, bytes, &end) || end > identity_.size)
    throw Error(path_ + ": read of " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(offset) + " is outside the file (" +
                std::to_string(identity_.size) + " bytes)");
  gguf_pread_full(fd_, static_cast<uint8_t*>(dst), bytes, offset, path_);
}

bool GgufFile::unchanged_on_disk() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return false;
  return gguf_identity(st) == identity_;
}

}  // namespace ebb
