// A one-line progress bar on stderr for long work (loading, writing, benchmarks).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace pagellm {

/// Draws "label  42% (1.2 / 2.9 GB)" on stderr, redrawn at most ten times a second, and
/// ends the line when done == total. Silent when `enabled` is false.
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled = true);
  void update(uint64_t done, uint64_t total);
  /// Ends the line if anything was drawn.
  void finish();
  ~ProgressBar() { finish(); }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace pagellm
