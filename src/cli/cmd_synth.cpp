// ebb synth: placeholder registration until the synthetic-model writer lands.
#include "cli/options.h"

namespace ebb::cli {
void add_synth_command(CLI::App&, int*) {}
}  // namespace ebb::cli
