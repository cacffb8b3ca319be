// Shared by the engine-level Vulkan tests (test_vulkan_engine, _kv, _lora,
// _split, _restore, _limit, _stream): how far a device's logits are from the
// CPU's, the CPU engine they are compared with, the prompts and sessions the
// KV tests use, and a prefill or greedy run's logits.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb::test {

// Normalised mean squared error of got against ref: Σ(got - ref)² / Σ ref².
inline double nmse(std::span<const float> got, std::span<const float> ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return err / std::max(norm, 1e-30);
}

inline int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The reference: one thread, scalar kernels, on ../shared/models/MODEL.gguf.
inline EngineOptions cpu_options(const std::string& model) {
  EngineOptions eo;
  eo.model_path = model_path(model + ".gguf");
  eo.n_threads = 1;
  eo.isa = Isa::kScalar;
  return eo;
}

inline std::vector<float> copy(std::span<const float> v) { return {v.begin(), v.end()}; }

// An engine on `be` (nullptr: the CPU), one thread, scalar kernels, the file at `path`.
inline EngineOptions device_options(const std::string& path, Backend* be) {
  EngineOptions eo;
  eo.model_path = path;
  eo.n_threads = 1;
  eo.isa = Isa::kScalar;
  eo.backend = be;
  return eo;
}

// The logits of the prompt's last token, from a fresh session.
inline std::vector<float> prefill(Engine& e, const std::vector<int32_t>& prompt) {
  Session s(e);
  return copy(s.feed(prompt));
}

struct Greedy {
  std::vector<int32_t> tokens;             // greedy continuation
  std::vector<std::vector<float>> logits;  // each step's
};

// Feeds the prompt, then `n` greedy tokens one at a time; `each` runs after every step.
template <typename F>
Greedy greedy(Session& s, const std::vector<int32_t>& prompt, int n, F&& each) {
  Greedy r;
  std::vector<float> l = copy(s.feed(prompt));
  each();
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(l);
    r.tokens.push_back(t);
    r.logits.push_back(l);
    l = copy(s.feed({&t, 1}));
    each();
  }
  return r;
}

// stories260K's first golden prompt and its greedy continuation: 13 tokens or more.
inline std::vector<int32_t> long_tokens() {
  const std::vector<GoldenCase> golden = load_golden("stories260K");
  std::vector<int32_t> all = golden[0].prompt_tokens;
  for (int32_t t : golden[0].greedy_tokens) all.push_back(t);
  return all;
}

// Sessions with KV chunks of `chunk` tokens (small, so short prompts span several).
inline SessionOptions chunked(int64_t chunk = 4) {
  SessionOptions so;
  so.kv_chunk_size = chunk;
  return so;
}

// What f throws as an ebb::Error, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Rewrites the file in place (same inode) with `bytes`, its mtime set back
// to `mtime` (as `rsync --inplace -t` would): only its ctime tells.
inline void rewrite_in_place(const std::string& path, const std::vector<char>& bytes, const timespec& mtime) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  const timespec times[2] = {mtime, mtime};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
}

}  // namespace ebb::test
