// Prefix-cache statistics (a plain vocabulary type: the engine fills it, LLM and
// AsyncEngine return it).
#pragma once

#include <cstdint>

namespace pagellm {

/// What the prefix cache has done since the engine started (docs/design.md, "Prefix
/// cache"). A query is one admission of a sequence with nothing computed (a new request, or
/// a preempted one resuming): its known tokens, less the last one (which is always
/// computed), are looked up page by page.
struct PrefixCacheStats {
  /// Tokens looked up at admissions.
  int64_t queried_tokens = 0;
  /// Of those, tokens found in cached pages (their prefill was skipped).
  int64_t hit_tokens = 0;
  /// Cached pages evicted to make room (each a page whose contents were forgotten).
  int64_t evictions = 0;
  /// Pages whose contents the cache knows now, referenced or not.
  int64_t cached_pages = 0;
  /// Of those, pages no request holds (evictable; they count as free).
  int64_t cached_free_pages = 0;
  /// hit_tokens / queried_tokens; 0 before any query.
  double hit_rate() const {
    return queried_tokens > 0 ? static_cast<double>(hit_tokens) / queried_tokens : 0.0;
  }
};

}  // namespace pagellm
