#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "platform/error.h"

namespace ebb {

size_t safetensors_dtype_size(std::string_view d) {
  struct Row {
    std::string_view name;
    size_t size;
  };
  // The dtypes of the reference implementation (safetensors' Dtype enum)
  // that occupy whole bytes.
  static constexpr Row kRows[] = {{"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                  {"I16", 2},  {"U16", 2},  {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                  {"U32", 4},  {"F32", 4},  {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const Row& r : kRows)
    if (r.name == d) return r.size;
  return 0;
}

std::optional<DType> safetensors_dtype(std::string_view d) {
  if (d == "F32") return DType::kF32;
  if (d == "F16") return DType::kF16;
  if (d == "BF16") return DType::kBF16;
  return std::nullopt;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void pread_full(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  constexpr uint64_t kMaxPerCall = 1ull << 30;
  while (n > 0) {
    const size_t want = static_cast<size_t>(std::min(n, kMaxPerCall));
    const ssize_t got = ::pread(fd, dst, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": read of " + std::to_string(want) + " bytes at offset " + std::to_string(offset) +
                  " failed: " + std::strerror(errno));
    }
    if (got == 0) {
      throw Error(path + ": unexpected end of file at offset " + std::to_string(offset) +
                  " (did the file shrink after it was opened?)");
    }
    dst += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// One header entry as parsed, before its sizes are checked.
struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
  unsigned seen = 0;  // kDtype | kShape | kOffsets
};
constexpr unsigned kDtype = 1, kShape = 2, kOffsets = 4;

// The header's JSON, read as events (nlohmann's SAX interface) by a state
// machine that accepts exactly the safetensors schema: no DOM is built, so a
// 100 MiB header costs its entries, and nesting beyond the schema, a value of
// the wrong type or a repeated key is an error at once.
class SafetensorsHeaderParser final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit SafetensorsHeaderParser(const std::string& path) : path_(path) {}
  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_float(double, const std::string&) override {
    return number(false, 0, "a fraction (or an integer too large for 64 bits)");
  }
  bool number_integer(int64_t v) override {
    return v < 0 ? number(false, 0, "negative (" + std::to_string(v) + ")")
                 : number(true, static_cast<uint64_t>(v), "");
  }
  bool number_unsigned(uint64_t v) override { return number(true, v, ""); }
  bool binary(binary_t&) override { return value("binary"); }
  bool string(std::string& v) override {
    if (state_ == kMetaValue) {
      metadata[key_] = v;
      state_ = kMeta;
      return true;
    }
    if (state_ == kEntryValue && field_ == kDtype) {
      cur_.dtype = v;
      state_ = kEntry;
      return true;
    }
    return value("a string");
  }
  bool start_object(size_t) override {
    switch (state_) {
      case kStart: state_ = kRoot; return true;
      case kRootValue: state_ = in_meta_ ? kMeta : kEntry; return true;
      default: return value("an object");
    }
  }
  bool key(std::string& k) override {
    switch (state_) {
      case kRoot:
        if (k == "__metadata__") {
          if (seen_meta_) fail("the header holds '__metadata__' twice");
          seen_meta_ = in_meta_ = true;
        } else {
          if (!names_.insert(k).second) fail("tensor '" + k + "' appears twice in the header");
          in_meta_ = false;
          cur_ = RawEntry{};
          cur_.name = k;
        }
        state_ = kRootValue;
        return true;
      case kMeta:
        if (metadata.count(k)) fail("__metadata__ holds the key '" + k + "' twice");
        key_ = k;
        state_ = kMetaValue;
        return true;
      case kEntry: {
        const unsigned f = k == "dtype" ? kDtype : k == "shape" ? kShape : k == "data_offsets" ? kOffsets : 0;
        if (!f) fail("tensor '" + cur_.name + "' has an unknown field '" + k + "' (expected dtype, shape, data_offsets)");
        if (cur_.seen & f) fail("tensor '" + cur_.name + "' has the field '" + k + "' twice");
        cur_.seen |= f;
        field_ = f;
        state_ = kEntryValue;
        return true;
      }
      default: fail("unexpected key '" + k + "'");
    }
  }
  bool end_object() override {
    switch (state_) {
      case kRoot: state_ = kDone; return true;
      case kMeta: state_ = kRoot; return true;
      case kEntry:
        for (auto [f, n] : {std::pair{kDtype, "dtype"}, {kShape, "shape"}, {kOffsets, "data_offsets"}})
          if (!(cur_.seen & f)) fail("tensor '" + cur_.name + "' has no '" + n + "'");
        entries.push_back(std::move(cur_));
        state_ = kRoot;
        return true;
      default: fail("unexpected end of an object");
    }
  }
  bool start_array(size_t) override {
    if (state_ == kEntryValue && (field_ == kShape || field_ == kOffsets)) {
      state_ = field_ == kShape ? kShapeItems : kOffsetItems;
      return true;
    }
    return value("an array");
  }
  bool end_array() override {
    if (state_ == kOffsetItems && cur_.offsets.size() != 2) {
      fail("tensor '" + cur_.name + "': data_offsets has " + std::to_string(cur_.offsets.size()) +
           " numbers, expected 2 ([begin, end])");
    }
    if (state_ != kShapeItems && state_ != kOffsetItems) fail("unexpected end of an array");
    state_ = kEntry;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    std::string what = ex.what();
    if (what.rfind("[json.exception", 0) == 0 && what.find("] ") != std::string::npos) what.erase(0, what.find("] ") + 2);
    fail("the header is not valid JSON: " + what);
  }
  void finish() const {
    if (state_ != kDone) fail("the header's JSON ends early");
  }

 private:
  enum State { kStart, kRoot, kRootValue, kMeta, kMetaValue, kEntry, kEntryValue, kShapeItems, kOffsetItems, kDone };

  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

  // A scalar or container where the schema has none of its kind.
  bool value(const std::string& kind) {
    switch (state_) {
      case kStart: fail("the header is " + kind + ", expected a JSON object");
      case kRootValue:
        if (in_meta_) fail("__metadata__ is " + kind + ", expected an object of strings");
        fail("tensor '" + cur_.name + "': its entry is " + kind + ", expected an object");
      case kMetaValue: fail("__metadata__['" + key_ + "'] is " + kind + ", expected a string");
      case kEntryValue:
        if (field_ == kDtype) fail("tensor '" + cur_.name + "': dtype is " + kind + ", expected a string");
        fail("tensor '" + cur_.name + "': " + (field_ == kShape ? "shape" : "data_offsets") + " is " + kind +
             ", expected an array of non-negative integers");
      case kShapeItems:
      case kOffsetItems:
        fail("tensor '" + cur_.name + "': " + (state_ == kShapeItems ? "shape" : "data_offsets") +
             " holds " + kind + ", expected non-negative integers");
      default: fail("unexpected " + kind + " in the header");
    }
  }
  bool number(bool ok, uint64_t v, const std::string& bad) {
    if (state_ != kShapeItems && state_ != kOffsetItems) return value("a number");
    const bool shape = state_ == kShapeItems;
    const char* field = shape ? "shape" : "data_offsets";
    if (!ok) fail("tensor '" + cur_.name + "': " + field + " holds a number that is " + bad + ", expected non-negative integers");
    if (shape) {
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        fail("tensor '" + cur_.name + "': shape dimension " + std::to_string(v) + " is larger than 2^63 - 1");
      }
      if (cur_.shape.size() >= kSafetensorsMaxDims) {
        fail("tensor '" + cur_.name + "': shape has more than " + std::to_string(kSafetensorsMaxDims) + " dimensions");
      }
      cur_.shape.push_back(static_cast<int64_t>(v));
    } else {
      if (cur_.offsets.size() >= 2) fail("tensor '" + cur_.name + "': data_offsets has more than 2 numbers");
      cur_.offsets.push_back(v);
    }
    return true;
  }

  const std::string& path_;
  State state_ = kStart;
  bool in_meta_ = false;
  bool seen_meta_ = false;
  unsigned field_ = 0;
  std::string key_;  // the metadata key whose value comes next
  RawEntry cur_;
  std::set<std::string, std::less<>> names_;
};

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  // O_NONBLOCK so that opening a FIFO by mistake cannot hang; anything but a
  // regular file is rejected below.
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  if (f->file_size_ < 8) {
    throw Error(path + ": truncated: the file has " + std::to_string(f->file_size_) +
                " bytes, a safetensors file starts with an 8-byte header length");
  }
  uint8_t len_bytes[8];
  pread_full(f->fd_, len_bytes, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
  if (n == 0) throw Error(path + ": the header length is 0 (a safetensors header is a JSON object)");
  if (n > kSafetensorsMaxHeader) {
    throw Error(path + ": the header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kSafetensorsMaxHeader) + " bytes (not a safetensors file?)");
  }
  if (n > f->file_size_ - 8) {
    throw Error(path + ": the header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(f->file_size_) + " bytes; truncated?)");
  }
  std::string header(static_cast<size_t>(n), '\0');
  pread_full(f->fd_, reinterpret_cast<uint8_t*>(header.data()), n, 8, path);
  f->data_offset_ = 8 + n;
  const uint64_t data_size = f->file_size_ - f->data_offset_;

  SafetensorsHeaderParser p(path);
  nlohmann::json::sax_parse(header, &p);
  p.finish();
  f->metadata_ = std::move(p.metadata);

  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (RawEntry& e : p.entries) {
    const std::string where = path + ": tensor '" + e.name + "'";
    const size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0) {
      throw Error(where + " has dtype '" + e.dtype +
                  "', which safetensors does not define (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, ...)");
    }
    uint64_t count = 1;
    for (int64_t d : e.shape) {
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
        throw Error(where + ": shape " + shape_str(e.shape) + " has more elements than fit in 64 bits");
      }
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(esize), &bytes)) {
      throw Error(where + ": shape " + shape_str(e.shape) + " of " + e.dtype + " has more bytes than fit in 64 bits");
    }
    const uint64_t begin = e.offsets[0], end = e.offsets[1];
    const std::string offs = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) throw Error(where + ": " + offs + " end before they begin");
    if (end > data_size) {
      throw Error(where + ": " + offs + " lie outside the data section (" + std::to_string(data_size) +
                  " bytes after the header)");
    }
    if (end - begin != bytes) {
      throw Error(where + ": " + offs + " hold " + std::to_string(end - begin) + " bytes, its shape " +
                  shape_str(e.shape) + " of " + e.dtype + " needs " + std::to_string(bytes));
    }
    SafetensorsTensorInfo t;
    t.name = std::move(e.name);
    t.dtype = std::move(e.dtype);
    t.type = safetensors_dtype(t.dtype);
    t.shape = std::move(e.shape);
    t.n_elements = count;
    t.n_bytes = bytes;
    t.file_offset = f->data_offset_ + begin;
    spans.push_back({begin, end, f->tensors_.size()});
    f->tensors_.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::vector<SafetensorsTensorInfo> ordered;
  ordered.reserve(spans.size());
  uint64_t reach = 0;  // the furthest end so far
  size_t reach_of = 0;
  for (const Span& s : spans) {
    if (!ordered.empty() && s.begin < reach) {
      throw Error(path + ": tensors '" + f->tensors_[reach_of].name + "' and '" + f->tensors_[s.index].name +
                  "' overlap in the data section (the second begins at byte " + std::to_string(s.begin) +
                  ", the first ends at byte " + std::to_string(reach) + ")");
    }
    if (s.end > reach || ordered.empty()) reach = s.end, reach_of = s.index;
    ordered.push_back(f->tensors_[s.index]);
  }
  f->tensors_ = std::move(ordered);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read(const SafetensorsTensorInfo& t, void* dst) const {
  uint64_t end = 0;
  if (__builtin_add_overflow(t.file_offset, t.n_bytes, &end) || end > file_size_) {
    throw Error(path_ + ": tensor '" + t.name + "' (" + std::to_string(t.n_bytes) + " bytes at offset " +
                std::to_string(t.file_offset) + ") is outside the file (" + std::to_string(file_size_) + " bytes)");
  }
  pread_full(fd_, static_cast<uint8_t*>(dst), t.n_bytes, t.file_offset, path_);
}

std::vector<uint8_t> SafetensorsFile::read(const SafetensorsTensorInfo& t) const {
  std::vector<uint8_t> out(static_cast<size_t>(t.n_bytes));
  read(t, out.data());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const std::string where = "cannot write '" + path + "': tensor '" + t.name + "'";
    if (t.name == "__metadata__") throw Error(where + ": the name is reserved for the metadata");
    if (header.contains(t.name)) throw Error(where + " is given twice");
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) throw Error(where + " has dtype '" + t.dtype + "', which safetensors does not define");
    uint64_t count = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(where + " has a negative dimension in shape " + shape_str(t.shape));
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
        throw Error(where + ": shape " + shape_str(t.shape) + " has more elements than fit in 64 bits");
      }
    }
    if (count > UINT64_MAX / esize || count * esize != t.data.size()) {
      throw Error(where + " has " + std::to_string(t.data.size()) + " bytes, its shape " + shape_str(t.shape) +
                  " of " + t.dtype + " needs " + std::to_string(count) + " x " + std::to_string(esize));
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error("cannot write '" + path + "': a name is not valid UTF-8 (" + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create '" + path + "': " + std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, b, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        throw Error("cannot write '" + path + "': " + std::strerror(err));
      }
      b += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_all(len, 8);
  write_all(text.data(), text.size());
  for (const SafetensorsTensor& t : tensors) write_all(t.data.data(), t.data.size());
  if (::close(fd) != 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace ebb
