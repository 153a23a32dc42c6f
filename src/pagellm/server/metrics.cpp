#include "pagellm/server/metrics.h"

#include <algorithm>
#include <sstream>

namespace pagellm::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  if (it != bounds_.end()) ++counts_[static_cast<size_t>(it - bounds_.begin())];
  ++count_;
  sum_ += value;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n";
  out << name << "_sum " << sum_ << "\n" << name << "_count " << count_ << "\n";
  return out.str();
}

namespace {
// Seconds; the TTFT buckets reach minutes (long prompts queued under load), the
// inter-token ones stay under a second (vLLM's choice of ranges).
std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
          20.0, 40.0, 80.0, 160.0};
}
std::vector<double> itl_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
          0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
}
std::vector<double> e2e_bounds() {
  return {0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}

void gauge(std::ostringstream& out, const char* name, const char* help, double value,
           const char* type = "gauge") {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
      << name << " " << value << "\n";
}
}  // namespace

ServerMetrics::ServerMetrics() : ttft_(ttft_bounds()), itl_(itl_bounds()), e2e_(e2e_bounds()) {}

void ServerMetrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += n;
}

void ServerMetrics::add_generation_tokens(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_tokens_ += n;
}

void ServerMetrics::finish_request(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, count] : finished_) {
    if (name == reason) {
      ++count;
      return;
    }
  }
  finished_.emplace_back(reason, 1);
}

void ServerMetrics::count_http_error(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [code, count] : http_errors_) {
    if (code == status) {
      ++count;
      return;
    }
  }
  http_errors_.emplace_back(status, 1);
}

std::string ServerMetrics::render(const EngineLoad& load, const PrefixCacheStats& prefix,
                                  uint64_t weights_version) const {
  std::ostringstream out;
  gauge(out, "pagellm_num_requests_running", "Samples running in the engine now.",
        static_cast<double>(load.running));
  gauge(out, "pagellm_num_requests_waiting", "Samples waiting to run (queued or held by a pause).",
        static_cast<double>(load.waiting));
  gauge(out, "pagellm_kv_pages_total", "Usable KV-cache pages.", static_cast<double>(load.usable_pages));
  gauge(out, "pagellm_kv_pages_free", "Free KV-cache pages (unreferenced cached prefix pages count as free).",
        static_cast<double>(load.free_pages));
  gauge(out, "pagellm_kv_pages_used", "KV-cache pages held by requests.",
        static_cast<double>(load.usable_pages - load.free_pages));
  gauge(out, "pagellm_kv_cache_usage_perc", "Fraction of the KV-cache pages held by requests.",
        load.usable_pages > 0
            ? static_cast<double>(load.usable_pages - load.free_pages) / load.usable_pages
            : 0.0);
  gauge(out, "pagellm_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
        static_cast<double>(prefix.queried_tokens), "counter");
  gauge(out, "pagellm_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
        static_cast<double>(prefix.hit_tokens), "counter");
  gauge(out, "pagellm_prefix_cache_hit_rate", "Prefix-cache hits over lookups since start.",
        prefix.hit_rate());
  gauge(out, "pagellm_weights_version", "Version of the weights sampled with now.",
        static_cast<double>(weights_version));
  gauge(out, "pagellm_paused", "1 while generation is paused.", load.paused ? 1 : 0);
  gauge(out, "pagellm_asleep", "1 while the engine sleeps.", load.asleep ? 1 : 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    gauge(out, "pagellm_prompt_tokens_total", "Prompt tokens of the requests served.",
          static_cast<double>(prompt_tokens_), "counter");
    gauge(out, "pagellm_generation_tokens_total", "Tokens generated.",
          static_cast<double>(generation_tokens_), "counter");
    out << "# HELP pagellm_request_success_total Finished engine requests by finish reason.\n"
        << "# TYPE pagellm_request_success_total counter\n";
    for (const auto& [reason, count] : finished_) {
      out << "pagellm_request_success_total{finished_reason=\"" << reason << "\"} " << count << "\n";
    }
    out << "# HELP pagellm_http_errors_total Error responses by HTTP status.\n"
        << "# TYPE pagellm_http_errors_total counter\n";
    for (const auto& [status, count] : http_errors_) {
      out << "pagellm_http_errors_total{status=\"" << status << "\"} " << count << "\n";
    }
  }
  out << ttft_.render("pagellm_time_to_first_token_seconds",
                      "Time from a request's arrival to its first token.");
  out << itl_.render("pagellm_inter_token_latency_seconds",
                     "Time between a sample's successive tokens.");
  out << e2e_.render("pagellm_e2e_request_latency_seconds",
                     "Time from a request's arrival to its last token.");
  return out.str();
}

}  // namespace pagellm::server
