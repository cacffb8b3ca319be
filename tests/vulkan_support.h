// Shared by the tests/test_vulkan_*.cpp: the Vulkan backend opened once per
// test binary, and a clean skip (with the reason printed) where no Vulkan
// device exists at all. CI installs Mesa's lavapipe, so there they run.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ebb::test {

// The first Vulkan device, opened on first use; nullptr (and *why set) when
// there is none.
inline Backend* vulkan_backend(std::string* why) {
  static std::string reason;
  static std::unique_ptr<Backend> be = [] {
    std::vector<DeviceInfo> devs = list_gpu_devices(&reason);
    if (devs.empty()) return std::unique_ptr<Backend>();
    return open_backend("vulkan:0");
  }();
  if (why) *why = reason;
  return be.get();
}

// Skips the test when there is no Vulkan device, unless the environment has
// EBB_TEST_REQUIRE_VULKAN=1 (scripts/test.sh sets it: CI installs lavapipe,
// so a missing device there is a failure, not a skip).
inline bool vulkan_required() {
  const char* v = std::getenv("EBB_TEST_REQUIRE_VULKAN");
  return v && std::strcmp(v, "1") == 0;
}

#define EBB_REQUIRE_VULKAN(be)                                                                       \
  std::string why_no_vulkan_;                                                                        \
  ::ebb::Backend* be = ::ebb::test::vulkan_backend(&why_no_vulkan_);                                 \
  if (!be) {                                                                                         \
    if (::ebb::test::vulkan_required()) FAIL() << "no Vulkan device (" << why_no_vulkan_ << ")";     \
    GTEST_SKIP() << "no Vulkan device (" << why_no_vulkan_ << "); install mesa-vulkan-drivers for " \
                 << "lavapipe, a CPU Vulkan driver";                                                 \
  }

// A device buffer holding `data`.
template <typename T>
std::unique_ptr<BackendBuffer> upload(Backend& be, const std::vector<T>& data, uint64_t pad_front = 0) {
  auto buf = be.alloc(pad_front + data.size() * sizeof(T), MemoryPlace::kDevice);
  buf->write(pad_front, data.data(), data.size() * sizeof(T));
  return buf;
}

template <typename T>
std::vector<T> download(BackendBuffer& buf, size_t n, uint64_t offset = 0) {
  std::vector<T> out(n);
  buf.read(offset, out.data(), n * sizeof(T));
  return out;
}

}  // namespace ebb::test
