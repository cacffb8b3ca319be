// The device profile (mzCache §4.3 "Offline profiling"): throughputs
// measured once per device, from which the hybrid-swap policy's per-unit
// times are derived for any model without re-profiling.
//
// Measured: direct reads of the swap directory's storage for a grid of
// request sizes and queue depths (DESIGN.md: full bandwidth needs requests of
// several MiB and several in flight; measure, do not assume), direct writes
// at the chosen point, compression and decompression throughput of each KV
// codec on one core, and the throughput of allocating and first-touching
// fresh memory through ebb::Allocator.
//
// Throughputs are in GB/s = 1e9 bytes per second of raw (uncompressed) data.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu.h"
#include "memory/hybrid_policy.h"

namespace ebb {

struct ReadPoint {
  uint64_t request_bytes = 0;
  int queue_depth = 0;
  double gbps = 0;
  bool confirmed = false;  // measured twice; gbps is the lower figure
};

struct CodecPoint {
  std::string codec;           // "int8", "int4"
  double compress_gbps = 0;    // raw bytes in per second, one thread
  double decompress_gbps = 0;  // raw bytes out per second, one thread
  double ratio = 0;            // compressed / raw
};

struct DeviceProfile {
  std::vector<ReadPoint> reads;  // the grid, request size major
  // The chosen read point: the fewest bytes in flight within 5% of the best.
  uint64_t best_request_bytes = 4ull << 20;
  int best_queue_depth = 8;
  double read_gbps = 0;
  std::vector<CodecPoint> codecs;
  double alloc_gbps = 0;  // allocate + first touch through ebb::Allocator (mmap + page faults)
  double write_gbps = 0;  // direct writes at the chosen point
  std::string device;     // the directory measured, and its block device when known
  bool direct_io = true;  // false: the filesystem refused O_DIRECT, reads may be cached

  // Per-unit times for a model (seconds):
  //   t_d   = kv_chunk_bytes / decompress_gbps(codec) + kv_chunk_bytes / alloc_gbps
  //   t_rkv = kv_chunk_bytes / read_gbps
  //   t_rw  = weight_layer_bytes / read_gbps
  // Decompression allocates and fills its chunk on the same core, so the
  // allocation adds to it; a storage read's allocation overlaps the transfer.
  // Throws Error when the codec is not in the profile or a throughput is not
  // positive.
  UnitTimes unit_times(uint64_t kv_chunk_bytes, uint64_t weight_layer_bytes, std::string_view codec = "int8") const;
  const CodecPoint* find_codec(std::string_view codec) const;

  nlohmann::json to_json() const;
  // Throws Error naming the missing or mistyped field.
  static DeviceProfile from_json(const nlohmann::json& j);
  // Writes atomically (temporary file + rename), creating the directory.
  void save(const std::string& path) const;
  // Throws Error naming the path when it cannot be read or parsed.
  static DeviceProfile load(const std::string& path);
  // Conservative figures for when no profile exists: 2 GB/s reads of 4 MiB x 8,
  // 1 GB/s writes, 3 GB/s decompression, 5 GB/s allocation.
  static DeviceProfile defaults();
};

// $XDG_CACHE_HOME/ebb/profile.json, or ~/.cache/ebb/profile.json.
std::string default_profile_path();
// The saved profile at `path` when it exists, DeviceProfile::defaults() otherwise.
DeviceProfile load_profile_or_defaults(const std::string& path);

struct ProfileOptions {
  std::string dir;                          // where to measure (empty: default_profile_dir())
  uint64_t file_bytes = 512ull << 20;       // test file; reads land at random offsets over it
  std::vector<uint64_t> request_sizes = {64ull << 10, 128ull << 10, 256ull << 10, 512ull << 10, 1ull << 20,
                                         2ull << 20,  4ull << 20,   8ull << 20,   16ull << 20};
  std::vector<int> queue_depths = {1, 2, 4, 8, 16};
  double seconds_per_point = 0.3;
  Isa isa = best_isa();  // codec target
  bool quick = false;    // a 32 MiB file, two sizes x two depths, short points: for tests
};

// The directory the storage swap files go to by default, where the profile
// measures: $XDG_CACHE_HOME/ebb/swap or ~/.cache/ebb/swap.
std::string default_profile_dir();

// The read point ebb uses: among the points within 5% of the fastest, the one
// with the fewest bytes in flight (then the smaller request). Throws Error
// when `reads` is empty.
const ReadPoint& choose_read_point(const std::vector<ReadPoint>& reads);

// A single timing of a shared disk can be lucky. Every point within `band`
// of the fastest is measured again by `measure(request_bytes, queue_depth)`,
// fastest first, and keeps the lower of its two figures, so the chosen point
// is one that held its speed twice. Repeats until no point in the band is
// left unconfirmed (a confirmed point's drop can bring others into it).
// Returns how many points were measured again.
int confirm_read_points(std::vector<ReadPoint>& reads, double band,
                        const std::function<double(uint64_t request_bytes, int queue_depth)>& measure);

// Measures a profile. Creates the directory if needed; the test file is
// removed before returning (also on error). progress, when given, gets one
// line per measured point.
DeviceProfile measure_device_profile(const ProfileOptions& opts,
                                     const std::function<void(std::string_view)>& progress = nullptr);

}  // namespace ebb
