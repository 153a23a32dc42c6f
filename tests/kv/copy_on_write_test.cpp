// n-sample fan-out in the KV cache manager: fork_all_pages shares every page of the parent,
// the partly filled last one included, and allocate_for_write copies a shared page before a
// holder writes into it (copy-on-write). Expected state after each call: pages, rows,
// refcounts, the copies recorded, free counts; check_invariants after every call.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "common/expect_error.h"
#include "pagellm/kv/kv_cache_manager.h"

namespace pagellm {
namespace {

using testing::expect_error;
using Copies = std::vector<KvCacheManager::PageCopy>;

std::vector<int32_t> row_of(const KvCacheManager& kv, int32_t row) {
  const int32_t* r = kv.page_table().row(row);
  return std::vector<int32_t>(r, r + kv.max_pages_per_seq());
}

KvSequence seq_with_id(int64_t id) {
  KvSequence s;
  s.id = id;
  return s;
}

/// A parent that has computed `tokens` tokens (its pages hold exactly those).
KvSequence computed_parent(KvCacheManager& kv, int64_t id, int32_t tokens) {
  KvSequence parent = seq_with_id(id);
  EXPECT_TRUE(kv.allocate(parent, tokens));
  parent.num_computed = tokens;
  return parent;
}

TEST(CopyOnWrite, ForkAllPagesSharesThePartlyFilledLastPage) {
  KvCacheManager kv(/*num_pages=*/12, /*page_size=*/4, /*max_slots=*/5, /*max_pages_per_seq=*/4);
  KvSequence parent = computed_parent(kv, 1, 10);  // pages 1 2 3; page 3 holds 2 of 4
  KvSequence a = seq_with_id(2), b = seq_with_id(3);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  ASSERT_TRUE(kv.fork_all_pages(parent, b));
  EXPECT_EQ(a.pages, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(a.num_computed, 10);
  EXPECT_EQ(a.slot, 2);
  EXPECT_EQ(b.slot, 3);
  EXPECT_EQ(row_of(kv, 3), (std::vector<int32_t>{1, 2, 3, 0}));
  for (int32_t page : {1, 2, 3}) EXPECT_EQ(kv.allocator().refcount(page), 3) << page;
  EXPECT_EQ(kv.num_free_pages(), 8);  // sharing takes no page
  EXPECT_EQ(kv.num_pending_page_copies(), 0);
  kv.check_invariants({&parent, &a, &b});

  // Each holder's next token writes block 2, which all three share.
  EXPECT_EQ(kv.pages_to_copy(parent, 1), 1);
  EXPECT_EQ(kv.pages_to_copy(a, 1), 1);
  // A token past the shared pages writes none of them (block 3 is new).
  KvSequence c = seq_with_id(9);
  EXPECT_EQ(kv.pages_to_copy(c, 5), 0);
}

TEST(CopyOnWrite, EachWriterCopiesOnceAndTheLastHolderWritesInPlace) {
  KvCacheManager kv(12, 4, 5, 4);
  KvSequence parent = computed_parent(kv, 1, 10);
  KvSequence a = seq_with_id(2), b = seq_with_id(3);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  ASSERT_TRUE(kv.fork_all_pages(parent, b));

  // a writes token 10 (block 2): it gets page 4 with a copy of page 3.
  ASSERT_TRUE(kv.allocate_for_write(a, 1));
  EXPECT_EQ(a.pages, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(row_of(kv, 2), (std::vector<int32_t>{1, 2, 4, 0}));
  EXPECT_EQ(kv.allocator().refcount(3), 2);
  EXPECT_EQ(kv.allocator().refcount(4), 1);
  EXPECT_EQ(kv.num_pending_page_copies(), 1);
  a.num_computed = 11;
  kv.check_invariants({&parent, &a, &b});
  // Its next token writes its own page: no second copy.
  EXPECT_EQ(kv.pages_to_copy(a, 1), 0);
  ASSERT_TRUE(kv.allocate_for_write(a, 1));
  EXPECT_EQ(kv.num_pending_page_copies(), 1);
  a.num_computed = 12;

  // b writes two tokens (10, 11): one copy, page 5.
  ASSERT_TRUE(kv.allocate_for_write(b, 2));
  EXPECT_EQ(b.pages, (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(kv.allocator().refcount(3), 1);
  b.num_computed = 12;
  kv.check_invariants({&parent, &a, &b});

  // The parent is now page 3's last holder: it writes in place, no copy, no new page.
  const int32_t free_before = kv.num_free_pages();
  EXPECT_EQ(kv.pages_to_copy(parent, 1), 0);
  ASSERT_TRUE(kv.allocate_for_write(parent, 1));
  EXPECT_EQ(parent.pages, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(kv.num_free_pages(), free_before);
  parent.num_computed = 11;
  kv.check_invariants({&parent, &a, &b});

  // The copies, in order, each once.
  EXPECT_EQ(kv.take_page_copies(), (Copies{{3, 4}, {3, 5}}));
  EXPECT_EQ(kv.num_pending_page_copies(), 0);
  EXPECT_TRUE(kv.take_page_copies().empty());

  // The full pages stay shared; writes past them take fresh pages.
  EXPECT_EQ(kv.allocator().refcount(1), 3);
  ASSERT_TRUE(kv.allocate_for_write(a, 1));  // token 12: block 3, a new page
  EXPECT_EQ(a.pages.size(), 4u);
  EXPECT_EQ(kv.num_pending_page_copies(), 0);
  kv.check_invariants({&parent, &a, &b});

  kv.free(parent);
  kv.free(a);
  EXPECT_EQ(kv.allocator().refcount(1), 1);  // b still holds the prompt's full pages
  kv.check_invariants({&b});
  kv.free(b);
  EXPECT_EQ(kv.num_free_pages(), kv.num_usable_pages());
  EXPECT_EQ(kv.num_used_rows(), 0);
  kv.check_invariants({});
}

TEST(CopyOnWrite, AFullLastPageIsNeverCopied) {
  KvCacheManager kv(12, 4, 4, 4);
  KvSequence parent = computed_parent(kv, 1, 8);  // two full pages
  KvSequence a = seq_with_id(2);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  EXPECT_EQ(kv.pages_to_copy(a, 1), 0);  // token 8 opens block 2
  ASSERT_TRUE(kv.allocate_for_write(a, 1));
  ASSERT_TRUE(kv.allocate_for_write(parent, 1));
  EXPECT_NE(a.pages[2], parent.pages[2]);
  EXPECT_TRUE(kv.take_page_copies().empty());
  kv.check_invariants({&parent, &a});
}

TEST(CopyOnWrite, AllOrNothingWhenPagesAreShort) {
  KvCacheManager kv(6, 4, 4, 4);  // 5 usable pages
  KvSequence parent = computed_parent(kv, 1, 10);  // 3 pages
  KvSequence a = seq_with_id(2);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  KvSequence hog = seq_with_id(3);
  ASSERT_TRUE(kv.allocate(hog, 4));  // 1 page left
  // Tokens 10..13 need a copy of block 2 and a new block 3: 2 pages, 1 free.
  EXPECT_EQ(kv.pages_to_copy(a, 4), 1);
  EXPECT_FALSE(kv.can_allocate_for_write(a, 4));
  EXPECT_FALSE(kv.allocate_for_write(a, 4));
  EXPECT_EQ(a.pages, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(kv.allocator().refcount(3), 2);
  EXPECT_EQ(kv.num_pending_page_copies(), 0);
  EXPECT_EQ(kv.num_free_pages(), 1);
  // One token needs only the copy.
  EXPECT_TRUE(kv.can_allocate_for_write(a, 1));
  ASSERT_TRUE(kv.allocate_for_write(a, 1));
  EXPECT_EQ(kv.num_free_pages(), 0);
  kv.check_invariants({&parent, &a, &hog});
}

TEST(CopyOnWrite, FreeingAWriterDropsItsPendingCopy) {
  KvCacheManager kv(12, 4, 5, 4);
  KvSequence parent = computed_parent(kv, 1, 6);  // pages 1 2; page 2 half full
  KvSequence a = seq_with_id(2), b = seq_with_id(3);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  ASSERT_TRUE(kv.fork_all_pages(parent, b));
  ASSERT_TRUE(kv.allocate_for_write(a, 1));  // copy 2 -> 3
  ASSERT_TRUE(kv.allocate_for_write(b, 1));  // copy 2 -> 4
  EXPECT_EQ(kv.num_pending_page_copies(), 2);
  kv.free(a);  // preempted before the step ran: its copy must not run into a free page
  EXPECT_EQ(kv.take_page_copies(), (Copies{{2, 4}}));
  kv.check_invariants({&parent, &b});
}

TEST(CopyOnWrite, ForkAllPagesRejectsMisuseAndFailsWithoutARow) {
  KvCacheManager kv(12, 4, 3, 4);  // 2 rows
  KvSequence parent = seq_with_id(1), child = seq_with_id(2), other = seq_with_id(3);
  expect_error([&] { kv.fork_all_pages(parent, child); }, "request 1 has no page-table row");
  ASSERT_TRUE(kv.allocate(parent, 6));
  // Pages allocated for a step that has not run (nothing computed) cannot be shared.
  expect_error([&] { kv.fork_all_pages(parent, child); }, "only computed pages can be shared");
  parent.num_computed = 6;
  ASSERT_TRUE(kv.fork_all_pages(parent, child));
  expect_error([&] { kv.fork_all_pages(parent, child); }, "request 2 must be empty");
  EXPECT_FALSE(kv.fork_all_pages(parent, other));  // no row left: nothing changes
  EXPECT_TRUE(other.pages.empty());
  EXPECT_EQ(kv.allocator().refcount(1), 2);
  kv.check_invariants({&parent, &child});
}

TEST(CopyOnWrite, InvariantsCatchAWriteIntoASharedPage) {
  KvCacheManager kv(12, 4, 4, 4);
  KvSequence parent = computed_parent(kv, 1, 6);
  KvSequence a = seq_with_id(2);
  ASSERT_TRUE(kv.fork_all_pages(parent, a));
  // allocate(), not allocate_for_write(): block 2 is appended fresh, but suppose a page
  // beyond the computed tokens were shared: the invariant names it.
  ASSERT_TRUE(kv.allocate(a, 3));  // tokens 6..8: block 2 (new)
  kv.allocator().incref(a.pages[2]);
  std::vector<int32_t> outside = {a.pages[2]};
  expect_error([&] { kv.check_invariants({&parent, &a}, {&outside}); }, "which is shared");
}

}  // namespace
}  // namespace pagellm
