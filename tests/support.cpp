#include "support.h"

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ebb::test {

std::string shared_path(const std::string& rel) {
  return std::string(EBB_SHARED_DIR) + "/" + rel;
}

std::string model_path(const std::string& name) { return shared_path("models/" + name); }

// The reference engine wrote raw token bytes into greedy_text, which for the
// random-weight models is not always valid UTF-8; the JSON parser rejects
// that, so invalid bytes become '?'. Only greedy_text is affected.
static std::string sanitize_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

std::vector<GoldenCase> load_golden(const std::string& model_name) {
  return load_golden_file(shared_path("golden/models/" + model_name + ".jsonl"));
}

std::vector<GoldenCase> load_golden_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open golden file " + path);
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(sanitize_utf8(line));
    GoldenCase c;
    c.prompt = j.at("prompt").get<std::string>();
    c.prompt_tokens = j.at("prompt_tokens").get<std::vector<int32_t>>();
    c.greedy_tokens = j.at("greedy_tokens").get<std::vector<int32_t>>();
    c.greedy_text = j.value("greedy_text", "");
    c.logits = j.at("logits").get<std::vector<std::vector<float>>>();
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string make_temp_dir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CliResult run_cli(const std::string& args, const std::string& stdin_text) {
  const std::string dir = make_temp_dir("ebb-cli");
  const std::string err_path = dir + "/err", in_path = dir + "/in";
  if (FILE* f = std::fopen(in_path.c_str(), "w")) {
    std::fputs(stdin_text.c_str(), f);
    std::fclose(f);
  }
  const std::string cmd = std::string(EBB_CLI_PATH) + " " + args + " <" + in_path + " 2>" + err_path;
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (FILE* f = std::fopen(err_path.c_str(), "r")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) r.err.append(buf.data(), n);
    std::fclose(f);
  }
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace ebb::test
