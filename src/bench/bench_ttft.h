// `ebb bench ttft`: time to first token of a short query after part of the
// LLM's memory was evicted (mzCache Figures 9, 11 and 12). For each system and
// context the session is prefilled once (every system's engine is kept side by
// side); then, in rounds, (1 - r/100) of the evictable bytes (every layer
// weight unit + the session's KV) is evicted for each system and
// remaining-memory level r in turn and feed(query) is timed, restoration
// included. A round visits every system and level once, so they all (100%
// among them, the bound's prefill term) share whatever the machine's speed
// was then; the storage bandwidth is measured before each round for the same
// reason.
//
// Systems:
//   ebb              elastic memory, hybrid-swap policy, restore overlapped
//   partial_offload  layer-granular raw weights + KV to storage, restored
//                    sequentially before compute (EvictPolicyKind::kPartialOffload)
//   os_paging        weights served from an mmap of the GGUF; the weight share is
//                    paged out (MADV_DONTNEED + fadvise DONTNEED, front layers
//                    first, like LRU after a forward pass) and faults back in.
//                    The machine has no swap device, so the KV share is handled
//                    as a mobile OS does under pressure: it is lost and
//                    recomputed (KV truncated to the kept point, re-fed).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memory/elastic.h"
#include "memory/hybrid_policy.h"

namespace ebb {

enum class TtftSystem : uint8_t { kEbb, kPartialOffload, kOsPaging };
TtftSystem parse_ttft_system(std::string_view s);  // "ebb"|"partial_offload"|"os_paging"; Error otherwise
std::string_view ttft_system_name(TtftSystem s);

struct BenchTtftOptions {
  std::string model;
  std::vector<int64_t> contexts = {2048};
  std::vector<int> remaining_pct = {0, 25, 50, 75, 100};
  int64_t query_tokens = 8;
  int reps = 5;
  int n_threads = 2;
  int64_t kv_chunk_size = 256;
  int64_t prefill_batch = 64;
  std::vector<TtftSystem> systems = {TtftSystem::kEbb, TtftSystem::kPartialOffload, TtftSystem::kOsPaging};
  // Ablations of the ebb system: one row set per value.
  std::vector<EvictOrder> orders = {EvictOrder::kBackward};
  std::vector<OverlapMode> overlaps = {OverlapMode::kFull};
  std::vector<bool> parallel_paths = {true};
  std::string swap_dir;      // "": the elastic default
  // The device profile of the ebb and partial_offload engines: their read
  // request size and queue depth, and ebb's hybrid-swap unit times (chunks
  // per dropped layer, the KVonly split). The CLI passes the one `ebb
  // profile` saved, or --profile FILE.
  DeviceProfile profile = DeviceProfile::defaults();
  // The bound's storage bandwidth. < 0: measured before every round of reps
  // (the disks of shared machines drift by a quarter from minute to minute),
  // by storage_probe or else by direct reads of the model file; 0: the
  // storage term is left out of the bound; > 0: this figure.
  double storage_gbps = -1;
  std::function<double()> storage_probe;
  uint64_t seed = 1;
  std::function<void(const std::string&)> log;  // progress lines (stderr in the CLI)
};

struct BenchTtftRow {
  std::string system;
  int64_t context = 0;
  int remaining_pct = 0;
  double ttft_s = 0;        // median over rounds: feed(query) until its logits
  double bound_s = 0;       // max(bytes_read / storage_gbps, decompress_s, TTFT at 100%)
  double storage_gbps = 0;  // median of the figures measured before the rounds of this row's context
  double ratio_vs_partial_offload = 0;  // partial_offload ttft / this ttft (0: no partial_offload row)
  // partial_offload ttft / this row's bound: the most x_po any restore
  // reading these bytes could reach on this machine (0: no partial_offload row).
  double max_ratio_vs_partial_offload = 0;
  double ratio_to_bound = 0;  // ttft_s / bound_s: 1 is as fast as the machine allows
  double alloc_s = 0, reload_s = 0, decompress_s = 0;  // restore paths' busy time (medians)
  double prefill_s = 0;     // ttft_s - stall_s: time the forward pass computed
  double stall_s = 0;       // time the forward pass waited on restore latches
  // CPU seconds the kernel spent for this process during the query (median):
  // mostly zeroing freshly allocated pages. On a virtual machine whose host
  // took back memory the guest freed, this jumps from ~0.2 s per GB to ~1.5 s.
  double kernel_s = 0;
  uint64_t bytes_read = 0;  // from storage (os_paging: /proc/self/io read_bytes)
  uint64_t evicted_bytes = 0;  // requested eviction
  double evict_s = 0;          // median time evict() took to give those bytes back (0: os_paging)
  std::string order, overlap, paths;  // "-" where not applicable
};

struct BenchTtftResult {
  std::vector<BenchTtftRow> rows;
  double storage_gbps_min = 0, storage_gbps_max = 0;  // range of every round's figure
  // The ebb engine's hybrid-swap unit times, which the profile gives for
  // this model (zero without an ebb system).
  UnitTimes ebb_unit_times;
};

// The context [n_ctx] and query [query_tokens] a run prefills and then asks,
// random tokens in [1, n_vocab) seeded by (seed, n_ctx): the same for every
// system and device.
struct TtftPrompt {
  std::vector<TokenId> context, query;
};
TtftPrompt ttft_prompt(uint64_t seed, int64_t n_ctx, int64_t query_tokens, int32_t n_vocab);

BenchTtftResult bench_ttft(const BenchTtftOptions& o);

nlohmann::json ttft_rows_json(const std::vector<BenchTtftRow>& rows);
// TTFT against remaining memory %, one panel per context, one line per
// system (and ablation), as an SVG document.
std::string ttft_plot_svg(const std::vector<BenchTtftRow>& rows);

}  // namespace ebb
