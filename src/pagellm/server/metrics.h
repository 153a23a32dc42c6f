// What GET /metrics reports, in the Prometheus text format (version 0.0.4): counters and
// histograms the HTTP side records, plus the engine's load read when scraped.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "pagellm/async_engine.h"
#include "pagellm/prefix_cache_stats.h"

namespace pagellm::server {

/// A cumulative Prometheus histogram: counts per upper bound (seconds), sum and count.
/// Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  /// The "# HELP", "# TYPE" and sample lines for metric `name`.
  std::string render(const std::string& name, const std::string& help) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative (summed when rendered)
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

/// The server's metrics. Token counters and latency histograms are recorded by the request
/// handlers (from the engine callbacks, so the times are those of the engine loop).
class ServerMetrics {
 public:
  ServerMetrics();
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  /// One finished request (an engine request: one prompt) with its OpenAI finish reason.
  void finish_request(const std::string& reason);
  void count_http_error(int status);
  Histogram& time_to_first_token() { return ttft_; }
  Histogram& inter_token_latency() { return itl_; }
  Histogram& e2e_latency() { return e2e_; }

  /// Everything, with the engine's state as given.
  std::string render(const EngineLoad& load, const PrefixCacheStats& prefix,
                     uint64_t weights_version) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::vector<std::pair<std::string, int64_t>> finished_;  // reason -> count
  std::vector<std::pair<int, int64_t>> http_errors_;       // status -> count
  Histogram ttft_, itl_, e2e_;
};

}  // namespace pagellm::server
