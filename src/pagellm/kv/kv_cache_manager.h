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
#include <vector>

#include "pagellm/kv/page_allocator.h"
#include "pagellm/kv/page_table.h"

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
};

/// Owns the PageAllocator and the PageTable, and keeps each sequence's page list and
/// page-table row equal: row seq.slot holds seq.pages, then zeros.
///
/// Ownership: a sequence owns one reference to each page of `pages`; a page with more than
/// one reference (after fork()) is full and only read, because fork() shares only pages
/// wholly inside the parent's computed tokens and every later write goes past them.
/// Not thread-safe: the engine's thread only.
class KvCacheManager {
 public:
  /// num_pages counts the reserved page 0 (>= 2); max_slots counts the reserved row 0
  /// (>= 2); page_size and max_pages_per_seq >= 1. Throws Error naming a bad value.
  KvCacheManager(int32_t num_pages, int32_t page_size, int32_t max_slots,
                 int32_t max_pages_per_seq);

  int32_t page_size() const { return page_size_; }
  int32_t max_pages_per_seq() const { return table_.max_pages_per_seq(); }
  /// Pages including the reserved page 0.
  int32_t num_pages() const { return allocator_.num_pages(); }
  int32_t num_usable_pages() const { return allocator_.num_usable(); }
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
  /// `extra_owners`; the rows in use are exactly theirs; a page that seq will write (any
  /// page from block num_computed / page_size on) has refcount 1. Throws Error naming the
  /// first violation.
  void check_invariants(const std::vector<const KvSequence*>& seqs,
                        const std::vector<const std::vector<int32_t>*>& extra_owners = {}) const;

 private:
  int32_t page_size_;
  PageAllocator allocator_;
  PageTable table_;
};

}  // namespace pagellm
