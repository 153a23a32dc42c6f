#include "pagellm/kv/page_allocator.h"

#include "pagellm/common/check.h"

namespace pagellm {

PageAllocator::PageAllocator(int32_t num_pages) {
  PAGELLM_CHECK(num_pages >= 2) << "the KV cache needs at least 2 pages (page 0 is reserved "
                                   "for padding), got num_pages = "
                                << num_pages;
  refcounts_.assign(static_cast<size_t>(num_pages), 0);
  cached_.assign(static_cast<size_t>(num_pages), 0);
  lru_pos_.resize(static_cast<size_t>(num_pages));
  for (int32_t p = 1; p < num_pages; ++p) free_list_.push_back(p);
}

void PageAllocator::check_page(int32_t page, const char* what) const {
  PAGELLM_CHECK(page >= 1 && page < num_pages())
      << what << " of page " << page << ": pages are 1.." << num_pages() - 1
      << " (page 0 is reserved for padding)";
}

int32_t PageAllocator::allocate() {
  if (!can_allocate(1)) return -1;
  int32_t page = -1;
  if (!free_list_.empty()) {
    page = free_list_.front();
    free_list_.pop_front();
  } else if (!cached_free_.empty()) {
    // Only when nothing never-cached is left: evict the least recently freed cached page.
    page = cached_free_.front();
    cached_free_.pop_front();
    cached_[page] = 0;
    if (on_evict_) on_evict_(page);
  } else {
    return -1;
  }
  PAGELLM_ASSERT(refcounts_[page] == 0) << "free-listed page " << page << " has refcount "
                                        << refcounts_[page];
  refcounts_[page] = 1;
  return page;
}

void PageAllocator::withhold_for_testing(int32_t pages) {
  PAGELLM_CHECK(pages >= 0) << "cannot withhold a negative number of pages (" << pages << ")";
  withheld_ = pages;
}

bool PageAllocator::allocate(int32_t count, std::vector<int32_t>* pages) {
  PAGELLM_CHECK(count >= 0) << "cannot allocate a negative number of pages (" << count << ")";
  if (!can_allocate(count)) return false;
  for (int32_t i = 0; i < count; ++i) pages->push_back(allocate());
  return true;
}

void PageAllocator::incref(int32_t page) {
  check_page(page, "incref");
  PAGELLM_CHECK(refcounts_[page] >= 1)
      << "incref of free page " << page << ": only a referenced page can be shared";
  ++refcounts_[page];
}

bool PageAllocator::decref(int32_t page) {
  check_page(page, "decref");
  PAGELLM_CHECK(refcounts_[page] >= 1) << "double free of page " << page
                                       << ": it is already on the free list";
  if (--refcounts_[page] > 0) return false;
  if (cached_[page]) {
    lru_pos_[page] = cached_free_.insert(cached_free_.end(), page);
  } else {
    free_list_.push_back(page);
  }
  return true;
}

void PageAllocator::mark_cached(int32_t page) {
  check_page(page, "mark_cached");
  PAGELLM_CHECK(refcounts_[page] >= 1 && !cached_[page])
      << "mark_cached of page " << page << " (refcount " << refcounts_[page]
      << (cached_[page] ? ", cached" : "")
      << "): only a referenced page that is not cached yet can be cached";
  cached_[page] = 1;
}

bool PageAllocator::is_cached(int32_t page) const {
  check_page(page, "is_cached");
  return cached_[page] != 0;
}

void PageAllocator::ref_cached(int32_t page) {
  check_page(page, "ref_cached");
  PAGELLM_CHECK(cached_[page]) << "ref_cached of page " << page << ", which is not cached";
  if (refcounts_[page] == 0) cached_free_.erase(lru_pos_[page]);
  ++refcounts_[page];
}

void PageAllocator::uncache(int32_t page) {
  check_page(page, "uncache");
  PAGELLM_CHECK(cached_[page]) << "uncache of page " << page << ", which is not cached";
  cached_[page] = 0;
  if (refcounts_[page] == 0) {
    cached_free_.erase(lru_pos_[page]);
    free_list_.push_back(page);
  }
}

std::vector<int32_t> PageAllocator::cached_free_pages() const {
  return std::vector<int32_t>(cached_free_.begin(), cached_free_.end());
}

void PageAllocator::release(const std::vector<int32_t>& pages) {
  for (int32_t page : pages) decref(page);
}

int32_t PageAllocator::refcount(int32_t page) const {
  PAGELLM_CHECK(page >= 0 && page < num_pages())
      << "refcount of page " << page << ": pages are 0.." << num_pages() - 1;
  return refcounts_[page];
}

void PageAllocator::check_invariants() const {
  PAGELLM_ASSERT(refcounts_[0] == 0 && !cached_[0])
      << "reserved page 0 has refcount " << refcounts_[0] << (cached_[0] ? " and is cached" : "");
  std::vector<char> on_free_list(refcounts_.size(), 0);
  for (int32_t page : free_list_) {
    PAGELLM_ASSERT(page >= 1 && page < num_pages()) << "free list holds invalid page " << page;
    PAGELLM_ASSERT(!on_free_list[page]) << "page " << page << " is on the free list twice";
    PAGELLM_ASSERT(refcounts_[page] == 0)
        << "free-listed page " << page << " has refcount " << refcounts_[page];
    PAGELLM_ASSERT(!cached_[page]) << "free-listed page " << page << " is marked cached";
    on_free_list[page] = 1;
  }
  for (int32_t page : cached_free_) {
    PAGELLM_ASSERT(page >= 1 && page < num_pages()) << "LRU list holds invalid page " << page;
    PAGELLM_ASSERT(!on_free_list[page]) << "page " << page << " is listed twice";
    PAGELLM_ASSERT(refcounts_[page] == 0)
        << "cached-free page " << page << " has refcount " << refcounts_[page];
    PAGELLM_ASSERT(cached_[page]) << "LRU-listed page " << page << " is not marked cached";
    PAGELLM_ASSERT(*lru_pos_[page] == page) << "LRU position of page " << page << " is stale";
    on_free_list[page] = 1;
  }
  int32_t referenced = 0;
  for (int32_t page = 1; page < num_pages(); ++page) {
    PAGELLM_ASSERT(refcounts_[page] >= 0) << "page " << page << " has negative refcount";
    if (refcounts_[page] > 0) {
      ++referenced;
    } else {
      PAGELLM_ASSERT(on_free_list[page]) << "page " << page << " is unreferenced but not free";
    }
  }
  PAGELLM_ASSERT(num_free() + referenced == num_usable())
      << "free " << free_list_.size() << " + cached-free " << cached_free_.size()
      << " + referenced " << referenced << " != usable " << num_usable();
}

void PageAllocator::check_invariants(
    const std::vector<const std::vector<int32_t>*>& owners) const {
  check_invariants();
  std::vector<int32_t> seen(refcounts_.size(), 0);
  for (size_t o = 0; o < owners.size(); ++o) {
    for (int32_t page : *owners[o]) {
      PAGELLM_ASSERT(page >= 1 && page < num_pages())
          << "owner " << o << " holds invalid page " << page;
      PAGELLM_ASSERT(refcounts_[page] > 0) << "owner " << o << " holds free page " << page;
      ++seen[page];
    }
  }
  for (int32_t page = 1; page < num_pages(); ++page) {
    PAGELLM_ASSERT(seen[page] == refcounts_[page])
        << "page " << page << " has refcount " << refcounts_[page] << " but " << seen[page]
        << " owner references";
  }
}

}  // namespace pagellm
