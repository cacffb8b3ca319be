// platform/hash.h: hash_words64, the identity of large buffers (an adapter's
// weights at every commit), sees every bit, every position and the length.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "platform/hash.h"

namespace ebb {
namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

TEST(HashWords64, EveryBitOfEveryByteChangesIt) {
  // 1000 bytes: 31 whole 32-byte rounds of the four lanes and an 8-byte tail.
  std::vector<uint8_t> v = pattern(1000);
  const uint64_t base = hash_words64(v.data(), v.size());
  std::set<uint64_t> seen{base};
  for (size_t i = 0; i < v.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      v[i] ^= static_cast<uint8_t>(1u << b);
      seen.insert(hash_words64(v.data(), v.size()));
      v[i] ^= static_cast<uint8_t>(1u << b);
    }
  }
  EXPECT_EQ(seen.size(), 1 + 8 * v.size()) << "two single-bit changes gave one hash";
  EXPECT_EQ(hash_words64(v.data(), v.size()), base);  // a function of the bytes alone
}

TEST(HashWords64, PositionsLengthAndSeedCount) {
  std::vector<uint8_t> v = pattern(256);
  const uint64_t base = hash_words64(v.data(), v.size());
  // Two words of one lane swapped (rounds 0 and 1), and two of one round.
  std::vector<uint8_t> w = v;
  std::memcpy(w.data(), v.data() + 32, 8);
  std::memcpy(w.data() + 32, v.data(), 8);
  EXPECT_NE(hash_words64(w.data(), w.size()), base);
  w = v;
  std::memcpy(w.data(), v.data() + 8, 8);
  std::memcpy(w.data() + 8, v.data(), 8);
  EXPECT_NE(hash_words64(w.data(), w.size()), base);
  // Zeros of every length from 0 to 99 bytes: all distinct.
  const std::vector<uint8_t> zeros(100, 0);
  std::set<uint64_t> lengths;
  for (size_t n = 0; n < zeros.size(); ++n) lengths.insert(hash_words64(zeros.data(), n));
  EXPECT_EQ(lengths.size(), zeros.size());
  // The seed continues a hash: another seed, another value.
  EXPECT_NE(hash_words64(v.data(), v.size(), 1), base);
  EXPECT_EQ(hash_words64(v.data(), v.size(), kFnv1a64Offset), base);
}

}  // namespace
}  // namespace ebb
