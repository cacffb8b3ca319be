#include "platform/checksum.h"

#include <array>
#include <cstring>

#include "platform/error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ebb {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

// table[k][b]: CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr auto kTables = make_tables();

// Raw (not inverted) register update over n zero bytes, from register r:
// r * x^(8n) mod P in the reflected representation.
constexpr uint32_t shift_zeros(uint32_t r, size_t n) {
  for (size_t i = 0; i < n; ++i) r = (r >> 8) ^ kTables[0][r & 0xFF];
  return r;
}

// a * b mod P, both reflected (bit 31 is x^0).
constexpr uint32_t mul_mod_p(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) p ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// kBytePowers[k] = x^(8 * 2^k) mod P: the shift of 2^k zero bytes.
constexpr std::array<uint32_t, 64> make_byte_powers() {
  std::array<uint32_t, 64> t{};
  t[0] = shift_zeros(1u << 31, 1);
  for (size_t k = 1; k < t.size(); ++k) t[k] = mul_mod_p(t[k - 1], t[k - 1]);
  return t;
}
constexpr auto kBytePowers = make_byte_powers();

#if defined(__x86_64__)
// x^(8 * lane) mod P: moves a lane's register past the lanes that follow it.
template <size_t kLane>
constexpr uint32_t kLaneShift = shift_zeros(1u << 31, kLane);

__attribute__((target("sse4.2"))) inline uint64_t crc_u64(uint64_t c, const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return _mm_crc32_u64(c, w);
}

// Three independent lanes hide the 3-cycle latency of the crc32 instruction;
// the lane registers are then joined by linearity:
// crc(A || B, c) = crc(A, c) * x^(8|B|) ^ crc(B, 0).
template <size_t kLane>
__attribute__((target("sse4.2"))) uint64_t crc_3lanes(const uint8_t*& p, size_t& n, uint64_t c) {
  for (; n >= 3 * kLane; n -= 3 * kLane, p += 3 * kLane) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      c = crc_u64(c, p + i);
      c1 = crc_u64(c1, p + kLane + i);
      c2 = crc_u64(c2, p + 2 * kLane + i);
    }
    constexpr uint32_t k = kLaneShift<kLane>;
    c = mul_mod_p(mul_mod_p(static_cast<uint32_t>(c), k) ^ static_cast<uint32_t>(c1), k) ^
        static_cast<uint32_t>(c2);
  }
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  c = crc_3lanes<4096>(p, n, c);
  c = crc_3lanes<256>(p, n, c);
  for (; n >= 8; n -= 8, p += 8) c = crc_u64(c, p);
  auto c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // crc(A || B) = crc(A) * x^(8|B|) ^ crc(B): the inverted start and end
  // values cancel out (crc(B, seed) = crc(B, 0) ^ seed * x^(8|B|)).
  uint32_t shift = 1u << 31;  // x^0
  for (size_t k = 0; len_b != 0; ++k, len_b >>= 1)
    if (len_b & 1) shift = mul_mod_p(shift, kBytePowers[k]);
  return mul_mod_p(crc_a, shift) ^ crc_b;
}

uint32_t crc32c_scalar(const void* data, size_t n, uint32_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~seed;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = c ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^ kTables[0][p[7]];
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool crc32c_hw_available() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("sse4.2");
  return ok;
#else
  return false;
#endif
}

uint32_t crc32c_hw(const void* data, size_t n, uint32_t seed) {
  EBB_CHECK(crc32c_hw_available());
#if defined(__x86_64__)
  return ~crc32c_sse42(static_cast<const uint8_t*>(data), n, ~seed);
#else
  return crc32c_scalar(data, n, seed);
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t seed) {
  return crc32c_hw_available() ? crc32c_hw(data, n, seed) : crc32c_scalar(data, n, seed);
}

}  // namespace ebb
