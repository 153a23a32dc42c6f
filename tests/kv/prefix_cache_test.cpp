// Unit tests of the prefix cache: the hash chain, the allocator's cached-free state and LRU
// eviction, and the KV cache manager's matching, attaching, registering and reset, with
// the expected pages, refcounts and counts after each call.
#include "pagellm/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "common/expect_error.h"
#include "pagellm/common/check.h"
#include "pagellm/kv/kv_cache_manager.h"
#include "pagellm/kv/page_allocator.h"

namespace pagellm {
namespace {

using testing::expect_error;

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence with its own tokens, as the engine's Sequence pairs them.
struct TestSeq {
  KvSequence kv;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  SequenceTokens tokens() const { return {&prompt, &output}; }
};

TestSeq make_seq(int64_t id, std::vector<int32_t> prompt) {
  TestSeq s;
  s.kv.id = id;
  s.prompt = std::move(prompt);
  return s;
}

// The chain hashes of a token list's full pages.
std::vector<uint64_t> chain(const std::vector<int32_t>& tokens, int32_t page_size,
                            uint64_t salt) {
  const std::vector<int32_t> none;
  SequenceTokens view{&tokens, &none};
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (int32_t b = 0; (b + 1) * page_size <= view.size(); ++b) {
    parent = prefix_page_hash(parent, salt, view, b * page_size, page_size);
    hashes.push_back(parent);
  }
  return hashes;
}

TEST(PrefixHash, SharedPrefixHashesAgreeAndDivergeAfter) {
  const uint64_t salt = prefix_cache_salt(0, 0);
  std::vector<int32_t> a = iota_tokens(12);
  std::vector<int32_t> b = a;
  b[9] = 7;  // differs in the third page
  const std::vector<uint64_t> ha = chain(a, 4, salt), hb = chain(b, 4, salt);
  ASSERT_EQ(ha.size(), 3u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);

  // The chain: equal page tokens after different prefixes hash differently.
  std::vector<int32_t> c = a;
  c[0] = 1;
  const std::vector<uint64_t> hc = chain(c, 4, salt);
  EXPECT_NE(hc[0], ha[0]);
  EXPECT_NE(hc[1], ha[1]);
  EXPECT_NE(hc[2], ha[2]);
}

TEST(PrefixHash, SaltSeparatesWeightsVersionsAndAdapters) {
  const std::vector<int32_t> a = iota_tokens(8);
  const std::vector<uint64_t> base = chain(a, 4, prefix_cache_salt(0, 0));
  const std::vector<uint64_t> bumped = chain(a, 4, prefix_cache_salt(1, 0));
  const std::vector<uint64_t> adapter = chain(a, 4, prefix_cache_salt(0, 1));
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NE(base[i], bumped[i]);
    EXPECT_NE(base[i], adapter[i]);
    EXPECT_NE(bumped[i], adapter[i]);
  }
  EXPECT_EQ(chain(a, 4, prefix_cache_salt(1, 0)), bumped);  // deterministic
}

TEST(PrefixHash, PromptOutputSplitDoesNotChangeTheHash) {
  const std::vector<int32_t> all = iota_tokens(8);
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 3), output(all.begin() + 3, all.end());
  const std::vector<int32_t> none;
  const SequenceTokens split{&prompt, &output}, whole{&all, &none};
  const uint64_t salt = prefix_cache_salt(0, 0);
  EXPECT_EQ(prefix_page_hash(0, salt, split, 0, 4), prefix_page_hash(0, salt, whole, 0, 4));
  EXPECT_EQ(prefix_page_hash(5, salt, split, 4, 4), prefix_page_hash(5, salt, whole, 4, 4));
  expect_error([&] { prefix_page_hash(0, salt, whole, 6, 4); }, "not a full page");
}

TEST(PageAllocatorCache, CachedFreePagesCountAsFreeAndAreEvictedLastInLruOrder) {
  PageAllocator a(6);  // pages 1..5
  std::vector<int32_t> evicted;
  a.set_eviction_listener([&](int32_t page) { evicted.push_back(page); });
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(3, &pages));  // 1 2 3
  a.mark_cached(1);
  a.mark_cached(2);
  a.mark_cached(3);
  a.decref(2);  // freed first: least recently used
  a.decref(3);
  a.decref(1);
  EXPECT_EQ(a.num_free(), 5);
  EXPECT_EQ(a.num_cached_free(), 3);
  EXPECT_EQ(a.cached_free_pages(), (std::vector<int32_t>{2, 3, 1}));
  a.check_invariants();

  // Never-cached pages 4, 5 go first; no eviction while they last.
  EXPECT_EQ(a.allocate(), 4);
  EXPECT_EQ(a.allocate(), 5);
  EXPECT_TRUE(evicted.empty());
  // Then the cached-free ones, least recently freed first, each reported.
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(evicted, (std::vector<int32_t>{2}));
  EXPECT_FALSE(a.is_cached(2));
  a.check_invariants();

  // A hit revives a cached-free page: it leaves the LRU list.
  a.ref_cached(1);
  EXPECT_EQ(a.refcount(1), 1);
  EXPECT_EQ(a.cached_free_pages(), (std::vector<int32_t>{3}));
  EXPECT_EQ(a.allocate(), 3);
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(evicted, (std::vector<int32_t>{2, 3}));
  a.check_invariants();

  // Freed again, page 1 is still cached; uncache sends it to the free list.
  a.decref(1);
  EXPECT_EQ(a.num_cached_free(), 1);
  a.uncache(1);
  EXPECT_EQ(a.num_cached_free(), 0);
  EXPECT_EQ(a.num_free(), 1);
  a.check_invariants();
}

TEST(PageAllocatorCache, MisuseIsReported) {
  PageAllocator a(4);
  expect_error([&] { a.mark_cached(1); }, "only a referenced page");
  expect_error([&] { a.ref_cached(1); }, "not cached");
  expect_error([&] { a.uncache(1); }, "not cached");
  const int32_t p = a.allocate();
  a.mark_cached(p);
  expect_error([&] { a.mark_cached(p); }, "not cached yet");
  a.decref(p);
  expect_error([&] { a.decref(p); }, "double free");
  a.check_invariants();
}

// page_size 4, 8 usable pages, 3 rows, 4 pages per row.
KvCacheManager make_kv(bool caching = true) { return KvCacheManager(9, 4, 4, 4, caching); }

// Allocates and "computes" seq's whole prompt, then registers its full pages.
void prefill(KvCacheManager& kv, TestSeq& s) {
  const PrefixMatch match = kv.match_prefix(s.kv, s.tokens());
  const int32_t n = static_cast<int32_t>(s.prompt.size()) - match.num_tokens;
  ASSERT_TRUE(kv.allocate(s.kv, match, n));
  s.kv.num_computed += n;
  kv.cache_full_pages(s.kv, s.tokens());
}

TEST(KvCacheManagerPrefix, SecondSequenceAttachesTheSharedFullPages) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(10));  // pages: 2 full + 1 half
  prefill(kv, a);
  EXPECT_EQ(a.kv.pages, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(kv.prefix_cache().size(), 2);  // the half page is not registered
  EXPECT_TRUE(kv.allocator().is_cached(1));
  EXPECT_TRUE(kv.allocator().is_cached(2));
  EXPECT_FALSE(kv.allocator().is_cached(3));
  EXPECT_EQ(a.kv.page_hashes, chain(a.prompt, 4, prefix_cache_salt(0, 0)));
  kv.check_invariants({&a.kv});

  // Same first 9 tokens, then different.
  std::vector<int32_t> pb = iota_tokens(13);
  pb[9] = 1;
  TestSeq b = make_seq(2, pb);
  const PrefixMatch match = kv.match_prefix(b.kv, b.tokens());
  EXPECT_EQ(match.pages, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(match.num_tokens, 8);
  EXPECT_EQ(match.num_queried, 12);
  EXPECT_EQ(match.num_cached_free, 0);  // a still holds them
  ASSERT_TRUE(kv.allocate(b.kv, match, 5));
  EXPECT_EQ(b.kv.num_computed, 8);
  EXPECT_EQ(b.kv.pages, (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(kv.allocator().refcount(1), 2);
  EXPECT_EQ(kv.allocator().refcount(2), 2);
  const int32_t* row = kv.page_table().row(b.kv.slot);
  EXPECT_EQ(std::vector<int32_t>(row, row + 4), (std::vector<int32_t>{1, 2, 4, 5}));
  kv.check_invariants({&a.kv, &b.kv});

  const PrefixCacheStats stats = kv.prefix_cache_stats();
  EXPECT_EQ(stats.queried_tokens, 9 + 12);  // a's lookup (no hit) and b's
  EXPECT_EQ(stats.hit_tokens, 8);
  EXPECT_DOUBLE_EQ(stats.hit_rate(), 8.0 / 21.0);
  EXPECT_EQ(stats.cached_pages, 2);
  EXPECT_EQ(stats.cached_free_pages, 0);
}

TEST(KvCacheManagerPrefix, FreedCachedPagesStayMatchableAndCountAsFree) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(9));
  prefill(kv, a);
  kv.free(a.kv);
  EXPECT_EQ(kv.num_free_pages(), 8);  // cached-free pages count as free
  EXPECT_EQ(kv.prefix_cache_stats().cached_free_pages, 2);
  kv.check_invariants({});

  TestSeq b = make_seq(2, iota_tokens(9));
  const PrefixMatch match = kv.match_prefix(b.kv, b.tokens());
  EXPECT_EQ(match.pages, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(match.num_cached_free, 2);
  ASSERT_TRUE(kv.allocate(b.kv, match, 1));  // only the last token is computed
  EXPECT_EQ(kv.allocator().refcount(1), 1);
  EXPECT_EQ(kv.num_free_pages(), 5);
  kv.check_invariants({&b.kv});
}

TEST(KvCacheManagerPrefix, FullyCachedPromptLeavesItsLastTokenToCompute) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(8));  // exactly two pages
  prefill(kv, a);
  a.kv.num_computed = 8;
  kv.cache_full_pages(a.kv, a.tokens());
  EXPECT_EQ(kv.prefix_cache().size(), 2);
  kv.free(a.kv);

  TestSeq b = make_seq(2, iota_tokens(8));
  const PrefixMatch match = kv.match_prefix(b.kv, b.tokens());
  // Both pages are cached, but the last token's logits are needed: only page 1 is used.
  EXPECT_EQ(match.pages, (std::vector<int32_t>{1}));
  EXPECT_EQ(match.num_tokens, 4);
  ASSERT_TRUE(kv.allocate(b.kv, match, 4));
  EXPECT_EQ(b.kv.num_computed, 4);
  // Block 1 is written again into a fresh page (never a shared one): page 2 stays cached.
  EXPECT_EQ(b.kv.pages.size(), 2u);
  EXPECT_NE(b.kv.pages[1], 2);
  EXPECT_EQ(kv.allocator().refcount(b.kv.pages[1]), 1);
  b.kv.num_computed = 8;
  kv.cache_full_pages(b.kv, b.tokens());  // same hash as page 2: not registered twice
  EXPECT_FALSE(kv.allocator().is_cached(b.kv.pages[1]));
  EXPECT_EQ(kv.prefix_cache().size(), 2);
  kv.check_invariants({&b.kv});
  kv.free(b.kv);
  kv.check_invariants({});
  EXPECT_EQ(kv.num_free_pages(), 8);
}

TEST(KvCacheManagerPrefix, EvictsOnlyUnderPressureTailOfAChainFirst) {
  KvCacheManager kv = make_kv();  // 8 usable pages
  TestSeq a = make_seq(1, iota_tokens(12, 100));
  prefill(kv, a);
  a.kv.num_computed = 12;
  kv.cache_full_pages(a.kv, a.tokens());  // pages 1 2 3 cached
  kv.free(a.kv);                          // LRU: 3, 2, 1 (tail first)
  EXPECT_EQ(kv.allocator().cached_free_pages(), (std::vector<int32_t>{3, 2, 1}));

  // 5 never-cached pages are free: a 5-page demand evicts nothing...
  TestSeq b = make_seq(2, iota_tokens(16, 500));
  ASSERT_TRUE(kv.allocate(b.kv, 16));  // 4 pages
  TestSeq c = make_seq(3, iota_tokens(4, 900));
  ASSERT_TRUE(kv.allocate(c.kv, 4));   // 1 page
  EXPECT_EQ(kv.prefix_cache_stats().evictions, 0);
  EXPECT_EQ(kv.prefix_cache().size(), 3);
  // ...the next page evicts the chain's tail (page 3), keeping its head matchable.
  ASSERT_TRUE(kv.allocate(c.kv, 5));
  EXPECT_EQ(c.kv.pages.back(), 3);
  EXPECT_EQ(kv.prefix_cache_stats().evictions, 1);
  EXPECT_EQ(kv.prefix_cache().size(), 2);
  kv.check_invariants({&b.kv, &c.kv});

  TestSeq d = make_seq(4, iota_tokens(13, 100));
  const PrefixMatch match = kv.match_prefix(d.kv, d.tokens());
  EXPECT_EQ(match.pages, (std::vector<int32_t>{1, 2}));  // page 3's contents are gone
  // The 2 free pages are the matched ones: attaching them leaves nothing for the rest.
  EXPECT_EQ(kv.num_free_pages(), 2);
  EXPECT_FALSE(kv.can_allocate(d.kv, match, 5));
  EXPECT_FALSE(kv.allocate(d.kv, match, 5));
  EXPECT_TRUE(d.kv.pages.empty());
  EXPECT_EQ(d.kv.num_computed, 0);
  kv.check_invariants({&b.kv, &c.kv});
}

TEST(KvCacheManagerPrefix, ResetForgetsEveryHashAndFreesCachedPages) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(9));
  prefill(kv, a);
  TestSeq keep = make_seq(2, iota_tokens(9, 300));
  prefill(kv, keep);  // running: its cached pages become ordinary ones
  kv.free(a.kv);
  EXPECT_EQ(kv.prefix_cache().size(), 4);
  kv.reset_prefix_cache();
  EXPECT_EQ(kv.prefix_cache().size(), 0);
  EXPECT_EQ(kv.allocator().num_cached_free(), 0);
  EXPECT_EQ(kv.num_free_pages(), 5);
  kv.check_invariants({&keep.kv});
  TestSeq b = make_seq(3, iota_tokens(9));
  EXPECT_TRUE(kv.match_prefix(b.kv, b.tokens()).pages.empty());
  kv.free(keep.kv);
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.allocator().num_cached_free(), 0);
  kv.check_invariants({});
}

TEST(KvCacheManagerPrefix, NewSaltMatchesNothingAndStaleChainsStopRegistering) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(12));
  const PrefixMatch none = kv.match_prefix(a.kv, a.tokens());
  ASSERT_TRUE(kv.allocate(a.kv, none, 4));
  a.kv.num_computed = 4;
  kv.cache_full_pages(a.kv, a.tokens());
  EXPECT_EQ(kv.prefix_cache().size(), 1);

  kv.set_prefix_salt(/*weights_version=*/1);
  ASSERT_TRUE(kv.allocate(a.kv, 4));
  a.kv.num_computed = 8;
  kv.cache_full_pages(a.kv, a.tokens());  // a began under version 0: not registered
  EXPECT_EQ(kv.prefix_cache().size(), 1);
  TestSeq b = make_seq(2, iota_tokens(12));
  EXPECT_TRUE(kv.match_prefix(b.kv, b.tokens()).pages.empty());
  kv.check_invariants({&a.kv});
}

TEST(KvCacheManagerPrefix, DisabledCachesNothingAndFreesAtOnce) {
  KvCacheManager kv = make_kv(/*caching=*/false);
  TestSeq a = make_seq(1, iota_tokens(9));
  prefill(kv, a);
  EXPECT_EQ(kv.prefix_cache().size(), 0);
  kv.free(a.kv);
  EXPECT_EQ(kv.allocator().num_cached_free(), 0);
  TestSeq b = make_seq(2, iota_tokens(9));
  const PrefixMatch match = kv.match_prefix(b.kv, b.tokens());
  EXPECT_TRUE(match.pages.empty());
  EXPECT_EQ(match.num_queried, 0);
  EXPECT_EQ(kv.prefix_cache_stats().queried_tokens, 0);
}

TEST(KvCacheManagerPrefix, ForkOfACachedSequenceKeepsInvariants) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(10));
  prefill(kv, a);
  KvSequence child;
  child.id = 2;
  ASSERT_TRUE(kv.fork(a.kv, child));
  EXPECT_EQ(child.pages, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kv.allocator().refcount(1), 2);
  kv.check_invariants({&a.kv, &child});
  kv.free(a.kv);
  kv.free(child);
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.allocator().num_cached_free(), 2);
  kv.check_invariants({});
}

TEST(KvCacheManagerPrefix, MatchRejectsASequenceThatAlreadyHoldsPages) {
  KvCacheManager kv = make_kv();
  TestSeq a = make_seq(1, iota_tokens(9));
  prefill(kv, a);
  expect_error([&] { kv.match_prefix(a.kv, a.tokens()); }, "first allocation");
}

}  // namespace
}  // namespace pagellm
