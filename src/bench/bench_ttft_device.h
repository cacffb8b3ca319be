// `ebb bench ttft --device vulkan`: time to first token of a short query on a
// compute device after part of the device's weights was evicted (mzCache
// §4–5: the GPU prefills the layers it holds while the CPU restores the
// others). One engine on the device, one session prefilled with the context;
// then, in rounds, for each remaining-weights level r: (100 - r)% of the
// device's layer weights are evicted (the last layers first), the model
// file's page cache dropped (the restore reads from storage), and
// feed(query) timed two ways, alternating:
//   overlap        the step restores the dropped layers while it runs the
//                  ones before them (runtime/device_restore.h)
//   sync_restore   Engine::restore() first, then the step (the baseline)
// The level 100 row ("resident") is the step with everything on the device:
// the bound's prefill term, measured in the same rounds. Bound:
// max(bytes read / storage GB/s, resident TTFT), storage measured before
// each round by direct reads of the model file (as `bench ttft` does).
// The KV stays on the device (weights only are evicted there).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ebb {

struct BenchTtftDeviceOptions {
  std::string model;
  std::string device = "vulkan";
  std::vector<int64_t> contexts = {4096};
  std::vector<int> remaining_pct = {0, 25, 50, 75, 100};
  int64_t query_tokens = 8;
  int reps = 5;
  int n_threads = 2;  // the host's (embedding lookup, format conversion)
  int64_t kv_chunk_size = 256;
  int64_t prefill_batch = 64;
  // < 0: measured before every round (storage_probe, else direct reads of
  // the model file); 0: left out of the bound; > 0: this figure.
  double storage_gbps = -1;
  std::function<double()> storage_probe;
  bool drop_page_cache = true;  // fadvise(DONTNEED) the model file after each eviction
  uint64_t seed = 1;
  std::function<void(const std::string&)> log;
};

struct BenchTtftDeviceRow {
  std::string mode;  // "resident", "overlap", "sync_restore"
  int64_t context = 0;
  int remaining_pct = 0;
  double ttft_s = 0;        // median over rounds: restore (sync_restore) + feed(query) until its logits
  double prefill_s = 0;     // the resident TTFT of this context (median): the device's prefill
  double read_s = 0;        // bytes_read / storage_gbps
  double bound_s = 0;       // max(read_s, prefill_s)
  double ratio_to_bound = 0;  // ttft_s / bound_s
  double gain_vs_sync = 0;  // sync_restore ttft / this ttft at the same level (overlap rows)
  uint64_t bytes_read = 0;  // file bytes of the dropped layers
  int64_t layers_dropped = 0;
  double storage_gbps = 0;  // median of the rounds' figures
};

struct BenchTtftDeviceResult {
  std::string device_id, device_name;
  bool unified_memory = false;
  std::vector<BenchTtftDeviceRow> rows;
};

BenchTtftDeviceResult bench_ttft_device(const BenchTtftDeviceOptions& o);
nlohmann::json ttft_device_rows_json(const std::vector<BenchTtftDeviceRow>& rows);

}  // namespace ebb
