// Decode attention speed: one query row over a 4096-token F16 context,
// 16 heads / 8 KV heads / head_dim 128 (Qwen3-0.6B's shape), per target and
// thread count, in GB/s of K+V read. Cycles over several layers' KV so the
// reads come from memory, not the last-level cache. The arithmetic is the
// engine's default, F32 over the F16 cache; `f16acc` as the 7th argument runs
// the half-precision accumulator of attention.h instead (--f16-attention).
//
//   bench_attention [ctx [layers [n_heads n_kv_heads [isa [n_q [f16acc]]]]]]
// e.g. `bench_attention 4096 8 16 1` for decode with a single KV head;
// `bench_attention 576 28 16 8 avx2` runs one target only;
// `bench_attention 4096 8 16 8 avx2 8` an 8-token query (a chat turn's prefill);
// `bench_attention 576 28 16 8 avx512 1 f16acc` the F16 accumulator.
//
// Built with -DEBB_BENCH=ON: cmake -S . -B build -DEBB_BENCH=ON &&
// cmake --build build --target bench_attention && build/bench_attention
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

using namespace ebb;

int main(int argc, char** argv) {
  const int64_t ctx = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t hd = 128, cs = 256;
  const int64_t n_layers = argc > 2 ? std::atoll(argv[2]) : 8;  // 1: KV stays in the LLC
  const int64_t n_heads = argc > 4 ? std::atoll(argv[3]) : 16, n_kv = argc > 4 ? std::atoll(argv[4]) : 8;
  const int64_t n_q = argc > 6 ? std::atoll(argv[6]) : 1;
  const bool f16_acc = argc > 7 && std::string(argv[7]) == "f16acc";
  const int64_t n_chunks = (ctx + cs - 1) / cs, chunk_elems = cs * n_kv * hd;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  // [layer][chunk] K and V, F16.
  std::vector<std::vector<uint16_t>> store(n_layers * n_chunks * 2);
  for (auto& c : store) {
    c.resize(chunk_elems);
    for (auto& e : c) e = fp32_to_fp16(d(rng));
  }
  std::vector<std::vector<KvChunkRef>> tables(n_layers);
  for (int64_t l = 0; l < n_layers; ++l)
    for (int64_t c = 0; c < n_chunks; ++c)
      tables[l].push_back({store[(l * n_chunks + c) * 2].data(), store[(l * n_chunks + c) * 2 + 1].data()});
  std::vector<float> q(n_q * n_heads * hd), out(n_q * n_heads * hd);
  for (auto& e : q) e = d(rng);
  const double bytes = 2.0 * ctx * n_kv * hd * 2;  // K and V, F16, per layer

  std::printf("decode attention: ctx %lld, %lld/%lld heads, head_dim %lld, F16 KV, %s arithmetic, chunk %lld; "
              "%.1f MiB KV per layer\n",
              (long long)ctx, (long long)n_heads, (long long)n_kv, (long long)hd, f16_acc ? "F16-accumulator" : "F32",
              (long long)cs, bytes / (1 << 20));
  std::printf("%-8s %7s %12s %10s\n", "isa", "threads", "us/layer", "GB/s");
  for (int nt : {1, 2}) {
    ThreadPool pool({.n_threads = nt});
    // ThreadPool misses a job issued before a new worker first runs; let them start.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> scratch(attention_scratch_floats(nt, hd, cs));
    for (Isa isa : supported_isas()) {
      if (argc > 5 && isa_name(isa) != argv[5]) continue;
      AttentionArgs a;
      a.q = q.data();
      a.out = out.data();
      a.n_q = n_q;
      a.n_heads = n_heads;
      a.n_kv_heads = n_kv;
      a.head_dim = hd;
      a.pos0 = ctx - n_q;
      a.chunk_size = cs;
      a.kv_type = DType::kF16;
      a.f16_accumulator = f16_acc;
      a.scale = 0.088388f;
      a.scratch = scratch.data();
      std::vector<double> us;
      const int reps = isa == Isa::kScalar ? 3 : 15;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t l = 0; l < n_layers; ++l) {
          a.chunks = tables[l].data();
          attention(isa, a, pool);
        }
        const auto t1 = std::chrono::steady_clock::now();
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n_layers);
      }
      std::sort(us.begin(), us.end());
      const double med = us[us.size() / 2];
      std::printf("%-8s %7d %12.1f %10.2f\n", std::string(isa_name(isa)).c_str(), nt, med, bytes / med / 1e3);
      std::printf("{\"isa\":\"%s\",\"threads\":%d,\"ctx\":%lld,\"us_per_layer\":%.1f,\"kv_gbps\":%.3f}\n",
                  std::string(isa_name(isa)).c_str(), nt, (long long)ctx, med, bytes / med / 1e3);
    }
  }
}
