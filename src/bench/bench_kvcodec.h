// ebb bench kvcodec: how well KV chunks compress (mzCache Table 2 and §6.5).
// Real KV is built by running the model on a text prompt; every chunk of
// every layer is then compressed with the quantizing codecs (int8, int4) and
// with general-purpose compressors on the raw chunk bytes (lz4, zstd).
//
// Per codec: space saving (1 - compressed / raw, raw = the valid rows of each
// chunk in the KV type), compress and decompress throughput on one core
// (GB/s of raw bytes, medians over reps), and for the quantizing codecs the
// accuracy cost: a session whose every chunk was round-tripped through the
// codec is fed the same continuation as an untouched session, and the
// next-token distributions are compared (mean KL(reference || codec), top-1
// agreement).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/tensor.h"
#include "runtime/engine.h"

namespace ebb {

struct KvCodecBenchOptions {
  int64_t context = 512;      // prompt tokens (clamped to the model's context less the continuation)
  int64_t continuation = 16;  // tokens fed after the round trip for the accuracy comparison
  int64_t reps = 3;           // timed repetitions; medians are reported
  int64_t kv_chunk_size = 0;  // 0: the engine's default
  DType kv_type = DType::kF16;
  bool zstd19 = false;        // also run zstd at level 19 (slow)
  std::optional<Isa> isa;     // codec target; default: the engine's
  std::function<void(const std::string&)> progress;  // a line per step, may be empty
};

struct KvCodecBenchRow {
  std::string codec;  // "int8", "int4", "lz4", "zstd-3", "zstd-19"
  double saving_pct = 0;
  double compress_gbps = 0;
  double decompress_gbps = 0;
  bool has_accuracy = false;  // int8 / int4 only
  double kl_div = 0;          // mean KL(reference || round-tripped) over the continuation, nats
  double top1_agree = 0;      // fraction of continuation positions with the same argmax
};

struct KvCodecBenchResult {
  std::vector<KvCodecBenchRow> rows;
  int64_t context = 0;       // prompt tokens actually used
  int64_t continuation = 0;
  int64_t n_layer = 0, n_chunks = 0;  // chunks over all layers
  int64_t chunk_tokens = 0, row_dim = 0;
  uint64_t raw_bytes = 0;    // valid KV bytes over all chunks
  double memcpy_gbps = 0;    // one-core copy of the same bytes: the bound for decompression
  Isa isa = Isa::kScalar;
  int64_t reps = 0;
};

// Throws ebb::Error on impossible options.
KvCodecBenchResult bench_kvcodec(Engine& engine, const KvCodecBenchOptions& opts);

}  // namespace ebb
