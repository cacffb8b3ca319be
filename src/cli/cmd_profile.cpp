// ebb profile: measures the device once (direct reads over a grid of request
// sizes and queue depths, writes, KV codecs, allocation) and saves the
// profile the hybrid-swap policy derives its per-unit times from. With -m it
// also prints those times and the threshold T for a model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "kernels/cpu.h"
#include "kernels/kv_codec.h"
#include "memory/device_profile.h"
#include "memory/hybrid_policy.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

struct ProfileArgs {
  std::string dir;
  std::string out;
  std::string from;  // print this saved profile instead of measuring
  std::string model;
  std::string codec = "int8";
  std::string isa;
  double seconds = 0.3;
  int64_t file_mib = 512;
  int64_t kv_chunk = 256;
  bool quick = false;
  bool json = false;
};

// What the profile means for one model.
struct ModelTimes {
  std::string name;
  int64_t n_layer = 0;
  uint64_t layer_bytes = 0;     // weight layer 0 (all layers have the same shape)
  uint64_t kv_chunk_bytes = 0;  // K and V of one chunk, F16
  UnitTimes t;
  int64_t chunks_per_layer = 0;
  int64_t threshold = 0;
  double compressed_share = 0;
};

ModelTimes model_times(const ProfileArgs& a, const DeviceProfile& p) {
  const auto file = GgufFile::open(a.model);
  const ModelConfig c = read_model_config(*file);
  const WeightLayout layout = plan_weights(*file, c);
  if (layout.layers.empty()) throw Error(a.model + ": the model has no transformer layers");
  ModelTimes m;
  m.name = c.name.empty() ? c.arch_name : c.name;
  m.n_layer = c.n_layer;
  m.layer_bytes = layout.layers[0].bytes();
  m.kv_chunk_bytes = 2ull * static_cast<uint64_t>(a.kv_chunk) * static_cast<uint64_t>(c.kv_dim()) * 2;  // K+V, F16
  m.t = p.unit_times(m.kv_chunk_bytes, m.layer_bytes, a.codec);
  const HybridSwapPolicy pol(m.t, 0, c.n_layer);
  m.chunks_per_layer = pol.chunks_per_layer();
  m.threshold = pol.threshold();
  m.compressed_share = pol.compressed_share();
  return m;
}

std::string size_label(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(b >> 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(b >> 10));
  }
  return buf;
}

void print_reads(const DeviceProfile& p) {
  std::vector<int> qds;
  std::vector<uint64_t> sizes;
  for (const ReadPoint& r : p.reads) {
    if (std::find(qds.begin(), qds.end(), r.queue_depth) == qds.end()) qds.push_back(r.queue_depth);
    if (std::find(sizes.begin(), sizes.end(), r.request_bytes) == sizes.end()) sizes.push_back(r.request_bytes);
  }
  std::printf("\n  direct reads, GB/s (random offsets; request size x queue depth)\n  %-10s", "request");
  for (int q : qds) std::printf(" %7s", ("qd " + std::to_string(q)).c_str());
  std::printf("\n");
  for (uint64_t s : sizes) {
    std::printf("  %-10s", size_label(s).c_str());
    for (int q : qds) {
      double g = NAN;
      bool confirmed = false;
      for (const ReadPoint& r : p.reads) {
        if (r.request_bytes == s && r.queue_depth == q) {
          g = r.gbps;
          confirmed = r.confirmed;
        }
      }
      const bool chosen = s == p.best_request_bytes && q == p.best_queue_depth;
      std::printf(" %6.2f%s", g, chosen ? "*" : confirmed ? "+" : " ");
    }
    std::printf("\n");
  }
  std::printf("  (* chosen; + measured twice, the lower figure kept)\n");
}

void print_profile(const DeviceProfile& p, const ProfileArgs& a, const ModelTimes* m, const std::string& saved) {
  std::printf("ebb profile: %s%s\n", p.device.c_str(), p.direct_io ? "" : "  [no O_DIRECT: reads may be cached]");
  print_reads(p);
  bool confirmed = false;
  for (const ReadPoint& r : p.reads)
    if (r.request_bytes == p.best_request_bytes && r.queue_depth == p.best_queue_depth) confirmed = r.confirmed;
  std::printf("\n  %-28s %s x %d = %.2f GB/s (fewest bytes in flight within 5%% of the best%s)\n",
              "chosen read point", size_label(p.best_request_bytes).c_str(), p.best_queue_depth, p.read_gbps,
              confirmed ? ", held on a second run" : "");
  std::printf("  %-28s %.2f GB/s\n", "direct writes at that point", p.write_gbps);
  std::printf("  %-28s %.2f GB/s (mmap, page faults and munmap through ebb::Allocator)\n", "allocate + first touch",
              p.alloc_gbps);
  std::printf("\n  KV codecs, one thread (F16 chunk of 256 x 1024, normal values)\n");
  std::printf("  %-8s %8s %15s %17s\n", "codec", "saving", "compress GB/s", "decompress GB/s");
  for (const CodecPoint& c : p.codecs) {
    std::printf("  %-8s %7.1f%% %15.2f %17.2f\n", c.codec.c_str(), 100.0 * (1.0 - c.ratio), c.compress_gbps,
                c.decompress_gbps);
  }
  if (m != nullptr) {
    std::printf("\n  model %s (%s): %lld layers of %s, KV chunk (%lld tokens, K+V F16) %s, codec %s\n",
                m->name.c_str(), a.model.c_str(), static_cast<long long>(m->n_layer),
                format_bytes(m->layer_bytes).c_str(), static_cast<long long>(a.kv_chunk),
                format_bytes(m->kv_chunk_bytes).c_str(), a.codec.c_str());
    std::printf("  %-28s %.3f ms (decompress + allocate one KV chunk)\n", "t_d", m->t.t_d * 1e3);
    std::printf("  %-28s %.3f ms (read one KV chunk)\n", "t_rKV", m->t.t_rkv * 1e3);
    std::printf("  %-28s %.3f ms (read one weight layer)\n", "t_rW", m->t.t_rw * 1e3);
    std::printf("  %-28s %lld = floor(t_rW / t_d), at least 1\n", "chunks per dropped layer",
                static_cast<long long>(m->chunks_per_layer));
    std::printf("  %-28s %lld chunks = %lld layers x %lld: KVonly above a context of %lld tokens\n", "threshold T",
                static_cast<long long>(m->threshold), static_cast<long long>(m->n_layer),
                static_cast<long long>(m->chunks_per_layer),
                static_cast<long long>(m->chunks_per_layer * a.kv_chunk));
    std::printf("  %-28s %.1f%% of KVonly chunks compressed, the rest to storage\n", "KVonly split",
                100.0 * m->compressed_share);
    if (m->kv_chunk_bytes < p.best_request_bytes) {
      std::printf("  note: a KV chunk (%s) is smaller than the chosen read request (%s); t_rKV assumes chunk\n"
                  "        reads are batched into requests of that size\n",
                  format_bytes(m->kv_chunk_bytes).c_str(), format_bytes(p.best_request_bytes).c_str());
    }
  }
  if (a.quick) std::printf("\n  note: --quick measures a small grid briefly; run without it for the real profile\n");
  std::printf("\n  %s %s\n", a.from.empty() ? "saved to" : "read from", saved.c_str());
}

nlohmann::json model_json(const ProfileArgs& a, const ModelTimes& m) {
  return {{"model", a.model},
          {"name", m.name},
          {"n_layer", m.n_layer},
          {"layer_bytes", m.layer_bytes},
          {"kv_chunk_tokens", a.kv_chunk},
          {"kv_chunk_bytes", m.kv_chunk_bytes},
          {"codec", a.codec},
          {"t_d", m.t.t_d},
          {"t_rkv", m.t.t_rkv},
          {"t_rw", m.t.t_rw},
          {"chunks_per_layer", m.chunks_per_layer},
          {"threshold", m.threshold},
          {"compressed_share", m.compressed_share}};
}

int run_profile(const ProfileArgs& a) {
  ProfileOptions o;
  o.dir = a.dir;
  o.quick = a.quick;
  if (!(a.seconds > 0)) throw Error("--seconds must be > 0, got " + std::to_string(a.seconds));
  if (a.file_mib < 1) throw Error("--file-mib must be >= 1, got " + std::to_string(a.file_mib));
  if (a.kv_chunk < 1) throw Error("--kv-chunk must be >= 1, got " + std::to_string(a.kv_chunk));
  o.seconds_per_point = a.seconds;
  o.file_bytes = static_cast<uint64_t>(a.file_mib) << 20;
  if (!a.isa.empty()) {
    const auto isa = parse_isa(a.isa);
    if (!isa || !isa_supported(*isa)) throw Error("--isa '" + a.isa + "' is unknown or not supported by this CPU");
    o.isa = *isa;
  }
  parse_kv_codec(a.codec);  // a bad name fails before the minutes of measuring
  const bool measure = a.from.empty();
  const DeviceProfile p = measure ? measure_device_profile(o,
                                                           [](std::string_view line) {
                                                             std::fprintf(stderr, "%.*s\n",
                                                                          static_cast<int>(line.size()), line.data());
                                                           })
                                  : DeviceProfile::load(a.from);
  std::unique_ptr<ModelTimes> m;
  if (!a.model.empty()) m = std::make_unique<ModelTimes>(model_times(a, p));
  const std::string saved = measure ? (a.out.empty() ? default_profile_path() : a.out) : a.from;
  if (measure) p.save(saved);
  if (a.json) {
    nlohmann::json j = p.to_json();
    j[measure ? "saved" : "from"] = saved;
    if (m) j["model"] = model_json(a, *m);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_profile(p, a, m.get(), saved);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* sub = app.add_subcommand("profile", "Measure storage, KV codecs and allocation; save the device profile");
  sub->add_option("--dir", a->dir, "Directory on the storage to measure (default: the swap directory)");
  sub->add_option("--out", a->out, "Where to save the profile (default: " + default_profile_path() + ")");
  sub->add_option("--from", a->from, "Print this saved profile (and the model's times) instead of measuring");
  sub->add_option("-m,--model", a->model, "GGUF model: also print its per-unit times and threshold T");
  sub->add_option("--codec", a->codec, "KV codec for the model's t_d (int8, int4)")->capture_default_str();
  sub->add_option("--kv-chunk", a->kv_chunk, "KV chunk size in tokens for the model's unit times")
      ->capture_default_str();
  sub->add_option("--isa", a->isa, "Codec target (scalar, avx2, ...; default: the best this CPU runs)");
  sub->add_option("--seconds", a->seconds, "Seconds per measured point")->capture_default_str();
  sub->add_option("--file-mib", a->file_mib, "Size of the test file in MiB")->capture_default_str();
  sub->add_flag("--quick", a->quick, "A small grid, measured briefly (for tests)");
  sub->add_flag("--json", a->json, "Print the profile as JSON instead of tables");
  sub->callback([a, rc] { *rc = run_profile(*a); });
}

}  // namespace ebb::cli
