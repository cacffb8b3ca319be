// aarch64 target. NEON kernels (vdotq_s32 int8 dots, fp16 conversions) are
// not written yet: this target currently runs the scalar rows, so Arm builds
// link and stay correct. Replace rows here as NEON versions are added and
// tested on Arm hardware (tests/test_matmul.cpp checks every row against the
// scalar reference on every supported target).
#include "kernels/quant_blocks.h"

namespace ebb {

FormatTable neon_format_table() { return scalar_format_table(); }

}  // namespace ebb
