// Decode / prefill throughput of matmul() per format and target.
// Built with -DEBB_BENCH=ON (cmake -S . -B build -DEBB_BENCH=ON; build/bench_NAME); or by hand, e.g.:
//   cmake --build build-mm --target ebb
//   g++ -O2 -std=c++20 -Isrc bench/bench_matmul.cpp build-mm/libebb.a -lpcre2-8 -lpthread -o build-mm/bench_matmul
// Usage: bench_matmul [rows=4096] [cols=4096] [n_tokens=1] [reps=20]
// Prints a human table and one JSON line per case. GB/s counts weight bytes
// (the decode bound: every weight byte is read once per call).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_weights.h"
#include "kernels/matmul.h"
#include "kernels/packing.h"
#include "kernels/quantize.h"
#include "platform/thread_pool.h"

using namespace ebb;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Streaming read bandwidth of the machine (an integer sum the compiler
// vectorizes), the physical bound for decode.
double read_bandwidth(ThreadPool& pool, const std::vector<uint64_t>& big) {
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    alignas(64) uint64_t sums[16][8] = {};
    const double t0 = now_s();
    pool.parallel_for(static_cast<int64_t>(big.size()), 4096, [&](int64_t b, int64_t e, int t) {
      uint64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += big[i];
      sums[t][0] = s;
    });
    best = std::min(best, now_s() - t0);
    volatile uint64_t sink = sums[0][0];
    (void)sink;
  }
  return big.size() * sizeof(uint64_t) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t n_tok = argc > 3 ? std::atoll(argv[3]) : 1;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  const char* only = argc > 5 ? argv[5] : nullptr;  // one format name, e.g. Q4_K
  const DType formats[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                           DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wsrc(static_cast<size_t>(cols) * 64);  // 64 distinct rows, tiled
  for (auto& v : wsrc) v = nd(rng);
  std::vector<float> x(static_cast<size_t>(cols) * n_tok), y(static_cast<size_t>(rows) * n_tok + 64);
  for (auto& v : x) v = nd(rng);

  const int max_threads = std::max(1u, std::thread::hardware_concurrency());
  std::printf("matmul %lldx%lld, n_tokens=%lld, median of %d\n", (long long)rows, (long long)cols, (long long)n_tok, reps);
  std::printf("%-6s %-7s %3s %9s %9s %9s %9s\n", "format", "isa", "thr", "MB", "us", "GB/s", "GFLOP/s");
  for (int threads : {1, 2}) {
    if (threads > max_threads) break;
    ThreadPool pool(ThreadPoolOptions{threads});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let workers start (see test_matmul.cpp)
    {
      std::vector<uint64_t> big(32 << 20, 1);  // 256 MiB
      std::printf("# read bandwidth, %d thread(s): %.1f GB/s\n", threads, read_bandwidth(pool, big));
    }
    for (DType t : formats) {
      if (only && dtype_name(t) != only) continue;
      const uint64_t rb = row_bytes(t, cols);
      std::vector<uint8_t> w = bench::tiled_weights(t, rows, cols, wsrc);
      WeightView wv{t, cols, rows, w.data(), rb};
      const size_t sb = matmul_scratch_bytes(t, cols, n_tok);
      void* scratch = std::aligned_alloc(64, std::max<size_t>(64, (sb + 63) / 64 * 64));
      // A buffer larger than the L3 cache, swept between reps, so weights
      // come from memory as they would in decode.
      static std::vector<uint8_t> flush(64 << 20);
      // Q4_0 also packed in groups of eight rows (Packing::kQ4_0x8), as an
      // engine on a target with packed kernels holds it.
      std::vector<uint8_t> wp;
      WeightView wpv = wv;
      if (packing_for(t, rows, cols) != Packing::kRows) {
        wp = w;
        wpv.data = wp.data();
        wpv.packing = packing_for(t, rows, cols);
        pack_rows(wpv.packing, t, wp.data(), rows, cols);
      }
      for (Isa isa : supported_isas()) {
        const KernelSet& ks = kernel_set(isa);
        for (const WeightView* view : {&wv, &wpv}) {
          if (view == &wpv && (wpv.packing == Packing::kRows || !ks.format(t)->x8_gemm)) continue;
          const std::string label = std::string(dtype_name(t)) + (view == &wpv ? "x8" : "");
          MatmulArgs args{view, x.data(), cols, n_tok, y.data(), rows, scratch};
          std::vector<double> times;
          for (int rep = 0; rep < reps + 2; ++rep) {
            for (size_t i = 0; i < flush.size(); i += 64) flush[i]++;
            const double t0 = now_s();
            matmul(ks, args, pool);
            if (rep >= 2) times.push_back(now_s() - t0);
          }
          std::sort(times.begin(), times.end());
          const double med = times[times.size() / 2];
          const double mb = static_cast<double>(rb * rows) / 1e6;
          const double gbs = mb / 1e3 / med;
          const double gflops = 2.0 * rows * cols * n_tok / med / 1e9;
          std::printf("%-6s %-7s %3d %9.1f %9.0f %9.2f %9.2f\n", label.c_str(), std::string(isa_name(isa)).c_str(),
                      threads, mb, med * 1e6, gbs, gflops);
          std::printf("{\"format\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"rows\":%lld,\"cols\":%lld,"
                      "\"n_tokens\":%lld,\"weight_mb\":%.2f,\"median_us\":%.1f,\"gb_s\":%.3f,\"gflop_s\":%.3f}\n",
                      label.c_str(), std::string(isa_name(isa)).c_str(), threads, (long long)rows, (long long)cols,
                      (long long)n_tok, mb, med * 1e6, gbs, gflops);
        }
      }
      std::free(scratch);
    }
  }
  return 0;
}
