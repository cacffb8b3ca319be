// ebb bench: benchmarks. `bench` is a group; each benchmark is a
// sub-subcommand (speed, kvcodec, budget, ttft, batch, prefix, serve, train).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "platform/error.h"
#include "bench/bench_speed.h"

namespace ebb::cli {
namespace {

// ---- bench speed ---------------------------------------------------------

struct SpeedArgs {
  ModelArgs model;
  SpeedOptions speed;
  int64_t membw_mib = 256;
  double device_gbps = 0;  // --device-gbps: the device's memory bandwidth, when known (0: unknown)
  bool json = false;
};

// Where decode's bandwidth bound comes from on a device: the host's memory
// when the device shares it (the probe measured it), else --device-gbps,
// else unknown (Vulkan does not report a bandwidth).
struct DeviceBound {
  std::string id, name;
  double gbps = 0;
  std::string source;  // "host memory (unified)", "--device-gbps", "unknown"
  uint64_t bytes = 0;  // what a decoded token reads there: the layers' buffers and the output head (formats
                       // without shaders were widened to F16, so this can exceed the file's model bytes)
  // A split (-ngl N < n_layers): the CPU's layers, read from host memory
  // at host_gbps (the probe) in the same token.
  uint64_t host_bytes = 0;
  double host_gbps = 0;
  double bound_tok_s() const {
    if (gbps <= 0 || bytes == 0) return 0.0;
    if (host_bytes == 0) return gbps * 1e9 / static_cast<double>(bytes);
    if (host_gbps <= 0) return 0.0;
    return 1.0 / (static_cast<double>(bytes) / (gbps * 1e9) + static_cast<double>(host_bytes) / (host_gbps * 1e9));
  }
};

DeviceBound device_bound(const SpeedArgs& a, const Engine& e, const SpeedResult& r) {
  DeviceBound b;
  const DeviceForward* d = e.device();
  if (!d) return b;
  b.id = d->device().id;
  b.name = d->device().name;
  const DeviceFootprint f = d->footprint();
  b.bytes = f.weights() + f.globals;
  if (d->first_layer() > 0) {
    b.host_bytes = e.footprint().weights();
    b.host_gbps = r.mem_bw_gbps;
  }
  if (a.device_gbps > 0) {
    b.gbps = a.device_gbps;
    b.source = "--device-gbps";
  } else if (d->device().caps.unified_memory && r.mem_bw_gbps > 0) {
    b.gbps = r.mem_bw_gbps;
    b.source = "host memory (unified with the device), probed";
  } else {
    b.source = "unknown (Vulkan reports no bandwidth; give it with --device-gbps)";
  }
  return b;
}

std::string format_mix(const SpeedResult& r) {
  uint64_t total = 0;
  for (const auto& [t, b] : r.bytes_by_type) total += b;
  std::string s;
  for (const auto& [t, b] : r.bytes_by_type) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", s.empty() ? "" : ", ", std::string(dtype_name(t)).c_str(),
                  total ? 100.0 * b / total : 0.0);
    s += buf;
  }
  return s;
}

std::string list(const std::vector<double>& v, const char* fmt) {
  std::string s;
  for (double x : v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, x);
    if (!s.empty()) s += ' ';
    s += buf;
  }
  return s;
}

void print_table(const SpeedArgs& a, const Engine& e, const SpeedResult& r) {
  const double mb = 1e6;
  const std::string name = e.config().name.empty() ? e.config().arch_name : e.config().name;
  std::printf("ebb bench speed: %s (%s)\n", name.c_str(), a.model.model.c_str());
  std::printf("  %-24s %s\n", "formats (streamed)", format_mix(r).c_str());
  std::printf("  %-24s %d\n", "threads", r.threads);
  std::printf("  %-24s %s\n", "isa", std::string(isa_name(r.isa)).c_str());
  const DeviceBound dev = device_bound(a, e, r);
  if (!dev.id.empty()) std::printf("  %-24s %s (%s)\n", "device", dev.id.c_str(), dev.name.c_str());
  std::printf("  %-24s prompt %lld tok, gen %lld tok, %lld reps (+1 warm-up), ctx %lld, batch %lld\n", "run",
              static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.gen_tokens),
              static_cast<long long>(r.reps), static_cast<long long>(r.n_ctx),
              static_cast<long long>(r.prefill_batch));
  std::printf("\n  %-24s %12s   %s\n", "metric", "median", "per rep");
  std::printf("  %-24s %12.1f   %s\n", "prefill tok/s", r.prefill_tok_s, list(r.prefill_tok_s_reps, "%.1f").c_str());
  std::printf("  %-24s %12.1f   %s\n", "decode tok/s", r.decode_tok_s, list(r.decode_tok_s_reps, "%.1f").c_str());
  std::printf("  %-24s %12.3f   layers %.3f + output head %.3f\n", "model MB / token", r.model_bytes / mb,
              r.layer_bytes / mb, r.output_head_bytes / mb);
  std::printf("  %-24s %12.2f   = model MB/token x decode tok/s\n", "achieved GB/s", r.achieved_gbps);
  if (!dev.id.empty()) {
    // On a device decode reads the weights from the device's memory.
    if (dev.gbps > 0) {
      std::printf("  %-24s %12.2f   %s\n", "device GB/s", dev.gbps, dev.source.c_str());
      std::printf("  %-24s %11.1f%%\n", "decode / bound", 100.0 * r.decode_tok_s / dev.bound_tok_s());
      if (dev.host_bytes > 0) {
        std::printf("  %-24s %12.1f   = 1 / (%.3f MB on the device / device GB/s + %.3f MB of the CPU's layers / "
                    "%.2f host GB/s)\n",
                    "decode bound tok/s", dev.bound_tok_s(), dev.bytes / mb, dev.host_bytes / mb, dev.host_gbps);
      } else {
        std::printf("  %-24s %12.1f   = device GB/s / %.3f MB read on the device per token\n", "decode bound tok/s",
                    dev.bound_tok_s(), dev.bytes / mb);
      }
    } else {
      std::printf("  %-24s %12s   %s\n", "device GB/s", "unknown", dev.source.c_str());
      std::printf("  %-24s %12s   = device GB/s / %.3f MB read on the device per token\n", "decode bound tok/s",
                  "unknown", dev.bytes / mb);
    }
  } else if (r.mem_bw_gbps > 0) {
    std::printf("  %-24s %12.2f   %s  (%.0f MiB read, %d threads)\n", "machine read GB/s", r.mem_bw_gbps,
                list(r.mem_bw_gbps_reps, "%.2f").c_str(), r.mem_bw_bytes / double(1 << 20), r.threads);
    std::printf("  %-24s %11.1f%%\n", "achieved / bound", 100.0 * r.achieved_fraction);
    std::printf("  %-24s %12.1f   = machine read GB/s / model MB per token\n", "decode roofline tok/s",
                r.decode_roofline_tok_s);
    std::printf("  %-24s %12.1f   memory only: one weight pass per %lld-token batch\n", "prefill roofline tok/s",
                r.prefill_roofline_tok_s, static_cast<long long>(r.prefill_batch));
  } else {
    std::printf("  %-24s %12s\n", "machine read GB/s", "skipped");
  }
  std::printf("  %-24s %12.2f   matmul FLOPs only (%.3f MFLOP/token)\n", "prefill GFLOP/s", r.prefill_gflops,
              r.matmul_flops_per_token / 1e6);
  if (r.llc_bytes > 0 && r.model_bytes <= r.llc_bytes) {
    std::printf("  note: the streamed weights (%.2f MB) fit in the %s last-level cache, so decode reads them from\n"
                "        cache and can beat the DRAM roofline.\n",
                r.model_bytes / mb, format_bytes(r.llc_bytes).c_str());
  }
}

nlohmann::json to_json(const SpeedArgs& a, const Engine& e, const SpeedResult& r) {
  nlohmann::json j;
  j["model"] = a.model.model;
  j["model_name"] = e.config().name;
  j["arch"] = e.config().arch_name;
  j["threads"] = r.threads;
  j["isa"] = std::string(isa_name(r.isa));
  j["prompt_tokens"] = r.prompt_tokens;
  j["gen_tokens"] = r.gen_tokens;
  j["reps"] = r.reps;
  j["n_ctx"] = r.n_ctx;
  j["prefill_batch"] = r.prefill_batch;
  j["prefill_tok_s"] = r.prefill_tok_s;
  j["decode_tok_s"] = r.decode_tok_s;
  j["prefill_tok_s_reps"] = r.prefill_tok_s_reps;
  j["decode_tok_s_reps"] = r.decode_tok_s_reps;
  j["prefill_seconds_reps"] = r.prefill_seconds_reps;
  j["decode_seconds_reps"] = r.decode_seconds_reps;
  j["model_bytes"] = r.model_bytes;
  j["layer_bytes"] = r.layer_bytes;
  j["output_head_bytes"] = r.output_head_bytes;
  nlohmann::json mix = nlohmann::json::object();
  for (const auto& [t, b] : r.bytes_by_type) mix[std::string(dtype_name(t))] = b;
  j["bytes_by_type"] = mix;
  j["matmul_flops_per_token"] = r.matmul_flops_per_token;
  j["achieved_gbps"] = r.achieved_gbps;
  j["mem_bw_gbps"] = r.mem_bw_gbps;
  j["mem_bw_gbps_reps"] = r.mem_bw_gbps_reps;
  j["mem_bw_bytes"] = r.mem_bw_bytes;
  j["achieved_fraction"] = r.achieved_fraction;
  j["decode_roofline_tok_s"] = r.decode_roofline_tok_s;
  j["prefill_roofline_tok_s"] = r.prefill_roofline_tok_s;
  j["prefill_gflops"] = r.prefill_gflops;
  j["llc_bytes"] = r.llc_bytes;
  const DeviceBound dev = device_bound(a, e, r);
  j["device"] = dev.id.empty() ? "cpu" : dev.id;
  if (!dev.id.empty()) {
    j["device_name"] = dev.name;
    j["device_gbps"] = dev.gbps;  // 0: unknown
    j["device_gbps_source"] = dev.source;
    j["device_bytes_per_token"] = dev.bytes;
    j["device_decode_bound_tok_s"] = dev.bound_tok_s();
    j["host_layer_bytes_per_token"] = dev.host_bytes;  // a split's CPU layers (0: all on the device)
  }
  return j;
}

int run_speed(SpeedArgs& a) {
  if (a.membw_mib < 0) throw Error("--membw-mib must be >= 0 (0 skips the probe), got " + std::to_string(a.membw_mib));
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const SessionOptions so = session_options(a.model);
  SpeedOptions o = a.speed;
  o.n_ctx = so.n_ctx;
  o.kv_chunk_size = so.kv_chunk_size;
  o.kv_type = so.kv_type;
  o.membw_bytes = static_cast<size_t>(a.membw_mib) << 20;
  // The host's bandwidth bounds a device only when the device shares its memory.
  // A split's CPU layers read host memory: then the probe runs for their part of the bound.
  if (const DeviceForward* d = engine->device();
      d && d->first_layer() == 0 && (!d->device().caps.unified_memory || a.device_gbps > 0))
    o.membw_bytes = 0;
  if (o.membw_bytes > 0) std::fprintf(stderr, "bench speed: measuring memory read bandwidth...\n");
  o.progress = [](int64_t rep, int64_t reps) {
    if (rep == 0) {
      std::fprintf(stderr, "bench speed: warm-up\n");
    } else {
      std::fprintf(stderr, "bench speed: rep %lld/%lld\n", static_cast<long long>(rep), static_cast<long long>(reps));
    }
  };
  const std::vector<AdapterBinding> adapters = adapter_bindings(a.model);
  if (adapters.empty()) {
    const SpeedResult r = bench_speed(*engine, o);
    if (a.json) {
      std::printf("%s\n", to_json(a, *engine, r).dump(2).c_str());
    } else {
      print_table(a, *engine, r);
    }
    std::fflush(stdout);
    return 0;
  }
  // With --lora: the base and the adapters in alternating rounds of the same
  // run (the machine is shared and noisy), each round's reps pooled.
  const int rounds = 3;
  SpeedResult base, lora, first_bw;
  auto pool_reps = [](SpeedResult& into, const SpeedResult& r) {
    const std::vector<double> p = into.prefill_tok_s_reps, d = into.decode_tok_s_reps;
    const double bw = into.mem_bw_gbps;
    into = r;
    into.prefill_tok_s_reps.insert(into.prefill_tok_s_reps.begin(), p.begin(), p.end());
    into.decode_tok_s_reps.insert(into.decode_tok_s_reps.begin(), d.begin(), d.end());
    if (r.mem_bw_gbps == 0) into.mem_bw_gbps = bw;
  };
  for (int round = 0; round < rounds; ++round) {
    SpeedOptions ob = o, ol = o;
    ol.adapters = adapters;
    if (round > 0) ob.membw_bytes = ol.membw_bytes = 0;
    ol.membw_bytes = 0;
    std::fprintf(stderr, "bench speed: round %d/%d, base model\n", round + 1, rounds);
    pool_reps(base, bench_speed(*engine, ob));
    if (round == 0) first_bw = base;
    std::fprintf(stderr, "bench speed: round %d/%d, with adapters\n", round + 1, rounds);
    pool_reps(lora, bench_speed(*engine, ol));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  for (SpeedResult* r : {&base, &lora}) {
    r->prefill_tok_s = median(r->prefill_tok_s_reps);
    r->decode_tok_s = median(r->decode_tok_s_reps);
    r->reps = static_cast<int64_t>(r->decode_tok_s_reps.size());
    r->mem_bw_gbps = first_bw.mem_bw_gbps;
    r->mem_bw_gbps_reps = first_bw.mem_bw_gbps_reps;
    r->mem_bw_bytes = first_bw.mem_bw_bytes;
    r->achieved_gbps = r->model_bytes * r->decode_tok_s / 1e9;
    if (r->mem_bw_gbps > 0) {
      r->achieved_fraction = r->achieved_gbps / r->mem_bw_gbps;
      r->decode_roofline_tok_s = r->mem_bw_gbps * 1e9 / static_cast<double>(r->model_bytes);
      r->prefill_roofline_tok_s = r->decode_roofline_tok_s * static_cast<double>(r->prefill_batch);
    }
  }
  // What an adapter adds to each decoded token: its A and B (F32), read once per token.
  uint64_t adapter_bytes = 0;
  std::string names;
  for (const AdapterInfo& i : engine->adapters().list()) {
    adapter_bytes += i.bytes;
    names += (names.empty() ? "" : ", ") + i.name + " (rank " + std::to_string(i.rank) + ", " + i.targets + ")";
  }
  // The bound: decode streams the weights and the adapter, so it can run at
  // best model / (model + adapter) of the base speed.
  const double bound = static_cast<double>(base.model_bytes) / static_cast<double>(base.model_bytes + adapter_bytes);
  const double prefill_ratio = base.prefill_tok_s > 0 ? lora.prefill_tok_s / base.prefill_tok_s : 0;
  const double decode_ratio = base.decode_tok_s > 0 ? lora.decode_tok_s / base.decode_tok_s : 0;
  if (a.json) {
    nlohmann::json j;
    j["base"] = to_json(a, *engine, base);
    j["lora"] = to_json(a, *engine, lora);
    j["adapters"] = names;
    j["adapter_bytes_per_token"] = adapter_bytes;
    j["prefill_ratio"] = prefill_ratio;
    j["decode_ratio"] = decode_ratio;
    j["decode_ratio_bound"] = bound;
    j["rounds"] = rounds;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_table(a, *engine, base);
    std::printf("\n  with adapters: %s\n", names.c_str());
    std::printf("  %-24s %12s %12s %8s   %s\n", "metric", "base", "lora", "ratio", "bound");
    std::printf("  %-24s %12.1f %12.1f %7.3fx   %s\n", "prefill tok/s", base.prefill_tok_s, lora.prefill_tok_s,
                prefill_ratio, "-");
    std::printf("  %-24s %12.1f %12.1f %7.3fx   %.3fx = model / (model + adapter) bytes per token\n", "decode tok/s",
                base.decode_tok_s, lora.decode_tok_s, decode_ratio, bound);
    std::printf("  %-24s %12.3f %12.3f\n", "MB read / token", base.model_bytes / 1e6,
                (base.model_bytes + adapter_bytes) / 1e6);
    std::printf("  %-24s %d rounds of base then lora, %lld reps each: medians over the pooled reps\n", "run", rounds,
                static_cast<long long>(o.reps));
  }
  std::fflush(stdout);
  return 0;
}

void add_speed_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<SpeedArgs>();
  CLI::App* sub = bench->add_subcommand("speed", "Prefill and decode tok/s against the machine's memory bandwidth");
  add_model_options(sub, a->model);
  sub->add_option("-p,--prompt-tokens", a->speed.prompt_tokens, "Prompt tokens fed in one prefill")
      ->capture_default_str();
  sub->add_option("-n,--gen-tokens", a->speed.gen_tokens, "Tokens decoded one at a time after the prompt")
      ->capture_default_str();
  sub->add_option("--reps", a->speed.reps, "Timed repetitions (after one warm-up); medians are reported")
      ->capture_default_str();
  sub->add_option("--seed", a->speed.seed, "Seed of the pseudo-random prompt token ids")->capture_default_str();
  sub->add_option("--membw-mib", a->membw_mib, "Memory-bandwidth probe buffer in MiB (0: skip the probe)")
      ->capture_default_str();
  sub->add_option("--device-gbps", a->device_gbps,
                  "With --device: the device's memory bandwidth in GB/s, for decode's bound (default: the host's, "
                  "probed, when the device shares its memory; else unknown)");
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_speed(*a); });
}

}  // namespace

void add_kvcodec_command(CLI::App* bench, int* rc);  // cmd_bench_kvcodec.cpp
void add_budget_command(CLI::App* bench, int* rc);   // cmd_bench_budget.cpp
void add_ttft_command(CLI::App* bench, int* rc);     // cmd_bench_ttft.cpp
void add_bench_batch_command(CLI::App* bench, int* rc);   // bench/bench_batch.cpp
void add_bench_prefix_command(CLI::App* bench, int* rc);  // bench/bench_prefix.cpp
void add_bench_serve_command(CLI::App* bench, int* rc);   // bench/bench_serve.cpp
void add_bench_pressure_command(CLI::App* bench, int* rc);  // bench/bench_pressure.cpp
void add_bench_train_command(CLI::App* bench, int* rc);   // bench/bench_train.cpp
void add_bench_sched_command(CLI::App* bench, int* rc);   // bench/bench_sched.cpp
void add_bench_grammar_command(CLI::App* bench, int* rc);  // bench/bench_grammar.cpp
void add_bench_agents_command(CLI::App* bench, int* rc);  // bench/bench_agents.cpp

void add_bench_command(CLI::App& app, int* rc) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks: speed (tok/s against memory bandwidth), kvcodec (KV compression), budget (tok/s "
               "against a memory budget), ttft (time to first token after eviction), batch (concurrent streams), prefix "
               "(TTFT after a cached prefix), serve (decode through the HTTP server), train (LoRA training tok/s beside prefill), sched (scheduler policies on a mixed "
               "workload), grammar (constrained decoding against none), agents (multi-agent handoffs with pre-prefill, "
               "training and publishes)");
  // Without a subcommand main names them (CLI11 would only say one is required).
  add_speed_command(bench, rc);
  add_kvcodec_command(bench, rc);
  add_budget_command(bench, rc);
  add_ttft_command(bench, rc);
  add_bench_batch_command(bench, rc);
  add_bench_prefix_command(bench, rc);
  add_bench_serve_command(bench, rc);
  add_bench_pressure_command(bench, rc);
  add_bench_train_command(bench, rc);
  add_bench_sched_command(bench, rc);
  add_bench_grammar_command(bench, rc);
  add_bench_agents_command(bench, rc);
}

}  // namespace ebb::cli
