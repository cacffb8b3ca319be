// Calendar time, for what is stored or shown with a date (trace rows,
// version records, gate results): seconds since the Unix epoch. Durations
// and deadlines use platform/timer.h's monotonic now_seconds() instead.
#pragma once

#include <chrono>

namespace ebb {

inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ebb
