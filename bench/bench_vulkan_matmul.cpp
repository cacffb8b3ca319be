// Matrix-product throughput of the Vulkan backend (backend/vulkan) per
// weight format, beside ebb's CPU matmul() on the same shape in the same run
// (the baseline: the best CPU target, 2 threads). On lavapipe, a CPU Vulkan
// driver, the figures say nothing about GPU speed; they show the backend
// runs and what one submission costs. The device's name is printed first.
//
//   bench_vulkan_matmul [rows=2048] [cols=2048] [n_tokens=1] [reps=9]
//
// Built with -DEBB_BENCH=ON (and EBB_VULKAN): cmake --build build --target
// bench_vulkan_matmul && build/bench_vulkan_matmul
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "platform/thread_pool.h"

using namespace ebb;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t n_tok = argc > 3 ? std::atoll(argv[3]) : 1;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 9;
  std::string why;
  const std::vector<DeviceInfo> devs = list_gpu_devices(&why);
  if (devs.empty()) {
    std::fprintf(stderr, "bench_vulkan_matmul: no Vulkan device: %s\n", why.c_str());
    return 1;
  }
  auto be = open_backend("vulkan:0");
  const DeviceInfo& info = be->info();
  std::printf("# device %s: %s [%s], %s\n", info.id.c_str(), info.name.c_str(),
              std::string(device_kind_name(info.kind)).c_str(), info.driver.c_str());
  std::printf("# matmul %lldx%lld, n_tokens %lld, median of %d; one submission per product (record, submit, fence)\n",
              (long long)rows, (long long)cols, (long long)n_tok, reps);
  std::printf("%-6s %-8s %9s %10s %9s %9s %8s\n", "format", "backend", "MB", "us", "GB/s", "GFLOP/s", "vs cpu");

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wf(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(n_tok * cols));
  for (auto& v : wf) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(n_tok * rows));
  ThreadPool pool(ThreadPoolOptions{2});
  // Swept before every rep, so the weights come from memory (as in decode),
  // not from the last-level cache.
  std::vector<uint8_t> flush(64 << 20);
  auto sweep = [&] {
    for (size_t i = 0; i < flush.size(); i += 64) flush[i]++;
  };
  const KernelSet& ks = kernel_set(best_isa());

  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const uint64_t rb = row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, wf.data() + r * cols, w.data() + r * rb, cols);
    const double mb = static_cast<double>(w.size()) / 1e6;

    // CPU baseline: ebb's matmul() on the row layout.
    WeightView wv{t, cols, rows, w.data(), rb};
    std::vector<uint8_t> scratch(matmul_scratch_bytes(t, cols, n_tok) + 64);
    void* sp = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
    MatmulArgs args{&wv, x.data(), cols, n_tok, y.data(), rows, sp};
    std::vector<double> cpu;
    for (int rep = 0; rep < reps + 1; ++rep) {
      sweep();
      const double t0 = now_s();
      matmul(ks, args, pool);
      if (rep) cpu.push_back(now_s() - t0);
    }
    const double cpu_s = median(cpu);

    auto wb = be->alloc(w.size(), MemoryPlace::kDevice);
    wb->write(0, w.data(), w.size());
    auto xb = be->alloc(x.size() * 4, MemoryPlace::kDevice);
    xb->write(0, x.data(), x.size() * 4);
    auto yb = be->alloc(y.size() * 4, MemoryPlace::kDevice);
    auto s = be->new_stream();
    MatmulOp op;
    op.w_type = t;
    op.rows = rows;
    op.cols = cols;
    op.w = {wb.get(), 0};
    op.x = {xb.get(), 0};
    op.n_tokens = n_tok;
    op.y = {yb.get(), 0};
    std::vector<double> gpu;
    for (int rep = 0; rep < reps + 1; ++rep) {  // the first builds the pipeline
      sweep();
      const double t0 = now_s();
      s->matmul(op);
      s->submit();
      s->wait();
      if (rep) gpu.push_back(now_s() - t0);
    }
    const double gpu_s = median(gpu);
    for (auto [label, sec] : {std::pair<const char*, double>{"cpu", cpu_s}, {"vulkan", gpu_s}}) {
      const double gbs = mb / 1e3 / sec, gflops = 2.0 * rows * cols * n_tok / sec / 1e9;
      std::printf("%-6s %-8s %9.1f %10.0f %9.2f %9.2f %8.2f\n", std::string(dtype_name(t)).c_str(), label, mb, sec * 1e6,
                  gbs, gflops, cpu_s / sec);
      std::printf("{\"format\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"n_tokens\":%lld,"
                  "\"weight_mb\":%.2f,\"median_us\":%.1f,\"gb_s\":%.3f,\"gflop_s\":%.3f,\"speed_vs_cpu\":%.3f}\n",
                  std::string(dtype_name(t)).c_str(), label, label[0] == 'c' ? "cpu" : info.name.c_str(),
                  (long long)rows, (long long)cols, (long long)n_tok, mb, sec * 1e6, gbs, gflops, cpu_s / sec);
    }
  }
  return 0;
}
