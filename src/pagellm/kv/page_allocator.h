// Reference-counted allocator of KV-cache pages.
//
// The KV pools of every layer are indexed by the same physical page numbers, so one
// allocator serves all layers: a page number names one [num_kv_heads, page_size, head_dim]
// block in each layer's K and V pool. Page 0 is reserved: it is never handed out, and
// padding entries of the page table point at it, so a padded lane of a kernel always
// reads valid (if meaningless) memory.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace pagellm {

/// Hands out physical pages 1 .. num_pages-1 with reference counts.
///
/// A page is either free (refcount 0, on the free list) or referenced (refcount >= 1, off
/// the free list); free + referenced == num_usable() at all times. allocate() gives pages
/// with refcount 1; incref() lets a second owner share a page (prefix sharing); decref()
/// drops one reference and puts the page back on the free list when it reaches 0.
/// The free list is FIFO: freed pages are reused last, which keeps recently used pages
/// intact for as long as possible (useful once prefix caching looks pages up by content).
/// Running out of pages is not an error: allocate() reports failure and changes nothing.
/// Misuse (double free, page 0, a page out of range) throws Error.
class PageAllocator {
 public:
  /// num_pages counts the reserved page 0, so num_pages - 1 pages are usable (>= 1).
  explicit PageAllocator(int32_t num_pages);

  /// Pages including the reserved page 0 (the first dimension of every KV pool).
  int32_t num_pages() const { return static_cast<int32_t>(refcounts_.size()); }
  /// Pages that can be handed out: num_pages() - 1.
  int32_t num_usable() const { return num_pages() - 1; }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  /// Pages with refcount >= 1.
  int32_t num_referenced() const { return num_usable() - num_free(); }
  bool can_allocate(int32_t count) const { return count <= num_free() - withheld_; }

  /// Takes one free page (refcount becomes 1). Returns -1 when none is free.
  int32_t allocate();
  /// Appends `count` fresh pages to *pages, all or nothing: returns false and changes
  /// nothing when fewer than `count` are free.
  bool allocate(int32_t count, std::vector<int32_t>* pages);

  /// Adds an owner to a referenced page. Throws Error for a free or invalid page.
  void incref(int32_t page);
  /// Drops one reference; returns true when the page became free. Throws Error for a page
  /// that is already free (double free), page 0 or a page out of range.
  bool decref(int32_t page);
  /// decref() of every page in the list.
  void release(const std::vector<int32_t>& pages);

  /// Current reference count (0 for free pages and for page 0).
  int32_t refcount(int32_t page) const;

  /// Verifies the allocator's own invariants: page 0 unreferenced and never free-listed,
  /// every free-listed page unique with refcount 0, every page with refcount 0 on the
  /// free list, free + referenced == usable. Throws Error naming the first violation.
  void check_invariants() const;
  /// The above, and also that `owners` (every page list that holds references, for
  /// example the pages of each running sequence) account for the references exactly: each
  /// page appears refcount(page) times across all lists, and no list names a free page or
  /// page 0.
  void check_invariants(const std::vector<const std::vector<int32_t>*>& owners) const;

  /// Fault injection for tests: from now on, can_allocate() and allocate() behave as if
  /// `pages` of the free pages were held by someone else (allocation fails, changing
  /// nothing, when fewer than count + pages are free), while num_free() and the invariants
  /// still count them as free. 0, the default, is normal operation; the cost is one
  /// subtraction per allocation. Throws Error for a negative count.
  void withhold_for_testing(int32_t pages);
  int32_t withheld_for_testing() const { return withheld_; }

 private:
  void check_page(int32_t page, const char* what) const;

  std::vector<int32_t> refcounts_;  // [num_pages]; refcounts_[0] stays 0
  std::deque<int32_t> free_list_;   // pop front, push back
  int32_t withheld_ = 0;            // free pages hidden from allocation (tests only)
};

}  // namespace pagellm
