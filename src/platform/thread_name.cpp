#include "platform/thread_name.h"

#include <pthread.h>

#include <algorithm>

namespace ebb {

namespace {
constexpr size_t kMaxName = 15;  // the kernel's TASK_COMM_LEN less the NUL
}  // namespace

void set_current_thread_name(std::string_view name) {
  char buf[kMaxName + 1] = {};
  name.copy(buf, std::min(name.size(), kMaxName));
#if defined(__linux__)
  pthread_setname_np(pthread_self(), buf);
#elif defined(__APPLE__)
  pthread_setname_np(buf);
#endif
}

std::string current_thread_name() {
#if defined(__linux__) || defined(__APPLE__)
  char buf[64] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof buf) == 0) return buf;
#endif
  return {};
}

}  // namespace ebb
