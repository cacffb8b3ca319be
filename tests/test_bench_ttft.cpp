// ebb bench ttft: rows for every system and level, sane times, ebb reads from
// storage when everything was evicted, the JSON fields, and the plot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "platform/error.h"
#include "bench/bench_ttft.h"
#include "support.h"

namespace ebb {
namespace {

BenchTtftOptions small_options(const std::string& swap_dir) {
  BenchTtftOptions o;
  o.model = test::model_path("stories260K.gguf");
  o.contexts = {96};
  o.remaining_pct = {0, 50, 100};
  o.query_tokens = 8;
  o.reps = 1;
  o.n_threads = 1;
  o.kv_chunk_size = 32;
  o.prefill_batch = 32;
  o.swap_dir = swap_dir;
  o.storage_gbps = 1.0;  // the model is too small to measure a bandwidth on
  return o;
}

TEST(BenchTtft, RowsForEverySystemAndLevel) {
  const std::string dir = test::make_temp_dir("ebb-ttft");
  const BenchTtftResult res = bench_ttft(small_options(dir));
  std::filesystem::remove_all(dir);

  ASSERT_EQ(res.rows.size(), 3u * 3u);
  std::set<std::pair<std::string, int>> seen;
  for (const BenchTtftRow& r : res.rows) {
    seen.insert({r.system, r.remaining_pct});
    EXPECT_EQ(r.context, 96);
    EXPECT_TRUE(std::isfinite(r.ttft_s) && r.ttft_s > 0) << r.system << " " << r.remaining_pct;
    EXPECT_TRUE(std::isfinite(r.bound_s) && r.bound_s > 0) << r.system << " " << r.remaining_pct;
    EXPECT_GT(r.ratio_vs_partial_offload, 0) << r.system;
    EXPECT_GE(r.prefill_s, 0);
    EXPECT_LE(r.stall_s, r.ttft_s + 1e-9);
    EXPECT_TRUE(std::isfinite(r.kernel_s) && r.kernel_s >= 0);
    if (r.remaining_pct == 100) {
      EXPECT_EQ(r.evicted_bytes, 0u);
      EXPECT_EQ(r.evict_s, 0.0);
      if (r.system != "os_paging") {
        EXPECT_EQ(r.bytes_read, 0u) << r.system;
      }
    } else {
      EXPECT_GT(r.evicted_bytes, 0u) << r.system;
      if (r.system != "os_paging") {
        EXPECT_GT(r.evict_s, 0.0) << r.system;
      }
    }
  }
  for (const char* s : {"ebb", "partial_offload", "os_paging"})
    for (int level : {0, 50, 100}) EXPECT_TRUE(seen.count({s, level})) << s << " " << level;

  for (const BenchTtftRow& r : res.rows) {
    if (r.system == "ebb" && r.remaining_pct == 0) {
      EXPECT_GT(r.bytes_read, 0u);  // dropped weight layers come back from the GGUF
      EXPECT_EQ(r.order, "backward");
      EXPECT_EQ(r.overlap, "full");
      EXPECT_EQ(r.paths, "parallel");
    }
    // x_po_max is partial offload's TTFT over this row's bound.
    double partial = 0;
    for (const BenchTtftRow& q : res.rows)
      if (q.system == "partial_offload" && q.remaining_pct == r.remaining_pct) partial = q.ttft_s;
    EXPECT_NEAR(r.max_ratio_vs_partial_offload, partial / r.bound_s, 1e-12) << r.system << " " << r.remaining_pct;
    EXPECT_NEAR(r.ratio_to_bound, r.ttft_s / r.bound_s, 1e-12) << r.system << " " << r.remaining_pct;
    if (r.system == "partial_offload") {
      EXPECT_NEAR(r.ratio_vs_partial_offload, 1.0, 1e-12);
      if (r.remaining_pct == 0) {
        EXPECT_GT(r.bytes_read, 0u);
      }
    }
  }

  const nlohmann::json j = ttft_rows_json(res.rows);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), res.rows.size());
  for (const auto& row : j) {
    for (const char* f : {"system", "context", "remaining_pct", "ttft_s", "bound_s", "ratio_vs_partial_offload",
                          "max_ratio_vs_partial_offload", "ratio_to_bound", "alloc_s", "reload_s", "decompress_s",
                          "prefill_s", "stall_s", "kernel_s", "bytes_read", "evict_s", "order", "overlap", "paths",
                          "storage_gbps"})
      EXPECT_TRUE(row.contains(f)) << f;
  }

  const std::string svg = ttft_plot_svg(res.rows);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("remaining memory"), std::string::npos);
  EXPECT_NE(svg.find("TTFT (s)"), std::string::npos);
  for (const char* s : {"ebb", "partial_offload", "os_paging"}) EXPECT_NE(svg.find(s), std::string::npos) << s;
}

// A context's systems are prefilled side by side and their rounds alternate;
// the disk is measured before every round, and each row's bound divides its
// bytes by the median of its context's round figures.
TEST(BenchTtft, StorageIsMeasuredBeforeEveryRound) {
  const std::string dir = test::make_temp_dir("ebb-ttft");
  BenchTtftOptions o = small_options(dir);
  o.systems = {TtftSystem::kEbb, TtftSystem::kPartialOffload};
  o.contexts = {64, 96};
  o.reps = 3;
  o.storage_gbps = -1;
  const std::vector<double> figures = {1e-3, 4e-3, 2e-3, 8e-3, 3e-3, 5e-3};  // GB/s, low enough to bind
  size_t calls = 0;
  o.storage_probe = [&] { return figures.at(calls++); };
  std::vector<std::string> lines;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  const BenchTtftResult res = bench_ttft(o);
  std::filesystem::remove_all(dir);

  EXPECT_EQ(calls, figures.size());  // 3 rounds per context
  EXPECT_DOUBLE_EQ(res.storage_gbps_min, 1e-3);
  EXPECT_DOUBLE_EQ(res.storage_gbps_max, 8e-3);
  // Both systems are prefilled before the first round at each context.
  auto first = [&](const std::string& needle) {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].find(needle) != std::string::npos) return i;
    return lines.size();
  };
  EXPECT_LT(first("partial_offload: prefilling 64"), first("ctx 64: round 1/3"));
  EXPECT_LT(first("ctx 64: round 3/3"), first("prefilling 96"));
  ASSERT_EQ(res.rows.size(), 2u * 2u * 3u);
  for (size_t i = 0; i < res.rows.size(); ++i) {
    EXPECT_EQ(res.rows[i].system, i < 6 ? "ebb" : "partial_offload");  // by system, then context
    EXPECT_EQ(res.rows[i].context, i % 6 < 3 ? 64 : 96);
  }
  for (const BenchTtftRow& r : res.rows) {
    const double gbps = r.context == 64 ? 2e-3 : 5e-3;  // the median of the context's three rounds
    EXPECT_DOUBLE_EQ(r.storage_gbps, gbps) << r.system << " " << r.remaining_pct;
    double prefill_ref = 0;
    for (const BenchTtftRow& q : res.rows)
      if (q.system == r.system && q.context == r.context && q.remaining_pct == 100) prefill_ref = q.ttft_s;
    const double io = static_cast<double>(r.bytes_read) / (gbps * 1e9);
    EXPECT_DOUBLE_EQ(r.bound_s, std::max({io, r.decompress_s, prefill_ref})) << r.system << " " << r.remaining_pct;
    if (r.remaining_pct == 0) {
      EXPECT_GT(io, prefill_ref) << r.system;  // the storage term is the one that binds here
    }
  }
}

TEST(BenchTtft, AblationsAreRowSets) {
  const std::string dir = test::make_temp_dir("ebb-ttft");
  BenchTtftOptions o = small_options(dir);
  o.systems = {TtftSystem::kEbb};
  o.remaining_pct = {0};  // 100% is still measured for the bound, not reported
  o.orders = {EvictOrder::kBackward, EvictOrder::kForward};
  o.parallel_paths = {true, false};
  const BenchTtftResult res = bench_ttft(o);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(res.rows.size(), 4u);
  std::set<std::string> cfgs;
  for (const BenchTtftRow& r : res.rows) {
    EXPECT_EQ(r.remaining_pct, 0);
    EXPECT_GT(r.bytes_read, 0u);
    EXPECT_GE(r.bound_s, r.decompress_s);
    EXPECT_EQ(r.ratio_vs_partial_offload, 0.0);  // no partial_offload rows
    EXPECT_EQ(r.max_ratio_vs_partial_offload, 0.0);
    cfgs.insert(r.order + "/" + r.paths);
  }
  EXPECT_EQ(cfgs.size(), 4u);
}

TEST(BenchTtft, TheProfileGivesTheEbbEnginesUnitTimes) {
  // The bench's engines take the profile they are given (the CLI's: the one
  // `ebb profile` saved, or --profile): its reads and decompression set the
  // hybrid-swap policy's unit times, not the built-in defaults.
  const std::string dir = test::make_temp_dir("ebb-ttft");
  BenchTtftOptions o = small_options(dir);
  o.systems = {TtftSystem::kEbb};
  o.remaining_pct = {100};  // nothing to evict: the unit times are known once the context is in
  const UnitTimes defaults = bench_ttft(o).ebb_unit_times;
  DeviceProfile slow = DeviceProfile::defaults(), fast = DeviceProfile::defaults();
  slow.read_gbps = 1.0;   // the defaults read at 2 GB/s
  fast.read_gbps = 8.0;
  fast.codecs[0].decompress_gbps = 30.0;  // int8; the defaults decompress at 3 GB/s
  o.profile = slow;
  const UnitTimes a = bench_ttft(o).ebb_unit_times;
  o.profile = fast;
  const UnitTimes b = bench_ttft(o).ebb_unit_times;
  std::filesystem::remove_all(dir);
  ASSERT_GT(defaults.t_rw, 0);
  EXPECT_NEAR(a.t_rw / defaults.t_rw, 2.0, 1e-9);
  EXPECT_NEAR(a.t_rkv / defaults.t_rkv, 2.0, 1e-9);
  EXPECT_NEAR(defaults.t_rw / b.t_rw, 4.0, 1e-9);
  EXPECT_EQ(a.t_d, defaults.t_d);  // the same decompression and allocation
  EXPECT_LT(b.t_d, defaults.t_d);
}

TEST(BenchTtft, RejectsBadLevels) {
  BenchTtftOptions o;
  o.model = test::model_path("stories260K.gguf");
  o.remaining_pct = {120};
  EXPECT_THROW(bench_ttft(o), Error);
  EXPECT_THROW(parse_ttft_system("swap"), Error);
}

}  // namespace
}  // namespace ebb
