// CRC-32C (Castagnoli), the checksum of every swap slot and weight layer.
// The hardware path (SSE4.2 crc32 instruction) is chosen once, at first use,
// from a runtime CPU check; the table-driven scalar version is the reference.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ebb {

// Standard CRC-32C (reflected polynomial 0x82F63B78, initial and final value
// inverted). `seed` is the result of a previous call, so a buffer may be
// checksummed in pieces: crc32c(b, n) == crc32c(b + k, n - k, crc32c(b, k)).
uint32_t crc32c(const void* data, size_t n, uint32_t seed = 0);

// The CRC-32C of A followed by B from crc32c(A), crc32c(B) and B's length,
// so pieces of a buffer can be checksummed on several threads and joined:
// crc32c_combine(crc32c(a, k), crc32c(a + k, n - k), n - k) == crc32c(a, n).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The two implementations behind crc32c(), for tests and benchmarks.
uint32_t crc32c_scalar(const void* data, size_t n, uint32_t seed = 0);
bool crc32c_hw_available();  // this binary has the SSE4.2 path and the CPU runs it
uint32_t crc32c_hw(const void* data, size_t n, uint32_t seed = 0);  // needs crc32c_hw_available()

}  // namespace ebb
