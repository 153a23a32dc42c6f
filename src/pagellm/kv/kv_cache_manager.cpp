#include "pagellm/kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "pagellm/common/check.h"

namespace pagellm {

KvCacheManager::KvCacheManager(int32_t num_pages, int32_t page_size, int32_t max_slots,
                               int32_t max_pages_per_seq, bool enable_prefix_caching)
    : page_size_(page_size),
      allocator_(num_pages),
      table_(max_slots, max_pages_per_seq),
      prefix_caching_(enable_prefix_caching),
      cache_(num_pages) {
  PAGELLM_CHECK(page_size >= 1) << "page_size must be at least 1, got " << page_size;
  allocator_.set_eviction_listener([this](int32_t page) {
    cache_.erase_page(page);
    ++stats_.evictions;
  });
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
  if (have == 0 && seq.num_computed == 0) {
    // A new chain: its pages will hold K/V computed under the current weights.
    seq.page_hashes.clear();
    seq.cache_salt = salt_for(seq);
  }
  const bool got = allocator_.allocate(need, &seq.pages);
  PAGELLM_ASSERT(got) << "pages counted free but allocation failed";
  for (int32_t b = have; b < have + need; ++b) table_.set(seq.slot, b, seq.pages[b]);
  return true;
}

void KvCacheManager::free(KvSequence& seq) {
  if (!pending_copies_.empty()) drop_copies_into(seq);
  // Last page first: cached pages join the LRU list tail first, so a chain is evicted from
  // its end and its head (the part most likely shared) stays matchable longest.
  for (auto it = seq.pages.rbegin(); it != seq.pages.rend(); ++it) allocator_.decref(*it);
  seq.pages.clear();
  seq.page_hashes.clear();
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
  child.page_hashes.assign(
      parent.page_hashes.begin(),
      parent.page_hashes.begin() + std::min<size_t>(parent.page_hashes.size(), full));
  child.cache_salt = parent.cache_salt;
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
  // The same tokens begin both, so the child continues the parent's hash chain.
  child.page_hashes = parent.page_hashes;
  child.cache_salt = parent.cache_salt;
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

void KvCacheManager::set_prefix_salt(uint64_t weights_version) {
  weights_version_ = weights_version;
}

PrefixMatch KvCacheManager::match_prefix(const KvSequence& seq,
                                         const SequenceTokens& tokens) const {
  PAGELLM_CHECK(seq.pages.empty() && seq.slot == 0 && seq.num_computed == 0)
      << "match_prefix: request " << seq.id
      << " already holds pages or computed tokens; only a sequence's first allocation looks "
         "up the prefix cache";
  PrefixMatch match;
  if (!prefix_caching_) return match;
  match.num_queried = std::max(0, tokens.size() - 1);
  const int32_t max_pages = std::min(match.num_queried / page_size_, max_pages_per_seq());
  const uint64_t salt = salt_for(seq);
  uint64_t parent = 0;
  for (int32_t b = 0; b < max_pages; ++b) {
    const uint64_t hash = prefix_page_hash(parent, salt, tokens, b * page_size_, page_size_);
    const int32_t page = cache_.find(hash);
    if (page < 0) break;
    match.pages.push_back(page);
    match.hashes.push_back(hash);
    match.num_cached_free += allocator_.refcount(page) == 0 ? 1 : 0;
    parent = hash;
  }
  match.num_tokens = static_cast<int32_t>(match.pages.size()) * page_size_;
  return match;
}

int32_t KvCacheManager::pages_needed(const KvSequence& seq, const PrefixMatch& match,
                                     int32_t num_tokens) const {
  if (match.pages.empty()) return pages_needed(seq, num_tokens);
  PAGELLM_CHECK(num_tokens >= 0) << "request " << seq.id << ": cannot allocate for "
                                 << num_tokens << " tokens";
  const int32_t need = pages_for(match.num_tokens + num_tokens);
  PAGELLM_CHECK(need <= max_pages_per_seq())
      << "request " << seq.id << " would need " << need << " KV-cache pages for "
      << match.num_tokens + num_tokens << " tokens but a page-table row holds "
      << max_pages_per_seq();
  return need - static_cast<int32_t>(match.pages.size());
}

bool KvCacheManager::can_allocate(const KvSequence& seq, const PrefixMatch& match,
                                  int32_t num_tokens) const {
  if (seq.slot == 0 && table_.num_free_rows() == 0) return false;
  // Attaching takes the matched cached-free pages off the free count.
  return allocator_.can_allocate(pages_needed(seq, match, num_tokens) + match.num_cached_free);
}

bool KvCacheManager::allocate(KvSequence& seq, const PrefixMatch& match, int32_t num_tokens) {
  if (!can_allocate(seq, match, num_tokens)) return false;
  if (!match.pages.empty()) {
    PAGELLM_CHECK(seq.pages.empty() && seq.slot == 0 && seq.num_computed == 0)
        << "allocate with a prefix match: request " << seq.id
        << " already holds pages or computed tokens";
    seq.slot = table_.acquire();
    PAGELLM_ASSERT(seq.slot > 0) << "a free page-table row was counted but none was acquired";
    for (size_t b = 0; b < match.pages.size(); ++b) {
      allocator_.ref_cached(match.pages[b]);
      seq.pages.push_back(match.pages[b]);
      table_.set(seq.slot, static_cast<int32_t>(b), match.pages[b]);
    }
    seq.num_computed = match.num_tokens;
    seq.page_hashes = match.hashes;
    seq.cache_salt = salt_for(seq);
  }
  const bool allocated = allocate(seq, num_tokens);
  PAGELLM_ASSERT(allocated) << "pages counted free but allocation failed";
  stats_.queried_tokens += match.num_queried;
  stats_.hit_tokens += match.num_tokens;
  return true;
}

void KvCacheManager::cache_full_pages(KvSequence& seq, const SequenceTokens& tokens) {
  const uint64_t salt = salt_for(seq);
  if (!prefix_caching_ || seq.cache_salt != salt) return;  // disabled, or stale weights or adapter
  const int32_t full =
      std::min(seq.num_computed / page_size_, static_cast<int32_t>(seq.pages.size()));
  for (int32_t b = static_cast<int32_t>(seq.page_hashes.size()); b < full; ++b) {
    const uint64_t parent = b == 0 ? 0 : seq.page_hashes[b - 1];
    const uint64_t hash = prefix_page_hash(parent, salt, tokens, b * page_size_, page_size_);
    seq.page_hashes.push_back(hash);
    const int32_t page = seq.pages[b];
    if (allocator_.is_cached(page)) continue;  // attached from the cache under this hash
    // A hash already taken means another page holds the same prefix: keep that one.
    if (cache_.insert(hash, page)) allocator_.mark_cached(page);
  }
}

void KvCacheManager::reset_prefix_cache() {
  for (int32_t page : cache_.clear()) allocator_.uncache(page);
}

PrefixCacheStats KvCacheManager::prefix_cache_stats() const {
  PrefixCacheStats stats = stats_;
  stats.cached_pages = cache_.size();
  stats.cached_free_pages = allocator_.num_cached_free();
  return stats;
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
  cache_.check_invariants();
  int32_t marked = 0;
  for (int32_t page = 1; page < num_pages(); ++page) {
    PAGELLM_ASSERT(allocator_.is_cached(page) == cache_.has_page(page))
        << "page " << page << (allocator_.is_cached(page) ? " is" : " is not")
        << " marked cached but the prefix cache" << (cache_.has_page(page) ? " has" : " lacks")
        << " its hash";
    marked += cache_.has_page(page) ? 1 : 0;
  }
  PAGELLM_ASSERT(prefix_caching_ || marked == 0)
      << marked << " pages are cached with prefix caching off";
  for (const KvSequence* seq : seqs) {
    const size_t hashed = std::min(seq->page_hashes.size(), seq->pages.size());
    for (size_t b = 0; b < hashed; ++b) {
      const int32_t page = seq->pages[b];
      PAGELLM_ASSERT(!cache_.has_page(page) || cache_.hash_of(page) == seq->page_hashes[b])
          << "request " << seq->id << "'s block " << b << " (page " << page
          << ") is cached under another hash than its chain's";
    }
  }
  PAGELLM_ASSERT(table_.num_used_rows() == static_cast<int32_t>(rows.size()))
      << table_.num_used_rows() << " page-table rows in use but " << rows.size()
      << " sequences hold rows";
}

}  // namespace pagellm
