// Prometheus text exposition (format 0.0.4) of the server's counters, for GET /metrics.
//
// Families (all prefixed gemma4rt_):
//   requests_total, requests_finished_total, requests_rejected_total (queue full),
//   requests_cancelled_total, requests_failed_total, degenerate_responses_total   counters
//   prompt_tokens_total, generated_tokens_total                                   counters
//   time_to_first_token_seconds, time_per_output_token_seconds                    histograms
//   queue_depth, busy_slots, slots, kv_cache_tokens_used, kv_cache_tokens_capacity,
//   kv_cache_usage_ratio                                                          gauges
//   http_requests_total{status="..."}                                              counter (HttpCounters)
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "runtime/scheduler.h"

namespace g4::server {

// Responses per HTTP status, counted by the HTTP layer. Thread-safe.
class HttpCounters {
 public:
  void Count(int status);
  std::map<int, uint64_t> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
};

// The exposition text. `http` may be null.
std::string RenderMetrics(const SchedulerStats& stats, const std::map<int, uint64_t>* http = nullptr);

}  // namespace g4::server
