// Two kinds of failure (STYLE habit 9):
//  - bad input (a malformed file, a full disk, an impossible request) throws
//    ebb::Error whose message names what, where and why;
//  - a bug trips EBB_CHECK, which stays on in release builds and aborts.
#pragma once

#include <stdexcept>
#include <string>

namespace ebb {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* msg);

}  // namespace ebb

#define EBB_CHECK(cond)                                                   \
  do {                                                                    \
    if (!(cond)) ::ebb::check_failed(#cond, __FILE__, __LINE__, nullptr); \
  } while (0)
#define EBB_CHECK_MSG(cond, msg)                                      \
  do {                                                                \
    if (!(cond)) ::ebb::check_failed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
