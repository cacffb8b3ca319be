// Names for the threads ebb starts, so that `top -H`, `perf report --sort comm`
// and a debugger tell the compute workers from the restore and I/O threads.
#pragma once

#include <string>
#include <string_view>

namespace ebb {

// Names the calling thread. Linux keeps 15 bytes of a name; a longer one is
// cut. Best effort: a platform without thread names ignores it.
void set_current_thread_name(std::string_view name);

// The calling thread's name ("" where the platform has none).
std::string current_thread_name();

}  // namespace ebb
