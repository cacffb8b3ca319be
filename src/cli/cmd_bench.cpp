// ebb bench: placeholder registration until the benchmarks land.
#include "cli/options.h"

namespace ebb::cli {
void add_bench_command(CLI::App&, int*) {}
}  // namespace ebb::cli
