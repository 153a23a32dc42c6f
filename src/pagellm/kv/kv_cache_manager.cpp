#include "pagellm/kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "pagellm/common/check.h"

namespace pagellm {

KvCacheManager::KvCacheManager(int32_t num_pages, int32_t page_size, int32_t max_slots,
                               int32_t max_pages_per_seq)
    : page_size_(page_size), allocator_(num_pages), table_(max_slots, max_pages_per_seq) {
  PAGELLM_CHECK(page_size >= 1) << "page_size must be at least 1, got " << page_size;
}

int32_t KvCacheManager::pages_for(int32_t num_tokens) const {
  return (num_tokens + page_size_ - 1) / page_size_;
}

int32_t KvCacheManager::pages_needed(const KvSequence& seq, int32_t num_tokens) const {
  PAGELLM_CHECK(num_tokens >= 0) << "request " << seq.id << ": cannot allocate for "
                                 << num_tokens << " tokens";
  const int32_t need = pages_for(seq.num_computed + num_tokens);
  PAGELLM_CHECK(need <= max_pages_per_seq())
      << "request " << seq.id << " would need " << need << " KV-cache pages for "
      << seq.num_computed + num_tokens << " tokens but a page-table row holds "
      << max_pages_per_seq();
  return std::max(0, need - static_cast<int32_t>(seq.pages.size()));
}

bool KvCacheManager::can_allocate(const KvSequence& seq, int32_t num_tokens) const {
  if (seq.slot == 0 && table_.num_free_rows() == 0) return false;
  return allocator_.can_allocate(pages_needed(seq, num_tokens));
}

bool KvCacheManager::allocate(KvSequence& seq, int32_t num_tokens) {
  if (!can_allocate(seq, num_tokens)) return false;
  const int32_t have = static_cast<int32_t>(seq.pages.size());
  const int32_t need = pages_needed(seq, num_tokens);
  if (seq.slot == 0) {
    seq.slot = table_.acquire();
    PAGELLM_ASSERT(seq.slot > 0) << "a free page-table row was counted but none was acquired";
  }
  const bool got = allocator_.allocate(need, &seq.pages);
  PAGELLM_ASSERT(got) << "pages counted free but allocation failed";
  for (int32_t b = have; b < have + need; ++b) table_.set(seq.slot, b, seq.pages[b]);
  return true;
}

void KvCacheManager::free(KvSequence& seq) {
  if (!pending_copies_.empty()) drop_copies_into(seq);
  allocator_.release(seq.pages);
  seq.pages.clear();
  if (seq.slot != 0) table_.release(seq.slot);
  seq.slot = 0;
}

bool KvCacheManager::fork(const KvSequence& parent, KvSequence& child) {
  PAGELLM_CHECK(child.pages.empty() && child.slot == 0 && child.num_computed == 0)
      << "fork: request " << child.id
      << " must be empty (no pages, no page-table row, nothing computed) to share request "
      << parent.id << "'s pages";
  PAGELLM_CHECK(table_.in_use(parent.slot))
      << "fork: request " << parent.id << " has no page-table row to share pages from";
  if (table_.num_free_rows() == 0) return false;
  const int32_t full = std::min(parent.num_computed / page_size_,
                                static_cast<int32_t>(parent.pages.size()));
  child.slot = table_.acquire();
  for (int32_t b = 0; b < full; ++b) {
    allocator_.incref(parent.pages[b]);
    child.pages.push_back(parent.pages[b]);
    table_.set(child.slot, b, parent.pages[b]);
  }
  child.num_computed = full * page_size_;
  return true;
}

bool KvCacheManager::fork_all_pages(const KvSequence& parent, KvSequence& child) {
  PAGELLM_CHECK(child.pages.empty() && child.slot == 0 && child.num_computed == 0)
      << "fork_all_pages: request " << child.id
      << " must be empty (no pages, no page-table row, nothing computed) to share request "
      << parent.id << "'s pages";
  PAGELLM_CHECK(table_.in_use(parent.slot))
      << "fork_all_pages: request " << parent.id << " has no page-table row to share pages from";
  PAGELLM_CHECK(static_cast<int32_t>(parent.pages.size()) == pages_for(parent.num_computed))
      << "fork_all_pages: request " << parent.id << " holds " << parent.pages.size()
      << " pages for " << parent.num_computed
      << " computed tokens; only computed pages can be shared";
  if (table_.num_free_rows() == 0) return false;
  child.slot = table_.acquire();
  for (size_t b = 0; b < parent.pages.size(); ++b) {
    allocator_.incref(parent.pages[b]);
    child.pages.push_back(parent.pages[b]);
    table_.set(child.slot, static_cast<int32_t>(b), parent.pages[b]);
  }
  child.num_computed = parent.num_computed;
  return true;
}

int32_t KvCacheManager::pages_to_copy(const KvSequence& seq, int32_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  // The tokens write blocks num_computed / page_size .. (num_computed + n - 1) / page_size;
  // of those, only the ones already held can be shared.
  const int32_t first = seq.num_computed / page_size_;
  const int32_t end = std::min(pages_for(seq.num_computed + num_tokens),
                               static_cast<int32_t>(seq.pages.size()));
  int32_t shared = 0;
  for (int32_t b = first; b < end; ++b) shared += allocator_.refcount(seq.pages[b]) > 1 ? 1 : 0;
  return shared;
}

bool KvCacheManager::can_allocate_for_write(const KvSequence& seq, int32_t num_tokens) const {
  const int32_t copies = pages_to_copy(seq, num_tokens);
  if (copies == 0) return can_allocate(seq, num_tokens);
  return can_allocate(seq, num_tokens) &&
         allocator_.can_allocate(pages_needed(seq, num_tokens) + copies);
}

bool KvCacheManager::allocate_for_write(KvSequence& seq, int32_t num_tokens) {
  if (pages_to_copy(seq, num_tokens) == 0) return allocate(seq, num_tokens);
  if (!can_allocate_for_write(seq, num_tokens)) return false;
  const int32_t first = seq.num_computed / page_size_;
  const int32_t end = std::min(pages_for(seq.num_computed + num_tokens),
                               static_cast<int32_t>(seq.pages.size()));
  for (int32_t b = first; b < end; ++b) {
    const int32_t shared = seq.pages[b];
    if (allocator_.refcount(shared) == 1) continue;  // the last holder writes in place
    const int32_t fresh = allocator_.allocate();
    PAGELLM_ASSERT(fresh > 0) << "pages counted free but copy-on-write found none";
    pending_copies_.emplace_back(shared, fresh);
    allocator_.decref(shared);  // the others keep it; it never drops to 0 here
    seq.pages[b] = fresh;
    table_.set(seq.slot, b, fresh);
  }
  const bool allocated = allocate(seq, num_tokens);
  PAGELLM_ASSERT(allocated) << "pages counted free but allocation after copy-on-write failed";
  return true;
}

std::vector<KvCacheManager::PageCopy> KvCacheManager::take_page_copies() {
  std::vector<PageCopy> copies;
  copies.swap(pending_copies_);
  return copies;
}

void KvCacheManager::drop_copies_into(const KvSequence& seq) {
  // A copy's destination is held by its writer alone until the copy runs.
  auto freed_with_seq = [&](const PageCopy& c) {
    return allocator_.refcount(c.second) == 1 &&
           std::find(seq.pages.begin(), seq.pages.end(), c.second) != seq.pages.end();
  };
  pending_copies_.erase(
      std::remove_if(pending_copies_.begin(), pending_copies_.end(), freed_with_seq),
      pending_copies_.end());
}

void KvCacheManager::check_invariants(
    const std::vector<const KvSequence*>& seqs,
    const std::vector<const std::vector<int32_t>*>& extra_owners) const {
  std::vector<const std::vector<int32_t>*> owners = extra_owners;
  for (const KvSequence* seq : seqs) owners.push_back(&seq->pages);
  allocator_.check_invariants(owners);
  table_.check_invariants();

  std::unordered_set<int32_t> rows;
  for (const KvSequence* seq : seqs) {
    if (seq->slot == 0) {
      PAGELLM_ASSERT(seq->pages.empty())
          << "request " << seq->id << " holds " << seq->pages.size() << " pages but no row";
      continue;
    }
    PAGELLM_ASSERT(table_.in_use(seq->slot) && rows.insert(seq->slot).second)
        << "request " << seq->id << " does not own its page-table row " << seq->slot;
    const int32_t num_pages = static_cast<int32_t>(seq->pages.size());
    PAGELLM_ASSERT(num_pages <= max_pages_per_seq())
        << "request " << seq->id << " holds " << num_pages << " pages, more than a row's "
        << max_pages_per_seq();
    const int32_t* row = table_.row(seq->slot);
    for (int32_t b = 0; b < max_pages_per_seq(); ++b) {
      const int32_t expected = b < num_pages ? seq->pages[b] : 0;
      PAGELLM_ASSERT(row[b] == expected)
          << "page-table row " << seq->slot << " of request " << seq->id << " maps block " << b
          << " to page " << row[b] << ", expected " << expected;
    }
    for (int32_t b = pages_for(seq->num_computed); b < num_pages; ++b) {
      PAGELLM_ASSERT(allocator_.refcount(seq->pages[b]) == 1)
          << "request " << seq->id << " will write block " << b << " (page " << seq->pages[b]
          << "), which is shared (refcount " << allocator_.refcount(seq->pages[b]) << ")";
    }
  }
  PAGELLM_ASSERT(table_.num_used_rows() == static_cast<int32_t>(rows.size()))
      << table_.num_used_rows() << " page-table rows in use but " << rows.size()
      << " sequences hold rows";
}

}  // namespace pagellm
