// FNV-1a, 64-bit: a fast non-cryptographic hash for identities (model
// fingerprints, cache keys, token spans). Not a checksum for data at rest:
// that is CRC-32C (platform/checksum.h).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ebb {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// Continues the hash h over n bytes.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// An identity of a large buffer (an adapter's weights: tens of MB, hashed
// at every optimizer commit) fast: 10 ms for 40 MiB where fnv1a64, one
// multiply per byte in one dependency chain, takes 74 ms. Four lanes
// over 8-byte words, each its own chain of the round xxHash64 uses
// (lane = rotl(lane + word * P2, 31) * P1: the word's bits spread by one
// multiply, the rotation brings high bits low before the next), then the
// lanes, the tail bytes and the length folded in with fnv1a64. A different
// function from fnv1a64, not a faster way to compute it.
inline uint64_t hash_words64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  uint64_t lane[4] = {h, h ^ 0xbf58476d1ce4e5b9ull, h ^ 0x94d049bb133111ebull, h ^ 0xd6e8feb86659fd93ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, sizeof w);
      lane[k] = std::rotl(lane[k] + w * kP2, 31) * kP1;
    }
  }
  h = fnv1a64(lane, sizeof lane, h);
  h = fnv1a64(p + i, n - i, h);
  const uint64_t len = n;
  return fnv1a64(&len, sizeof len, h);
}

}  // namespace ebb
