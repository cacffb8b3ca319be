// The training backward's product through a frozen weight, matmul_t
// (dx[T, n_in] += dy[T, n_out] · W), against the forward's matmul
// (y[T, n_out] = x[T, n_in] · Wᵀ) on the same weight and token count, per
// format, on the best target: the backward's share of a training step.
// Built with -DEBB_BENCH=ON (build/bench_matmul_t), or by hand, e.g.:
//   g++ -O2 -std=c++20 -Isrc bench/bench_matmul_t.cpp build/libebb.a -lpcre2-8 -luring -lzstd -llz4 -lpthread
//       -o /tmp/bench_matmul_t
// Usage: bench_matmul_t [rows=3072] [cols=1024] [T=256] [reps=20] [format]
// Prints a table and one JSON line per case, with the machine's F32 FMA peak
// (a register-only loop, the bound of an F32 product) beside each figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
// GCC 12's avx512fintrin.h seeds _mm512_reduce_add_ps with
// _mm512_undefined_ps() and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include "bench_weights.h"
#include "kernels/matmul.h"
#include "kernels/packing.h"
#include "kernels/quantize.h"
#include "kernels/train_ops.h"
#include "platform/thread_pool.h"

using namespace ebb;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#if defined(__x86_64__)
// 12 independent chains of 512-bit FMAs in registers, `iters` steps each.
__attribute__((target("avx512f,fma"))) float fma_chains(int64_t iters) {
  __m512 acc[12];
  for (auto& v : acc) v = _mm512_set1_ps(1.0f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    #pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);  // unrolled: in registers
  }
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}
#endif

// F32 multiply-adds per second on all threads (the AVX-512 bound of an F32
// product on x86-64 with AVX-512; 0 elsewhere: not measured).
double fma_peak_gflops(ThreadPool& pool) {
  double best = 0;
#if defined(__x86_64__)
  if (!isa_supported(Isa::kAvx512)) return 0;
  constexpr int64_t kIters = 20'000'000;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    pool.parallel_for(pool.size(), 1, [&](int64_t, int64_t, int) {
      volatile float sink = fma_chains(kIters);
      (void)sink;
    });
    const double dt = now_s() - t0;
    best = std::max(best, 2.0 * 16 * 12 * kIters * pool.size() / dt / 1e9);
  }
#endif
  return best;
}

template <class F>
double median_s(int reps, F&& f) {
  std::vector<double> times;
  for (int rep = 0; rep < reps + 2; ++rep) {
    const double t0 = now_s();
    f();
    if (rep >= 2) times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 3072;  // n_out
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 1024;  // n_in
  const int64_t T = argc > 3 ? std::atoll(argv[3]) : 256;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  const char* only = argc > 5 ? argv[5] : nullptr;
  const DType formats[] = {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K};

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wsrc(static_cast<size_t>(cols) * 64);
  for (auto& v : wsrc) v = nd(rng);
  std::vector<float> x(static_cast<size_t>(cols) * T), y(static_cast<size_t>(rows) * T + 64);
  std::vector<float> dy(static_cast<size_t>(rows) * T), dx(static_cast<size_t>(cols) * T);
  for (auto& v : x) v = nd(rng);
  for (auto& v : dy) v = nd(rng);

  const int threads = static_cast<int>(std::max(1u, std::min(2u, std::thread::hardware_concurrency())));
  ThreadPool pool(ThreadPoolOptions{threads});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double peak = fma_peak_gflops(pool);
  const Isa isa = best_isa();
  const KernelSet& ks = kernel_set(isa);
  std::printf("W %lldx%lld, T=%lld, %s, %d threads, median of %d; F32 FMA peak %.1f GFLOP/s\n", (long long)rows,
              (long long)cols, (long long)T, std::string(isa_name(isa)).c_str(), threads, reps, peak);
  std::printf("%-6s %12s %12s %12s %12s %8s\n", "format", "fwd ms", "fwd GFLOP/s", "bwd ms", "bwd GFLOP/s",
              "bwd/fwd");
  const double flops = 2.0 * rows * cols * T;
  for (DType t : formats) {
    if (only && dtype_name(t) != only) continue;
    const uint64_t rb = row_bytes(t, cols);
    std::vector<uint8_t> w = bench::tiled_weights(t, rows, cols, wsrc);
    WeightView wv{t, cols, rows, w.data(), rb};
    // As the engine holds it: packed in groups of eight rows where the
    // target has kernels for that.
    const Packing pk = packing_for(t, rows, cols);
    if (pk != Packing::kRows && ks.format(t)->x8_gemm) {
      wv.packing = pk;
      pack_rows(pk, t, w.data(), rows, cols);
    }
    const size_t sb = matmul_scratch_bytes(t, cols, T);
    void* scratch = std::aligned_alloc(64, std::max<size_t>(64, (sb + 63) / 64 * 64));
    std::vector<float> mt_scratch(matmul_t_scratch_floats(wv, T, pool.size()));
    MatmulArgs args{&wv, x.data(), cols, T, y.data(), rows, scratch};
    const double fwd = median_s(reps, [&] { matmul(ks, args, pool); });
    const double bwd = median_s(reps, [&] { matmul_t(ks, wv, dy.data(), T, dx.data(), mt_scratch.data(), pool); });
    std::free(scratch);
    const std::string label = std::string(dtype_name(t)) + (wv.packing != Packing::kRows ? "x8" : "");
    std::printf("%-6s %12.2f %12.1f %12.2f %12.1f %8.2f\n", label.c_str(), fwd * 1e3, flops / fwd / 1e9, bwd * 1e3,
                flops / bwd / 1e9, bwd / fwd);
    std::printf("{\"format\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"rows\":%lld,\"cols\":%lld,\"T\":%lld,"
                "\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"fwd_gflop_s\":%.2f,\"bwd_gflop_s\":%.2f,\"fma_peak_gflop_s\":%.2f}\n",
                label.c_str(), std::string(isa_name(isa)).c_str(), threads, (long long)rows, (long long)cols,
                (long long)T, fwd * 1e3, bwd * 1e3, flops / fwd / 1e9, flops / bwd / 1e9, peak);
  }
  return 0;
}
