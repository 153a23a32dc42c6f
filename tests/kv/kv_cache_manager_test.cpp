// Unit tests of the KV cache manager (TensorRT-LLM style): a real manager, and the expected
// state after each call (pages, row, free counts, refcounts, the page-table row itself).
#include "pagellm/kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "common/expect_error.h"

namespace pagellm {
namespace {

using testing::expect_error;

std::vector<int32_t> row_of(const KvCacheManager& kv, int32_t row) {
  const int32_t* r = kv.page_table().row(row);
  return std::vector<int32_t>(r, r + kv.max_pages_per_seq());
}

KvSequence seq_with_id(int64_t id) {
  KvSequence s;
  s.id = id;
  return s;
}

TEST(KvCacheManager, AllocateAppendsPagesForComputedPlusNewTokens) {
  KvCacheManager kv(/*num_pages=*/9, /*page_size=*/4, /*max_slots=*/3, /*max_pages_per_seq=*/4);
  EXPECT_EQ(kv.num_usable_pages(), 8);
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.num_free_rows(), 2);
  KvSequence a = seq_with_id(1);

  // 5 tokens: 2 pages, row 1.
  EXPECT_EQ(kv.pages_needed(a, 5), 2);
  ASSERT_TRUE(kv.can_allocate(a, 5));
  ASSERT_TRUE(kv.allocate(a, 5));
  EXPECT_EQ(a.slot, 1);
  EXPECT_EQ(a.pages, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(row_of(kv, 1), (std::vector<int32_t>{1, 2, 0, 0}));
  EXPECT_EQ(kv.num_free_pages(), 6);
  EXPECT_EQ(kv.num_used_rows(), 1);
  kv.check_invariants({&a});

  // 5 computed, 3 more: 8 tokens still fit 2 pages; nothing changes.
  a.num_computed = 5;
  EXPECT_EQ(kv.pages_needed(a, 3), 0);
  ASSERT_TRUE(kv.allocate(a, 3));
  EXPECT_EQ(a.pages.size(), 2u);
  EXPECT_EQ(kv.num_free_pages(), 6);

  // 1 more token (the 9th): a third page, written into the same row.
  ASSERT_TRUE(kv.allocate(a, 4));
  EXPECT_EQ(a.pages, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(row_of(kv, 1), (std::vector<int32_t>{1, 2, 3, 0}));
  EXPECT_EQ(kv.num_free_pages(), 5);
  kv.check_invariants({&a});

  // Beyond the row's 4 pages (16 tokens) is an engine bug, named with the capacity.
  expect_error([&] { kv.can_allocate(a, 12); }, "a page-table row holds 4");
}

TEST(KvCacheManager, AllocateIsAllOrNothing) {
  KvCacheManager kv(4, 2, 3, 8);  // 3 usable pages of 2 tokens
  KvSequence a = seq_with_id(1), b = seq_with_id(2), c = seq_with_id(3);
  ASSERT_TRUE(kv.allocate(a, 4));  // 2 pages
  EXPECT_FALSE(kv.can_allocate(b, 3));
  EXPECT_FALSE(kv.allocate(b, 3));  // needs 2, 1 free: no row, no page taken
  EXPECT_EQ(b.slot, 0);
  EXPECT_TRUE(b.pages.empty());
  EXPECT_EQ(kv.num_free_pages(), 1);
  EXPECT_EQ(kv.num_free_rows(), 1);
  ASSERT_TRUE(kv.allocate(b, 2));
  EXPECT_EQ(b.slot, 2);
  // Pages left (0 needed) but no row: a sequence without a row cannot start.
  EXPECT_EQ(kv.num_free_rows(), 0);
  EXPECT_FALSE(kv.can_allocate(c, 0));
  EXPECT_FALSE(kv.allocate(c, 0));
  kv.check_invariants({&a, &b});
}

TEST(KvCacheManager, FreeReturnsPagesAndZeroesTheRow) {
  KvCacheManager kv(9, 4, 3, 4);
  KvSequence a = seq_with_id(1), b = seq_with_id(2);
  ASSERT_TRUE(kv.allocate(a, 9));   // pages 1 2 3, row 1
  ASSERT_TRUE(kv.allocate(b, 4));   // page 4, row 2
  a.num_computed = 9;
  kv.free(a);
  EXPECT_TRUE(a.pages.empty());
  EXPECT_EQ(a.slot, 0);
  EXPECT_EQ(a.num_computed, 9);  // progress is the caller's to reset
  EXPECT_EQ(row_of(kv, 1), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(kv.num_free_pages(), 7);
  EXPECT_EQ(kv.num_free_rows(), 1);
  kv.check_invariants({&b});
  kv.free(a);  // nothing held: no change, no double free
  EXPECT_EQ(kv.num_free_pages(), 7);

  // The FIFO free list hands out never-used pages before the ones just freed.
  KvSequence c = seq_with_id(3);
  ASSERT_TRUE(kv.allocate(c, 4));
  EXPECT_EQ(c.pages, (std::vector<int32_t>{5}));
  EXPECT_EQ(c.slot, 1);  // lowest free row
  kv.free(b);
  kv.free(c);
  EXPECT_EQ(kv.num_free_pages(), kv.num_usable_pages());
  EXPECT_EQ(kv.num_used_rows(), 0);
  kv.check_invariants({});
}

TEST(KvCacheManager, ForkSharesFullComputedPagesByReference) {
  KvCacheManager kv(9, 4, 4, 4);
  KvSequence parent = seq_with_id(1);
  ASSERT_TRUE(kv.allocate(parent, 10));  // pages 1 2 3: blocks 0, 1 full, block 2 half
  parent.num_computed = 10;

  KvSequence child = seq_with_id(2);
  ASSERT_TRUE(kv.fork(parent, child));
  EXPECT_EQ(child.slot, 2);
  EXPECT_EQ(child.pages, (std::vector<int32_t>{1, 2}));  // the half page is not shared
  EXPECT_EQ(child.num_computed, 8);                      // it recomputes tokens 8, 9
  EXPECT_EQ(row_of(kv, 2), (std::vector<int32_t>{1, 2, 0, 0}));
  EXPECT_EQ(kv.allocator().refcount(1), 2);
  EXPECT_EQ(kv.allocator().refcount(2), 2);
  EXPECT_EQ(kv.allocator().refcount(3), 1);
  EXPECT_EQ(kv.num_free_pages(), 5);  // sharing takes no page
  kv.check_invariants({&parent, &child});

  // The child grows into pages of its own.
  ASSERT_TRUE(kv.allocate(child, 3));  // tokens 8..10: block 2
  EXPECT_EQ(child.pages, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(row_of(kv, 2), (std::vector<int32_t>{1, 2, 4, 0}));
  kv.check_invariants({&parent, &child});

  // Freeing the parent keeps the shared pages alive for the child.
  kv.free(parent);
  EXPECT_EQ(kv.allocator().refcount(1), 1);
  EXPECT_EQ(kv.allocator().refcount(3), 0);
  EXPECT_EQ(kv.num_free_pages(), 5);
  kv.check_invariants({&child});
  kv.free(child);
  EXPECT_EQ(kv.num_free_pages(), 8);
  kv.check_invariants({});
}

TEST(KvCacheManager, ForkFailsWithoutARowAndRejectsMisuse) {
  KvCacheManager kv(9, 4, 3, 4);  // 2 rows
  KvSequence parent = seq_with_id(1), child = seq_with_id(2), other = seq_with_id(3);
  expect_error([&] { kv.fork(parent, child); }, "request 1 has no page-table row");
  ASSERT_TRUE(kv.allocate(parent, 8));
  parent.num_computed = 8;
  ASSERT_TRUE(kv.fork(parent, child));
  EXPECT_FALSE(kv.fork(parent, other));  // no row left: nothing changes
  EXPECT_EQ(other.slot, 0);
  EXPECT_TRUE(other.pages.empty());
  EXPECT_EQ(kv.allocator().refcount(1), 2);
  expect_error([&] { kv.fork(parent, child); }, "request 2 must be empty");
  kv.check_invariants({&parent, &child});
}

TEST(KvCacheManager, InvariantsCatchBrokenBookkeeping) {
  KvCacheManager kv(9, 4, 3, 4);
  KvSequence a = seq_with_id(1), b = seq_with_id(2);
  ASSERT_TRUE(kv.allocate(a, 8));
  ASSERT_TRUE(kv.allocate(b, 4));
  // A sequence missing from the list leaves its pages unaccounted for.
  expect_error([&] { kv.check_invariants({&a}); }, "owner references");
  // A page list that disagrees with the row.
  std::swap(a.pages[0], a.pages[1]);
  expect_error([&] { kv.check_invariants({&a, &b}); }, "maps block 0");
  std::swap(a.pages[0], a.pages[1]);
  // A page that will be written but is shared.
  kv.allocator().incref(b.pages[0]);
  std::vector<int32_t> outside = {b.pages[0]};
  expect_error([&] { kv.check_invariants({&a, &b}, {&outside}); }, "which is shared");
  b.num_computed = 4;  // block 0 is now full and only read: sharing it is fine
  kv.check_invariants({&a, &b}, {&outside});
}

TEST(KvCacheManager, BadConfigsThrow) {
  expect_error([] { KvCacheManager kv(1, 4, 3, 4); }, "at least 2 pages");
  expect_error([] { KvCacheManager kv(9, 0, 3, 4); }, "page_size must be at least 1");
  expect_error([] { KvCacheManager kv(9, 4, 1, 4); }, "at least 2 rows");
  expect_error([] { KvCacheManager kv(9, 4, 3, 0); }, "max_pages_per_seq must be at least 1");
}

}  // namespace
}  // namespace pagellm
