// GET /metrics: Prometheus text from the scheduler's metrics.
#include <cstdio>

#include "serve/server_impl.h"

namespace ebb::serve {

void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += " ";
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " ";
  out += type;
  out += "\n";
}

void sample(std::string& out, const std::string& name, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += name;
  out += buf;
}

std::string label(const char* key, const std::string& value) {
  std::string v;
  for (char c : value) {
    if (c == '\\' || c == '"') v += '\\';
    if (c == '\n') {
      v += "\\n";
      continue;
    }
    v += c;
  }
  return std::string("{") + key + "=\"" + v + "\"}";
}

std::string Server::Impl::metrics() const {
  const SchedulerMetrics m = sched.metrics();
  std::string o;
  metric(o, "ebb_requests_total", "counter", "Generation requests by outcome");
  sample(o, "ebb_requests_total" + label("outcome", "submitted"), static_cast<double>(m.fg_submitted));
  sample(o, "ebb_requests_total" + label("outcome", "completed"), static_cast<double>(m.fg_completed));
  sample(o, "ebb_requests_total" + label("outcome", "cancelled"), static_cast<double>(m.fg_cancelled));
  sample(o, "ebb_requests_total" + label("outcome", "failed"), static_cast<double>(m.fg_failed));
  sample(o, "ebb_requests_total" + label("outcome", "rejected"), static_cast<double>(m.fg_rejected));
  metric(o, "ebb_requests_deferred_memory_total", "counter",
         "Generation requests that waited because the memory limit had no room for their KV");
  sample(o, "ebb_requests_deferred_memory_total", static_cast<double>(m.fg_deferred_memory));
  {
    const HttpCounters h = http.counters();
    metric(o, "ebb_http_connections", "gauge", "Open HTTP connections");
    sample(o, "ebb_http_connections", static_cast<double>(http.open_connections()));
    metric(o, "ebb_http_refused_total", "counter", "Requests and connections refused by the HTTP layer, by reason");
    sample(o, "ebb_http_refused_total" + label("reason", "connection_cap"), static_cast<double>(h.refused_connections));
    sample(o, "ebb_http_refused_total" + label("reason", "head_timeout"), static_cast<double>(h.head_timeouts));
    sample(o, "ebb_http_refused_total" + label("reason", "body_timeout"), static_cast<double>(h.body_timeouts));
    sample(o, "ebb_http_refused_total" + label("reason", "body_too_large"), static_cast<double>(h.refused_bodies));
    sample(o, "ebb_http_refused_total" + label("reason", "unauthorized"), static_cast<double>(h.refused_unauthorized));
    metric(o, "ebb_http_body_waits_total", "counter", "Requests that waited for room among the bodies in flight");
    sample(o, "ebb_http_body_waits_total", static_cast<double>(h.body_waits));
    metric(o, "ebb_http_pipelined_total", "counter", "Requests that arrived behind another on one connection");
    sample(o, "ebb_http_pipelined_total", static_cast<double>(h.pipelined));
  }
  metric(o, "ebb_tokens_generated_total", "counter", "Tokens generated");
  sample(o, "ebb_tokens_generated_total", static_cast<double>(m.generated_tokens));
  metric(o, "ebb_prompt_tokens_total", "counter", "Prompt tokens of finished requests");
  sample(o, "ebb_prompt_tokens_total", static_cast<double>(m.prompt_tokens));
  metric(o, "ebb_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV came from the prefix cache");
  sample(o, "ebb_prompt_tokens_cached_total", static_cast<double>(m.cached_tokens));
  metric(o, "ebb_decode_tokens_per_second", "gauge", "Tokens generated per second of foreground rounds (EMA)");
  sample(o, "ebb_decode_tokens_per_second", m.decode_tok_s);
  metric(o, "ebb_foreground_busy_seconds_total", "counter", "Time spent in foreground rounds");
  sample(o, "ebb_foreground_busy_seconds_total", m.fg_busy_s);
  metric(o, "ebb_background_busy_seconds_total", "counter", "Time spent in background steps");
  sample(o, "ebb_background_busy_seconds_total", m.bg_busy_s);
  metric(o, "ebb_rounds_total", "counter", "Foreground rounds (batched steps)");
  sample(o, "ebb_rounds_total", static_cast<double>(m.rounds));
  metric(o, "ebb_queue_length", "gauge", "Tasks waiting, by class");
  sample(o, "ebb_queue_length" + label("class", "foreground"), static_cast<double>(m.fg_waiting));
  sample(o, "ebb_queue_length" + label("class", "background"), static_cast<double>(m.bg_waiting));
  metric(o, "ebb_running", "gauge", "Foreground tasks running together");
  sample(o, "ebb_running", static_cast<double>(m.fg_running));
  metric(o, "ebb_queue_wait_seconds", "summary", "Foreground wait from submission to admission");
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.5\"}", m.wait_p50_s);
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.95\"}", m.wait_p95_s);
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.99\"}", m.wait_p99_s);
  sample(o, "ebb_queue_wait_seconds_sum", m.wait_sum_s);
  sample(o, "ebb_queue_wait_seconds_count", static_cast<double>(m.wait_count));
  metric(o, "ebb_queue_wait_max_seconds", "gauge", "Longest foreground wait");
  sample(o, "ebb_queue_wait_max_seconds", m.wait_max_s);
  metric(o, "ebb_queue_wait_behind_seconds_total", "counter",
         "Foreground wait attributed to the kind of work that ran meanwhile");
  for (const auto& [kind, s] : m.wait_behind_s)
    sample(o, "ebb_queue_wait_behind_seconds_total" + label("kind", kind), s);
  metric(o, "ebb_background_tasks_total", "counter", "Background tasks by outcome");
  sample(o, "ebb_background_tasks_total" + label("outcome", "submitted"), static_cast<double>(m.bg_submitted));
  sample(o, "ebb_background_tasks_total" + label("outcome", "completed"), static_cast<double>(m.bg_completed));
  sample(o, "ebb_background_tasks_total" + label("outcome", "cancelled"), static_cast<double>(m.bg_cancelled));
  sample(o, "ebb_background_tasks_total" + label("outcome", "failed"), static_cast<double>(m.bg_failed));
  sample(o, "ebb_background_tasks_total" + label("outcome", "rejected"), static_cast<double>(m.bg_rejected));
  metric(o, "ebb_background_steps_total", "counter", "Background steps run");
  sample(o, "ebb_background_steps_total", static_cast<double>(m.bg_steps));
  metric(o, "ebb_background_deferred_total", "counter", "Times a background task was held back, by rule");
  sample(o, "ebb_background_deferred_total" + label("rule", "memory"), static_cast<double>(m.bg_deferred_memory));
  sample(o, "ebb_background_deferred_total" + label("rule", "window"), static_cast<double>(m.bg_deferred_window));
  metric(o, "ebb_background_over_window_total", "counter",
         "Background steps run past the window rule after waiting on an idle engine (window_starvation_s)");
  sample(o, "ebb_background_over_window_total", static_cast<double>(m.bg_over_window));
  metric(o, "ebb_background_aged_total", "counter",
         "Background steps picked ahead of higher-utility tasks after being passed over (background_aging_s)");
  sample(o, "ebb_background_aged_total", static_cast<double>(m.bg_aged));
  metric(o, "ebb_background_share_total", "counter",
         "Background steps picked ahead of the others because their kind was below its guaranteed share");
  sample(o, "ebb_background_share_total", static_cast<double>(m.bg_share));
  metric(o, "ebb_background_share_over_foreground_total", "counter",
         "Background steps run ahead of waiting or running foreground work because their kind was below its "
         "guaranteed share of the engine's time");
  sample(o, "ebb_background_share_over_foreground_total", static_cast<double>(m.bg_share_fg));
  metric(o, "ebb_background_seconds_total", "counter", "Seconds of background steps, by kind");
  for (const auto& [kind, sec] : m.bg_busy_by_kind_s) sample(o, "ebb_background_seconds_total" + label("kind", kind), sec);
  metric(o, "ebb_scheduler_idle_seconds_total", "counter",
         "Seconds the scheduler had nothing it could run, in all and while background tasks were held back");
  sample(o, "ebb_scheduler_idle_seconds_total" + label("background", "none"), m.idle_s - m.idle_bg_waiting_s);
  sample(o, "ebb_scheduler_idle_seconds_total" + label("background", "held_back"), m.idle_bg_waiting_s);
  metric(o, "ebb_background_pending", "gauge",
         "Waiting background tasks held back at their last check, by reason (memory: m + reserve > free; window)");
  sample(o, "ebb_background_pending" + label("reason", "memory"), static_cast<double>(m.bg_pending_memory));
  sample(o, "ebb_background_pending" + label("reason", "window"), static_cast<double>(m.bg_pending_window));
  metric(o, "ebb_offload_requests_total", "counter",
         "Offload requests made before admitting a background task, by result");
  sample(o, "ebb_offload_requests_total" + label("result", "requested"), static_cast<double>(m.offload_requests));
  sample(o, "ebb_offload_requests_total" + label("result", "admitted"), static_cast<double>(m.offload_admitted));
  sample(o, "ebb_offload_requests_total" + label("result", "short"), static_cast<double>(m.offload_short));
  metric(o, "ebb_offload_freed_bytes_total", "counter", "Bytes offload requests gave back");
  sample(o, "ebb_offload_freed_bytes_total", static_cast<double>(m.offload_freed_bytes));
  metric(o, "ebb_prefix_cache_lookups_total", "counter", "Prefix cache lookups");
  sample(o, "ebb_prefix_cache_lookups_total", static_cast<double>(m.prefix_cache.lookups));
  metric(o, "ebb_prefix_cache_hits_total", "counter", "Prefix cache lookups that found a prefix");
  sample(o, "ebb_prefix_cache_hits_total", static_cast<double>(m.prefix_cache.hits));
  metric(o, "ebb_prefix_cache_hit_tokens_total", "counter", "Tokens served from the prefix cache");
  sample(o, "ebb_prefix_cache_hit_tokens_total", static_cast<double>(m.prefix_cache.hit_tokens));
  metric(o, "ebb_prefix_cache_dropped_chunks_total", "counter", "Prefix cache chunks dropped over its limit");
  sample(o, "ebb_prefix_cache_dropped_chunks_total", static_cast<double>(m.prefix_cache.dropped_chunks));
  const Footprint& f = m.footprint;
  metric(o, "ebb_memory_bytes", "gauge", "Memory the LLM holds, by category (engine footprint)");
  uint64_t weights = 0, kv = 0;
  for (uint64_t b : f.weights_per_layer) weights += b;
  for (uint64_t b : f.kv_per_layer) kv += b;
  const std::pair<const char*, uint64_t> cats[] = {{"weights", weights},
                                                   {"globals", f.globals},
                                                   {"kv", kv},
                                                   {"kv_spare", f.kv_spare},
                                                   {"scratch", f.scratch},
                                                   {"compressed", f.compressed},
                                                   {"io_buffers", f.io_buffers},
                                                   {"adapters", f.adapters},
                                                   {"training", f.training},
                                                   {"kv_stored", f.kv_stored},
                                                   {"weights_stored", f.weights_stored}};
  for (const auto& [name, bytes] : cats)
    sample(o, "ebb_memory_bytes" + label("category", name), static_cast<double>(bytes));
  metric(o, "ebb_memory_total_bytes", "gauge", "Memory the LLM holds in RAM");
  sample(o, "ebb_memory_total_bytes", static_cast<double>(f.total()));
  metric(o, "ebb_http_responses_total", "counter", "HTTP responses by status");
  {
    std::lock_guard lock(stats_mu);
    for (const auto& [status, n] : responses)
      sample(o, "ebb_http_responses_total" + label("status", std::to_string(status)), static_cast<double>(n));
    metric(o, "ebb_streams_cancelled_total", "counter", "Streaming clients that went away mid-answer");
    sample(o, "ebb_streams_cancelled_total", static_cast<double>(streams_cancelled));
  }
  memory_metrics(o);
  adapter_metrics(o);
  training_metrics(o);
  learning_metrics(o);
  handoff_metrics(o);
  pressure_metrics(o);
  return o;
}

}  // namespace ebb::serve
