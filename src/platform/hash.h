// FNV-1a, 64-bit: a fast non-cryptographic hash for identities (model
// fingerprints, cache keys, token spans). Not a checksum for data at rest:
// that is CRC-32C (platform/checksum.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ebb {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// Continues the hash h over n bytes.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace ebb
