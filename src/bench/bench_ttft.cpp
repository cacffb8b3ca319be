#include "bench/bench_ttft.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "memory/mmap_weights.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "bench/bench_budget.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb {
namespace {

// Bytes this process caused to be read from storage (page faults included).
uint64_t proc_read_bytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (f >> key >> v)
    if (key == "read_bytes:") return v;
  return 0;
}

// Every layer weight unit resident in RAM + all sessions' resident KV.
uint64_t evictable_bytes(const Engine& e) {
  const Footprint f = e.footprint();
  uint64_t w = 0;
  for (uint64_t b : f.weights_per_layer) w += b;
  return w + f.kv();
}

// CPU seconds spent in the kernel by this process so far.
double kernel_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) * 1e-6;
}

// One timed feed(query).
struct Sample {
  double ttft = 0, alloc = 0, read = 0, decompress = 0, stall = 0, kernel = 0, evict = 0;
  uint64_t bytes_read = 0;
};

// The OS-paging baseline's eviction of `fraction` of the evictable bytes:
// whole layers' mapped weight pages from layer 0 on (least recently used after
// a forward pass) are unmapped and dropped from the page cache; the same
// fraction of the KV is lost (truncated) and recomputed by the next feed.
void os_page_out(Engine& e, MmapWeights& mm, Session& s, int model_fd, double fraction) {
  const Footprint fp = e.footprint();
  uint64_t weights = 0;
  for (uint64_t b : fp.weights_per_layer) weights += b;
  const auto target = static_cast<uint64_t>(fraction * static_cast<double>(weights));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t dropped = 0;
  for (int l = 0; l < e.config().n_layer && dropped < target; ++l) {
    const LayerWeights lw = mm.acquire_layer(l);
    for (const WeightView* v : {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down}) {
      if (!v->data) continue;
      const auto begin = reinterpret_cast<uintptr_t>(v->data);
      const uintptr_t a = begin / page * page;
      const uintptr_t z = (begin + v->rows * v->row_stride + page - 1) / page * page;
      ::madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED);
    }
    mm.release_layer(l);
    dropped += fp.weights_per_layer[static_cast<size_t>(l)];
  }
  // Unmapped pages leave the page cache; pages still mapped stay.
  ::posix_fadvise(model_fd, 0, 0, POSIX_FADV_DONTNEED);
  const int64_t n = s.kv().n_tokens();
  const auto keep = static_cast<int64_t>(std::llround((1.0 - fraction) * static_cast<double>(n)));
  if (keep < n) s.kv().truncate(keep);
}

struct Config {
  EvictOrder order = EvictOrder::kBackward;
  OverlapMode overlap = OverlapMode::kFull;
  bool parallel = true;
};

void log(const BenchTtftOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// One system at one context: its engine and session, prefilled once; then
// round() samples every configuration and level once, and rows() reports the
// medians. The systems of a context are kept side by side so that their rounds
// can alternate.
class SystemRun {
 public:
  SystemRun(const BenchTtftOptions& o, TtftSystem sys, int64_t n_ctx, const std::vector<int>& levels)
      : o_(o), sys_(sys), n_ctx_(n_ctx), levels_(levels), name_(ttft_system_name(sys)) {
    EngineOptions eo;
    eo.model_path = o.model;
    eo.n_threads = o.n_threads;
    eo.prefill_batch = o.prefill_batch;
    eo.kv_chunk_size = o.kv_chunk_size;
    eo.elastic = sys != TtftSystem::kOsPaging;
    eo.os_paging = sys == TtftSystem::kOsPaging;
    eo.elastic_opts.swap_dir = o.swap_dir;
    eo.elastic_opts.profile = o.profile;
    eo.elastic_opts.policy =
        sys == TtftSystem::kPartialOffload ? EvictPolicyKind::kPartialOffload : EvictPolicyKind::kHybrid;
    e_ = std::make_unique<Engine>(eo);
    if (sys == TtftSystem::kOsPaging) {
      mm_ = e_->mmap_weights();
      fd_ = ::open(o.model.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) throw Error("bench ttft: cannot open " + o.model + " for the os_paging baseline");
      ::fdatasync(fd_);  // a freshly written file's dirty pages cannot be dropped
    }
    SessionOptions so;
    so.n_ctx = n_ctx + o.query_tokens;
    so.kv_chunk_size = o.kv_chunk_size;
    s_ = std::make_unique<Session>(*e_, so);
    TtftPrompt prompt = ttft_prompt(o.seed, n_ctx, o.query_tokens, e_->config().n_vocab);
    const std::vector<TokenId> context = std::move(prompt.context);
    query_ = std::move(prompt.query);
    log(o, "bench ttft: " + name_ + ": prefilling " + std::to_string(n_ctx) + " tokens");
    int64_t last_pct = -1;
    const double t_pre = now_seconds();
    s_->feed(context, nullptr, [&](int64_t done, int64_t total) {
      const int64_t pct = done * 10 / std::max<int64_t>(total, 1);
      if (pct != last_pct) {
        last_pct = pct;
        char buf[128];
        std::snprintf(buf, sizeof buf, "bench ttft: %s: prefill %lld/%lld tokens (%.0f s)", name_.c_str(),
                      static_cast<long long>(done), static_cast<long long>(total), now_seconds() - t_pre);
        log(o, buf);
      }
    });
    if (sys == TtftSystem::kEbb) {
      // What the profile makes of this model: the policy's unit times.
      unit_times_ = e_->elastic()->unit_times();
      const UnitTimes& t = unit_times_;
      const HybridSwapPolicy policy(t, 0, 0);
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "bench ttft: ebb: t_d %.3f ms, t_rKV %.3f ms, t_rW %.2f ms: %lld chunks per dropped layer, "
                    "%.1f%% of KVonly chunks compressed",
                    t.t_d * 1e3, t.t_rkv * 1e3, t.t_rw * 1e3, static_cast<long long>(policy.chunks_per_layer()),
                    100 * policy.compressed_share());
      log(o, buf);
      for (EvictOrder ord : o.orders)
        for (OverlapMode ov : o.overlaps)
          for (bool par : o.parallel_paths) configs_.push_back({ord, ov, par});
    } else {
      configs_.push_back({});
    }
    samples_.assign(configs_.size(), std::vector<std::vector<Sample>>(levels.size()));
    evicted_.assign(configs_.size(), std::vector<uint64_t>(levels.size(), 0));
  }
  ~SystemRun() {
    s_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  SystemRun(const SystemRun&) = delete;
  SystemRun& operator=(const SystemRun&) = delete;

  // Every configuration and level once.
  void round() {
    ElasticMemory* em = e_->elastic();
    for (size_t ci = 0; ci < configs_.size(); ++ci) {
      const Config& c = configs_[ci];
      if (em && sys_ == TtftSystem::kEbb) {
        em->set_order(c.order);
        em->set_overlap(c.overlap);
        em->set_parallel_paths(c.parallel);
      }
      for (size_t li = 0; li < levels_.size(); ++li) samples_[ci][li].push_back(sample(ci, li));
    }
  }

  const UnitTimes& unit_times() const { return unit_times_; }

  // One row per configuration and level; storage_gbps: the median of the
  // figures measured before the rounds.
  void rows(double storage_gbps, std::vector<BenchTtftRow>& out) const {
    for (size_t ci = 0; ci < configs_.size(); ++ci) {
      const Config& c = configs_[ci];
      for (size_t li = 0; li < levels_.size(); ++li) {
        const std::vector<Sample>& samples = samples_[ci][li];
        auto med = [&](auto field) {
          std::vector<double> v;
          for (const Sample& x : samples) v.push_back(static_cast<double>(x.*field));
          return median(v);
        };
        BenchTtftRow row;
        row.system = name_;
        row.context = n_ctx_;
        row.remaining_pct = levels_[li];
        row.ttft_s = med(&Sample::ttft);
        row.alloc_s = med(&Sample::alloc);
        row.reload_s = med(&Sample::read);
        row.decompress_s = med(&Sample::decompress);
        row.stall_s = med(&Sample::stall);
        row.kernel_s = med(&Sample::kernel);
        row.evict_s = med(&Sample::evict);
        row.prefill_s = std::max(0.0, row.ttft_s - row.stall_s);
        row.bytes_read = static_cast<uint64_t>(med(&Sample::bytes_read));
        row.evicted_bytes = evicted_[ci][li];
        row.storage_gbps = storage_gbps;
        const bool ebb = sys_ == TtftSystem::kEbb;
        row.order = ebb ? std::string(evict_order_name(c.order)) : "-";
        row.overlap = ebb ? std::string(overlap_mode_name(c.overlap)) : "-";
        row.paths = ebb ? (c.parallel ? "parallel" : "sequential") : "-";
        out.push_back(row);
        char buf[160];
        std::snprintf(buf, sizeof buf, "bench ttft: %s ctx %lld remaining %d%%: TTFT %.3f s", name_.c_str(),
                      static_cast<long long>(n_ctx_), row.remaining_pct, row.ttft_s);
        log(o_, buf);
      }
    }
  }

 private:
  // Evicts for level li, times feed(query), and truncates back to the context
  // (which restores anything still evicted).
  Sample sample(size_t ci, size_t li) {
    ElasticMemory* em = e_->elastic();
    const double fraction = 1.0 - levels_[li] / 100.0;
    evicted_[ci][li] = static_cast<uint64_t>(fraction * static_cast<double>(evictable_bytes(*e_)));
    Sample smp;
    if (evicted_[ci][li] > 0) {
      if (em) {
        smp.evict = e_->evict(evicted_[ci][li]).seconds;
      } else {
        os_page_out(*e_, *mm_, *s_, fd_, fraction);
      }
    }
    const bool restoring = em && !em->fully_resident();
    const uint64_t io0 = proc_read_bytes();
    const double k0 = kernel_seconds();
    const double t0 = now_seconds();
    s_->feed(query_);
    smp.ttft = now_seconds() - t0;
    smp.kernel = kernel_seconds() - k0;
    if (restoring) {
      const RestoreReport& r = s_->last_restore();
      smp.alloc = r.alloc_s;
      smp.read = r.read_s;
      smp.decompress = r.decompress_s;
      smp.stall = r.stall_s;
      smp.bytes_read = r.bytes_read;
    } else if (!em) {
      smp.bytes_read = proc_read_bytes() - io0;
    }
    s_->truncate(n_ctx_);
    return smp;
  }

  const BenchTtftOptions& o_;
  TtftSystem sys_;
  int64_t n_ctx_;
  std::vector<int> levels_;
  std::string name_;
  std::unique_ptr<Engine> e_;
  MmapWeights* mm_ = nullptr;  // the engine's mapping (os_paging only)
  int fd_ = -1;
  std::unique_ptr<Session> s_;
  std::vector<TokenId> query_;
  std::vector<Config> configs_;
  std::vector<std::vector<std::vector<Sample>>> samples_;  // [config][level][round]
  std::vector<std::vector<uint64_t>> evicted_;             // [config][level]
  UnitTimes unit_times_;                                   // ebb's, from the profile
};

// Every system at one context, their rounds alternating: round r measures the
// disk, then runs round r of each system in turn.
// Returns the disk figures of the rounds.
std::vector<double> run_context(const BenchTtftOptions& o, int64_t n_ctx, const std::vector<int>& levels,
                                const std::function<double()>& probe, std::vector<BenchTtftRow>& rows,
                                UnitTimes& ebb_times) {
  std::vector<std::unique_ptr<SystemRun>> runs;
  for (TtftSystem sys : o.systems) {
    runs.push_back(std::make_unique<SystemRun>(o, sys, n_ctx, levels));
    if (sys == TtftSystem::kEbb) ebb_times = runs.back()->unit_times();
  }
  std::vector<double> gbps;  // [round]
  for (int rep = 0; rep < o.reps; ++rep) {
    gbps.push_back(o.storage_gbps >= 0 ? o.storage_gbps : probe());
    char line[128];
    std::snprintf(line, sizeof line, "bench ttft: ctx %lld: round %d/%d, storage %.2f GB/s",
                  static_cast<long long>(n_ctx), rep + 1, o.reps, gbps.back());
    log(o, line);
    for (auto& r : runs) r->round();
  }
  for (const auto& r : runs) r->rows(median(gbps), rows);
  return gbps;
}

bool same_series(const BenchTtftRow& a, const BenchTtftRow& b) {
  return a.system == b.system && a.context == b.context && a.order == b.order && a.overlap == b.overlap &&
         a.paths == b.paths;
}

}  // namespace

TtftSystem parse_ttft_system(std::string_view s) {
  if (s == "ebb") return TtftSystem::kEbb;
  if (s == "partial_offload") return TtftSystem::kPartialOffload;
  if (s == "os_paging") return TtftSystem::kOsPaging;
  throw Error("--systems: '" + std::string(s) + "' is not one of ebb, partial_offload, os_paging");
}

std::string_view ttft_system_name(TtftSystem s) {
  switch (s) {
    case TtftSystem::kEbb: return "ebb";
    case TtftSystem::kPartialOffload: return "partial_offload";
    case TtftSystem::kOsPaging: return "os_paging";
  }
  return "?";
}

TtftPrompt ttft_prompt(uint64_t seed, int64_t n_ctx, int64_t query_tokens, int32_t n_vocab) {
  std::mt19937_64 rng(seed + static_cast<uint64_t>(n_ctx));
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (TokenId& x : t) x = static_cast<TokenId>(1 + rng() % static_cast<uint64_t>(n_vocab - 1));
    return t;
  };
  TtftPrompt p;
  p.context = random_tokens(n_ctx);
  p.query = random_tokens(query_tokens);
  return p;
}

BenchTtftResult bench_ttft(const BenchTtftOptions& o) {
  if (o.reps < 1) throw Error("bench ttft: --reps must be >= 1");
  if (o.query_tokens < 1) throw Error("bench ttft: --query must be >= 1");
  for (int r : o.remaining_pct)
    if (r < 0 || r > 100) throw Error("bench ttft: --remaining " + std::to_string(r) + " is outside 0..100");
  for (int64_t n : o.contexts)
    if (n < 1) throw Error("bench ttft: --context " + std::to_string(n) + " must be >= 1");
  BenchTtftResult res;
  // Best of three direct reads of 256 MiB (0.4 s at 2 GB/s) before each round.
  const std::function<double()> probe =
      o.storage_probe ? o.storage_probe : [&] { return measure_storage_gbps(o.model, uint64_t{256} << 20); };
  // 100% is always measured: it is the bound's prefill term.
  std::vector<int> levels = o.remaining_pct;
  if (std::find(levels.begin(), levels.end(), 100) == levels.end()) levels.push_back(100);
  std::vector<BenchTtftRow> all;
  for (int64_t n : o.contexts) {
    for (double g : run_context(o, n, levels, probe, all, res.ebb_unit_times)) {
      res.storage_gbps_min = res.storage_gbps_min > 0 ? std::min(res.storage_gbps_min, g) : g;
      res.storage_gbps_max = std::max(res.storage_gbps_max, g);
    }
  }
  // Rows by system (in the order asked), then context.
  std::stable_sort(all.begin(), all.end(), [&](const BenchTtftRow& a, const BenchTtftRow& b) {
    auto rank = [&](const std::string& name) {
      for (size_t i = 0; i < o.systems.size(); ++i)
        if (ttft_system_name(o.systems[i]) == name) return i;
      return o.systems.size();
    };
    return rank(a.system) < rank(b.system);
  });
  for (BenchTtftRow& r : all) {
    double prefill_ref = 0, partial = 0;
    for (const BenchTtftRow& q : all) {
      if (same_series(q, r) && q.remaining_pct == 100) prefill_ref = q.ttft_s;
      if (q.system == "partial_offload" && q.context == r.context && q.remaining_pct == r.remaining_pct) partial = q.ttft_s;
    }
    const double io = r.storage_gbps > 0 ? static_cast<double>(r.bytes_read) / (r.storage_gbps * 1e9) : 0.0;
    r.bound_s = std::max({io, r.decompress_s, prefill_ref});
    r.ratio_vs_partial_offload = partial > 0 && r.ttft_s > 0 ? partial / r.ttft_s : 0.0;
    r.max_ratio_vs_partial_offload = partial > 0 && r.bound_s > 0 ? partial / r.bound_s : 0.0;
    r.ratio_to_bound = r.bound_s > 0 ? r.ttft_s / r.bound_s : 0.0;
  }
  const std::set<int> wanted(o.remaining_pct.begin(), o.remaining_pct.end());
  for (const BenchTtftRow& r : all)
    if (wanted.count(r.remaining_pct)) res.rows.push_back(r);
  return res;
}

nlohmann::json ttft_rows_json(const std::vector<BenchTtftRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const BenchTtftRow& r : rows) {
    j.push_back({{"system", r.system},
                 {"context", r.context},
                 {"remaining_pct", r.remaining_pct},
                 {"ttft_s", r.ttft_s},
                 {"bound_s", r.bound_s},
                 {"ratio_vs_partial_offload", r.ratio_vs_partial_offload},
                 {"max_ratio_vs_partial_offload", r.max_ratio_vs_partial_offload},
                 {"ratio_to_bound", r.ratio_to_bound},
                 {"alloc_s", r.alloc_s},
                 {"reload_s", r.reload_s},
                 {"decompress_s", r.decompress_s},
                 {"prefill_s", r.prefill_s},
                 {"stall_s", r.stall_s},
                 {"kernel_s", r.kernel_s},
                 {"bytes_read", r.bytes_read},
                 {"evicted_bytes", r.evicted_bytes},
                 {"evict_s", r.evict_s},
                 {"order", r.order},
                 {"overlap", r.overlap},
                 {"paths", r.paths},
                 {"storage_gbps", r.storage_gbps}});
  }
  return j;
}

std::string ttft_plot_svg(const std::vector<BenchTtftRow>& rows) {
  // Series: one per system, and per ablation when the ebb rows have several.
  std::set<std::string> ebb_cfgs;
  for (const BenchTtftRow& r : rows)
    if (r.system == "ebb") ebb_cfgs.insert(r.order + "/" + r.overlap + "/" + r.paths);
  auto label = [&](const BenchTtftRow& r) {
    return r.system == "ebb" && ebb_cfgs.size() > 1 ? "ebb " + r.order + "/" + r.overlap + "/" + r.paths : r.system;
  };
  std::map<int64_t, std::map<std::string, std::vector<std::pair<double, double>>>> panels;  // context -> series
  std::vector<std::string> names;
  double max_y = 0;
  for (const BenchTtftRow& r : rows) {
    const std::string n = label(r);
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    panels[r.context][n].push_back({static_cast<double>(r.remaining_pct), r.ttft_s});
    max_y = std::max(max_y, r.ttft_s);
  }
  if (max_y <= 0) max_y = 1;
  const double PW = 300, H = 360, L = 60, B = 50, T = 30, gap = 30, legend = 200;
  const double W = L + std::max<size_t>(panels.size(), 1) * (PW + gap) + legend;
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  auto color = [&](const std::string& n) {
    return colors[(std::find(names.begin(), names.end(), n) - names.begin()) % 9];
  };
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' font-family='sans-serif' font-size='11'>\n",
                W, H);
  std::string s = buf;
  auto py = [&](double y) { return H - B - y / max_y * (H - B - T); };
  double x0 = L;
  for (const auto& [ctx, series] : panels) {
    auto px = [&](double pct) { return x0 + pct / 100.0 * PW; };
    std::snprintf(buf, sizeof buf, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='black'/>\n", x0, H - B, x0 + PW, H - B);
    s += buf;
    std::snprintf(buf, sizeof buf, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='black'/>\n", x0, T, x0, H - B);
    s += buf;
    for (int pct = 0; pct <= 100; pct += 25) {
      std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='middle'>%d</text>\n", px(pct), H - B + 14, pct);
      s += buf;
    }
    for (int i = 0; i <= 4; ++i) {
      std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='end'>%.2f</text>\n", x0 - 4, py(max_y * i / 4) + 4,
                    max_y * i / 4);
      s += buf;
    }
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='middle'>context %lld tokens</text>\n", x0 + PW / 2,
                  T - 10, static_cast<long long>(ctx));
    s += buf;
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='middle'>remaining memory (%%)</text>\n", x0 + PW / 2,
                  H - 15);
    s += buf;
    for (auto pts : series) {
      std::sort(pts.second.begin(), pts.second.end());
      s += "<polyline fill='none' stroke='" + std::string(color(pts.first)) + "' points='";
      for (auto [x, y] : pts.second) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
        s += buf;
      }
      s += "'/>\n";
      for (auto [x, y] : pts.second) {
        std::snprintf(buf, sizeof buf, "<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>\n", px(x), py(y), color(pts.first));
        s += buf;
      }
    }
    x0 += PW + gap;
  }
  std::snprintf(buf, sizeof buf, "<text x='12' y='%g' transform='rotate(-90 12 %g)' text-anchor='middle'>TTFT (s)</text>\n",
                (H - B + T) / 2, (H - B + T) / 2);
  s += buf;
  for (size_t i = 0; i < names.size(); ++i) {
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' fill='%s'>%s</text>\n", x0 + 4, T + 14.0 * (i + 1),
                  color(names[i]), names[i].c_str());
    s += buf;
  }
  return s + "</svg>\n";
}

}  // namespace ebb
