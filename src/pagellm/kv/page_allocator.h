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
#include <functional>
#include <list>
#include <vector>

namespace pagellm {

/// Hands out physical pages 1 .. num_pages-1 with reference counts.
///
/// A page is in one of three states (docs/design.md, "Prefix cache"):
///   - free: refcount 0, never cached (or evicted), on the free list;
///   - cached-free: refcount 0 but marked cached (the prefix cache knows its contents), on
///     the LRU list, evictable;
///   - referenced: refcount >= 1 (cached or not), on neither list.
/// free + cached-free + referenced == num_usable() at all times, and num_free() counts both
/// kinds of unreferenced page: a cached-free page is handed out when nothing else is left,
/// so the cache never makes an allocation fail.
/// allocate() gives pages with refcount 1, taking never-cached pages first and evicting
/// cached-free pages least-recently-freed first only when no free page remains (the
/// eviction listener hears of each, so the cache forgets its contents); incref() lets a
/// second owner share a page; decref() drops one reference and, at 0, puts the page at the
/// back of the free list, or of the LRU list if it is cached. The free list is FIFO: freed
/// pages are reused last.
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
  /// Unreferenced pages, cached-free ones included: what allocate() can hand out.
  int32_t num_free() const {
    return static_cast<int32_t>(free_list_.size() + cached_free_.size());
  }
  /// Unreferenced pages that the prefix cache still knows (evictable).
  int32_t num_cached_free() const { return static_cast<int32_t>(cached_free_.size()); }
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

  /// Marks a referenced page as cached (the prefix cache has registered its contents):
  /// when its refcount drops to 0 it becomes cached-free instead of free. Throws Error for
  /// an unreferenced or already cached page.
  void mark_cached(int32_t page);
  bool is_cached(int32_t page) const;
  /// Takes a reference to a cached page (a prefix-cache hit): a cached-free page leaves
  /// the LRU list with refcount 1, a referenced one gains an owner. Throws Error for a page
  /// that is not cached.
  void ref_cached(int32_t page);
  /// Forgets that a page is cached: a cached-free page goes back to the free list (at its
  /// back), a referenced one becomes an ordinary referenced page. The eviction listener is
  /// not called (the caller drops its own entry). Throws Error for a page that is not
  /// cached.
  void uncache(int32_t page);
  /// Called with each cached-free page that allocate() evicts, before it is handed out.
  using EvictionListener = std::function<void(int32_t page)>;
  void set_eviction_listener(EvictionListener listener) { on_evict_ = std::move(listener); }
  /// Cached-free pages, least recently freed (the next to be evicted) first.
  std::vector<int32_t> cached_free_pages() const;

  /// Verifies the allocator's own invariants: page 0 unreferenced, never listed nor
  /// cached; every free-listed page unique, uncached, with refcount 0; every LRU-listed
  /// page unique, cached, with refcount 0; every page with refcount 0 on exactly the list
  /// its cached mark names; free + cached-free + referenced == usable. Throws Error naming
  /// the first violation.
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
  std::deque<int32_t> free_list_;   // never-cached unreferenced pages; pop front, push back
  std::vector<char> cached_;        // [num_pages]; 1: the prefix cache holds its contents
  std::list<int32_t> cached_free_;  // cached unreferenced pages; evict front, push back
  std::vector<std::list<int32_t>::iterator> lru_pos_;  // [num_pages]; valid while listed
  EvictionListener on_evict_;
  int32_t withheld_ = 0;            // free pages hidden from allocation (tests only)
};

}  // namespace pagellm
