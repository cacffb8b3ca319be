#include "bench/bench_kvcodec.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>

#include "kernels/kv_codec.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb {
namespace {

// A plain-English prompt (tokenized, then repeated to the wanted length).
constexpr const char* kText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her "
    "dog, Max. One day, Lily and Max went to the park. They saw a big tree with red apples. Lily wanted to pick "
    "an apple, but the tree was too tall. Max barked and ran around the tree. A kind old man saw them and came "
    "to help. He lifted Lily up so she could reach the apples. Lily picked three apples and said thank you. "
    "Then they all sat on the grass and shared the apples. The sun went down and the sky turned orange. Lily "
    "and Max walked home, happy and tired, and dreamed of the big tree that night.";

std::vector<TokenId> make_tokens(const Tokenizer& tok, int64_t n) {
  EncodeOptions first;
  EncodeOptions rest;
  rest.add_bos = false;
  std::vector<TokenId> ids = tok.encode(kText, first);
  const std::vector<TokenId> more = tok.encode(std::string(" ") + kText, rest);
  if (more.empty()) throw Error("bench kvcodec: the tokenizer produced no tokens for the prompt text");
  while (static_cast<int64_t>(ids.size()) < n) ids.insert(ids.end(), more.begin(), more.end());
  ids.resize(static_cast<size_t>(n));
  return ids;
}

// One chunk of the reference KV: where it lives and how many rows are valid.
struct ChunkView {
  uint8_t* data;
  KvChunkShape shape;
  size_t raw;  // valid bytes (K and V rows)
};

std::vector<ChunkView> chunk_views(KvCache& kv, int64_t n_tokens) {
  const KvShape& ks = kv.shape();
  const int64_t ct = kv.options().chunk_size;
  std::vector<ChunkView> v;
  for (int64_t l = 0; l < ks.n_layer; ++l) {
    for (int64_t c = 0; c * ct < n_tokens; ++c) {
      const int64_t n = std::min(ct, n_tokens - c * ct);
      const KvChunkShape s{ct, n, ks.n_kv_heads * ks.head_dim, kv.options().type};
      v.push_back({kv.chunk_data(l, c), s, static_cast<size_t>(2 * n) * kv.row_bytes()});
    }
  }
  return v;
}

// Softmax statistics of one position: KL(p || q) and whether the argmaxes agree.
void compare_logits(std::span<const float> p_logits, std::span<const float> q_logits, double* kl, bool* same) {
  const size_t n = p_logits.size();
  const double pm = *std::max_element(p_logits.begin(), p_logits.end());
  const double qm = *std::max_element(q_logits.begin(), q_logits.end());
  double ps = 0, qs = 0;
  for (size_t i = 0; i < n; ++i) {
    ps += std::exp(p_logits[i] - pm);
    qs += std::exp(q_logits[i] - qm);
  }
  const double lps = std::log(ps), lqs = std::log(qs);
  double k = 0;
  for (size_t i = 0; i < n; ++i) {
    const double lp = p_logits[i] - pm - lps, lq = q_logits[i] - qm - lqs;
    k += std::exp(lp) * (lp - lq);
  }
  *kl = std::max(0.0, k);
  *same = std::max_element(p_logits.begin(), p_logits.end()) - p_logits.begin() ==
          std::max_element(q_logits.begin(), q_logits.end()) - q_logits.begin();
}

// Times fn() reps times; returns the median GB/s for `bytes`.
template <class F>
double gbps(int64_t reps, uint64_t bytes, F fn) {
  std::vector<double> v;
  for (int64_t r = 0; r < reps; ++r) {
    Stopwatch sw;
    fn();
    v.push_back(bytes / std::max(sw.seconds(), 1e-9) / 1e9);
  }
  return median(v);
}

}  // namespace

KvCodecBenchResult bench_kvcodec(Engine& engine, const KvCodecBenchOptions& o) {
  if (o.context < 1) throw Error("bench kvcodec: --context must be >= 1, got " + std::to_string(o.context));
  if (o.continuation < 1) throw Error("bench kvcodec: the continuation must be >= 1 token");
  if (o.reps < 1) throw Error("bench kvcodec: --reps must be >= 1, got " + std::to_string(o.reps));
  const Isa isa = o.isa.value_or(engine.isa());
  if (!isa_supported(isa)) throw Error("bench kvcodec: instruction set " + std::string(isa_name(isa)) + " is not supported here");
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };

  const int64_t train = engine.config().n_ctx_train > 0 ? engine.config().n_ctx_train : 4096;
  KvCodecBenchResult res;
  res.continuation = o.continuation;
  res.context = std::min(o.context, train - o.continuation);
  if (res.context < 1) throw Error("bench kvcodec: the model's context is too short for the continuation");
  res.isa = isa;
  res.reps = o.reps;
  const std::vector<TokenId> all = make_tokens(engine.tokenizer(), res.context + o.continuation);
  const std::span<const TokenId> prompt(all.data(), static_cast<size_t>(res.context));
  const std::span<const TokenId> cont(all.data() + res.context, static_cast<size_t>(o.continuation));
  SessionOptions so;
  so.n_ctx = res.context + o.continuation;
  so.kv_chunk_size = o.kv_chunk_size;
  so.kv_type = o.kv_type;

  say("prefill of the reference session (" + std::to_string(res.context) + " tokens)");
  Session ref(engine, so);
  ref.feed(prompt);
  const std::vector<ChunkView> chunks = chunk_views(ref.kv(), res.context);
  res.n_layer = ref.kv().shape().n_layer;
  res.n_chunks = static_cast<int64_t>(chunks.size());
  res.chunk_tokens = ref.kv().options().chunk_size;
  res.row_dim = ref.kv().shape().n_kv_heads * ref.kv().shape().head_dim;

  // The valid bytes of every chunk, contiguous: the input of lz4 / zstd.
  std::vector<size_t> off(chunks.size() + 1, 0);
  for (size_t i = 0; i < chunks.size(); ++i) off[i + 1] = off[i] + chunks[i].raw;
  res.raw_bytes = off.back();
  Allocator& alloc = engine.allocator();
  Buffer staged = alloc.allocate(res.raw_bytes, MemCategory::kScratch);
  Buffer restored = alloc.allocate(res.raw_bytes, MemCategory::kScratch);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkView& c = chunks[i];
    const size_t half = c.raw / 2, k_off = 0, v_off = static_cast<size_t>(c.shape.chunk_tokens) * (half / c.shape.n_tokens);
    std::memcpy(staged.as<uint8_t>() + off[i], c.data + k_off, half);
    std::memcpy(staged.as<uint8_t>() + off[i] + half, c.data + v_off, half);
  }
  res.memcpy_gbps = gbps(o.reps, res.raw_bytes, [&] { std::memcpy(restored.data(), staged.data(), res.raw_bytes); });

  // Quantizing codecs.
  const size_t chunk_bytes = ref.kv().chunk_bytes();
  Buffer chunk_out = alloc.allocate(chunk_bytes, MemCategory::kScratch);
  std::vector<size_t> coff(chunks.size() + 1, 0);
  std::vector<float> ref_logits;
  bool have_ref_logits = false;
  for (KvCodecId id : {KvCodecId::kInt8, KvCodecId::kInt4}) {
    const KvCodec& codec = kv_codec(id, isa);
    KvCodecBenchRow row;
    row.codec = std::string(codec.name());
    say("codec " + row.codec);
    for (size_t i = 0; i < chunks.size(); ++i) coff[i + 1] = coff[i] + codec.max_compressed_bytes(chunks[i].shape);
    Buffer blobs = alloc.allocate(coff.back(), MemCategory::kCompressed);
    row.compress_gbps = gbps(o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i) codec.compress(chunks[i].shape, chunks[i].data, blobs.as<uint8_t>() + coff[i]);
    });
    row.decompress_gbps = gbps(o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i)
        codec.decompress(chunks[i].shape, blobs.as<uint8_t>() + coff[i], coff[i + 1] - coff[i], chunk_out.data());
    });
    row.saving_pct = 100.0 * (1.0 - static_cast<double>(coff.back()) / res.raw_bytes);

    // Accuracy: round-trip every chunk of a second session in place.
    say("accuracy of " + row.codec + ": prefill, round trip, continuation");
    Session s(engine, so);
    s.feed(prompt);
    for (const ChunkView& c : chunk_views(s.kv(), res.context)) {
      codec.compress(c.shape, c.data, blobs.data());
      codec.decompress(c.shape, blobs.data(), codec.max_compressed_bytes(c.shape), c.data);
    }
    std::vector<float> got;
    s.feed(cont, &got);
    if (!have_ref_logits) {
      ref.feed(cont, &ref_logits);  // after the timings: it extends the reference KV
      have_ref_logits = true;
    }
    const size_t nv = static_cast<size_t>(engine.tokenizer().n_vocab());
    EBB_CHECK(got.size() == ref_logits.size() && got.size() == nv * cont.size());
    double kl_sum = 0;
    int64_t agree = 0;
    for (size_t p = 0; p < cont.size(); ++p) {
      double kl;
      bool same;
      compare_logits({ref_logits.data() + p * nv, nv}, {got.data() + p * nv, nv}, &kl, &same);
      kl_sum += kl;
      agree += same;
    }
    row.has_accuracy = true;
    row.kl_div = kl_sum / cont.size();
    row.top1_agree = static_cast<double>(agree) / cont.size();
    res.rows.push_back(row);
  }

  // General-purpose compressors on the raw bytes, chunk by chunk (zRAM's view
  // of the same memory, at chunk rather than page granularity).
  const uint8_t* in = staged.as<uint8_t>();
  uint8_t* back = restored.as<uint8_t>();
  {
    KvCodecBenchRow row;
    row.codec = "lz4";
    say("codec lz4");
    std::vector<size_t> bound(chunks.size() + 1, 0), size(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) bound[i + 1] = bound[i] + LZ4_compressBound(static_cast<int>(chunks[i].raw));
    Buffer out = alloc.allocate(bound.back(), MemCategory::kCompressed);
    row.compress_gbps = gbps(o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        const int n = LZ4_compress_default(reinterpret_cast<const char*>(in + off[i]), out.as<char>() + bound[i],
                                           static_cast<int>(chunks[i].raw), static_cast<int>(bound[i + 1] - bound[i]));
        if (n <= 0) throw Error("bench kvcodec: LZ4_compress_default failed");
        size[i] = static_cast<size_t>(n);
      }
    });
    row.decompress_gbps = gbps(o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        const int n = LZ4_decompress_safe(out.as<char>() + bound[i], reinterpret_cast<char*>(back + off[i]),
                                          static_cast<int>(size[i]), static_cast<int>(chunks[i].raw));
        EBB_CHECK(n == static_cast<int>(chunks[i].raw));
      }
    });
    EBB_CHECK(std::memcmp(in, back, res.raw_bytes) == 0);
    size_t total = 0;
    for (size_t n : size) total += n;
    row.saving_pct = 100.0 * (1.0 - static_cast<double>(total) / res.raw_bytes);
    res.rows.push_back(row);
  }
  const int levels[] = {3, 19};
  for (int level : levels) {
    if (level == 19 && !o.zstd19) continue;
    KvCodecBenchRow row;
    row.codec = "zstd-" + std::to_string(level);
    say("codec " + row.codec);
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
    if (!cctx || !dctx) throw Error("bench kvcodec: cannot create a zstd context");
    std::vector<size_t> bound(chunks.size() + 1, 0), size(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) bound[i + 1] = bound[i] + ZSTD_compressBound(chunks[i].raw);
    Buffer out = alloc.allocate(bound.back(), MemCategory::kCompressed);
    // zstd-19 is slow: time it once.
    row.compress_gbps = gbps(level > 9 ? 1 : o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        const size_t n = ZSTD_compressCCtx(cctx.get(), out.as<uint8_t>() + bound[i], bound[i + 1] - bound[i],
                                           in + off[i], chunks[i].raw, level);
        if (ZSTD_isError(n)) throw Error(std::string("bench kvcodec: zstd compression failed: ") + ZSTD_getErrorName(n));
        size[i] = n;
      }
    });
    row.decompress_gbps = gbps(o.reps, res.raw_bytes, [&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        const size_t n = ZSTD_decompressDCtx(dctx.get(), back + off[i], chunks[i].raw, out.as<uint8_t>() + bound[i], size[i]);
        EBB_CHECK(!ZSTD_isError(n) && n == chunks[i].raw);
      }
    });
    EBB_CHECK(std::memcmp(in, back, res.raw_bytes) == 0);
    size_t total = 0;
    for (size_t n : size) total += n;
    row.saving_pct = 100.0 * (1.0 - static_cast<double>(total) / res.raw_bytes);
    res.rows.push_back(row);
  }
  return res;
}

}  // namespace ebb
