// Instruction-set targets. The target is chosen once, at engine start-up,
// from what the CPU has (or forced lower by an option); kernels never test
// CPU features per call (STYLE habit 4).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace ebb {

enum class Isa {
  kScalar,  // portable; the reference every SIMD kernel is checked against
  kAvx2,    // x86-64: AVX2 + FMA + F16C
  kAvx512,  // x86-64: AVX-512 F/BW/VL + VNNI
  kNeon,    // aarch64: NEON + dot product
  // Portable scalar kernels that round in the order of the reference engine
  // the golden logits come from (its x86 AVX-512 build), so ebb's logits can
  // be compared with them to print precision. Slow; for validation, never
  // chosen by best_isa().
  kRefEngine,
};

std::string_view isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);  // "scalar", "avx2", "avx512", "neon", "ref-engine"
bool isa_compiled(Isa isa);   // this binary contains kernels for it
bool isa_supported(Isa isa);  // compiled and the running CPU can execute it
Isa best_isa();               // the fastest supported target
std::vector<Isa> supported_isas();  // every supported target, scalar first, ref-engine last

// True when the running CPU executes 512-bit vector instructions as two
// 256-bit halves (AMD Zen 4: family 0x19 with AVX-512), so AVX-512 gains no
// arithmetic width over AVX2 and a kernel whose AVX-512 form spends more on
// cross-lane reductions is slower in it (attention's scores); such kernels
// pick their AVX2 variant inside the AVX-512 target. Read from CPUID once.
bool avx512_in_halves();
namespace detail {
// avx512_in_halves() for a given CPU: AMD family 0x19 (Zen 3 and Zen 4; only
// Zen 4 has AVX-512).
bool avx512_in_halves_for(bool amd, unsigned family, bool avx512f);
}  // namespace detail

}  // namespace ebb
