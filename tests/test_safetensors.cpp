// The safetensors reader and writer: a round trip keeps every name, dtype,
// shape, byte and metadata entry; hostile headers (truncated files, lengths
// past the end, bad JSON, fields of the wrong type, offsets outside the
// data, overlaps, size mismatches, overflowing shapes) are each a clear
// error naming the file and the tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

// A file of an 8-byte length, the header text and `data_bytes` zero bytes;
// `length` overrides the stored header length.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t length = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length >= 0 ? static_cast<uint64_t>(length) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  out << std::string(data_bytes, '\0');
}

// The message open() throws, or "" when it opens.
std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of_header(const test::TempDir& tmp, const std::string& header, size_t data_bytes) {
  const std::string path = tmp.file("t.safetensors");
  write_raw(path, header, data_bytes);
  return open_error(path);
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST(Safetensors, RoundTripKeepsTensorsAndMetadata) {
  test::TempDir tmp;
  const std::string path = tmp.file("rt.safetensors");
  std::vector<uint8_t> f32(2 * 3 * 4), f16(4 * 2), bf16(2 * 2 * 2), i64(8);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint8_t>(i * 5 + 3);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint8_t>(i * 3 + 2);
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<uint8_t>(0xa0 + i);
  write_safetensors(path,
                    {{"w.f32", "F32", {2, 3}, f32},
                     {"w.f16", "F16", {4}, f16},
                     {"w.bf16", "BF16", {2, 2}, bf16},
                     {"scalar", "I64", {}, i64},
                     {"empty", "F32", {0, 5}, {}}},
                    {{"format", "pt"}, {"note", "ebb test"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->data_offset() % 8, 0u);  // the header is padded to 8 bytes
  ASSERT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "ebb test");

  struct Want {
    const char* name;
    const char* dtype;
    std::optional<DType> type;
    std::vector<int64_t> shape;
    const std::vector<uint8_t>* bytes;
  };
  const std::vector<uint8_t> none;
  for (const Want& w : {Want{"w.f32", "F32", DType::kF32, {2, 3}, &f32}, Want{"w.f16", "F16", DType::kF16, {4}, &f16},
                        Want{"w.bf16", "BF16", DType::kBF16, {2, 2}, &bf16},
                        Want{"scalar", "I64", std::nullopt, {}, &i64}, Want{"empty", "F32", DType::kF32, {0, 5}, &none}}) {
    const SafetensorsTensorInfo* t = f->find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->type, w.type) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    EXPECT_EQ(t->n_bytes, w.bytes->size()) << w.name;
    EXPECT_EQ(f->read(*t), *w.bytes) << w.name;
  }
  EXPECT_EQ(f->find("missing"), nullptr);
  // In order of their data: the order they were written in.
  EXPECT_EQ(f->tensors()[0].name, "w.f32");
  EXPECT_EQ(f->tensors()[1].name, "w.f16");
  EXPECT_EQ(f->tensors()[2].name, "w.bf16");
}

TEST(Safetensors, EmptyFileAndNoMetadataAreValid) {
  test::TempDir tmp;
  const std::string path = tmp.file("e.safetensors");
  write_safetensors(path, {});
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
}

TEST(Safetensors, TruncatedFilesAreClearErrors) {
  test::TempDir tmp;
  const std::string path = tmp.file("short.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  std::string e = open_error(path);
  EXPECT_HAS(e, path);
  EXPECT_HAS(e, "truncated");

  write_raw(path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 0, 1000);
  e = open_error(path);
  EXPECT_HAS(e, "header length 1000 runs past the end of the file");

  write_raw(path, "{}", 0, int64_t{1} << 40);
  EXPECT_HAS(open_error(path), "exceeds the limit");
  write_raw(path, "", 0, 0);
  EXPECT_HAS(open_error(path), "header length is 0");
  EXPECT_HAS(open_error(tmp.file("missing.safetensors")), "cannot open");
}

TEST(Safetensors, BadJsonAndWrongTypesAreClearErrors) {
  test::TempDir tmp;
  struct Case {
    std::string header;
    size_t data;
    std::string want;
  };
  const std::vector<Case> cases = {
      {R"({"a": {"dtype": "F32", "shape": [1], )", 0, "not valid JSON"},
      {R"({} trailing)", 0, "not valid JSON"},
      {"[1, 2]", 0, "the header is an array, expected a JSON object"},
      {R"({"a": [1]})", 0, "tensor 'a': its entry is an array, expected an object"},
      {R"({"a": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4, "tensor 'a': dtype is a number"},
      {R"({"a": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", 4, "tensor 'a': shape is a string"},
      {R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4, "shape holds a number that is a fraction"},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "negative (-1)"},
      {R"({"a": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})", 4, "shape holds an array"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8, "data_offsets has more than 2"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 8, "data_offsets has 1 numbers, expected 2"},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, "tensor 'a' has no 'shape'"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1}})", 4, "unknown field 'extra'"},
      {R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4, "field 'dtype' twice"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "tensor 'a' appears twice"},
      {R"({"__metadata__": {"k": 1}})", 0, "__metadata__['k'] is a number, expected a string"},
      {R"({"__metadata__": ["x"]})", 0, "__metadata__ is an array"},
      {R"({"a": {"dtype": "Q4_0", "shape": [1], "data_offsets": [0, 4]}})", 4, "dtype 'Q4_0', which safetensors does not define"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of_header(tmp, c.header, c.data);
    EXPECT_HAS(e, c.want) << "header: " << c.header;
    EXPECT_HAS(e, tmp.file("t.safetensors")) << "header: " << c.header;
  }
}

TEST(Safetensors, OffsetsAndSizesAreChecked) {
  test::TempDir tmp;
  struct Case {
    std::string header;
    size_t data;
    std::string want;
  };
  const std::vector<Case> cases = {
      // outside the data section
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 12, "tensor 'w': data_offsets [8, 16] lie outside the data section (12 bytes"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 12, "end before they begin"},
      // size mismatch
      {R"({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}})", 8, "hold 8 bytes, its shape [3] of F16 needs 6"},
      // overlap
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "tensors 'x' and 'y' overlap"},
      // dims whose product overflows 64 bits, and bytes that do
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})", 4, "more elements than fit in 64 bits"},
      {R"({"w": {"dtype": "F64", "shape": [4294967296, 1073741824], "data_offsets": [0, 4]}})", 4, "more bytes than fit in 64 bits"},
      {R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", 4, "larger than 2^63 - 1"},
      {R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", 4, "more than 16 dimensions"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of_header(tmp, c.header, c.data);
    EXPECT_HAS(e, c.want) << "header: " << c.header;
  }
  // Touching tensors and a zero-size one at a boundary are fine.
  EXPECT_EQ(error_of_header(tmp,
                            R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                "y": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
                            8),
            "");
}

TEST(Safetensors, ReadOfAFileThatShrankIsAnError) {
  test::TempDir tmp;
  const std::string path = tmp.file("s.safetensors");
  std::vector<uint8_t> bytes(64, 1);
  write_safetensors(path, {{"w", "F32", {16}, bytes}});
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_offset() + 10)), 0);
  try {
    f->read(f->tensors()[0]);
    FAIL() << "read past the end succeeded";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "unexpected end of file");
  }
}

TEST(Safetensors, WriterRejectsBadTensors) {
  test::TempDir tmp;
  const std::string path = tmp.file("w.safetensors");
  std::vector<uint8_t> four(4);
  auto error_of = [&](const std::vector<SafetensorsTensor>& ts) -> std::string {
    try {
      write_safetensors(path, ts);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_HAS(error_of({{"a", "F32", {1}, four}, {"a", "F32", {1}, four}}), "tensor 'a' is given twice");
  EXPECT_HAS(error_of({{"a", "F32", {2}, four}}), "tensor 'a' has 4 bytes");
  EXPECT_HAS(error_of({{"a", "Q8_0", {1}, four}}), "dtype 'Q8_0'");
  EXPECT_HAS(error_of({{"a", "F32", {-1}, four}}), "negative dimension");
  EXPECT_HAS(error_of({{"__metadata__", "F32", {1}, four}}), "reserved");
  EXPECT_EQ(error_of({{"a", "F32", {1}, four}}), "");
  EXPECT_HAS([&] {
    try {
      write_safetensors(tmp.file("no/such/dir.safetensors"), {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), "cannot create");
}

}  // namespace
}  // namespace ebb
