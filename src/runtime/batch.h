// Several conversations in one forward pass (DESIGN.md "Per-call state"):
// each session contributes rows with its own chunk table and positions; every
// weight matrix is read once per step for all of them, attention runs per
// session over its own chunks.
#pragma once

#include <cstdint>
#include <span>

namespace ebb {

class Engine;
class Session;
class Generation;

// One step for several sessions of one engine (each at most once): every
// session that has pending tokens (or needs its logits again) gets one row,
// then the step's remaining rows (up to the engine's prefill batch) go to
// the sessions with more pending tokens, in turn, so a long prefill shares
// the step with other sessions' decode tokens. Sessions that do not fit in
// this step wait for the next. Returns the tokens run.
int64_t run_step(Engine& engine, std::span<Session* const> sessions);

// Advances several generations by one step together: their pending tokens
// run in one forward pass (run_step), then each samples what follows.
// Cancelled generations end without running. Returns how many still run.
int64_t step_generations(Engine& engine, std::span<Generation* const> gens);

}  // namespace ebb
