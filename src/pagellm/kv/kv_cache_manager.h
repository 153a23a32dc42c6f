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
/// Ownership: a sequence owns one reference to each page of `pages`. A page with more than
/// one reference holds only computed tokens of each holder. fork() shares only full pages,
/// which are never written again; fork_all_pages() (n-sample fan-out) also shares the
/// partly filled last page, and the first holder to write into it gets a copy of its own
/// (copy-on-write, allocate_for_write()): a page is written only while its refcount is 1.
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
  /// 1. Throws Error naming the first violation.
  void check_invariants(const std::vector<const KvSequence*>& seqs,
                        const std::vector<const std::vector<int32_t>*>& extra_owners = {}) const;

 private:
  /// Drops the pending copies into seq's pages that only seq holds (it is being freed).
  void drop_copies_into(const KvSequence& seq);

  int32_t page_size_;
  PageAllocator allocator_;
  PageTable table_;
  std::vector<PageCopy> pending_copies_;  // recorded by allocate_for_write, in order
};

}  // namespace pagellm
