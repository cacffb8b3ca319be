#include "runtime/batch.h"

#include <algorithm>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace ebb {

int64_t run_step(Engine& engine, std::span<Session* const> sessions) {
  Forward& fwd = engine.forward();
  int64_t budget = fwd.max_batch();
  // Rows wanted and given per session.
  std::vector<Session*> in;
  std::vector<int64_t> want, give;
  for (Session* s : sessions) {
    EBB_CHECK(&s->engine() == &engine);
    EBB_CHECK_MSG(std::find(in.begin(), in.end(), s) == in.end(), "a session appears twice in one step");
    const int64_t w = s->n_pending() > 0 ? s->n_pending() : (s->has_logits() || s->tokens().empty() ? 0 : 1);
    if (w == 0 || budget == 0) continue;
    in.push_back(s);
    want.push_back(w);
    give.push_back(1);
    --budget;
  }
  if (in.empty()) return 0;
  // The rest in turn, one row at a time per pass, so no session takes all.
  for (bool more = true; more && budget > 0;) {
    more = false;
    for (size_t i = 0; i < in.size() && budget > 0; ++i) {
      if (give[i] >= want[i]) continue;
      const int64_t extra = std::min({want[i] - give[i], budget, std::max<int64_t>(1, budget / static_cast<int64_t>(in.size()))});
      give[i] += extra;
      budget -= extra;
      more = true;
    }
  }
  std::vector<StepSeq> seqs;
  seqs.reserve(in.size());
  std::vector<int64_t> ran(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const Session::StepPart p = in[i]->prepare_step(give[i]);
    ran[i] = static_cast<int64_t>(p.tokens.size());
    seqs.push_back({p.kv, p.tokens, p.logits, false, p.adapters});
  }
  fwd.run_batch(seqs, engine.weight_source());
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    in[i]->finish_step(ran[i]);
    total += ran[i];
  }
  return total;
}

int64_t step_generations(Engine& engine, std::span<Generation* const> gens) {
  std::vector<Session*> sessions;
  for (Generation* g : gens) {
    if (g->done() || g->cancelled()) continue;
    Session& s = g->session();
    if (s.n_pending() > 0 || !s.has_logits()) sessions.push_back(&s);
  }
  run_step(engine, sessions);
  int64_t running = 0;
  for (Generation* g : gens) {
    if (g->done()) continue;
    g->after_forward();
    running += g->done() ? 0 : 1;
  }
  return running;
}

}  // namespace ebb
