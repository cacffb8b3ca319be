#include "platform/membw.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "platform/error.h"
#include "platform/timer.h"

namespace ebb {
namespace {

constexpr size_t kLine = 64;                       // bytes; slices start on a cache line
constexpr size_t kWordsPerLine = kLine / sizeof(uint64_t);

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Words [begin, end) of thread t of nt, split on cache-line boundaries.
void slice(size_t n_words, int t, int nt, size_t* begin, size_t* end) {
  const size_t lines = n_words / kWordsPerLine;
  *begin = lines * t / nt * kWordsPerLine;
  *end = lines * (t + 1) / nt * kWordsPerLine;
}

// Sums a slice. Eight independent lanes keep the loop free of a single
// dependency chain; GCC turns it into packed 64-bit adds (SSE2 paddq on
// the portable x86-64 baseline). n is a multiple of 8.
uint64_t sum_words(const uint64_t* __restrict p, size_t n) {
  uint64_t acc[kWordsPerLine] = {};
  for (size_t i = 0; i < n; i += kWordsPerLine) {
    for (size_t j = 0; j < kWordsPerLine; ++j) acc[j] += p[i + j];
  }
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  if (bytes < 4096) throw Error("memory-bandwidth probe: buffer of " + std::to_string(bytes) + " bytes is too small (need >= 4096)");
  if (reps < 1) throw Error("memory-bandwidth probe: reps must be >= 1, got " + std::to_string(reps));
  const int nt = pool.size();
  // Whole cache lines per thread; round down to a multiple of 4 KiB pages.
  bytes &= ~size_t{4095};
  const size_t n_words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[], FreeDeleter> buf(static_cast<uint64_t*>(std::aligned_alloc(4096, bytes)));
  if (!buf) throw Error("memory-bandwidth probe: cannot allocate " + std::to_string(bytes) + " bytes");
  uint64_t* data = buf.get();

  // First touch by the reading thread (page faults stay out of the timing,
  // and on NUMA machines the pages land near their reader).
  pool.run([&](int t, int n) {
    size_t b, e;
    slice(n_words, t, n, &b, &e);
    for (size_t i = b; i < e; ++i) data[i] = i;
  });

  std::vector<uint64_t> partial(static_cast<size_t>(nt) * kWordsPerLine);  // one cache line per thread
  size_t read_bytes = 0;
  for (int t = 0; t < nt; ++t) {
    size_t b, e;
    slice(n_words, t, nt, &b, &e);
    read_bytes += (e - b) * sizeof(uint64_t);
  }
  // The expected sum of 0..n-1 over the words read: checking it proves every
  // word was read (and keeps the loop from being optimised away).
  // sum(b..e-1) = n * (b + e - 1) / 2 with n = e - b; one factor is even,
  // so halve that one first and the result is exact modulo 2^64.
  uint64_t expected = 0;
  for (int t = 0; t < nt; ++t) {
    size_t b, e;
    slice(n_words, t, nt, &b, &e);
    if (e == b) continue;
    const uint64_t n = e - b, s = b + e - 1;
    expected += n % 2 == 0 ? (n / 2) * s : n * (s / 2);
  }

  ReadBandwidth r;
  r.bytes = read_bytes;
  r.threads = nt;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    const double t0 = now_seconds();
    pool.run([&](int t, int n) {
      size_t b, e;
      slice(n_words, t, n, &b, &e);
      partial[static_cast<size_t>(t) * kWordsPerLine] = sum_words(data + b, e - b);
    });
    const double dt = now_seconds() - t0;
    uint64_t total = 0;
    for (int t = 0; t < nt; ++t) total += partial[static_cast<size_t>(t) * kWordsPerLine];
    EBB_CHECK_MSG(total == expected, "memory-bandwidth probe read back a wrong sum");
    if (rep >= 0) r.reps_gbps.push_back(dt > 0 ? read_bytes / dt / 1e9 : 0.0);
  }
  r.median_gbps = median_of(r.reps_gbps);
  return r;
}

double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes, int reps) {
  return measure_read_bandwidth(pool, bytes, reps).median_gbps;
}

uint64_t last_level_cache_bytes() {
  uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    if (!f) continue;
    std::string s;
    f >> s;
    if (s.empty()) continue;
    char* end = nullptr;
    uint64_t v = std::strtoull(s.c_str(), &end, 10);
    if (end && (*end == 'K' || *end == 'k')) v <<= 10;
    else if (end && (*end == 'M' || *end == 'm')) v <<= 20;
    else if (end && (*end == 'G' || *end == 'g')) v <<= 30;
    best = std::max(best, v);
  }
  return best;
}

}  // namespace ebb
