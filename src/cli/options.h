// Command-line options shared by the subcommands, each declared once with its
// help text (STYLE habit 14).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ebb::cli {

struct ModelArgs {
  std::string model;
  int threads = 0;
  std::string isa;
  int64_t ctx = 0;
  int64_t kv_chunk = 256;
  std::string kv_type = "f16";
  bool f16_attention = false;
  int64_t batch = 64;
  std::string memory_budget;          // budget mode: "600MiB", "1.5GiB", "40%" (empty: off)
  std::string budget_system = "ebb";  // budget mode planner / baseline
  int budget_window = 3;              // budget mode prefetch window in layers
  std::string swap_dir;               // elastic memory: swap files ("": the user's cache directory)
  std::string kv_codec = "int8";      // elastic memory: codec of compressed KV
  std::string evict_order = "backward";
  std::string overlap = "full";
  std::string profile;                // device profile ("": the saved one, else defaults)
};

void add_model_options(CLI::App* app, ModelArgs& a);
void add_sampling_options(CLI::App* app, SamplerOptions& s);

// Builds the engine and a session from the options; errors are ebb::Error.
std::unique_ptr<Engine> make_engine(const ModelArgs& a);
EngineOptions engine_options(const ModelArgs& a);
SessionOptions session_options(const ModelArgs& a);

// "1.5 MiB"
std::string format_bytes(uint64_t b);
// The one-line run summary (STYLE habit 13): tok/s, TTFT, footprint, output hash.
std::string summary_line(const Engine& e, const GenerateStats& st);

// Each registers its subcommand; the subcommand's exit status goes to *rc.
void add_run_command(CLI::App& app, int* rc);
void add_chat_command(CLI::App& app, int* rc);
void add_inspect_command(CLI::App& app, int* rc);
void add_synth_command(CLI::App& app, int* rc);
void add_bench_command(CLI::App& app, int* rc);
void add_profile_command(CLI::App& app, int* rc);
// The device profile of a --profile option: that file ("": the saved one, or
// the built-in defaults when none was saved).
DeviceProfile load_profile_option(const std::string& path);

}  // namespace ebb::cli
