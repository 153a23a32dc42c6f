#include "pagellm/kv/prefix_cache.h"

// The state's layout, so that it lives on the stack (the header of the version linked).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>

#include "pagellm/common/check.h"

namespace pagellm {

uint64_t prefix_cache_salt(uint64_t weights_version, uint64_t adapter_id) {
  const uint64_t fields[2] = {weights_version, adapter_id};
  return XXH3_64bits(fields, sizeof(fields));
}

uint64_t prefix_page_hash(uint64_t parent, uint64_t salt, const SequenceTokens& tokens,
                          int32_t first, int32_t page_size) {
  PAGELLM_CHECK(first >= 0 && page_size >= 1 && first + page_size <= tokens.size())
      << "prefix_page_hash: tokens [" << first << ", " << first + page_size
      << ") are not a full page of a sequence of " << tokens.size() << " tokens";
  // Streamed, so the tokens need not be contiguous (prompt and output are two vectors).
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &parent, sizeof(parent));
  XXH3_64bits_update(&state, &salt, sizeof(salt));
  const int32_t prompt_len = static_cast<int32_t>(tokens.prompt->size());
  const int32_t end = first + page_size;
  if (first < prompt_len) {
    const int32_t stop = end < prompt_len ? end : prompt_len;
    XXH3_64bits_update(&state, tokens.prompt->data() + first,
                       sizeof(int32_t) * static_cast<size_t>(stop - first));
  }
  if (end > prompt_len) {
    const int32_t start = first > prompt_len ? first : prompt_len;
    XXH3_64bits_update(&state, tokens.output->data() + (start - prompt_len),
                       sizeof(int32_t) * static_cast<size_t>(end - start));
  }
  return XXH3_64bits_digest(&state);
}

PrefixCache::PrefixCache(int32_t num_pages)
    : hash_of_page_(static_cast<size_t>(num_pages), 0),
      has_hash_(static_cast<size_t>(num_pages), 0) {}

int32_t PrefixCache::find(uint64_t hash) const {
  auto it = page_of_hash_.find(hash);
  return it == page_of_hash_.end() ? -1 : it->second;
}

bool PrefixCache::insert(uint64_t hash, int32_t page) {
  PAGELLM_CHECK(page >= 1 && page < static_cast<int32_t>(has_hash_.size()) && !has_hash_[page])
      << "prefix cache: page " << page << " is out of range or already registered";
  if (!page_of_hash_.emplace(hash, page).second) return false;
  hash_of_page_[page] = hash;
  has_hash_[page] = 1;
  return true;
}

void PrefixCache::erase_page(int32_t page) {
  PAGELLM_CHECK(page >= 1 && page < static_cast<int32_t>(has_hash_.size()) && has_hash_[page])
      << "prefix cache: page " << page << " is not registered";
  page_of_hash_.erase(hash_of_page_[page]);
  has_hash_[page] = 0;
}

std::vector<int32_t> PrefixCache::clear() {
  std::vector<int32_t> pages;
  pages.reserve(page_of_hash_.size());
  for (const auto& entry : page_of_hash_) {
    pages.push_back(entry.second);
    has_hash_[entry.second] = 0;
  }
  page_of_hash_.clear();
  std::sort(pages.begin(), pages.end());  // a deterministic order for the free list
  return pages;
}

void PrefixCache::check_invariants() const {
  int32_t registered = 0;
  for (size_t page = 0; page < has_hash_.size(); ++page) {
    if (!has_hash_[page]) continue;
    ++registered;
    auto it = page_of_hash_.find(hash_of_page_[page]);
    PAGELLM_ASSERT(it != page_of_hash_.end() && it->second == static_cast<int32_t>(page))
        << "prefix cache: page " << page << "'s hash does not map back to it";
  }
  PAGELLM_ASSERT(registered == size())
      << "prefix cache: " << size() << " hashes but " << registered << " registered pages";
}

}  // namespace pagellm
