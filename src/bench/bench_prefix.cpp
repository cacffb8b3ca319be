// ebb bench prefix: time to first token of a short turn after a long prefix,
// three ways in the same run, rounds interleaved:
//   hit:  a new session whose prefix the prefix cache holds (a producer
//         session ran it and is gone),
//   live: a session that has run the prefix itself (the bound: a hit cannot
//         beat the KV already being in the session),
//   cold: a new session with no cache (prefix and turn recomputed),
// and with --cache-dir, resume: a new engine (as after a restart) whose
// prefix is in the cache directory's files (read back with direct I/O), its
// bound the files' bytes at the disk's measured direct-read rate plus the
// live turn.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/options.h"
#include "platform/direct_io.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb::cli {
namespace {

struct PrefixArgs {
  ModelArgs model;
  int64_t prefix = 2048;
  int64_t turn = 32;
  int64_t reps = 5;
  bool json = false;
};

// Direct-read rate of the cache files (GB/s): the disk's speed for exactly
// these bytes, measured in the same run.
double probe_read_gbps(const std::string& dir, uint64_t* bytes) {
  IoEngine io(IoOptions{.queue_depth = 8, .max_request = uint64_t{4} << 20});
  std::vector<DirectFile> files;
  *bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".kv") files.push_back(DirectFile::open_read(e.path().string())), *bytes += files.back().size();
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> bufs;
  std::vector<IoRequest> reqs;
  for (const DirectFile& f : files) {
    const uint64_t n = align_up(f.size());
    bufs.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, n)), &std::free);
    reqs.push_back({f.fd(), 0, bufs.back().get(), n, false});
  }
  const Stopwatch sw;
  io.run(reqs);
  const double s = sw.seconds();
  for (const DirectFile& f : files) f.drop_cache(0, f.size());
  return s > 0 ? static_cast<double>(*bytes) / s / 1e9 : 0;
}

void drop_page_cache() {
  sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("3\n", f);
    std::fclose(f);
  }
}

int run_prefix_bench(PrefixArgs& a) {
  if (a.prefix < 1 || a.turn < 1 || a.reps < 1) throw Error("bench prefix: --prefix, --turn and --reps must be at least 1");
  // --cache-dir (a model option) is where resume is measured; the hit, live
  // and cold rows keep their cache in RAM.
  const std::string cache_dir = a.model.cache_dir;
  EngineOptions eo = engine_options(a.model);
  eo.prefix_cache = true;
  eo.cache_dir.clear();
  Engine e(eo);
  const int64_t nv = e.config().n_vocab;
  std::mt19937 rng(7);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(nv - 1));
    return t;
  };
  const std::vector<TokenId> prefix = random_tokens(a.prefix);
  SessionOptions so = session_options(a.model);
  so.n_ctx = a.prefix + a.turn + 8;
  SessionOptions no_cache = so;
  no_cache.use_prefix_cache = false;
  {
    Session producer(e, so);  // fills the cache; its KV stays there when it goes
    producer.feed(prefix);
  }
  Session live(e, no_cache);
  live.feed(prefix);

  std::vector<double> hit, live_s, cold;
  int64_t reused = 0;
  for (int64_t r = 0; r <= a.reps; ++r) {  // r == 0: warm-up
    std::fprintf(stderr, "bench prefix: %s\n", r == 0 ? "warm-up" : ("round " + std::to_string(r)).c_str());
    const std::vector<TokenId> turn = random_tokens(a.turn);
    std::vector<TokenId> all = prefix;
    all.insert(all.end(), turn.begin(), turn.end());
    double t_hit, t_live, t_cold;
    {
      Session s(e, so);
      const Stopwatch sw;
      s.feed(all);
      t_hit = sw.seconds();
      reused = s.reused_tokens();
    }
    {
      const Stopwatch sw;
      live.feed(turn);
      t_live = sw.seconds();
      live.truncate(a.prefix);
    }
    {
      Session s(e, no_cache);
      const Stopwatch sw;
      s.feed(all);
      t_cold = sw.seconds();
    }
    if (r == 0) continue;
    hit.push_back(t_hit);
    live_s.push_back(t_live);
    cold.push_back(t_cold);
  }
  const double h = median(hit), l = median(live_s), c = median(cold);

  // Resume after a restart: the producer writes the files; each round a new
  // engine reads them back (page cache dropped when permitted).
  std::vector<double> resume_s, probe_gbps;
  uint64_t resume_bytes = 0, file_bytes = 0;
  if (!cache_dir.empty()) {
    std::filesystem::create_directories(cache_dir);
    for (const auto& f : std::filesystem::directory_iterator(cache_dir))
      if (f.path().extension() == ".kv") std::filesystem::remove(f.path());
    EngineOptions ro = eo;
    ro.cache_dir = cache_dir;
    {
      Engine producer(ro);
      Session s(producer, so);
      s.feed(prefix);
    }
    for (int64_t r = 0; r <= a.reps; ++r) {
      std::fprintf(stderr, "bench prefix: resume %s\n", r == 0 ? "warm-up" : ("round " + std::to_string(r)).c_str());
      drop_page_cache();
      Engine fresh(ro);
      std::vector<TokenId> all = prefix;
      const std::vector<TokenId> turn = random_tokens(a.turn);
      all.insert(all.end(), turn.begin(), turn.end());
      Session s(fresh, so);
      const Stopwatch sw;
      s.feed(all);
      const double t = sw.seconds();
      resume_bytes = fresh.cache_store()->stats().bytes_read;
      drop_page_cache();
      const double gbps = probe_read_gbps(cache_dir, &file_bytes);
      if (r == 0) continue;
      resume_s.push_back(t);
      probe_gbps.push_back(gbps);
    }
  }
  const double rs = median(resume_s), disk = median(probe_gbps);
  const double resume_bound = disk > 0 ? static_cast<double>(resume_bytes) / disk / 1e9 + l : 0;
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["threads"] = e.pool().size();
    j["isa"] = std::string(isa_name(e.isa()));
    j["prefix_tokens"] = a.prefix;
    j["turn_tokens"] = a.turn;
    j["reused_tokens"] = reused;
    j["ttft_hit_s"] = h;
    j["ttft_live_s"] = l;
    j["ttft_cold_s"] = c;
    j["ttft_hit_s_reps"] = hit;
    j["ttft_live_s_reps"] = live_s;
    j["ttft_cold_s_reps"] = cold;
    j["hit_over_live"] = l > 0 ? h / l : 0;
    j["cold_over_hit"] = h > 0 ? c / h : 0;
    if (!cache_dir.empty()) {
      j["ttft_resume_s"] = rs;
      j["ttft_resume_s_reps"] = resume_s;
      j["resume_bytes_read"] = resume_bytes;
      j["disk_read_gbps"] = disk;
      j["disk_read_gbps_reps"] = probe_gbps;
      j["resume_bound_s"] = resume_bound;
      j["resume_over_bound"] = resume_bound > 0 ? rs / resume_bound : 0;
      j["cold_over_resume"] = rs > 0 ? c / rs : 0;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("ebb bench prefix: %s, %d threads, %s, prefix %lld + turn %lld tokens, median of %lld rounds\n",
                a.model.model.c_str(), e.pool().size(), std::string(isa_name(e.isa())).c_str(),
                static_cast<long long>(a.prefix), static_cast<long long>(a.turn), static_cast<long long>(a.reps));
    std::printf("bound: the live session (its KV already in place); the hit reused %lld tokens\n",
                static_cast<long long>(reused));
    std::printf("%-8s %12s %14s\n", "", "TTFT s", "ratio");
    std::printf("%-8s %12.4f %14s\n", "live", l, "(bound)");
    std::printf("%-8s %12.4f %11.2f x live\n", "hit", h, l > 0 ? h / l : 0);
    std::printf("%-8s %12.4f %11.1f x hit\n", "cold", c, h > 0 ? c / h : 0);
    if (!cache_dir.empty()) {
      std::printf("%-8s %12.4f %11.2f x bound (%.4f s: %.1f MiB at %.2f GB/s + the live turn); cold is %.1f x resume\n",
                  "resume", rs, resume_bound > 0 ? rs / resume_bound : 0, resume_bound, resume_bytes / 1048576.0,
                  disk, rs > 0 ? c / rs : 0);
    }
  }
  return 0;
}

}  // namespace

void add_bench_prefix_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<PrefixArgs>();
  CLI::App* sub = bench->add_subcommand("prefix", "TTFT of a turn after a cached prefix, a live session and none");
  add_model_options(sub, a->model);
  sub->add_option("--prefix", a->prefix, "Prefix tokens")->capture_default_str();
  sub->add_option("--turn", a->turn, "Turn tokens after the prefix")->capture_default_str();
  sub->add_option("--reps", a->reps, "Timed rounds (after one warm-up); medians are reported")->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_prefix_bench(*a); });
}

}  // namespace ebb::cli
