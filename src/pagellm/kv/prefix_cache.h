// The prefix cache's index: which KV page holds which token prefix.
//
// A full page is named by a hash chained over the tokens before it (vLLM's prefix caching,
// SGLang's radix cache flattened to pages):
//   hash(page i) = XXH3-64(hash(page i-1), salt, the page's page_size token ids)
// with hash(page -1) = 0, so equal hashes mean equal prefixes up to and including the page
// (up to a 64-bit collision), and the salt (weights version, LoRA adapter) keeps K/V
// computed under other weights from ever matching. The KvCacheManager owns one PrefixCache
// and keeps it consistent with the PageAllocator's cached marks; docs/design.md, "Prefix
// cache", gives the whole life of a cached page.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pagellm/prefix_cache_stats.h"

namespace pagellm {

/// A sequence's known tokens (prompt then output) without copying them.
struct SequenceTokens {
  const std::vector<int32_t>* prompt = nullptr;
  const std::vector<int32_t>* output = nullptr;

  int32_t size() const { return static_cast<int32_t>(prompt->size() + output->size()); }
  int32_t operator[](int32_t i) const {
    const int32_t p = static_cast<int32_t>(prompt->size());
    return i < p ? (*prompt)[i] : (*output)[i - p];
  }
};

/// The salt every page hash of a sequence carries: the weights version its K/V are
/// computed under and the LoRA adapter applied (0: none; adapters do not exist yet).
uint64_t prefix_cache_salt(uint64_t weights_version, uint64_t adapter_id);

/// hash(page) = XXH3-64 over (parent, salt, tokens[first .. first + page_size - 1]); parent
/// is the previous page's hash, 0 for the first page.
uint64_t prefix_page_hash(uint64_t parent, uint64_t salt, const SequenceTokens& tokens,
                          int32_t first, int32_t page_size);

/// Hash -> page and page -> hash for the pages whose contents are cached. At most one page
/// per hash: a second page with the same contents (two requests computing one prefix in
/// the same step) is simply not registered. Knows nothing of reference counts; the
/// KvCacheManager pairs every entry with PageAllocator::mark_cached.
class PrefixCache {
 public:
  explicit PrefixCache(int32_t num_pages);

  /// The page cached under `hash`, or -1.
  int32_t find(uint64_t hash) const;
  /// Registers `page` under `hash`; false (and nothing changes) when the hash is already
  /// taken. Throws Error when the page is already registered.
  bool insert(uint64_t hash, int32_t page);
  /// Forgets the page's entry (it was evicted). Throws Error for a page not registered.
  void erase_page(int32_t page);
  bool has_page(int32_t page) const { return has_hash_[page] != 0; }
  uint64_t hash_of(int32_t page) const { return hash_of_page_[page]; }
  /// Forgets every entry; returns the pages that were registered.
  std::vector<int32_t> clear();
  int32_t size() const { return static_cast<int32_t>(page_of_hash_.size()); }

  /// Verifies that the two maps are inverse of each other. Throws Error naming the first
  /// violation.
  void check_invariants() const;

 private:
  std::unordered_map<uint64_t, int32_t> page_of_hash_;
  std::vector<uint64_t> hash_of_page_;  // [num_pages]; valid where has_hash_
  std::vector<char> has_hash_;          // [num_pages]
};

}  // namespace pagellm
