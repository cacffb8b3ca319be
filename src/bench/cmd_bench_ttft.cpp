// ebb bench ttft: time to first token after eviction (mzCache Figures 9, 11, 12).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/options.h"
#include "platform/error.h"
#include "platform/page_reporting.h"
#include "bench/bench_ttft.h"
#include "bench/bench_ttft_device.h"

namespace ebb::cli {
namespace {

struct TtftArgs {
  BenchTtftOptions o;
  std::string contexts = "2048";
  std::string remaining = "0,25,50,75,100";
  std::string systems = "ebb,partial_offload,os_paging";
  std::string orders = "backward";
  std::string overlaps = "full";
  std::string paths = "parallel";
  bool json = false;
  std::string plot;
  std::string profile;  // "": the saved one, or the defaults
  int threads = 0;      // 0: all hardware threads, as in every subcommand
  std::string device = "cpu";  // else the device path (bench_ttft_device.h)
  double storage_gbps = -1;    // < 0: measured each round
  std::vector<CLI::Option*> cpu_only;  // the CPU systems' options: refused with --device
};

std::vector<std::string> split(const std::string& s, const char* what) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  if (v.empty()) throw Error(std::string(what) + ": empty list");
  return v;
}

int64_t parse_int(const std::string& s, const char* what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size()) throw Error(std::string(what) + ": '" + s + "' is not an integer");
  return v;
}

int run_ttft_device(TtftArgs& a) {
  for (CLI::Option* opt : a.cpu_only)
    if (opt->count() > 0)
      throw Error(opt->get_name() + ": applies to the CPU systems only; with --device " + a.device +
                  " the rows are the overlapped restore and the synchronous one");
  BenchTtftDeviceOptions o;
  o.model = a.o.model;
  o.device = a.device;
  o.n_threads = resolve_threads(a.threads);
  o.contexts.clear();
  for (const std::string& c : split(a.contexts, "--context")) o.contexts.push_back(parse_int(c, "--context"));
  o.remaining_pct.clear();
  for (const std::string& r : split(a.remaining, "--remaining"))
    o.remaining_pct.push_back(static_cast<int>(parse_int(r, "--remaining")));
  o.query_tokens = a.o.query_tokens;
  o.reps = a.o.reps;
  o.kv_chunk_size = a.o.kv_chunk_size;
  o.storage_gbps = a.storage_gbps;
  o.seed = a.o.seed;
  o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const BenchTtftDeviceResult res = bench_ttft_device(o);
  if (a.json) {
    std::printf("%s\n", ttft_device_rows_json(res.rows).dump(2).c_str());
    std::fflush(stdout);
    return 0;
  }
  std::printf("model %s on %s (%s, %s), %lld-token query, %d rounds (median)\n", o.model.c_str(),
              res.device_id.c_str(), res.device_name.c_str(),
              res.unified_memory ? "unified memory" : "discrete memory: restores go through staging copies",
              static_cast<long long>(o.query_tokens), o.reps);
  std::printf("%-13s %6s %4s %8s %8s %8s %8s %7s %7s %6s %10s %5s\n", "mode", "ctx", "rem", "ttft_s", "prefill",
              "read_s", "bound_s", "x_bound", "x_sync", "layers", "read", "disk");
  for (const BenchTtftDeviceRow& r : res.rows)
    std::printf("%-13s %6lld %3d%% %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %6lld %10s %5.2f\n", r.mode.c_str(),
                static_cast<long long>(r.context), r.remaining_pct, r.ttft_s, r.prefill_s, r.read_s, r.bound_s,
                r.ratio_to_bound, r.gain_vs_sync, static_cast<long long>(r.layers_dropped),
                format_bytes(r.bytes_read).c_str(), r.storage_gbps);
  std::printf("rem: the device's layer weights left before the query (the KV stays on the device).\n"
              "overlap: the step restores the dropped layers while it runs the ones before them.\n"
              "sync_restore: restore() first, then the step. resident: nothing evicted (the prefill term).\n"
              "bound: max(read bytes / disk, resident TTFT); x_bound: TTFT / bound; x_sync: sync_restore TTFT / "
              "this TTFT.\n"
              "disk: GB/s of direct reads of the model file, measured before each round (median); the model file's\n"
              "      page cache is dropped after each eviction, so the restore reads from storage.\n");
  if (res.device_name.find("llvmpipe") != std::string::npos)
    std::printf("note: %s is Mesa's CPU driver: its \"device\" prefill runs on the same cores as the restore, so\n"
                "      these times say nothing of a GPU's overlap.\n",
                res.device_name.c_str());
  std::fflush(stdout);
  return 0;
}

int run_ttft(TtftArgs& a) {
  if (a.device != "cpu") return run_ttft_device(a);
  if (a.storage_gbps >= 0) a.o.storage_gbps = a.storage_gbps;
  BenchTtftOptions& o = a.o;
  o.n_threads = resolve_threads(a.threads);
  o.contexts.clear();
  for (const std::string& c : split(a.contexts, "--context")) o.contexts.push_back(parse_int(c, "--context"));
  o.remaining_pct.clear();
  for (const std::string& r : split(a.remaining, "--remaining"))
    o.remaining_pct.push_back(static_cast<int>(parse_int(r, "--remaining")));
  o.systems.clear();
  for (const std::string& s : split(a.systems, "--systems")) o.systems.push_back(parse_ttft_system(s));
  o.orders.clear();
  for (const std::string& s : split(a.orders, "--order")) o.orders.push_back(parse_evict_order(s));
  o.overlaps.clear();
  for (const std::string& s : split(a.overlaps, "--overlap")) o.overlaps.push_back(parse_overlap_mode(s));
  o.parallel_paths.clear();
  for (const std::string& s : split(a.paths, "--paths")) {
    if (s != "parallel" && s != "sequential") throw Error("--paths: '" + s + "' is not parallel or sequential");
    o.parallel_paths.push_back(s == "parallel");
  }
  const std::string profile_path = a.profile.empty() ? default_profile_path() : a.profile;
  o.profile = load_profile_option(a.profile);
  const IoOptions io = elastic_io_options(o.profile);
  char profile_line[512];
  std::error_code ec;
  const std::string source = a.profile.empty() && !std::filesystem::exists(profile_path, ec)
                                 ? "built-in defaults (no " + profile_path + "; run `ebb profile`)"
                                 : profile_path + " (" + o.profile.device + ")";
  std::snprintf(profile_line, sizeof profile_line, "device profile: %s: restores read %s requests, %d in flight",
                source.c_str(), format_bytes(io.max_request).c_str(), io.queue_depth);
  o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  o.log(profile_line);
  const BenchTtftResult res = bench_ttft(o);
  const std::string reporting = describe_page_reporting(read_page_reporting());
  if (a.json) {
    std::printf("%s\n", ttft_rows_json(res.rows).dump(2).c_str());
    if (!reporting.empty()) std::fprintf(stderr, "%s\n", reporting.c_str());
  } else {
    std::printf("model %s, %lld-token query, %d rounds (median), %d threads, KV chunk %lld, storage %.2f-%.2f GB/s"
                " (direct I/O)\n",
                o.model.c_str(), static_cast<long long>(o.query_tokens), o.reps, o.n_threads,
                static_cast<long long>(o.kv_chunk_size), res.storage_gbps_min, res.storage_gbps_max);
    if (!reporting.empty()) std::printf("%s\n", reporting.c_str());
    std::printf("%s\n", profile_line);
    std::printf("os_paging: weights paged out of an mmap and faulted back in; no swap device here, so its KV share\n"
                "           is lost and recomputed (truncated and re-fed), as a mobile OS does under pressure.\n");
    std::printf("%-15s %6s %4s %8s %8s %7s %6s %8s %7s %7s %7s %7s %7s %7s %10s %5s %7s %-9s %-14s %s\n", "system",
                "ctx", "rem", "ttft_s", "bound_s", "x_bound", "x_po", "x_po_max", "alloc", "reload", "decomp",
                "prefill", "stall", "kernel", "read", "disk", "evict", "order", "overlap", "paths");
    for (const BenchTtftRow& r : res.rows) {
      std::printf(
          "%-15s %6lld %3d%% %8.3f %8.3f %7.2f %6.2f %8.2f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %10s %5.2f %7.3f %-9s "
          "%-14s %s\n",
          r.system.c_str(), static_cast<long long>(r.context), r.remaining_pct, r.ttft_s, r.bound_s, r.ratio_to_bound,
          r.ratio_vs_partial_offload, r.max_ratio_vs_partial_offload, r.alloc_s, r.reload_s, r.decompress_s,
          r.prefill_s, r.stall_s, r.kernel_s, format_bytes(r.bytes_read).c_str(), r.storage_gbps, r.evict_s,
          r.order.c_str(), r.overlap.c_str(), r.paths.c_str());
    }
    std::printf("bound: max(read bytes / disk, decompression, TTFT at 100%%). x_bound: TTFT / bound.\n"
                "disk: GB/s of direct reads of the model file, measured before each round; a row shows the median of\n"
                "      its context's rounds.\n"
                "x_po: partial_offload TTFT / this TTFT.\n"
                "x_po_max: partial_offload TTFT / this row's bound, the most x_po a restore of these bytes can\n"
                "          reach here.\n"
                "kernel: CPU seconds in the kernel during the query, mostly zeroing fresh pages.\n"
                "evict: seconds evict() took to give the memory back, before the query.\n");
  }
  if (!a.plot.empty()) {
    std::ofstream f(a.plot);
    f << ttft_plot_svg(res.rows);
    if (!f) throw Error("--plot: cannot write " + a.plot);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_ttft_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<TtftArgs>();
  CLI::App* sub = bench->add_subcommand("ttft", "TTFT of a query after evicting part of memory (elastic memory vs baselines)");
  sub->add_option("-m,--model", a->o.model, "GGUF model file")->required();
  sub->add_option("--context", a->contexts, "Context lengths in tokens, comma-separated")->capture_default_str();
  sub->add_option("--remaining", a->remaining, "Remaining memory levels in % of weights + KV")->capture_default_str();
  sub->add_option("--query", a->o.query_tokens, "Query tokens fed after the context")->capture_default_str();
  sub->add_option("--reps", a->o.reps, "Rounds (every level once per round); medians are reported")
      ->capture_default_str();
  sub->add_option("-t,--threads", a->threads, "Compute threads (0: all hardware threads)")->capture_default_str();
  sub->add_option("--kv-chunk", a->o.kv_chunk_size, "KV chunk size in tokens")->capture_default_str();
  a->cpu_only.push_back(
      sub->add_option("--systems", a->systems, "ebb, partial_offload, os_paging")->capture_default_str());
  a->cpu_only.push_back(
      sub->add_option("--order", a->orders, "ebb eviction orders: backward, forward, random")->capture_default_str());
  a->cpu_only.push_back(sub->add_option("--overlap", a->overlaps, "ebb overlap: none, alloc-reload, reload-prefill, full")
                            ->capture_default_str());
  a->cpu_only.push_back(
      sub->add_option("--paths", a->paths, "ebb restore paths: sequential, parallel")->capture_default_str());
  a->cpu_only.push_back(
      sub->add_option("--swap-dir", a->o.swap_dir, "Directory of the swap file (default: the elastic default)"));
  sub->add_option("--device", a->device,
                  "cpu, or vulkan[:N]: TTFT on the device after evicting its weights, the restore overlapped with "
                  "the step against restore() then the step")
      ->capture_default_str();
  sub->add_option("--storage-gbps", a->storage_gbps,
                  "Storage GB/s for the bound (default: measured before each round; 0 leaves it out)");
  sub->add_option("--seed", a->o.seed, "Seed of the random context and query tokens")->capture_default_str();
  sub->add_flag("--json", a->json, "Print JSON rows");
  sub->add_option("--plot", a->plot, "Write TTFT against remaining memory as an SVG");
  a->cpu_only.push_back(sub->add_option("--profile", a->profile,
                  "Device profile of the ebb and partial_offload engines (default: the one `ebb profile` saved, "
                  "else built-in defaults)"));
  sub->callback([a, rc] { *rc = run_ttft(*a); });
}

}  // namespace ebb::cli
