#include "pagellm/common/progress.h"

#include <cstdio>

namespace pagellm {

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled) {}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || finished_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const bool complete = done >= total;
  if (!complete && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double pct = 100.0 * static_cast<double>(done) / static_cast<double>(total);
  std::fprintf(stderr, "\r%s %5.1f%% (%.2f / %.2f GB)", label_.c_str(), pct, done / 1e9,
               total / 1e9);
  std::fflush(stderr);
  drawn_ = true;
  if (complete) finish();
}

void ProgressBar::finish() {
  if (drawn_ && !finished_) std::fputc('\n', stderr);
  finished_ = true;
}

}  // namespace pagellm
