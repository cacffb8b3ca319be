// KV chunk codecs: round-trip error within half a quantization step,
// idempotency (compress(decompress(compress(x))) == compress(x) byte for byte)
// on random and adversarial chunks, every SIMD target against the scalar
// reference, corrupt blobs rejected, and the kvcodec benchmark on a real model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kv_codec.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"
#include "bench/bench_kvcodec.h"
#include "support.h"

namespace ebb {
namespace {

constexpr KvCodecId kCodecs[] = {KvCodecId::kInt8, KvCodecId::kInt4};

size_t elem(const KvChunkShape& s) { return s.type == DType::kF16 ? 2 : 4; }
size_t chunk_bytes(const KvChunkShape& s) { return 2 * s.chunk_tokens * s.row_dim * elem(s); }

// A chunk of the given shape whose element (part, t, c) is f(part, t, c),
// rounded to the chunk type; rows >= n_tokens hold garbage (they must be ignored).
template <class F>
std::vector<uint8_t> make_chunk(const KvChunkShape& s, F f) {
  std::vector<uint8_t> buf(chunk_bytes(s));
  for (int part = 0; part < 2; ++part) {
    for (int64_t t = 0; t < s.chunk_tokens; ++t) {
      for (int64_t c = 0; c < s.row_dim; ++c) {
        const float v = t < s.n_tokens ? f(part, t, c) : 1e4f;
        const size_t i = static_cast<size_t>((part * s.chunk_tokens + t) * s.row_dim + c);
        if (s.type == DType::kF16) {
          const uint16_t h = fp32_to_fp16(v);
          std::memcpy(buf.data() + 2 * i, &h, 2);
        } else {
          std::memcpy(buf.data() + 4 * i, &v, 4);
        }
      }
    }
  }
  return buf;
}

float value(const KvChunkShape& s, const std::vector<uint8_t>& buf, int part, int64_t t, int64_t c) {
  const size_t i = static_cast<size_t>((part * s.chunk_tokens + t) * s.row_dim + c);
  if (s.type == DType::kF16) {
    uint16_t h;
    std::memcpy(&h, buf.data() + 2 * i, 2);
    return fp16_to_fp32(h);
  }
  float v;
  std::memcpy(&v, buf.data() + 4 * i, 4);
  return v;
}

// Realistic KV: per-channel offsets (K outlier channels), smooth rows.
std::vector<uint8_t> random_chunk(const KvChunkShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> offset(s.row_dim), scale(s.row_dim);
  for (int64_t c = 0; c < s.row_dim; ++c) {
    offset[c] = (c % 13 == 0) ? 8.f * nd(rng) : 0.3f * nd(rng);
    scale[c] = 0.2f + std::fabs(nd(rng));
  }
  std::vector<float> vals(static_cast<size_t>(2 * s.chunk_tokens * s.row_dim));
  for (auto& v : vals) v = nd(rng);
  return make_chunk(s, [&](int part, int64_t t, int64_t c) {
    const float x = vals[static_cast<size_t>((part * s.chunk_tokens + t) * s.row_dim + c)];
    return part == 0 ? offset[c] + scale[c] * x : x;
  });
}

std::vector<uint8_t> compress(const KvCodec& codec, const KvChunkShape& s, const std::vector<uint8_t>& chunk,
                              KvCodecStats* st = nullptr) {
  std::vector<uint8_t> blob(codec.max_compressed_bytes(s));
  const size_t n = codec.compress(s, chunk.data(), blob.data(), st);
  EXPECT_EQ(n, blob.size());
  return blob;
}

std::vector<uint8_t> decompress(const KvCodec& codec, const KvChunkShape& s, const std::vector<uint8_t>& blob) {
  std::vector<uint8_t> out(chunk_bytes(s), 0xAB);
  codec.decompress(s, blob.data(), blob.size(), out.data());
  return out;
}

std::string label(KvCodecId id, Isa isa, const KvChunkShape& s) {
  return std::string(kv_codec_name(id)) + "/" + std::string(isa_name(isa)) + " " +
         std::string(dtype_name(s.type)) + " chunk " + std::to_string(s.chunk_tokens) + " n " +
         std::to_string(s.n_tokens) + " dim " + std::to_string(s.row_dim);
}

std::vector<KvChunkShape> shapes() {
  std::vector<KvChunkShape> v;
  for (DType t : {DType::kF16, DType::kF32}) {
    for (int64_t dim : {1, 7, 32, 63, 64, 65, 100, 259}) {
      for (auto [chunk, n] : {std::pair<int64_t, int64_t>{256, 256}, {256, 1}, {130, 65}, {70, 64}, {16, 0}}) {
        v.push_back({chunk, n, dim, t});
      }
    }
  }
  return v;
}

TEST(KvCodec, ParseAndNames) {
  EXPECT_EQ(parse_kv_codec("int8"), KvCodecId::kInt8);
  EXPECT_EQ(parse_kv_codec("int4"), KvCodecId::kInt4);
  try {
    parse_kv_codec("int3");
    FAIL() << "int3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int8, int4"), std::string::npos) << e.what();
  }
  for (KvCodecId id : kCodecs)
    for (Isa isa : supported_isas()) EXPECT_EQ(kv_codec(id, isa).name(), kv_codec_name(id));
}

// Decoded values lie within half a step of the input (plus the F16 rounding
// of the decoded value), rows past n_tokens decode to zero, and realistic
// data never needs the constant fallback.
TEST(KvCodec, RoundTripErrorWithinHalfStep) {
  for (KvCodecId id : kCodecs) {
    for (const KvChunkShape& s : shapes()) {
      const KvCodec& codec = kv_codec(id, Isa::kScalar);
      const auto x = random_chunk(s, 7);
      KvCodecStats st;
      const auto y = decompress(codec, s, compress(codec, s, x, &st));
      EXPECT_EQ(st.fallbacks, 0) << label(id, Isa::kScalar, s);
      double worst = 0;  // largest error / allowed
      for (int part = 0; part < 2; ++part) {
        // The step of each group, recomputed from the input: int8 amax/127,
        // int4 (max - min)/15 (K per channel over 64 tokens, V along the row).
        for (int64_t t = 0; t < s.chunk_tokens; ++t) {
          for (int64_t c = 0; c < s.row_dim; ++c) {
            const float got = value(s, y, part, t, c);
            if (t >= s.n_tokens) {
              ASSERT_EQ(got, 0.f) << label(id, Isa::kScalar, s);
              continue;
            }
            float lo = INFINITY, hi = -INFINITY, amax = 0;
            auto see = [&](float v) {
              lo = std::min(lo, v);
              hi = std::max(hi, v);
              amax = std::max(amax, std::fabs(v));
            };
            if (id == KvCodecId::kInt4 && part == 0) {
              const int64_t t0 = t / 64 * 64;
              for (int64_t u = t0; u < std::min(s.n_tokens, t0 + 64); ++u) see(value(s, x, 0, u, c));
            } else {
              const int64_t c0 = c / 64 * 64;
              for (int64_t u = c0; u < std::min(s.row_dim, c0 + 64); ++u) see(value(s, x, part, t, u));
            }
            const double step = id == KvCodecId::kInt8 ? amax / 127.0 : (hi - lo) / 15.0;
            // Half a step, the F16 rounding of the step and of the minimum, and of the output.
            const double allowed = 0.5 * step * (1 + 4e-3) + (id == KvCodecId::kInt4 ? 8 * std::ldexp(std::fabs(lo), -11) : 0) +
                                   (s.type == DType::kF16 ? std::ldexp(std::fabs(got), -11) : 0) + 1e-7;
            const double err = std::fabs(double(got) - value(s, x, part, t, c));
            worst = std::max(worst, err / allowed);
          }
        }
      }
      EXPECT_LE(worst, 1.0) << label(id, Isa::kScalar, s);
    }
  }
}

// Adversarial chunks: the refinement or the constant fallback must still give
// compress(decompress(b)) == b.
std::vector<std::vector<uint8_t>> adversarial(const KvChunkShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  std::vector<std::vector<uint8_t>> v;
  v.push_back(make_chunk(s, [](int, int64_t, int64_t) { return 0.f; }));
  v.push_back(make_chunk(s, [](int, int64_t, int64_t) { return -0.f; }));
  v.push_back(make_chunk(s, [](int, int64_t t, int64_t c) { return (t + c) % 2 ? 65504.f : -65504.f; }));
  v.push_back(make_chunk(s, [](int, int64_t, int64_t c) { return c % 3 ? 65504.f : 65472.f; }));
  v.push_back(make_chunk(s, [](int p, int64_t, int64_t) { return p ? 3.14159f : -2.5f; }));  // all-equal groups
  v.push_back(make_chunk(s, [&](int, int64_t, int64_t) { return u(rng) * 6e-8f; }));  // F16 denormals
  v.push_back(make_chunk(s, [&](int, int64_t, int64_t) { return u(rng) * 6e-5f; }));  // around the F16 normal minimum
  v.push_back(make_chunk(s, [&](int, int64_t t, int64_t c) { return (t * 7 + c) % 61 == 0 ? 60000.f * u(rng) : 1e-3f * u(rng); }));
  v.push_back(make_chunk(s, [&](int, int64_t, int64_t) { return 1000.f + 0.05f * u(rng); }));  // narrow band far from 0
  v.push_back(make_chunk(s, [&](int, int64_t, int64_t) { return -60000.f + 3000.f * u(rng); }));
  v.push_back(make_chunk(s, [&](int, int64_t, int64_t) {  // random finite F16 bit patterns
    uint16_t h;
    do h = static_cast<uint16_t>(bits(rng)); while ((h & 0x7c00) == 0x7c00);
    return fp16_to_fp32(h);
  }));
  return v;
}

TEST(KvCodec, Idempotent) {
  int64_t fallbacks = 0, groups = 0, refined = 0;
  for (KvCodecId id : kCodecs) {
    for (Isa isa : supported_isas()) {
      const KvCodec& codec = kv_codec(id, isa);
      for (const KvChunkShape& s : shapes()) {
        auto inputs = adversarial(s, 11);
        inputs.push_back(random_chunk(s, 1));
        for (size_t k = 0; k < inputs.size(); ++k) {
          KvCodecStats st;
          const auto b1 = compress(codec, s, inputs[k], &st);
          const auto b2 = compress(codec, s, decompress(codec, s, b1), nullptr);
          const auto b3 = compress(codec, s, decompress(codec, s, b2), nullptr);
          ASSERT_EQ(b1, b2) << label(id, isa, s) << " input " << k;
          ASSERT_EQ(b1, b3) << label(id, isa, s) << " input " << k;
          fallbacks += st.fallbacks;
          groups += st.groups;
          refined += st.refined;
        }
      }
    }
  }
  std::printf("adversarial + random: %lld groups, %lld blocks refined, %lld groups fell back to constants\n",
              static_cast<long long>(groups), static_cast<long long>(refined), static_cast<long long>(fallbacks));
}

// Every target against the scalar reference: the same blob byte for byte,
// the same decoded values bit for bit.
TEST(KvCodec, TargetsMatchScalar) {
  for (KvCodecId id : kCodecs) {
    const KvCodec& ref = kv_codec(id, Isa::kScalar);
    for (Isa isa : supported_isas()) {
      if (isa == Isa::kScalar) continue;
      const KvCodec& codec = kv_codec(id, isa);
      for (const KvChunkShape& s : shapes()) {
        auto inputs = adversarial(s, 5);
        inputs.push_back(random_chunk(s, 9));
        for (size_t k = 0; k < inputs.size(); ++k) {
          const auto b_ref = compress(ref, s, inputs[k]);
          ASSERT_EQ(compress(codec, s, inputs[k]), b_ref) << label(id, isa, s) << " input " << k;
          ASSERT_EQ(decompress(codec, s, b_ref), decompress(ref, s, b_ref)) << label(id, isa, s) << " input " << k;
        }
      }
    }
  }
}

// Records encoded on a pool's threads land in the same places: the blob and
// the stats equal the one-thread ones.
TEST(KvCodec, ThreadPoolGivesTheSameBlob) {
  ThreadPool pool(ThreadPoolOptions{.n_threads = 3});
  for (KvCodecId id : kCodecs) {
    for (Isa isa : {Isa::kScalar, best_isa()}) {
      const KvCodec& codec = kv_codec(id, isa);
      for (const KvChunkShape& s : shapes()) {
        const auto edge = adversarial(s, 21);
        // Random values, extremes that need refinement, outliers among small values.
        const std::vector<std::vector<uint8_t>> inputs = {random_chunk(s, 22), edge[2], edge[7]};
        for (size_t k = 0; k < inputs.size(); ++k) {
          KvCodecStats one, many;
          const auto want = compress(codec, s, inputs[k], &one);
          std::vector<uint8_t> got(want.size() + 1, 0xCD);  // one guard byte
          ASSERT_EQ(codec.compress(s, inputs[k].data(), got.data(), &many, &pool), want.size());
          ASSERT_EQ(got.back(), 0xCD) << label(id, isa, s);
          got.pop_back();
          ASSERT_EQ(got, want) << label(id, isa, s) << " input " << k;
          EXPECT_EQ(many.groups, one.groups);
          EXPECT_EQ(many.refined, one.refined);
          EXPECT_EQ(many.fallbacks, one.fallbacks);
        }
      }
    }
  }
}

TEST(KvCodec, SpaceSaving) {
  for (int64_t dim : {32, 1024}) {
    const KvChunkShape s{256, 256, dim, DType::kF16};
    const double raw = static_cast<double>(chunk_bytes(s));
    const double s8 = 1 - kv_codec(KvCodecId::kInt8, Isa::kScalar).max_compressed_bytes(s) / raw;
    const double s4 = 1 - kv_codec(KvCodecId::kInt4, Isa::kScalar).max_compressed_bytes(s) / raw;
    EXPECT_GE(s8, 0.46) << dim;
    EXPECT_GE(s4, 0.68) << dim;
    EXPECT_GT(s4, s8) << dim;
  }
}

TEST(KvCodec, CorruptBlobRejected) {
  const KvChunkShape s{64, 40, 48, DType::kF16};
  for (KvCodecId id : kCodecs) {
    const KvCodec& codec = kv_codec(id, Isa::kScalar);
    auto blob = compress(codec, s, random_chunk(s, 3));
    std::vector<uint8_t> out(chunk_bytes(s));
    EXPECT_THROW(codec.decompress(s, blob.data(), blob.size() - 1, out.data()), Error);
    KvChunkShape other = s;
    other.n_tokens = 39;
    std::vector<uint8_t> shorter(codec.max_compressed_bytes(other));
    std::memcpy(shorter.data(), blob.data(), shorter.size());
    EXPECT_THROW(codec.decompress(other, shorter.data(), shorter.size(), out.data()), Error);  // header says 40
    const KvCodec& wrong = kv_codec(id == KvCodecId::kInt8 ? KvCodecId::kInt4 : KvCodecId::kInt8, Isa::kScalar);
    std::vector<uint8_t> w(wrong.max_compressed_bytes(s));
    std::memcpy(w.data(), blob.data(), std::min(w.size(), blob.size()));
    EXPECT_THROW(wrong.decompress(s, w.data(), w.size(), out.data()), Error);
  }
}

// The benchmark on a real model: the paper's Table 2 shape (general-purpose
// compressors barely shrink KV) next to the quantizing codecs.
TEST(KvCodecBench, Stories260K) {
  EngineOptions eo;
  eo.model_path = test::model_path("stories260K.gguf");
  eo.n_threads = 2;
  Engine engine(eo);
  KvCodecBenchOptions o;
  o.context = 256;
  o.reps = 1;
  const auto rows = bench_kvcodec(engine, o).rows;
  const KvCodecBenchRow* i8 = nullptr;
  const KvCodecBenchRow* i4 = nullptr;
  bool lz4 = false, zstd = false;
  for (const auto& r : rows) {
    if (r.codec == "int8") i8 = &r;
    if (r.codec == "int4") i4 = &r;
    lz4 |= r.codec == "lz4";
    zstd |= r.codec.rfind("zstd", 0) == 0;
    EXPECT_GT(r.compress_gbps, 0) << r.codec;
    EXPECT_GT(r.decompress_gbps, 0) << r.codec;
    EXPECT_LT(r.saving_pct, 100) << r.codec;
  }
  ASSERT_TRUE(i8 && i4 && lz4 && zstd);
  EXPECT_GE(i8->saving_pct, 46.0);
  EXPECT_LT(i8->kl_div, 0.01);
  EXPECT_GE(i8->kl_div, 0.0);
  EXPECT_GT(i8->top1_agree, 0.9);
  EXPECT_GT(i4->saving_pct, i8->saving_pct);
  EXPECT_GT(i4->kl_div, i8->kl_div);  // four bits lose more than eight
}

}  // namespace
}  // namespace ebb
