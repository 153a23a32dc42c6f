// The KV cache manager: the one owner of the page allocator and the page table.
//
// The scheduler decides who runs; the manager decides whether the pages are there and hands
// them out (nano-vllm's BlockManager, vLLM v1's KVCacheManager). It lives in kv/ rather
// than engine/ because it is page bookkeeping: it must not know what a request is
// (prompts, sampling, outputs), and the layer rule makes that checkable. It sees a sequence
// only through KvSequence, the part of engine/sequence.h's Sequence that it reads and
// writes.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "pagellm/kv/page_allocator.h"
#include "pagellm/kv/page_table.h"
#include "pagellm/kv/prefix_cache.h"
#include "pagellm/prefix_cache_stats.h"

namespace pagellm {

/// What the KV cache manager tracks of one sequence. Sequence (engine/sequence.h) derives
/// from it. `pages` and `slot` are written only by the manager.
struct KvSequence {
  int64_t id = 0;
  /// Tokens whose K/V are in the cache; allocate() covers num_computed + n tokens.
  int32_t num_computed = 0;
  /// Physical pages of the sequence's logical blocks, in order; one reference each.
  std::vector<int32_t> pages;
  /// Page-table row while the sequence holds pages; 0 (the reserved row) otherwise.
  int32_t slot = 0;
  /// Prefix-cache chain hashes of the first full pages (prefix_cache.h), as far as they
  /// have been computed; cleared by free().
  std::vector<uint64_t> page_hashes;
  /// The salt page_hashes were computed with (set when the chain starts).
  uint64_t cache_salt = 0;
  /// The prefix-cache identity of the LoRA adapter the sequence runs with (0: none), salted
  /// into its hashes: a different adapter, or the same one reloaded or replaced (the
  /// engine gives each load a new key), never matches its pages. Set by the engine.
  uint64_t adapter_key = 0;
};

/// The cached full pages that begin a sequence's known tokens (KvCacheManager::match_prefix).
struct PrefixMatch {
  /// Cached pages, in block order, and their chain hashes.
  std::vector<int32_t> pages;
  std::vector<uint64_t> hashes;
  /// Tokens looked up: the known tokens less the last one (always computed).
  int32_t num_queried = 0;
  /// pages.size() * page_size: tokens whose prefill is skipped.
  int32_t num_tokens = 0;
  /// Of `pages`, those no sequence holds now (they stop counting as free once attached).
  int32_t num_cached_free = 0;
};

/// Owns the PageAllocator and the PageTable, and keeps each sequence's page list and
/// page-table row equal: row seq.slot holds seq.pages, then zeros.
///
/// Ownership: a sequence owns one reference to each page of `pages`. A page with more than
/// one reference holds only computed tokens of each holder. fork() shares only full pages,
/// which are never written again; fork_all_pages() (n-sample fan-out) also shares the
/// partly filled last page, and the first holder to write into it gets a copy of its own
/// (copy-on-write, allocate_for_write()): a page is written only while its refcount is 1.
///
///
/// Prefix cache (docs/design.md, "Prefix cache"): with enable_prefix_caching, full pages
/// whose K/V are computed are registered under their chain hash (cache_full_pages), stay
/// cached when no sequence holds them (cached-free, counted as free) and are evicted
/// least-recently-freed first only when the allocator runs out of other free pages. A
/// sequence with nothing computed attaches the longest cached prefix of its tokens when it
/// gets its first pages (match_prefix, then allocate with the match). Registered pages are
/// full and computed, so a page shared through the cache is only read.
/// Not thread-safe: the engine's thread only.
class KvCacheManager {
 public:
  /// num_pages counts the reserved page 0 (>= 2); max_slots counts the reserved row 0
  /// (>= 2); page_size and max_pages_per_seq >= 1. Throws Error naming a bad value.
  KvCacheManager(int32_t num_pages, int32_t page_size, int32_t max_slots,
                 int32_t max_pages_per_seq, bool enable_prefix_caching = false);
  // The allocator's eviction listener points at this manager.
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t page_size() const { return page_size_; }
  int32_t max_pages_per_seq() const { return table_.max_pages_per_seq(); }
  /// Pages including the reserved page 0.
  int32_t num_pages() const { return allocator_.num_pages(); }
  int32_t num_usable_pages() const { return allocator_.num_usable(); }
  /// Unreferenced pages, cached-free ones included (they are evicted on demand).
  int32_t num_free_pages() const { return allocator_.num_free(); }
  int32_t num_free_rows() const { return table_.num_free_rows(); }
  int32_t num_used_rows() const { return table_.num_used_rows(); }
  /// Pages that hold the K/V of the first `num_tokens` tokens: ceil(num_tokens / page_size).
  int32_t pages_for(int32_t num_tokens) const;

  /// Pages seq lacks to hold num_computed + num_tokens tokens (0 when it has them).
  int32_t pages_needed(const KvSequence& seq, int32_t num_tokens) const;
  /// Whether allocate(seq, num_tokens) would succeed: a free row if seq has none, and
  /// pages_needed() free pages. Throws Error when num_computed + num_tokens exceeds a row.
  bool can_allocate(const KvSequence& seq, int32_t num_tokens) const;
  /// Gives seq a row if it has none and appends fresh pages until it covers
  /// num_computed + num_tokens tokens, writing them into its row. All or nothing: returns
  /// false and changes nothing when a row or pages are short.
  bool allocate(KvSequence& seq, int32_t num_tokens);
  /// Drops seq's page references and returns its row (zeroed); seq keeps num_computed.
  /// A sequence without pages or row is left as it is.
  void free(KvSequence& seq);
  /// Lets `child` (no pages, no row, nothing computed) share `parent`'s full computed pages
  /// by reference count, in a row of its own: child.pages = the first
  /// floor(parent.num_computed / page_size) pages of parent, child.num_computed =
  /// that many pages * page_size. The tail of a partly filled page is not shared (the
  /// child recomputes it into a page of its own), so no shared page is ever written.
  /// Returns false and changes nothing when no row is free. Throws Error for a child that
  /// is not empty, or a parent without a row.
  bool fork(const KvSequence& parent, KvSequence& child);

  // ---- n-sample fan-out: sharing the partly filled last page, copy-on-write ------------
  /// (source page, destination page): copy every layer's K and V of page `first` into page
  /// `second` before the next forward (Backend::copy_kv_pages).
  using PageCopy = std::pair<int32_t, int32_t>;
  /// Lets `child` (no pages, no row, nothing computed) share *all* of `parent`'s pages by
  /// reference count, the partly filled last one included, in a row of its own:
  /// child.pages = parent.pages, child.num_computed = parent.num_computed. Whoever of them
  /// next writes into a shared page copies it first (allocate_for_write). Returns false and
  /// changes nothing when no row is free. Throws Error for a child that is not empty, or a
  /// parent without a row or with pages beyond its computed tokens (allocated for a step
  /// that has not run).
  bool fork_all_pages(const KvSequence& parent, KvSequence& child);
  /// Shared pages (refcount > 1) among those that the next num_tokens tokens of seq write:
  /// the pages allocate_for_write() would copy.
  int32_t pages_to_copy(const KvSequence& seq, int32_t num_tokens) const;
  /// Whether allocate_for_write(seq, num_tokens) would succeed: can_allocate() and free
  /// pages for pages_needed() + pages_to_copy().
  bool can_allocate_for_write(const KvSequence& seq, int32_t num_tokens) const;
  /// allocate(seq, num_tokens) after copy-on-write: each shared page that the tokens write
  /// is replaced in seq.pages and its row by a fresh page, the copy (shared, fresh) is
  /// recorded for take_page_copies(), and seq's reference to the shared page is dropped
  /// (so its last holder later writes it in place). All or nothing: returns false and
  /// changes nothing when a row or pages are short.
  bool allocate_for_write(KvSequence& seq, int32_t num_tokens);
  /// The copies recorded since the previous call, in order (a later copy may read a page
  /// an earlier one wrote); the caller must run them before the next forward. Copies into
  /// pages freed in the meantime (a preempted or aborted writer) are already dropped.
  std::vector<PageCopy> take_page_copies();
  /// Copies recorded and not yet taken.
  int32_t num_pending_page_copies() const { return static_cast<int32_t>(pending_copies_.size()); }
  // ---- Prefix cache. Without enable_prefix_caching, match_prefix finds nothing and
  // cache_full_pages registers nothing.
  bool prefix_caching_enabled() const { return prefix_caching_; }
  /// Sets the weights version salted into new chains (prefix_cache_salt of it and the
  /// sequence's adapter_key): pages computed under other weights or another adapter never
  /// match afterwards. Chains whose salt is no longer current (other weights, or an
  /// adapter_key changed by a replace) keep their hashes and stop registering pages.
  void set_prefix_salt(uint64_t weights_version);
  /// The longest run of cached full pages that begins `tokens` (seq's known tokens),
  /// capped so that at least one token remains to compute (its logits are needed). Changes
  /// nothing. Throws Error for a sequence that holds pages or has tokens computed.
  PrefixMatch match_prefix(const KvSequence& seq, const SequenceTokens& tokens) const;
  /// Pages seq lacks to hold match.num_tokens + num_tokens tokens once `match` is attached.
  int32_t pages_needed(const KvSequence& seq, const PrefixMatch& match, int32_t num_tokens) const;
  /// Whether allocate(seq, match, num_tokens) would succeed.
  bool can_allocate(const KvSequence& seq, const PrefixMatch& match, int32_t num_tokens) const;
  /// A sequence's first allocation with a prefix hit: attaches match's pages (one reference
  /// each), sets num_computed = match.num_tokens, then allocates for num_tokens more as
  /// allocate(seq, num_tokens) does, and counts the query in the statistics. All or
  /// nothing. `match` must come from match_prefix(seq, ...) with no page allocated since.
  bool allocate(KvSequence& seq, const PrefixMatch& match, int32_t num_tokens);
  /// Registers seq's full pages that lie inside its num_computed tokens and are not yet
  /// registered (their K/V are written, so they are only read from now on). Call whenever
  /// num_computed advances; `tokens` are seq's known tokens.
  void cache_full_pages(KvSequence& seq, const SequenceTokens& tokens);
  /// Forgets every hash: cached-free pages go back to the free list, referenced cached
  /// pages become ordinary pages, and nothing cached before matches afterwards.
  void reset_prefix_cache();
  /// Statistics since construction, with the current page counts.
  PrefixCacheStats prefix_cache_stats() const;
  const PrefixCache& prefix_cache() const { return cache_; }

  const PageAllocator& allocator() const { return allocator_; }
  /// Mutable for tests and future owners that hold pages outside any sequence (a prefix
  /// cache); those pages are passed to check_invariants as extra owners.
  PageAllocator& allocator() { return allocator_; }
  const PageTable& page_table() const { return table_; }
  /// Mutable so the batch builder can take the entries changed since the last upload.
  PageTable& page_table() { return table_; }

  /// Verifies the allocator's and page table's invariants and, for the sequences that hold
  /// pages or rows (`seqs`): each has its own row in use, equal to its pages then zeros;
  /// every referenced page is owned exactly refcount times by their page lists plus
  /// `extra_owners`; the rows in use are exactly theirs; a page past seq's computed tokens
  /// (any page from block pages_for(num_computed) on: allocated for writing) has refcount
  /// 1; the prefix cache's maps are inverse of each other and name exactly the pages the
  /// allocator marks cached; a sequence's cached pages carry the hash of its chain. Throws
  /// Error naming the first violation.
  void check_invariants(const std::vector<const KvSequence*>& seqs,
                        const std::vector<const std::vector<int32_t>*>& extra_owners = {}) const;

 private:
  /// Drops the pending copies into seq's pages that only seq holds (it is being freed).
  void drop_copies_into(const KvSequence& seq);

  int32_t page_size_;
  PageAllocator allocator_;
  PageTable table_;
  std::vector<PageCopy> pending_copies_;  // recorded by allocate_for_write, in order
  bool prefix_caching_ = false;
  PrefixCache cache_;
  uint64_t weights_version_ = 0;  // salted into every chain with the sequence's adapter_key
  /// The salt of chains started now for `seq`.
  uint64_t salt_for(const KvSequence& seq) const {
    return prefix_cache_salt(weights_version_, seq.adapter_key);
  }
  PrefixCacheStats stats_;  // queried_tokens, hit_tokens, evictions
};

}  // namespace pagellm
