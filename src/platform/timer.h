// Monotonic wall-clock timing.
#pragma once

#include <chrono>

namespace ebb {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  double seconds() const { return now_seconds() - start_; }
  void restart() { start_ = now_seconds(); }

 private:
  double start_;
};

}  // namespace ebb
