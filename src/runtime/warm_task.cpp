#include "runtime/warm_task.h"

#include <string>

#include "platform/error.h"
#include "platform/timer.h"

namespace ebb {

std::unique_ptr<Session> open_warm_session(Engine& engine, const CacheKey& key, std::span<const TokenId> tokens,
                                           const std::vector<AdapterBinding>& bindings, std::string_view what) {
  SessionOptions so;
  so.n_ctx = static_cast<int64_t>(tokens.size()) + 1;
  so.kv_chunk_size = key.chunk_size;
  so.kv_type = key.kv_type;
  so.f16_attention = key.f16_accumulator;
  so.cache_namespace = key.ns;
  so.use_prefix_cache = false;
  auto session = std::make_unique<Session>(engine, so);
  session->set_adapters(bindings);
  session->append(tokens);
  if (session->cache_key() != key)
    throw Error(std::string(what) + ": the session's cache key is not the one planned for");
  return session;
}

WarmStep run_warm_step(Session& session, int64_t mb, int64_t max_tokens, double step_seconds, double t0) {
  WarmStep r;
  while (r.tokens < max_tokens && session.n_pending() > 0) {
    const double m0 = now_seconds();
    r.tokens += session.step(mb);
    const double now = now_seconds();
    if (step_seconds > 0 && r.tokens < max_tokens && session.n_pending() > 0 && now - t0 + (now - m0) > step_seconds) {
      r.timed = true;
      break;
    }
  }
  return r;
}

}  // namespace ebb
