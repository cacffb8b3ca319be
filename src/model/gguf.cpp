// GGUF metadata values and the typed look-ups of GgufFile, plus the small
// helpers (messages, pread, file identity) the reader and writer share.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>

#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "platform/error.h"

namespace ebb {
namespace {

bool is_unsigned_int(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

bool is_signed_int(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const { return is_unsigned_int(type) || is_signed_int(type); }

double GgufValue::as_double() const {
  if (is_unsigned_int(type) || type == GgufType::kBool) return static_cast<double>(u);
  if (is_signed_int(type)) return static_cast<double>(i);
  EBB_CHECK_MSG(is_float(), "GgufValue::as_double on a string or array");
  return f;
}

// ---- helpers shared with the reader and writer ----

void GgufErrorContext::fail(std::string_view field, const std::string& problem) const {
  fail_text(std::string(field) + ": " + problem);
}

void GgufErrorContext::fail_text(const std::string& text) const {
  std::string msg = path + ": ";
  if (!where.empty()) msg += where + ": ";
  throw Error(msg + text);
}

std::string_view gguf_file_type_name(uint64_t file_type) {
  // Values 4-6 and 33-35 were retired formats; the gaps stay unnamed.
  static constexpr std::string_view kNames[] = {
      "ALL_F32",        "MOSTLY_F16",     "MOSTLY_Q4_0",    "MOSTLY_Q4_1",    "",
      "",               "",               "MOSTLY_Q8_0",    "MOSTLY_Q5_0",    "MOSTLY_Q5_1",
      "MOSTLY_Q2_K",    "MOSTLY_Q3_K_S",  "MOSTLY_Q3_K_M",  "MOSTLY_Q3_K_L",  "MOSTLY_Q4_K_S",
      "MOSTLY_Q4_K_M",  "MOSTLY_Q5_K_S",  "MOSTLY_Q5_K_M",  "MOSTLY_Q6_K",    "MOSTLY_IQ2_XXS",
      "MOSTLY_IQ2_XS",  "MOSTLY_Q2_K_S",  "MOSTLY_IQ3_XS",  "MOSTLY_IQ3_XXS", "MOSTLY_IQ1_S",
      "MOSTLY_IQ4_NL",  "MOSTLY_IQ3_S",   "MOSTLY_IQ3_M",   "MOSTLY_IQ2_S",   "MOSTLY_IQ2_M",
      "MOSTLY_IQ4_XS",  "MOSTLY_IQ1_M",   "MOSTLY_BF16",    "",               "",
      "",               "MOSTLY_TQ1_0",   "MOSTLY_TQ2_0",   "MOSTLY_MXFP4_MOE"};
  if (file_type == 1024) return "GUESSED";
  return file_type < std::size(kNames) ? kNames[file_type] : std::string_view();
}

std::string gguf_quote(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out = "'";
  for (size_t k = 0; k < s.size() && k < kMaxShown; ++k) {
    const auto c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  out += "'";
  if (s.size() > kMaxShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string gguf_describe(const GgufValue& v) {
  if (v.type != GgufType::kArray) return std::string(gguf_type_name(v.type));
  std::string s = "array of ";
  // Nested arrays describe their first item's element type when they have one.
  if (v.elem_type == GgufType::kArray && !v.items.empty()) return s + gguf_describe(v.items[0]);
  return s + std::string(gguf_type_name(v.elem_type));
}

void gguf_pread_full(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  // One pread moves at most ~2 GB on Linux; loop for larger reads, for short
  // reads and for EINTR.
  constexpr uint64_t kMaxPerCall = 1ull << 30;
  while (n > 0) {
    const size_t want = static_cast<size_t>(n < kMaxPerCall ? n : kMaxPerCall);
    const ssize_t got = ::pread(fd, dst, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": read of " + std::to_string(want) + " bytes at offset " +
                  std::to_string(offset) + " failed: " + std::strerror(errno));
    }
    if (got == 0)
      throw Error(path + ": unexpected end of file at offset " + std::to_string(offset) +
                  " (did the file shrink after it was opened?)");
    dst += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

FileIdentity gguf_identity(const struct stat& st) {
  FileIdentity id;
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.device = static_cast<uint64_t>(st.st_dev);
  return id;
}

// ---- look-ups ----

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void type_mismatch(const std::string& path, std::string_view key,
                                const char* expected, const GgufValue& v) {
  GgufErrorContext{path, "metadata key " + gguf_quote(key)}.fail(
      "value", std::string("expected ") + expected + ", got " + gguf_describe(v));
}

[[noreturn]] void out_of_range(const std::string& path, std::string_view key,
                               const std::string& value, const char* target) {
  GgufErrorContext{path, "metadata key " + gguf_quote(key)}.fail(
      "value", "value " + value + " does not fit " + target);
}

// An integer value as int64; unsigned values above INT64_MAX do not fit.
int64_t to_int(const std::string& path, std::string_view key, const GgufValue& v) {
  if (is_signed_int(v.type)) return v.i;
  if (v.u > kInt64Max) out_of_range(path, key, std::to_string(v.u), "int64");
  return static_cast<int64_t>(v.u);
}

}  // namespace

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (is_unsigned_int(v->type)) return v->u;
  if (!is_signed_int(v->type)) type_mismatch(path_, key, "an integer", *v);
  if (v->i < 0) out_of_range(path_, key, std::to_string(v->i), "an unsigned integer");
  return static_cast<uint64_t>(v->i);
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) type_mismatch(path_, key, "an integer", *v);
  return to_int(path_, key, *v);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_float() && !v->is_integer()) type_mismatch(path_, key, "a number", *v);
  return v->as_double();
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kBool) type_mismatch(path_, key, "bool", *v);
  return v->u != 0;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kString) type_mismatch(path_, key, "string", *v);
  return v->str;
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString)
    type_mismatch(path_, key, "array of string", *v);
  return &v->strings;
}

std::optional<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const GgufType e = v->elem_type;
  if (v->type != GgufType::kArray ||
      !(e == GgufType::kFloat32 || e == GgufType::kFloat64 || is_unsigned_int(e) ||
        is_signed_int(e)))
    type_mismatch(path_, key, "array of numbers", *v);
  std::vector<float> out;
  out.reserve(v->items.size());
  for (const GgufValue& item : v->items) out.push_back(static_cast<float>(item.as_double()));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kArray || !(is_unsigned_int(v->elem_type) || is_signed_int(v->elem_type)))
    type_mismatch(path_, key, "array of integers", *v);
  std::vector<int64_t> out;
  out.reserve(v->items.size());
  for (const GgufValue& item : v->items) out.push_back(to_int(path_, key, item));
  return out;
}

}  // namespace ebb
