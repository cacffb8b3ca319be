// ebb bench kvcodec: KV chunk compression (space saving, speed, accuracy) of
// the quantizing codecs next to lz4 / zstd, as a table or JSON.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "platform/error.h"
#include "bench/bench_kvcodec.h"

namespace ebb::cli {
namespace {

struct KvCodecArgs {
  ModelArgs model;
  KvCodecBenchOptions bench;
  std::string codec_isa;
  bool json = false;
};

void print_table(const KvCodecArgs& a, const Engine& e, const KvCodecBenchResult& r) {
  const std::string name = e.config().name.empty() ? e.config().arch_name : e.config().name;
  std::printf("ebb bench kvcodec: %s (%s)\n", name.c_str(), a.model.model.c_str());
  std::printf("  KV: %lld tokens, %lld layers, %lld chunks of %lld tokens, row %lld x %s, %s raw\n",
              static_cast<long long>(r.context), static_cast<long long>(r.n_layer), static_cast<long long>(r.n_chunks),
              static_cast<long long>(r.chunk_tokens), static_cast<long long>(r.row_dim), a.model.kv_type.c_str(),
              format_bytes(r.raw_bytes).c_str());
  std::printf("  codec target %s, one core, medians of %lld reps; accuracy over %lld continuation tokens\n",
              std::string(isa_name(r.isa)).c_str(), static_cast<long long>(r.reps),
              static_cast<long long>(r.continuation));
  std::printf("\n  %-8s %9s %13s %15s %12s %10s\n", "codec", "saving %", "compress GB/s", "decompress GB/s", "KL (nats)",
              "top-1");
  for (const auto& row : r.rows) {
    std::printf("  %-8s %9.2f %13.3f %15.3f", row.codec.c_str(), row.saving_pct, row.compress_gbps,
                row.decompress_gbps);
    if (row.has_accuracy) {
      std::printf(" %12.2e %9.1f%%\n", row.kl_div, 100.0 * row.top1_agree);
    } else {
      std::printf(" %12s %10s\n", "-", "-");
    }
  }
  std::printf("  %-8s %9s %13s %15.3f   (bound: one-core copy of the same bytes)\n", "memcpy", "", "", r.memcpy_gbps);
}

nlohmann::json to_json(const KvCodecBenchResult& r) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json j;
    j["codec"] = row.codec;
    j["saving_pct"] = row.saving_pct;
    j["compress_gbps"] = row.compress_gbps;
    j["decompress_gbps"] = row.decompress_gbps;
    j["kl_div"] = row.has_accuracy ? nlohmann::json(row.kl_div) : nlohmann::json(nullptr);
    j["top1_agree"] = row.has_accuracy ? nlohmann::json(row.top1_agree) : nlohmann::json(nullptr);
    arr.push_back(j);
  }
  return arr;
}

int run_kvcodec(KvCodecArgs& a) {
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const SessionOptions so = session_options(a.model);
  KvCodecBenchOptions o = a.bench;
  o.kv_chunk_size = so.kv_chunk_size;
  o.kv_type = so.kv_type;
  if (!a.codec_isa.empty()) {
    o.isa = parse_isa(a.codec_isa);
    if (!o.isa) throw Error("--codec-isa '" + a.codec_isa + "' is not one of scalar, avx2, avx512, neon");
  }
  o.progress = [](const std::string& s) { std::fprintf(stderr, "bench kvcodec: %s\n", s.c_str()); };
  const KvCodecBenchResult r = bench_kvcodec(*engine, o);
  if (a.json) {
    std::printf("%s\n", to_json(r).dump(2).c_str());
  } else {
    print_table(a, *engine, r);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_kvcodec_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<KvCodecArgs>();
  CLI::App* sub = bench->add_subcommand("kvcodec", "KV chunk compression: int8/int4 codecs against lz4 and zstd");
  add_model_options(sub, a->model);
  sub->add_option("--context", a->bench.context, "Prompt tokens whose KV is compressed (clamped to the model)")
      ->capture_default_str();
  sub->add_option("--continuation", a->bench.continuation, "Tokens fed after the round trip to measure accuracy")
      ->capture_default_str();
  sub->add_option("--reps", a->bench.reps, "Timed repetitions; medians are reported")->capture_default_str();
  sub->add_option("--codec-isa", a->codec_isa, "Codec target: scalar, avx2, avx512, neon (default: the engine's)");
  sub->add_flag("--zstd19", a->bench.zstd19, "Also run zstd at level 19 (slow)");
  sub->add_flag("--json", a->json, "Print one JSON array of rows instead of the table");
  sub->callback([a, rc] { *rc = run_kvcodec(*a); });
}

}  // namespace ebb::cli
