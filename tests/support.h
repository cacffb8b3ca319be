// Helpers shared by the test files: where ../shared is, golden JSONL loading.
#pragma once
#include <string>
#include <vector>
#include <cstdint>

namespace ebb::test {

// Absolute path of a file under ../shared (the read-only reference folder).
std::string shared_path(const std::string& rel);
// Path of a file under shared/models/.
std::string model_path(const std::string& name);

// One prompt of a golden file in shared/golden/models/NAME.jsonl.
struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;   // with BOS
  std::vector<int32_t> greedy_tokens;   // greedy continuation
  std::string greedy_text;
  std::vector<std::vector<float>> logits;  // [prompt_tokens + greedy_tokens - 1][n_vocab]
};
std::vector<GoldenCase> load_golden(const std::string& model_name);
// A golden file by its path (the LoRA goldens are in shared/golden/lora/).
std::vector<GoldenCase> load_golden_file(const std::string& path);

// A fresh empty directory under the system temp dir, removed by the caller.
std::string make_temp_dir(const std::string& prefix);

// A fresh temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ebb-test") : path_(make_temp_dir(prefix)) {}
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs the ebb binary with `args` (shell words) and `stdin_text` on its
// standard input; returns its exit status and what it wrote to each stream.
struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};
CliResult run_cli(const std::string& args, const std::string& stdin_text = "");

}  // namespace ebb::test
