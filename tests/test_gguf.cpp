// GGUF reader and writer: the shared model files, writer round trips,
// hand-made malformed files (each must throw ebb::Error naming the field),
// and a mutation test over the shared models (every variant must load or
// throw ebb::Error; never crash, hang, leak or throw anything else).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- helpers

// A scratch directory removed at the end of the test. Prefers /dev/shm so the
// mutation test does not wear a disk.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = "/dev/shm/ebb-gguf-XXXXXX";
    if (::access("/dev/shm", W_OK) == 0 && ::mkdtemp(tmpl.data()) != nullptr)
      path_ = tmpl;
    else
      path_ = test::make_temp_dir("ebb-gguf");
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Opens `path` expecting ebb::Error; returns its message ("" if it loaded).
std::string open_error(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Writes `bytes` to a file and checks that opening it fails with a message
// that names the file and contains `needle`.
void expect_rejected(const ScratchDir& dir, const std::vector<uint8_t>& bytes,
                     const std::string& needle) {
  const std::string path = dir.file("bad.gguf");
  write_all(path, bytes);
  const std::string msg = open_error(path);
  EXPECT_NE(msg, "") << "expected an error containing '" << needle << "'";
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
}

// Little-endian builder for hand-made (mostly malformed) files.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(std::string_view s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Bytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

bool values_equal(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufType::kString: return a.str == b.str;
    case GgufType::kArray:
      if (a.elem_type != b.elem_type || a.strings != b.strings || a.items.size() != b.items.size())
        return false;
      for (size_t k = 0; k < a.items.size(); ++k)
        if (!values_equal(a.items[k], b.items[k])) return false;
      return true;
    case GgufType::kFloat32:
    case GgufType::kFloat64: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    default: return a.u == b.u && a.i == b.i;
  }
}

GgufValue scalar(GgufType t, uint64_t u, int64_t i = 0, double f = 0) {
  GgufValue v;
  v.type = t;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

GgufValue array_of(GgufType elem, std::vector<GgufValue> items) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.elem_type = elem;
  v.items = std::move(items);
  return v;
}

std::vector<std::string> shared_models() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(test::shared_path("models")))
    if (e.path().extension() == ".gguf") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::map<DType, int> type_counts(const GgufFile& f) {
  std::map<DType, int> counts;
  for (const auto& t : f.tensors()) ++counts[t.type];
  return counts;
}

// Checks what a successfully opened file promises: every tensor is aligned,
// sized consistently and lies inside the file.
void check_invariants(const GgufFile& f) {
  ASSERT_TRUE(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  ASSERT_EQ(f.data_offset() % f.alignment(), 0u);
  for (const auto& t : f.tensors()) {
    ASSERT_TRUE(!t.dims.empty() && t.dims.size() <= 4) << t.name;
    uint64_t n = 1;
    for (int64_t d : t.dims) {
      ASSERT_GT(d, 0) << t.name;
      n *= static_cast<uint64_t>(d);
    }
    ASSERT_EQ(n, t.n_elements) << t.name;
    const TypeInfo& info = type_info(t.type);
    ASSERT_EQ(t.dims[0] % info.block_size, 0) << t.name;
    ASSERT_EQ(t.n_bytes, n / info.block_size * info.block_bytes) << t.name;
    ASSERT_EQ(t.offset % f.alignment(), 0u) << t.name;
    ASSERT_EQ(t.file_offset, f.data_offset() + t.offset) << t.name;
    ASSERT_LE(t.file_offset + t.n_bytes, f.file_size()) << t.name;
    ASSERT_EQ(f.find_tensor(t.name), &t) << t.name;
  }
}

// ---------------------------------------------------------------- shared models

TEST(GgufModels, EverySharedModelLoads) {
  const auto models = shared_models();
  ASSERT_EQ(models.size(), 32u);  // with the Q4_1 ... IQ4_XS and tiny-qwen2 files of issue 25
  for (const auto& path : models) {
    SCOPED_TRACE(path);
    auto f = GgufFile::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->file_size(), fs::file_size(path));
    EXPECT_EQ(f->alignment(), 32u);
    const auto arch = f->get_string("general.architecture");
    ASSERT_TRUE(arch.has_value());
    EXPECT_TRUE(*arch == "llama" || *arch == "qwen3" || *arch == "qwen2") << *arch;
    EXPECT_TRUE(f->get_uint(*arch + ".block_count").has_value());
    ASSERT_NE(f->get_string_array("tokenizer.ggml.tokens"), nullptr);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
    EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores")->size(), 512u);
    EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")->size(), 512u);
    EXPECT_NE(f->find_tensor("token_embd.weight"), nullptr);
    EXPECT_NE(f->find_tensor("output_norm.weight"), nullptr);
    EXPECT_TRUE(f->unchanged_on_disk());
    check_invariants(*f);
    // The last tensor's data ends the file (no trailing garbage in these files).
    uint64_t end = 0;
    for (const auto& t : f->tensors()) end = std::max(end, t.file_offset + t.n_bytes);
    EXPECT_LE(f->file_size() - end, f->alignment());
  }
}

TEST(GgufModels, Stories260KFacts) {
  auto f = GgufFile::open(test::model_path("stories260K.gguf"));
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->metadata().front().first, "tokenizer.ggml.tokens");  // file order kept
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->get_uint("llama.block_count"), 5u);
  EXPECT_EQ(f->get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(f->get_uint("llama.feed_forward_length"), 172u);
  EXPECT_EQ(f->get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(f->get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f->get_uint("llama.context_length"), 128u);
  EXPECT_EQ(f->get_int("tokenizer.ggml.padding_token_id"), 4294967295);
  EXPECT_NEAR(*f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f->get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f->get_uint("tokenizer.ggml.eos_token_id"), 2u);
  const auto* tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")->at(0), 2);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(type_counts(*f), (std::map<DType, int>{{DType::kF32, 48}}));

  const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb->type, DType::kF32);
  EXPECT_EQ(emb->offset, 0u);
  EXPECT_EQ(emb->n_bytes, 131072u);
  const GgufTensorInfo* q = f->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dims, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(q->offset, 262400u);
  EXPECT_EQ(q->file_offset, 14176u + 262400u);
  EXPECT_EQ(f->find_tensor("no.such.tensor"), nullptr);

  // read() returns the same bytes as an ordinary read of the file.
  const auto bytes = read_all(test::model_path("stories260K.gguf"));
  std::vector<uint8_t> got(q->n_bytes);
  f->read(q->file_offset, got.data(), got.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + static_cast<long>(q->file_offset)));
}

TEST(GgufModels, Stories260KF16Facts) {
  auto f = GgufFile::open(test::model_path("stories260K-f16.gguf"));
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->metadata().size(), 21u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->get_uint("general.file_type"), 1u);
  EXPECT_EQ(f->data_offset(), 14240u);
  EXPECT_EQ(type_counts(*f), (std::map<DType, int>{{DType::kF32, 11}, {DType::kF16, 37}}));
}

TEST(GgufModels, TinyQwen3Facts) {
  const std::map<std::string, std::map<DType, int>> expected = {
      {"bf16", {{DType::kF32, 17}, {DType::kBF16, 29}}},
      {"f16", {{DType::kF32, 17}, {DType::kF16, 29}}},
      {"q4_0", {{DType::kF32, 17}, {DType::kQ4_0, 28}, {DType::kQ6_K, 1}}},
      {"q4_k_m", {{DType::kF32, 17}, {DType::kQ4_K, 24}, {DType::kQ6_K, 5}}},
      {"q5_k_m", {{DType::kF32, 17}, {DType::kQ5_K, 24}, {DType::kQ6_K, 5}}},
      {"q6_k", {{DType::kF32, 17}, {DType::kQ6_K, 29}}},
      {"q8_0", {{DType::kF32, 17}, {DType::kQ8_0, 29}}},
  };
  for (const auto& [suffix, counts] : expected) {
    SCOPED_TRACE(suffix);
    auto f = GgufFile::open(test::model_path("tiny-qwen3-" + suffix + ".gguf"));
    EXPECT_EQ(f->get_string("general.architecture"), "qwen3");
    EXPECT_EQ(f->get_string("general.name"), "synthetic-tiny-qwen3");
    EXPECT_EQ(f->metadata().size(), 23u);
    EXPECT_EQ(f->tensors().size(), 46u);
    EXPECT_EQ(f->get_uint("qwen3.block_count"), 4u);
    EXPECT_EQ(f->get_uint("qwen3.embedding_length"), 256u);
    EXPECT_EQ(f->get_uint("qwen3.attention.key_length"), 64u);
    EXPECT_EQ(f->get_float("qwen3.rope.freq_base"), 1000000.0);
    EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), true);
    EXPECT_EQ(f->data_offset(), 14176u);
    EXPECT_EQ(type_counts(*f), counts);
    ASSERT_NE(f->find_tensor("blk.3.attn_k_norm.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.3.attn_k_norm.weight")->dims, (std::vector<int64_t>{64}));
  }
  auto f = GgufFile::open(test::model_path("tiny-qwen3-q4_k_m.gguf"));
  const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, DType::kQ6_K);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(emb->n_bytes, 512u * 210u);
  EXPECT_EQ(emb->offset, 1024u);
}

TEST(GgufModels, TinyLlamaFacts) {
  for (const char* suffix : {"bf16", "f16", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "q8_0"}) {
    SCOPED_TRACE(suffix);
    auto f = GgufFile::open(test::model_path(std::string("tiny-llama-") + suffix + ".gguf"));
    EXPECT_EQ(f->get_string("general.architecture"), "llama");
    EXPECT_EQ(f->tensors().size(), 39u);
    EXPECT_EQ(f->get_uint("llama.block_count"), 4u);
    EXPECT_EQ(f->get_float("llama.rope.freq_base"), 10000.0);
    EXPECT_EQ(f->data_offset(), 13792u);
  }
}

// ---------------------------------------------------------------- getters, read, identity

TEST(GgufGetters, TypedLookups) {
  auto f = GgufFile::open(test::model_path("stories260K.gguf"));
  EXPECT_EQ(f->get_uint("missing.key"), std::nullopt);
  EXPECT_EQ(f->get_string_array("missing.key"), nullptr);
  EXPECT_EQ(f->get_float_array("missing.key"), std::nullopt);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_float("llama.block_count"), 5.0);  // integers are accepted as floats
  const std::vector<float> scores = *f->get_float_array("tokenizer.ggml.scores");
  EXPECT_EQ(scores.size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.token_type")->at(0), 2.0f);

  // Incompatible types name the key and both types.
  try {
    f->get_string("llama.block_count");
    FAIL() << "expected ebb::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("llama.block_count"), std::string::npos) << m;
    EXPECT_NE(m.find("string"), std::string::npos) << m;
    EXPECT_NE(m.find("uint32"), std::string::npos) << m;
  }
  EXPECT_THROW(f->get_uint("general.architecture"), Error);
  EXPECT_THROW(f->get_bool("llama.block_count"), Error);
  EXPECT_THROW(f->get_float("general.name"), Error);
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_float_array("tokenizer.ggml.tokens"), Error);
}

TEST(GgufGetters, IntegerWidthsConvertWhenTheyFit) {
  ScratchDir dir;
  GgufWriter w;
  w.set("neg", scalar(GgufType::kInt8, 0, -3));
  w.set("big", scalar(GgufType::kUint64, ~0ull));
  w.set("small", scalar(GgufType::kInt64, 0, 7));
  w.set("ints", array_of(GgufType::kUint64, {scalar(GgufType::kUint64, ~0ull)}));
  const std::string path = dir.file("w.gguf");
  w.write(path, [](size_t, uint8_t*) {});
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->get_int("neg"), -3);
  EXPECT_THROW(f->get_uint("neg"), Error);
  EXPECT_EQ(f->get_uint("big"), ~0ull);
  EXPECT_THROW(f->get_int("big"), Error);
  EXPECT_EQ(f->get_uint("small"), 7u);
  EXPECT_EQ(f->get_float("neg"), -3.0);
  EXPECT_THROW(f->get_int_array("ints"), Error);
}

TEST(GgufFileAccess, ReadChecksRange) {
  auto f = GgufFile::open(test::model_path("stories260K.gguf"));
  uint8_t buf[16];
  EXPECT_NO_THROW(f->read(f->file_size() - 16, buf, 16));
  EXPECT_THROW(f->read(f->file_size() - 15, buf, 16), Error);
  EXPECT_THROW(f->read(~0ull - 4, buf, 16), Error);  // offset + bytes overflows
  EXPECT_NO_THROW(f->read(0, buf, 0));
  f->read(0, buf, 4);
  EXPECT_EQ(std::memcmp(buf, "GGUF", 4), 0);
}

TEST(GgufFileAccess, IdentityDetectsChanges) {
  ScratchDir dir;
  const std::string path = dir.file("copy.gguf");
  fs::copy_file(test::model_path("stories260K.gguf"), path);
  auto f = GgufFile::open(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(f->identity().size, static_cast<uint64_t>(st.st_size));
  EXPECT_EQ(f->identity().inode, static_cast<uint64_t>(st.st_ino));
  EXPECT_TRUE(f->unchanged_on_disk());
  // A new modification time is a change, even with the same bytes.
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 678}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_FALSE(f->unchanged_on_disk());
  fs::remove(path);
  EXPECT_FALSE(f->unchanged_on_disk());
}

// ---------------------------------------------------------------- writer round trip

// A writer with every value type, nested arrays and tensors of several types.
GgufWriter make_rich_writer() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set("u8", scalar(GgufType::kUint8, 200));
  w.set("i8", scalar(GgufType::kInt8, 0, -100));
  w.set("u16", scalar(GgufType::kUint16, 60000));
  w.set("i16", scalar(GgufType::kInt16, 0, -30000));
  w.set_uint32("u32", 4000000000u);
  w.set_int32("i32", -2000000000);
  w.set_float32("f32", 0.15625f);
  w.set_bool("bool_true", true);
  w.set_bool("bool_false", false);
  w.set_string("str", std::string("bytes \x01\xff and utf-8 \xc3\xa9", 22));
  w.set_string("empty_str", "");
  w.set("u64", scalar(GgufType::kUint64, 0xfedcba9876543210ull));
  w.set("i64", scalar(GgufType::kInt64, 0, INT64_MIN));
  w.set("f64", scalar(GgufType::kFloat64, 0, 0, -1.0e300));
  w.set_string_array("strs", {"a", "", "longer string"});
  w.set_float32_array("floats", {1.5f, -2.25f, 1e-30f});
  w.set_int32_array("ints", {1, -2, 2147483647});
  w.set("empty_arr", array_of(GgufType::kUint16, {}));
  w.set("u8_arr", array_of(GgufType::kUint8, {scalar(GgufType::kUint8, 1), scalar(GgufType::kUint8, 255)}));
  w.set("bool_arr", array_of(GgufType::kBool, {scalar(GgufType::kBool, 1), scalar(GgufType::kBool, 0)}));
  w.set("f64_arr", array_of(GgufType::kFloat64, {scalar(GgufType::kFloat64, 0, 0, 3.25)}));
  // Nested: [[1, 2], [], [3]] and [["x"], ["y", "z"]] and three levels deep.
  GgufValue s1 = array_of(GgufType::kString, {});
  s1.strings = {"x"};
  GgufValue s2 = array_of(GgufType::kString, {});
  s2.strings = {"y", "z"};
  w.set("nested_ints",
        array_of(GgufType::kArray,
                 {array_of(GgufType::kInt64, {scalar(GgufType::kInt64, 0, 1), scalar(GgufType::kInt64, 0, 2)}),
                  array_of(GgufType::kInt64, {}),
                  array_of(GgufType::kInt64, {scalar(GgufType::kInt64, 0, 3)})}));
  w.set("nested_strs", array_of(GgufType::kArray, {s1, s2}));
  w.set("deep", array_of(GgufType::kArray,
                         {array_of(GgufType::kArray, {array_of(GgufType::kUint32, {scalar(GgufType::kUint32, 9)})})}));
  w.set_uint32("u32", 4000000001u);  // set again: replaced in place

  w.add_tensor("f32", {7}, DType::kF32);
  w.add_tensor("f16", {3, 5}, DType::kF16);
  w.add_tensor("q4_0", {64, 3}, DType::kQ4_0);
  w.add_tensor("q4_k", {256, 2}, DType::kQ4_K);
  w.add_tensor("q6_k", {256}, DType::kQ6_K);
  w.add_tensor("q8_0", {32, 2, 2}, DType::kQ8_0);
  w.add_tensor("bf16", {4, 3, 2, 2}, DType::kBF16);
  w.add_tensor("i32", {5}, DType::kI32);
  return w;
}

uint8_t pattern(size_t tensor, uint64_t k) { return static_cast<uint8_t>(tensor * 31 + k * 7 + (k >> 8)); }

void fill_pattern(size_t i, uint8_t* dst, uint64_t n) {
  for (uint64_t k = 0; k < n; ++k) dst[k] = pattern(i, k);
}

TEST(GgufRoundTrip, AllValueTypesAndTensors) {
  ScratchDir dir;
  const std::string path = dir.file("rich.gguf");
  const GgufWriter w = make_rich_writer();

  // The writer's own layout is what the reader must reproduce: record the
  // tensor sizes through the fill callback.
  std::vector<uint64_t> sizes = {28, 30, 2 * 3 * 18, 2 * 144, 210, 4 * 34, 48 * 2, 20};
  uint64_t last_done = 0, last_total = 0;
  int progress_calls = 0;
  w.write(path, [&](size_t i, uint8_t* dst) { fill_pattern(i, dst, sizes.at(i)); },
          [&](uint64_t done, uint64_t total) {
            EXPECT_GE(done, last_done);
            last_done = done;
            last_total = total;
            ++progress_calls;
          });
  EXPECT_GE(progress_calls, 1);
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, fs::file_size(path));

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  check_invariants(*f);

  // Metadata: same keys, same order, same values (u32 replaced in place).
  ASSERT_EQ(f->metadata().size(), 25u);
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");
  EXPECT_EQ(f->metadata()[5].first, "u32");
  EXPECT_EQ(f->get_uint("u32"), 4000000001u);
  EXPECT_EQ(f->get_uint("u8"), 200u);
  EXPECT_EQ(f->get_int("i8"), -100);
  EXPECT_EQ(f->get_uint("u16"), 60000u);
  EXPECT_EQ(f->get_int("i16"), -30000);
  EXPECT_EQ(f->get_int("i32"), -2000000000);
  EXPECT_EQ(f->get_float("f32"), 0.15625);
  EXPECT_EQ(f->get_bool("bool_true"), true);
  EXPECT_EQ(f->get_bool("bool_false"), false);
  EXPECT_EQ(f->get_string("str"), std::string("bytes \x01\xff and utf-8 \xc3\xa9", 22));
  EXPECT_EQ(f->get_string("empty_str"), "");
  EXPECT_EQ(f->get_uint("u64"), 0xfedcba9876543210ull);
  EXPECT_EQ(f->get_int("i64"), INT64_MIN);
  EXPECT_EQ(f->get_float("f64"), -1.0e300);
  EXPECT_EQ(*f->get_string_array("strs"), (std::vector<std::string>{"a", "", "longer string"}));
  EXPECT_EQ(f->get_float_array("floats"), (std::vector<float>{1.5f, -2.25f, 1e-30f}));
  EXPECT_EQ(f->get_int_array("ints"), (std::vector<int64_t>{1, -2, 2147483647}));
  EXPECT_EQ(f->find("empty_arr")->array_size(), 0u);
  EXPECT_EQ(f->find("empty_arr")->elem_type, GgufType::kUint16);
  const GgufValue* nested = f->find("nested_ints");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->array_size(), 3u);
  EXPECT_EQ(nested->items[0].items[1].i, 2);
  EXPECT_EQ(f->find("nested_strs")->items[1].strings[1], "z");
  EXPECT_EQ(f->find("deep")->items[0].items[0].items[0].u, 9u);

  // The writer is deterministic: writing the same declarations again gives
  // the same bytes.
  const std::string p2 = dir.file("rich2.gguf");
  make_rich_writer().write(p2, [&](size_t i, uint8_t* dst) { fill_pattern(i, dst, sizes.at(i)); });
  EXPECT_EQ(read_all(p2), read_all(path));
  const auto* deep = f->find("deep");
  EXPECT_TRUE(values_equal(*deep, array_of(GgufType::kArray,
                                           {array_of(GgufType::kArray,
                                                     {array_of(GgufType::kUint32,
                                                               {scalar(GgufType::kUint32, 9)})})})));

  // Tensors: names, shapes, types, sizes and bytes.
  const std::vector<std::pair<std::string, DType>> names = {
      {"f32", DType::kF32},   {"f16", DType::kF16},   {"q4_0", DType::kQ4_0}, {"q4_k", DType::kQ4_K},
      {"q6_k", DType::kQ6_K}, {"q8_0", DType::kQ8_0}, {"bf16", DType::kBF16}, {"i32", DType::kI32}};
  ASSERT_EQ(f->tensors().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, names[i].first);
    EXPECT_EQ(t.type, names[i].second);
    EXPECT_EQ(t.n_bytes, sizes[i]) << t.name;
    std::vector<uint8_t> got(t.n_bytes), want_bytes(t.n_bytes);
    f->read(t.file_offset, got.data(), got.size());
    fill_pattern(i, want_bytes.data(), t.n_bytes);
    EXPECT_EQ(got, want_bytes) << t.name;
  }
  EXPECT_EQ(f->find_tensor("bf16")->dims, (std::vector<int64_t>{4, 3, 2, 2}));
  EXPECT_EQ(f->find_tensor("q8_0")->n_elements, 128u);
}

TEST(GgufRoundTrip, CustomAlignmentAndEmptyFile) {
  ScratchDir dir;
  GgufWriter w;
  w.alignment = 64;
  w.set_string("general.name", "aligned");
  w.add_tensor("a", {3}, DType::kF32);
  w.add_tensor("b", {32}, DType::kQ8_0);
  const std::string path = dir.file("a64.gguf");
  w.write(path, [](size_t i, uint8_t* dst) { std::memset(dst, static_cast<int>(i + 1), i == 0 ? 12 : 34); });
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_uint("general.alignment"), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->tensors()[1].offset, 64u);
  check_invariants(*f);

  GgufWriter empty;
  const std::string p2 = dir.file("empty.gguf");
  empty.write(p2, [](size_t, uint8_t*) { FAIL(); });
  auto e = GgufFile::open(p2);
  EXPECT_TRUE(e->metadata().empty());
  EXPECT_TRUE(e->tensors().empty());
}

TEST(GgufRoundTrip, StreamsLargeAndManySmallTensors) {
  // Past the writer's 16 MiB staging buffer both ways: one 20 MiB tensor and
  // 48 tensors of 512 KiB (flushed in several batches).
  ScratchDir dir;
  GgufWriter w;
  w.alignment = 4096;
  w.add_tensor("big", {5 << 20}, DType::kF32);
  for (int i = 0; i < 48; ++i) w.add_tensor("small." + std::to_string(i), {256, 1024}, DType::kI16);
  const std::string path = dir.file("big.gguf");
  int calls = 0;
  uint64_t last = 0;
  w.write(path,
          [&](size_t i, uint8_t* dst) {
            const uint64_t n = i == 0 ? (20ull << 20) : (512ull << 10);
            std::memset(dst, static_cast<int>(i * 5 + 1), n);
          },
          [&](uint64_t done, uint64_t total) {
            ++calls;
            EXPECT_GE(done, last);
            last = done;
            EXPECT_EQ(total, 4096u + (20u << 20) + 48u * (512u << 10));
          });
  EXPECT_GE(calls, 3);
  EXPECT_EQ(last, fs::file_size(path));
  auto f = GgufFile::open(path);
  check_invariants(*f);
  ASSERT_EQ(f->tensors().size(), 49u);
  for (size_t i : {size_t{0}, size_t{1}, size_t{30}, size_t{48}}) {
    const GgufTensorInfo& t = f->tensors()[i];
    uint8_t first = 0, last_byte = 0;
    f->read(t.file_offset, &first, 1);
    f->read(t.file_offset + t.n_bytes - 1, &last_byte, 1);
    EXPECT_EQ(first, static_cast<uint8_t>(i * 5 + 1)) << t.name;
    EXPECT_EQ(last_byte, static_cast<uint8_t>(i * 5 + 1)) << t.name;
  }
}

TEST(GgufWriterErrors, ReportsPathAndBadDeclarations) {
  ScratchDir dir;
  GgufWriter w;
  w.add_tensor("t", {1024}, DType::kF32);
  const auto fill = [](size_t, uint8_t* dst) { std::memset(dst, 0, 4096); };
  // Disk full: /dev/full fails every write with ENOSPC.
  if (::access("/dev/full", W_OK) == 0) {
    try {
      w.write("/dev/full", fill);
      ADD_FAILURE() << "expected ebb::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    }
  }
  const std::string missing = dir.file("no/such/dir/x.gguf");
  try {
    w.write(missing, fill);
    ADD_FAILURE() << "expected ebb::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  GgufWriter bad_align;
  bad_align.alignment = 48;
  EXPECT_THROW(bad_align.write(dir.file("a.gguf"), fill), Error);

  EXPECT_THROW(w.add_tensor("t", {32}, DType::kF32), Error);        // duplicate
  EXPECT_THROW(w.add_tensor("q", {33}, DType::kQ4_0), Error);       // ne0 % 32
  EXPECT_THROW(w.add_tensor("d", {1, 1, 1, 1, 1}, DType::kF32), Error);
  EXPECT_THROW(w.add_tensor("z", {4, 0}, DType::kF32), Error);
  EXPECT_THROW(w.set("mixed", array_of(GgufType::kInt32, {scalar(GgufType::kUint8, 1)})), Error);
  GgufValue deep = scalar(GgufType::kUint8, 1);
  for (int k = 0; k < 9; ++k) deep = array_of(deep.type == GgufType::kArray ? GgufType::kArray : GgufType::kUint8, {deep});
  EXPECT_THROW(w.set("deep", deep), Error);
}

// ---------------------------------------------------------------- malformed files

TEST(GgufMalformed, HeaderFields) {
  ScratchDir dir;
  expect_rejected(dir, Bytes().raw("GGML", 4).u32(3).u64(0).u64(0).b, "magic");
  expect_rejected(dir, Bytes().header(0, 0, 1).b, "version 1");
  expect_rejected(dir, Bytes().header(0, 0, 4).b, "version");
  expect_rejected(dir, Bytes().header(0, 0, 0x03000000).b, "big-endian");
  expect_rejected(dir, Bytes().header(1ull << 62, 0).b, "tensor count");
  expect_rejected(dir, Bytes().header(0, ~0ull).b, "metadata key count");
  expect_rejected(dir, {}, "magic");
  expect_rejected(dir, Bytes().raw("GGUF", 4).u32(3).u32(0).b, "tensor count");
  // v2 has the same layout and is accepted.
  const std::string v2 = dir.file("v2.gguf");
  write_all(v2, Bytes().header(0, 1, 2).kv_u32("k", 7).b);
  EXPECT_EQ(GgufFile::open(v2)->version(), 2u);
}

TEST(GgufMalformed, MetadataFields) {
  ScratchDir dir;
  // Huge lengths are refused before anything is allocated for them.
  expect_rejected(dir, Bytes().header(0, 1).u64(1ull << 60).zeros(64).b, "string length");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(8).u64(1ull << 60).b, "string length");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(9).u32(4).u64(1ull << 61).b, "array length");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(9).u32(8).u64(~0ull).zeros(64).b, "array length");
  // 9.6M one-byte elements fit in the file but would take > 1 GiB as values.
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(9).u32(0).u64(9'600'000).zeros(9'600'000).b,
                  "MiB of memory");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(9).u32(77).u64(0).b, "array element type");
  expect_rejected(dir, Bytes().header(0, 1).str("k").u32(7).u8(2).b, "bool value 2");
  expect_rejected(dir, Bytes().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "duplicate key");
  // Nesting: 9 arrays deep is refused.
  Bytes deep;
  deep.header(0, 1).str("deep").u32(9);
  for (int k = 0; k < 9; ++k) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  expect_rejected(dir, deep.b, "nested deeper than 8");
}

TEST(GgufMalformed, Alignment) {
  ScratchDir dir;
  for (uint32_t a : {0u, 48u, 3u})
    expect_rejected(dir, Bytes().header(0, 1).kv_u32("general.alignment", a).b, "general.alignment");
  expect_rejected(dir, Bytes().header(0, 1).str("general.alignment").u32(8).str("32").b,
                  "expected uint32, got string");
  // A valid non-default alignment moves the data section.
  const std::string ok = dir.file("ok.gguf");
  write_all(ok, Bytes().header(1, 1).kv_u32("general.alignment", 256).tensor("t", {4}, 0, 0).pad(256).zeros(16).b);
  EXPECT_EQ(GgufFile::open(ok)->data_offset(), 256u);
}

TEST(GgufMalformed, TensorInfoFields) {
  ScratchDir dir;
  const auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data = 4096) {
    return Bytes().header(1, 0).tensor("blk.0.w", std::move(dims), type, offset).pad(32).zeros(data).b;
  };
  expect_rejected(dir, one({8}, 99, 0), "unknown tensor type 99");
  expect_rejected(dir, one({33}, 2, 0), "block size");  // Q4_0, ne0 = 33
  expect_rejected(dir, one({8, 0}, 0, 0), "dims");
  expect_rejected(dir, one({1ull << 40, 1ull << 40}, 0, 0), "overflow");
  expect_rejected(dir, one({1ull << 63}, 0, 0), "dims");
  expect_rejected(dir, one({8}, 0, 4), "not a multiple of the alignment");
  expect_rejected(dir, one({1025}, 0, 0), "extends past end of file");
  expect_rejected(dir, one({8}, 0, ~0ull << 5), "extends past end of file");  // offset + size overflows
  expect_rejected(dir, Bytes().header(1, 0).str("t").u32(5).u64(1).u64(1).u64(1).u64(1).u64(1).u32(0).u64(0).b,
                  "n_dims 5");
  expect_rejected(dir, Bytes().header(1, 0).str("t").u32(0).u32(0).u64(0).u64(0).b, "n_dims 0");
  expect_rejected(dir,
                  Bytes().header(2, 0).tensor("same", {8}, 0, 0).tensor("same", {8}, 0, 32).pad(32).zeros(64).b,
                  "duplicate tensor name");
  // The message names the tensor, its range and the file size.
  const std::string path = dir.file("past.gguf");
  write_all(path, one({64}, 0, 32, 100));
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find("tensor 'blk.0.w': data [offset 32, 256 bytes] extends past end of file"),
            std::string::npos) << msg;
  // Overlapping tensors are allowed.
  const std::string overlap = dir.file("overlap.gguf");
  write_all(overlap, Bytes().header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).pad(32).zeros(32).b);
  EXPECT_EQ(GgufFile::open(overlap)->tensors().size(), 2u);
}

TEST(GgufMalformed, NotAFile) {
  ScratchDir dir;
  const std::string missing = dir.file("missing.gguf");
  EXPECT_NE(open_error(missing).find("cannot open"), std::string::npos);
  EXPECT_NE(open_error(dir.file("")).find("not a regular file"), std::string::npos);
}

// Every proper prefix of a valid file is rejected: header, metadata, tensor
// infos, padding and data all hit a truncation check.
TEST(GgufMalformed, TruncatedInEveryRegion) {
  ScratchDir dir;
  const std::string full = dir.file("full.gguf");
  const std::vector<uint64_t> sizes = {28, 30, 2 * 3 * 18, 2 * 144, 210, 4 * 34, 48 * 2, 20};
  make_rich_writer().write(full, [&](size_t i, uint8_t* dst) { fill_pattern(i, dst, sizes.at(i)); });
  const auto bytes = read_all(full);
  const auto whole = GgufFile::open(full);
  const uint64_t data_offset = whole->data_offset();
  // Cuts inside the padding after the last tensor still load; stop before.
  uint64_t data_end = 0;
  for (const auto& t : whole->tensors()) data_end = std::max(data_end, t.file_offset + t.n_bytes);
  const std::string path = dir.file("cut.gguf");
  int truncated = 0, past_end = 0;
  for (size_t len = 0; len < data_end; ++len) {
    write_all(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(len)));
    const std::string msg = open_error(path);
    ASSERT_NE(msg, "") << "prefix of " << len << " bytes loaded";
    if (msg.find("truncated") != std::string::npos) ++truncated;
    else if (msg.find("extends past end of file") != std::string::npos) ++past_end;
    else ADD_FAILURE() << len << ": " << msg;
  }
  // Prefixes that keep all tensor infos fail on the data range instead.
  EXPECT_GT(truncated, 100);
  EXPECT_GE(static_cast<uint64_t>(past_end), data_end - data_offset);
  EXPECT_EQ(static_cast<uint64_t>(truncated + past_end), data_end);
}

// ---------------------------------------------------------------- mutation test

// Offsets of a valid GGUF's fixed-size fields (lengths, counts, types, dims,
// offsets, scalar values) and of its entry boundaries, found by walking it.
struct Layout {
  struct Field {
    uint64_t offset;
    uint32_t size;  // 4 or 8
    bool in_array;  // a field of an array element (the vocabulary has thousands)
  };
  std::vector<Field> fields;
  std::vector<uint64_t> boundaries;
  uint64_t infos_end = 0;
};

class LayoutWalker {
 public:
  explicit LayoutWalker(const std::vector<uint8_t>& b) : b_(b) {}

  Layout walk() {
    p_ = 4;
    field(4);
    const uint64_t n_tensors = field(8);
    const uint64_t n_kv = field(8);
    for (uint64_t k = 0; k < n_kv; ++k) {
      out_.boundaries.push_back(p_);
      string();
      value(static_cast<uint32_t>(field(4)));
    }
    for (uint64_t t = 0; t < n_tensors; ++t) {
      out_.boundaries.push_back(p_);
      string();
      const uint64_t n_dims = field(4);
      for (uint64_t d = 0; d < n_dims; ++d) field(8);
      field(4);
      field(8);
    }
    out_.infos_end = p_;
    out_.boundaries.push_back(p_);
    return out_;
  }

 private:
  uint64_t field(uint32_t size) {
    out_.fields.push_back({p_, size, array_depth_ > 0});
    uint64_t v = 0;
    std::memcpy(&v, b_.data() + p_, size);
    p_ += size;
    return v;
  }
  void string() { p_ += field(8); }
  void value(uint32_t type) {
    static constexpr uint32_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) return string();
    if (type == 9) {
      const uint32_t elem = static_cast<uint32_t>(field(4));
      const uint64_t n = field(8);
      ++array_depth_;
      for (uint64_t k = 0; k < n; ++k) value(elem);
      --array_depth_;
      return;
    }
    if (kSizes[type] >= 4) field(kSizes[type]);
    else p_ += kSizes[type];
  }

  const std::vector<uint8_t>& b_;
  uint64_t p_ = 0;
  int array_depth_ = 0;
  Layout out_;
};

// Applies mutations to one scratch copy of a model in place and restores it
// afterwards, so each variant costs a few small writes rather than a copy.
class Mutator {
 public:
  Mutator(const std::string& path, std::vector<uint8_t> base) : path_(path), base_(std::move(base)) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EBB_CHECK(fd_ >= 0);
    pwrite_all(base_.data(), base_.size(), 0);
  }
  ~Mutator() { ::close(fd_); }

  void patch(uint64_t offset, const void* p, size_t n) {
    n = std::min<uint64_t>(n, base_.size() - offset);
    pwrite_all(p, n, offset);
    dirty_.push_back({offset, n});
  }
  void truncate(uint64_t len) {
    EBB_CHECK(::ftruncate(fd_, static_cast<off_t>(len)) == 0);
    truncated_at_ = std::min(truncated_at_, len);
  }
  void restore() {
    for (auto [off, n] : dirty_) pwrite_all(base_.data() + off, n, off);
    dirty_.clear();
    if (truncated_at_ < base_.size())
      pwrite_all(base_.data() + truncated_at_, base_.size() - truncated_at_, truncated_at_);
    truncated_at_ = ~0ull;
  }
  uint64_t size() const { return base_.size(); }
  const std::vector<uint8_t>& base() const { return base_; }

 private:
  void pwrite_all(const void* p, size_t n, uint64_t off) {
    EBB_CHECK(::pwrite(fd_, p, n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
  }
  std::string path_;
  std::vector<uint8_t> base_;
  int fd_ = -1;
  std::vector<std::pair<uint64_t, uint64_t>> dirty_;
  uint64_t truncated_at_ = ~0ull;
};

struct MutationStats {
  int variants = 0;
  int loaded = 0;
  int rejected = 0;
};

// Opens the current variant. Loading or ebb::Error are both fine; a loaded
// file must keep its promises, and its look-ups and reads must work or throw
// ebb::Error too.
void try_variant(const std::string& path, const std::string& what, MutationStats& stats) {
  ++stats.variants;
  std::unique_ptr<GgufFile> f;
  try {
    f = GgufFile::open(path);
  } catch (const Error&) {
    ++stats.rejected;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-ebb exception: " << e.what();
    return;
  }
  ++stats.loaded;
  check_invariants(*f);
  // The layers above the reader must also end in a usable model or a clean
  // error: the architecture config, the weight-unit plan, the tokenizer.
  try {
    const ModelConfig c = read_model_config(*f);
    (void)plan_weights(*f, c);
    (void)Tokenizer::from_gguf(*f);
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": model construction threw a non-ebb exception: " << e.what();
  }
  // Every getter on a few keys (most throw a type mismatch, which is slow
  // under ASan), then the getter that matches each value's type.
  size_t k = 0;
  for (const auto& [key, value] : f->metadata()) {
    const bool all = k++ < 3;
    const auto attempt = [&](bool wanted, auto&& fn) {
      if (!wanted && !all) return;
      try {
        fn();
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": getter on '" << key << "' threw " << e.what();
      }
    };
    const bool is_array = value.type == GgufType::kArray;
    attempt(value.is_integer(), [&] { (void)f->get_uint(key); });
    attempt(value.is_integer(), [&] { (void)f->get_int(key); });
    attempt(value.is_float(), [&] { (void)f->get_float(key); });
    attempt(value.type == GgufType::kBool, [&] { (void)f->get_bool(key); });
    attempt(value.type == GgufType::kString, [&] { (void)f->get_string(key); });
    attempt(is_array && value.elem_type == GgufType::kString, [&] { (void)f->get_string_array(key); });
    attempt(is_array && value.elem_type == GgufType::kFloat32, [&] { (void)f->get_float_array(key); });
    attempt(is_array && value.elem_type == GgufType::kInt32, [&] { (void)f->get_int_array(key); });
  }
  uint8_t buf[64];
  for (const auto& t : f->tensors()) {
    const uint64_t n = std::min<uint64_t>(sizeof(buf), t.n_bytes);
    f->read(t.file_offset, buf, n);  // inside the file: must not throw
    f->read(t.file_offset + t.n_bytes - n, buf, n);
  }
}

MutationStats mutate_model(const std::string& model, const ScratchDir& dir, uint64_t seed,
                           int n_truncations, int n_flips, int n_fields, int n_random_words) {
  const std::string path = dir.file("variant.gguf");
  Mutator m(path, read_all(test::model_path(model)));
  const Layout layout = LayoutWalker(m.base()).walk();
  const auto base_file = GgufFile::open(test::model_path(model));
  std::vector<uint64_t> boundaries = layout.boundaries;
  for (const auto& f : layout.fields) boundaries.push_back(f.offset);
  boundaries.push_back(base_file->data_offset());
  for (const auto& t : base_file->tensors()) {
    boundaries.push_back(t.file_offset);
    boundaries.push_back(t.file_offset + t.n_bytes - 1);
  }
  const uint64_t size = m.size();
  const uint64_t header_end = base_file->data_offset();

  std::mt19937_64 rng(seed);
  const auto below = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  MutationStats stats;
  const auto run = [&](const std::string& what) {
    try_variant(path, model + ": " + what, stats);
    m.restore();
  };

  // 1. Truncations: at structural boundaries (and one byte either side), and
  //    at random lengths, a quarter of them inside the header. Cut longest
  //    first, so each variant is one ftruncate and the file is restored once.
  std::vector<uint64_t> lengths;
  for (int k = 0; k < n_truncations; ++k) {
    if (k % 2 == 0) {
      const uint64_t b = boundaries[below(boundaries.size())];
      lengths.push_back(std::min<uint64_t>(b == 0 ? 0 : b - 1 + below(3), size - 1));
    } else if (k % 4 == 1) {
      lengths.push_back(below(header_end));
    } else {
      lengths.push_back(below(size));
    }
  }
  std::sort(lengths.rbegin(), lengths.rend());
  for (uint64_t len : lengths) {
    m.truncate(len);
    try_variant(path, model + ": truncated to " + std::to_string(len), stats);
  }
  m.restore();
  // 2. Byte flips, mostly in the header where they change the structure.
  for (int k = 0; k < n_flips; ++k) {
    const int n_bytes = 1 + static_cast<int>(below(3));
    std::string what = "flipped";
    for (int j = 0; j < n_bytes; ++j) {
      const uint64_t r = below(10);
      const uint64_t off = r < 8 ? below(header_end) : below(size);
      const uint8_t v = m.base()[off] ^ static_cast<uint8_t>(1 + below(255));
      m.patch(off, &v, 1);
      what += " @" + std::to_string(off);
    }
    run(what);
  }
  // 3. Extreme values written over real length/count/type/dim/offset fields.
  const uint64_t extremes64[] = {0, 1, 2, 4, 5, 31, 32, 0xffffffffull, 0x100000000ull, 1ull << 31,
                                 1ull << 60, 1ull << 62, 0x7fffffffffffffffull, 0x8000000000000000ull,
                                 ~0ull, ~0ull - 31, size, size - 1, size + 1, header_end};
  const uint32_t extremes32[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 30, 31, 99, 0x80000000u, 0xffffffffu};
  // Half of them hit the structural fields, which the vocabulary's thousands
  // of string lengths would otherwise drown out.
  std::vector<Layout::Field> structural;
  for (const auto& f : layout.fields)
    if (!f.in_array) structural.push_back(f);
  for (int k = 0; k < n_fields; ++k) {
    const Layout::Field& f = k % 2 ? structural[below(structural.size())] : layout.fields[below(layout.fields.size())];
    uint64_t v = 0;
    std::memcpy(&v, m.base().data() + f.offset, f.size);
    const uint64_t pick = below(4);
    if (pick == 0) v += below(2) ? 1 : ~0ull;  // +-1
    else if (pick == 1) v = f.size == 8 ? rng() : static_cast<uint32_t>(rng());
    else v = f.size == 8 ? extremes64[below(std::size(extremes64))] : extremes32[below(std::size(extremes32))];
    m.patch(f.offset, &v, f.size);
    run("field @" + std::to_string(f.offset) + " = " + std::to_string(v));
  }
  // 4. Extreme 8-byte words at random offsets (unaligned, anywhere in the
  //    header or the first bytes of the data).
  for (int k = 0; k < n_random_words; ++k) {
    const uint64_t off = below(std::min(size - 8, header_end + 64));
    const uint64_t v = extremes64[below(std::size(extremes64))];
    m.patch(off, &v, 8);
    run("word @" + std::to_string(off) + " = " + std::to_string(v));
  }
  return stats;
}

TEST(GgufMutation, SharedModelsSurviveThousandsOfVariants) {
  ScratchDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  MutationStats total;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  // ~1300 variants per model: about 1 s in Release, 4 s under ASan.
  for (const char* model : {"stories260K.gguf", "stories260K-f16.gguf", "tiny-qwen3-q4_k_m.gguf",
                            "tiny-llama-q8_0.gguf"}) {
    const MutationStats s = mutate_model(model, dir, seed++, 250, 450, 450, 150);
    EXPECT_GT(s.rejected, 0) << model;
    EXPECT_GT(s.loaded, 0) << model;  // data-only flips still load
    total.variants += s.variants;
    total.loaded += s.loaded;
    total.rejected += s.rejected;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(total.variants, 3000);
  std::printf("[ mutation ] %d variants: %d loaded, %d rejected, %.2f s\n", total.variants, total.loaded,
              total.rejected, secs);
}

}  // namespace
}  // namespace ebb
