#include "bench/bench_budget.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "memory/weight_streamer.h"
#include "platform/direct_io.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb {
namespace {

void drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  if (!f) throw Error("--drop-caches: cannot write /proc/sys/vm/drop_caches (needs root)");
}

int32_t argmax(std::span<const float> l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

}  // namespace

double measure_storage_gbps(const std::string& path, uint64_t bytes) {
  DirectFile f = DirectFile::open_read(path);
  constexpr uint64_t kReq = 4ull << 20;
  bytes = std::min(align_down(f.size(), kReq), bytes);
  if (bytes == 0) return 0;
  IoEngine io(IoOptions{.queue_depth = 8, .max_request = kReq});
  Ledger ledger;
  Allocator alloc(&ledger);
  Buffer buf = alloc.allocate(8 * kReq, MemCategory::kIoBuffer, kDirectAlign);
  std::vector<IoRequest> reqs;
  // Best of three passes: the streamer re-reads the same bytes every token,
  // so a storage layer below the OS (a VM host's cache) is warm for it too.
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double t0 = now_seconds();
    for (uint64_t off = 0; off < bytes;) {
      reqs.clear();
      for (int i = 0; i < 8 && off < bytes; ++i, off += kReq)
        reqs.push_back({f.fd(), off, buf.as<uint8_t>() + i * kReq, kReq, false});
      io.run(reqs, path);
      f.drop_cache(0, f.size());
    }
    best = std::max(best, bytes / (now_seconds() - t0) / 1e9);
  }
  return best;
}

BenchBudgetRow bench_budget_one(const BenchBudgetOptions& o, BudgetSystem system, uint64_t budget,
                                double storage_gbps) {
  BenchBudgetRow row;
  row.system = budget == 0 ? "resident" : std::string(budget_system_name(system));
  row.budget_bytes = budget;
  row.storage_gbps = storage_gbps;
  std::vector<double> dec, pre, wait;
  for (int r = 0; r < o.reps; ++r) {
    if (o.drop_caches) drop_caches();
    EngineOptions eo;
    eo.model_path = o.model;
    eo.n_threads = o.n_threads;
    eo.prefill_batch = std::max<int64_t>(o.prompt_tokens, 1);
    eo.budget.budget = budget;
    eo.budget.system = system;
    eo.budget.window = o.window;
    eo.budget.n_ctx = o.prompt_tokens + o.gen_tokens + 1;
    Engine e(eo);
    auto* st = dynamic_cast<WeightStreamer*>(e.budget_source());
    if (st) row.streamed_per_token = st->plan().streamed_per_token();
    SessionOptions so;
    so.n_ctx = eo.budget.n_ctx;
    Session s(e, so);
    std::mt19937_64 rng(o.seed + r);
    std::vector<TokenId> prompt(o.prompt_tokens);
    for (TokenId& t : prompt) t = static_cast<TokenId>(1 + rng() % (e.config().n_vocab - 1));
    double t0 = now_seconds();
    auto logits = s.feed(prompt);
    pre.push_back(o.prompt_tokens / (now_seconds() - t0));
    const double w0 = st ? st->io_wait_seconds() : 0;
    t0 = now_seconds();
    for (int64_t i = 0; i < o.gen_tokens; ++i) {
      const TokenId t = argmax(logits);
      logits = s.feed(std::span<const TokenId>(&t, 1));
    }
    const double dt = now_seconds() - t0;
    dec.push_back(o.gen_tokens / dt);
    if (st) wait.push_back((st->io_wait_seconds() - w0) / dt);
  }
  row.decode_tok_s = median(dec);
  row.prefill_tok_s = median(pre);
  row.io_wait_fraction = median(wait);
  if (row.streamed_per_token > 0 && storage_gbps > 0)
    row.roofline_tok_s = storage_gbps * 1e9 / static_cast<double>(row.streamed_per_token);
  return row;
}

std::string budget_plot_svg(const std::vector<BenchBudgetRow>& rows, uint64_t model_bytes) {
  const double W = 640, H = 400, L = 60, B = 50, T = 20, R = 120;
  double max_x = model_bytes / double(1 << 20), max_y = 0;
  std::map<std::string, std::vector<std::pair<double, double>>> lines;
  for (const BenchBudgetRow& r : rows) {
    const double x = r.budget_bytes / double(1 << 20);
    max_x = std::max(max_x, x);
    max_y = std::max({max_y, r.decode_tok_s, r.roofline_tok_s});
    lines[r.system].push_back({x, r.decode_tok_s});
    if (r.system == "ebb" && r.roofline_tok_s > 0) lines["I/O roofline"].push_back({x, r.roofline_tok_s});
  }
  if (max_y <= 0) max_y = 1;
  auto px = [&](double x) { return L + x / max_x * (W - L - R); };
  auto py = [&](double y) { return H - B - y / max_y * (H - B - T); };
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' width='640' height='400' font-family='sans-serif' font-size='11'>\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='black'/>\n", L, H - B, W - R, H - B);
  s += buf;
  std::snprintf(buf, sizeof buf, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='black'/>\n", L, T, L, H - B);
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x='%g' y='%g'>memory budget (MiB), max %.0f</text>\n", L, H - 15, max_x);
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x='5' y='%g'>decode tok/s (max %.1f)</text>\n", T - 5 + 10, max_y);
  s += buf;
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  int ci = 0;
  for (auto& [name, pts] : lines) {
    std::sort(pts.begin(), pts.end());
    const char* c = colors[ci++ % 9];
    s += "<polyline fill='none' stroke='" + std::string(c) + "'" + (name == "I/O roofline" ? " stroke-dasharray='4 3'" : "") + " points='";
    for (auto [x, y] : pts) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
      s += buf;
    }
    s += "'/>\n";
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' fill='%s'>%s</text>\n", W - R + 8, T + 14.0 * ci, c, name.c_str());
    s += buf;
  }
  return s + "</svg>\n";
}

}  // namespace ebb
