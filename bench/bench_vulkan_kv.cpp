// What moving a session's KV between a Vulkan device and the host costs
// (runtime/device_kv.h): publishing one chunk to the prefix cache (read
// back into host chunks), reusing one (uploaded from host chunks), and a
// fork's copy on the device, each beside its bound measured in the same
// run: a host memcpy of the same bytes (a read-back or upload copies them
// twice, device <-> staging <-> host chunk; where the device shares the
// host's memory both copies run at about memcpy speed). Rounds interleave
// the operations (A B C D, A B C D, ...); medians.
//
//   bench_vulkan_kv MODEL.gguf [chunk=256] [reps=9]
//
// The session's KV is filled with random F16 rows (no prefill: on lavapipe
// a chunk's prefill of a real model takes minutes). Built with
// -DEBB_BENCH=ON (and EBB_VULKAN): cmake --build build --target
// bench_vulkan_kv && build/bench_vulkan_kv model.gguf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memory/kv_cache.h"
#include "runtime/device_kv.h"
#include "runtime/engine.h"
#include "runtime/session.h"

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
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_vulkan_kv MODEL.gguf [chunk=256] [reps=9]\n");
    return 2;
  }
  const int64_t cs = argc > 2 ? std::atoll(argv[2]) : 256;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 9;
  std::string why;
  if (list_gpu_devices(&why).empty()) {
    std::fprintf(stderr, "bench_vulkan_kv: no Vulkan device: %s\n", why.c_str());
    return 1;
  }
  EngineOptions eo;
  eo.model_path = argv[1];
  eo.device = "vulkan";
  eo.n_threads = 1;
  Engine e(eo);
  DeviceForward& dev = *e.device();
  const ModelConfig& c = e.config();
  const int64_t nl = c.n_layer, kvd = c.kv_dim();
  SessionOptions so;
  so.kv_chunk_size = cs;
  so.n_ctx = 2 * cs;
  Session a(e, so), b(e, so);
  // a's device KV: one chunk of random F16 rows (finite values).
  {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> d(0x3000, 0x3bff);  // F16 in [0.125, 1)
    std::vector<uint16_t> k(static_cast<size_t>(nl * cs * kvd)), v(k.size());
    for (auto& x : k) x = static_cast<uint16_t>(d(rng));
    for (auto& x : v) x = static_cast<uint16_t>(d(rng));
    dev.write_kv(a.kv(), 0, cs, k.data(), v.data());
    a.kv().set_n_tokens(cs);
  }
  const uint64_t bytes = static_cast<uint64_t>(2 * nl * cs * kvd) * 2;  // K and V of every layer
  const DeviceInfo& info = dev.device();
  std::printf("# device %s: %s [%s, %s memory], %s\n", info.id.c_str(), info.name.c_str(),
              std::string(device_kind_name(info.kind)).c_str(), info.caps.unified_memory ? "unified" : "own",
              info.driver.c_str());
  std::printf("# model %s: %lld layers, kv_dim %lld; one chunk of %lld tokens = %.2f MB; median of %d rounds\n",
              argv[1], (long long)nl, (long long)kvd, (long long)cs, bytes / 1e6, reps);
  std::vector<uint8_t> src(bytes, 1), dst(bytes);
  std::vector<double> t_memcpy, t_read, t_write, t_fork;
  for (int r = 0; r < reps; ++r) {
    double t0 = now_s();
    std::memcpy(dst.data(), src.data(), bytes);
    t_memcpy.push_back(now_s() - t0);
    t0 = now_s();
    std::vector<std::vector<KvChunkHandle>> chunks = download_kv_chunks(dev, a.kv(), 0, 1, e.kv_pool());
    t_read.push_back(now_s() - t0);
    t0 = now_s();
    upload_kv_chunks(dev, b.kv(), 0, chunks);
    t_write.push_back(now_s() - t0);
    t0 = now_s();
    dev.copy_kv(a.kv(), b.kv(), cs);
    t_fork.push_back(now_s() - t0);
    if (src[0] != dst[0]) return 3;  // keeps the memcpy
  }
  const double mc = median(t_memcpy);
  std::printf("%-28s %9s %9s %12s %14s\n", "operation", "ms", "GB/s", "bound ms", "x bound");
  auto row = [&](const char* name, const std::vector<double>& t, double copies) {
    const double m = median(t), bound = copies * mc;
    std::printf("%-28s %9.3f %9.2f %12.3f %14.2f\n", name, m * 1e3, bytes / m / 1e9, bound * 1e3, m / bound);
    std::printf("{\"op\":\"%s\",\"device\":\"%s\",\"chunk\":%lld,\"bytes\":%llu,\"median_s\":%.6g,\"bound_s\":%.6g,"
                "\"x_bound\":%.4g}\n",
                name, info.id.c_str(), (long long)cs, (unsigned long long)bytes, m, bound, m / bound);
  };
  row("host memcpy (the baseline)", t_memcpy, 1);
  row("publish: read back a chunk", t_read, 2);
  row("reuse: upload a chunk", t_write, 2);
  row("fork: copy on the device", t_fork, 1);
  return 0;
}
