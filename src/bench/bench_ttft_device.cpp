#include "bench/bench_ttft_device.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <memory>
#include <cstdio>
#include <random>

#include "bench/bench_budget.h"
#include "bench/bench_ttft.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb {
namespace {

void say(const BenchTtftDeviceOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// One context: the engine, its session, and the samples of every level.
class DeviceRun {
 public:
  DeviceRun(const BenchTtftDeviceOptions& o, int64_t n_ctx) : o_(o), n_ctx_(n_ctx) {
    EngineOptions eo;
    eo.model_path = o.model;
    eo.device = o.device;
    eo.n_threads = o.n_threads;
    eo.prefill_batch = o.prefill_batch;
    eo.kv_chunk_size = o.kv_chunk_size;
    e_ = std::make_unique<Engine>(eo);
    if (!e_->device()) throw Error("bench ttft --device " + o.device + ": the engine did not open a device");
    fd_ = ::open(o.model.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("bench ttft: cannot open " + o.model);
    SessionOptions so;
    so.n_ctx = n_ctx + o.query_tokens;
    so.kv_chunk_size = o.kv_chunk_size;
    s_ = std::make_unique<Session>(*e_, so);
    TtftPrompt prompt = ttft_prompt(o.seed, n_ctx, o.query_tokens, e_->config().n_vocab);
    const std::vector<TokenId> context = std::move(prompt.context);
    query_ = std::move(prompt.query);
    say(o, "bench ttft: " + e_->device_id() + ": prefilling " + std::to_string(n_ctx) + " tokens");
    s_->feed(context);
    weights_ = e_->footprint().device->weights();
  }
  ~DeviceRun() {
    s_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  DeviceRun(const DeviceRun&) = delete;
  DeviceRun& operator=(const DeviceRun&) = delete;

  Engine& engine() { return *e_; }

  struct Sample {
    double ttft = 0;
    uint64_t bytes = 0;
    int64_t layers = 0;
  };
  // Evicts (100 - pct)% of the device's weights, then times (restore() and)
  // feed(query); truncates back to the context.
  Sample sample(int pct, bool sync) {
    Sample smp;
    const uint64_t want = static_cast<uint64_t>((1.0 - pct / 100.0) * static_cast<double>(weights_));
    if (want > 0) {
      e_->evict(want);
      const std::vector<uint64_t> per_layer = e_->footprint().device->weights_per_layer;
      for (size_t l = 0; l < per_layer.size(); ++l)
        if (per_layer[l] == 0) {
          smp.bytes += e_->model().layer_unit(static_cast<int>(l)).bytes();
          ++smp.layers;
        }
      // The read goes to storage, as the CPU path's direct reads do.
      if (o_.drop_page_cache) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    }
    const double t0 = now_seconds();
    if (sync) e_->restore();
    s_->feed(query_);
    smp.ttft = now_seconds() - t0;
    s_->truncate(n_ctx_);
    if (e_->device()->n_dropped() != 0) throw Error("bench ttft: layers still dropped after the step");
    return smp;
  }

 private:
  const BenchTtftDeviceOptions& o_;
  int64_t n_ctx_;
  std::unique_ptr<Engine> e_;
  std::unique_ptr<Session> s_;
  std::vector<TokenId> query_;
  uint64_t weights_ = 0;
  int fd_ = -1;
};

}  // namespace

BenchTtftDeviceResult bench_ttft_device(const BenchTtftDeviceOptions& o) {
  if (o.reps < 1) throw Error("bench ttft: --reps must be >= 1");
  if (o.query_tokens < 1) throw Error("bench ttft: --query must be >= 1");
  for (int r : o.remaining_pct)
    if (r < 0 || r > 100) throw Error("bench ttft: --remaining " + std::to_string(r) + " is outside [0, 100]");
  std::vector<int> levels;  // without 100: the resident row is always measured
  for (int r : o.remaining_pct)
    if (r < 100 && std::find(levels.begin(), levels.end(), r) == levels.end()) levels.push_back(r);
  const std::function<double()> probe =
      o.storage_probe ? o.storage_probe : [&] { return measure_storage_gbps(o.model, uint64_t{256} << 20); };
  BenchTtftDeviceResult res;
  for (int64_t n_ctx : o.contexts) {
    if (n_ctx < 1) throw Error("bench ttft: --context " + std::to_string(n_ctx) + " must be >= 1");
    DeviceRun run(o, n_ctx);
    const DeviceInfo& dev = run.engine().device()->device();
    res.device_id = dev.id;
    res.device_name = dev.name;
    res.unified_memory = dev.caps.unified_memory;
    std::vector<double> gbps, resident;
    // [level][mode]: samples; mode 0 overlap, 1 sync_restore
    std::vector<std::array<std::vector<DeviceRun::Sample>, 2>> samples(levels.size());
    for (int rep = 0; rep < o.reps; ++rep) {
      gbps.push_back(o.storage_gbps >= 0 ? o.storage_gbps : probe());
      char line[160];
      std::snprintf(line, sizeof line, "bench ttft: ctx %lld: round %d/%d, storage %.2f GB/s",
                    static_cast<long long>(n_ctx), rep + 1, o.reps, gbps.back());
      say(o, line);
      run.sample(100, false);  // discarded: the first step after the probe's reads is slower here
      resident.push_back(run.sample(100, false).ttft);
      // A B per level, the order flipped every round.
      for (size_t li = 0; li < levels.size(); ++li)
        for (int k = 0; k < 2; ++k) {
          const int mode = (k + rep) % 2;
          samples[li][static_cast<size_t>(mode)].push_back(run.sample(levels[li], mode == 1));
        }
    }
    const double g = median(gbps), prefill = median(resident);
    BenchTtftDeviceRow base;
    base.context = n_ctx;
    base.prefill_s = prefill;
    base.storage_gbps = g;
    BenchTtftDeviceRow r = base;
    r.mode = "resident";
    r.remaining_pct = 100;
    r.ttft_s = prefill;
    r.bound_s = prefill;
    r.ratio_to_bound = prefill > 0 ? 1.0 : 0.0;
    res.rows.push_back(r);
    for (size_t li = 0; li < levels.size(); ++li) {
      double ttft[2];
      for (int mode = 0; mode < 2; ++mode) {
        std::vector<double> t;
        for (const DeviceRun::Sample& s : samples[li][static_cast<size_t>(mode)]) t.push_back(s.ttft);
        ttft[mode] = median(t);
      }
      for (int mode = 0; mode < 2; ++mode) {
        const DeviceRun::Sample& s0 = samples[li][static_cast<size_t>(mode)].front();
        BenchTtftDeviceRow row = base;
        row.mode = mode == 0 ? "overlap" : "sync_restore";
        row.remaining_pct = levels[li];
        row.ttft_s = ttft[mode];
        row.bytes_read = s0.bytes;
        row.layers_dropped = s0.layers;
        row.read_s = g > 0 ? static_cast<double>(s0.bytes) / (g * 1e9) : 0.0;
        row.bound_s = std::max(row.read_s, prefill);
        row.ratio_to_bound = row.bound_s > 0 ? row.ttft_s / row.bound_s : 0.0;
        row.gain_vs_sync = row.ttft_s > 0 ? ttft[1] / row.ttft_s : 0.0;
        res.rows.push_back(row);
      }
    }
  }
  return res;
}

nlohmann::json ttft_device_rows_json(const std::vector<BenchTtftDeviceRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const BenchTtftDeviceRow& r : rows)
    a.push_back({{"mode", r.mode},
                 {"context", r.context},
                 {"remaining_pct", r.remaining_pct},
                 {"ttft_s", r.ttft_s},
                 {"prefill_s", r.prefill_s},
                 {"read_s", r.read_s},
                 {"bound_s", r.bound_s},
                 {"ratio_to_bound", r.ratio_to_bound},
                 {"gain_vs_sync", r.gain_vs_sync},
                 {"bytes_read", r.bytes_read},
                 {"layers_dropped", r.layers_dropped},
                 {"storage_gbps", r.storage_gbps}});
  return a;
}

}  // namespace ebb
