// The CPU backend: backend.h over ebb's existing CPU kernels (matmul,
// ops, attention), each op run at once on the calling thread and a thread
// pool, buffers from the platform allocator (its ledger). The reference the
// GPU backends are compared with through one interface.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "kernels/cpu.h"

namespace ebb {

struct CpuBackendOptions {
  Isa isa = Isa::kScalar;  // the kernels' target (best_isa() for speed; scalar is the reference)
  int n_threads = 1;       // the pool's threads
};

// Throws ebb::Error when the target is not supported on this CPU.
std::unique_ptr<Backend> open_cpu_backend(const CpuBackendOptions& opts = {});

}  // namespace ebb
