#include "kernels/cpu.h"

#if defined(EBB_ARCH_ARM)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#if defined(EBB_ARCH_X86)
#include <cpuid.h>

#include <cstring>
#endif

namespace ebb {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
    case Isa::kRefEngine: return "ref-engine";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kRefEngine})
    if (isa_name(i) == name) return i;
  return std::nullopt;
}

bool isa_compiled(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
    case Isa::kRefEngine: return true;
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2:
    case Isa::kAvx512: return true;
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: return true;
#endif
    default: return false;
  }
}

bool isa_supported(Isa isa) {
  if (!isa_compiled(isa)) return false;
  switch (isa) {
    case Isa::kScalar:
    case Isa::kRefEngine: return true;
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    case Isa::kAvx512:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512bf16");
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: {
      // The NEON kernels use the int8 dot product (SDOT) and half-precision
      // arithmetic and conversions (armv8.2-a+dotprod+fp16).
      const unsigned long hw = getauxval(AT_HWCAP);
      const unsigned long need = HWCAP_ASIMDDP | HWCAP_FPHP | HWCAP_ASIMDHP;
      return (hw & need) == need;
    }
#endif
    default: return false;
  }
}

Isa best_isa() {
  for (Isa i : {Isa::kAvx512, Isa::kAvx2, Isa::kNeon})
    if (isa_supported(i)) return i;
  return Isa::kScalar;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kRefEngine})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

namespace detail {

bool avx512_in_halves_for(bool amd, unsigned family, bool avx512f) { return amd && family == 0x19 && avx512f; }

}  // namespace detail

bool avx512_in_halves() {
#if defined(EBB_ARCH_X86)
  static const bool halves = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    // Family: the base field, plus the extended one when the base is 0xF.
    unsigned family = (a >> 8) & 0xF;
    if (family == 0xF) family += (a >> 20) & 0xFF;
    return detail::avx512_in_halves_for(std::strcmp(vendor, "AuthenticAMD") == 0, family,
                                        __builtin_cpu_supports("avx512f"));
  }();
  return halves;
#else
  return false;
#endif
}

}  // namespace ebb
