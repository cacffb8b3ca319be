// ebb bench batch --choices N (bench_choices.cpp): n choices of one request
// through the scheduler against one choice.
#pragma once

#include <cstdint>

#include "cli/options.h"

namespace ebb::cli {

struct ChoicesBenchArgs {
  ModelArgs model;
  int choices = 0;
  int64_t prompt = 128;
  int64_t gen = 64;
  int64_t reps = 3;
  bool json = false;
};

int run_choices_bench(const ChoicesBenchArgs& a);

}  // namespace ebb::cli
