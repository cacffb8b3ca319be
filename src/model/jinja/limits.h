// Bounds on what a chat template may cost. A GGUF file is untrusted input and
// its template is a program: these keep a hostile one from exhausting the
// stack, memory or time. Crossing any of them is an ebb::Error naming it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ebb {

struct JinjaLimits {
  int max_depth = 256;                       // parser nesting (statements, expressions) and macro call depth
  int64_t max_loop_iterations = 1'000'000;   // for-loop iterations in one render, all loops together
  size_t max_output_bytes = size_t(4) << 20; // the rendered text (and any macro's or block's output)
  size_t max_string_bytes = size_t(4) << 20; // any string a template builds ('x' * n, join, replace, ...)
  size_t max_list_items = size_t(1) << 20;   // any list a template builds (range, list * n, ...)
  int64_t max_work = 100'000'000;            // evaluation steps in one render (nodes, plus bytes built / 16)
  int64_t max_render_ms = 10'000;            // wall time of one render (checked every 4096 steps); 0: none
  // Native stack the parser and the renderer may use, measured from where
  // they start; keep it well below the calling thread's stack size.
  size_t max_stack_bytes = size_t(1) << 20;
};

}  // namespace ebb
