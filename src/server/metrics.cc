#include "server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace g4::server {
namespace {

// Shortest of %.15g / %.17g that reads back as `v` (0.005, not 0.0050000000000000001).
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP gemma4rt_") + name + " " + help + "\n";
  *out += std::string("# TYPE gemma4rt_") + name + " " + type + "\n";
}

void Sample(std::string* out, const char* name, double v, const std::string& labels = "") {
  *out += std::string("gemma4rt_") + name + (labels.empty() ? "" : "{" + labels + "}") + " " + Num(v) + "\n";
}

void Scalar(std::string* out, const char* name, const char* type, const char* help, double v) {
  Family(out, name, type, help);
  Sample(out, name, v);
}

// Buckets are cumulative (each counts observations <= its bound), as the scheduler keeps them.
void Histogram(std::string* out, const char* name, const char* help, const uint64_t* buckets, uint64_t count, double sum) {
  Family(out, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t prev = 0;
  for (int i = 0; i < SchedulerStats::kNumBuckets; ++i) {
    prev = std::max(prev, buckets[i]);  // keep the series monotonic whatever happens
    Sample(out, bucket.c_str(), static_cast<double>(prev), "le=\"" + Num(SchedulerStats::kBuckets[i]) + "\"");
  }
  Sample(out, bucket.c_str(), static_cast<double>(std::max(prev, count)), "le=\"+Inf\"");
  Sample(out, (std::string(name) + "_sum").c_str(), sum);
  Sample(out, (std::string(name) + "_count").c_str(), static_cast<double>(std::max(prev, count)));
}

}  // namespace

void HttpCounters::Count(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++by_status_[status];
}

std::map<int, uint64_t> HttpCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_status_;
}

std::string RenderMetrics(const SchedulerStats& s, const std::map<int, uint64_t>* http) {
  std::string o;
  o.reserve(4096);
  Scalar(&o, "requests_total", "counter", "Completion requests accepted into the queue.", s.requests_total);
  Scalar(&o, "requests_finished_total", "counter", "Completion requests that ended (any reason).", s.requests_finished);
  Scalar(&o, "requests_rejected_total", "counter", "Completion requests refused because the queue was full.", s.requests_rejected);
  Scalar(&o, "requests_cancelled_total", "counter", "Completion requests cancelled (client gone or shutdown).", s.requests_cancelled);
  Scalar(&o, "requests_failed_total", "counter", "Completion requests ended by an internal error.", s.requests_failed);
  Scalar(&o, "degenerate_responses_total", "counter", "Generations ended by the degeneracy (loop) guard.", s.requests_degenerate);
  Scalar(&o, "prompt_tokens_total", "counter", "Prompt tokens processed (prefill).", s.prompt_tokens_total);
  Scalar(&o, "prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache instead of prefilled.",
         s.prompt_tokens_cached_total);
  Scalar(&o, "generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens_total);
  Histogram(&o, "time_to_first_token_seconds", "Time from queueing a request to its first token.", s.ttft_bucket, s.ttft_count,
            s.ttft_sum);
  Histogram(&o, "time_per_output_token_seconds", "Time between consecutive generated tokens of a request.", s.tpot_bucket,
            s.tpot_count, s.tpot_sum);
  Scalar(&o, "queue_depth", "gauge", "Requests waiting for a slot.", s.queue_depth);
  Scalar(&o, "busy_slots", "gauge", "Slots serving a request.", s.busy_slots);
  Scalar(&o, "slots", "gauge", "Slots (parallel sequences).", s.slots);
  Scalar(&o, "kv_cache_tokens_used", "gauge", "KV cache positions in use over all slots.", static_cast<double>(s.kv_tokens_used));
  Scalar(&o, "kv_cache_tokens_capacity", "gauge", "KV cache positions over all slots.", static_cast<double>(s.kv_tokens_capacity));
  Scalar(&o, "kv_cache_usage_ratio", "gauge", "kv_cache_tokens_used / kv_cache_tokens_capacity.",
         s.kv_tokens_capacity > 0 ? static_cast<double>(s.kv_tokens_used) / static_cast<double>(s.kv_tokens_capacity) : 0.0);
  if (http) {
    Family(&o, "http_requests_total", "counter", "HTTP responses by status code.");
    for (const auto& [status, n] : *http) Sample(&o, "http_requests_total", static_cast<double>(n), "status=\"" + std::to_string(status) + "\"");
  }
  return o;
}

}  // namespace g4::server
