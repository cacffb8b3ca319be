// Instruction-set targets. The target is chosen once, at engine start-up,
// from what the CPU has (or forced lower by an option); kernels never test
// CPU features per call (STYLE habit 4).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace ebb {

enum class Isa {
  kScalar,  // portable reference
  kAvx2,    // x86-64: AVX2 + FMA + F16C
  kAvx512,  // x86-64: AVX-512 F/BW/VL + VNNI
  kNeon,    // aarch64: NEON + dot product
};

std::string_view isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);  // "scalar", "avx2", "avx512", "neon"
bool isa_compiled(Isa isa);   // this binary contains kernels for it
bool isa_supported(Isa isa);  // compiled and the running CPU can execute it
Isa best_isa();               // the fastest supported target
std::vector<Isa> supported_isas();  // every supported target, scalar first

}  // namespace ebb
