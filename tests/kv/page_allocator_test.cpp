// Unit tests of the reference-counted page allocator.
#include "pagellm/kv/page_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "pagellm/common/check.h"
#include "common/expect_error.h"

namespace pagellm {
namespace {

using testing::expect_error;

TEST(PageAllocator, FreshPoolHandsOutPagesOneToNInOrder) {
  PageAllocator a(5);
  EXPECT_EQ(a.num_pages(), 5);
  EXPECT_EQ(a.num_usable(), 4);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_referenced(), 0);
  for (int32_t expected = 1; expected <= 4; ++expected) {
    EXPECT_EQ(a.allocate(), expected);
    EXPECT_EQ(a.refcount(expected), 1);
    EXPECT_EQ(a.num_free() + a.num_referenced(), a.num_usable());
    a.check_invariants();
  }
  EXPECT_EQ(a.refcount(0), 0);
}

TEST(PageAllocator, OutOfPagesReportsFailureAndChangesNothing) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(2, &pages));
  EXPECT_EQ(pages, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(a.can_allocate(2));
  EXPECT_FALSE(a.allocate(2, &pages));  // only one left: all or nothing
  EXPECT_EQ(pages.size(), 2u);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.allocate(), 3);
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_TRUE(a.allocate(0, &pages));
  EXPECT_EQ(a.num_free(), 0);
  a.check_invariants();
}

TEST(PageAllocator, FreeListIsFifo) {
  PageAllocator a(5);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(4, &pages));
  EXPECT_TRUE(a.decref(3));
  EXPECT_TRUE(a.decref(1));
  EXPECT_EQ(a.allocate(), 3);  // freed first, reused first
  EXPECT_EQ(a.allocate(), 1);
  a.check_invariants();
}

TEST(PageAllocator, RefcountsShareAPageUntilTheLastOwnerDrops) {
  PageAllocator a(3);
  int32_t p = a.allocate();
  a.incref(p);
  a.incref(p);
  EXPECT_EQ(a.refcount(p), 3);
  EXPECT_EQ(a.num_referenced(), 1);
  EXPECT_FALSE(a.decref(p));
  EXPECT_FALSE(a.decref(p));
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.decref(p));
  EXPECT_EQ(a.refcount(p), 0);
  EXPECT_EQ(a.num_free(), 2);
  a.check_invariants();
}

TEST(PageAllocator, DoubleFreeIsAnErrorAndLeavesStateIntact) {
  PageAllocator a(3);
  int32_t p = a.allocate();
  EXPECT_TRUE(a.decref(p));
  expect_error([&] { a.decref(p); }, "double free of page 1");
  EXPECT_EQ(a.num_free(), 2);
  a.check_invariants();
  std::vector<int32_t> twice = {a.allocate()};
  twice.push_back(twice[0]);
  expect_error([&] { a.release(twice); }, "double free");
}

TEST(PageAllocator, MisuseOfReservedOrInvalidPagesThrows) {
  PageAllocator a(3);
  expect_error([&] { a.decref(0); }, "page 0 is reserved");
  expect_error([&] { a.incref(0); }, "page 0 is reserved");
  expect_error([&] { a.decref(3); }, "pages are 1..2");
  expect_error([&] { a.incref(-1); }, "pages are 1..2");
  expect_error([&] { a.incref(2); }, "incref of free page 2");
  expect_error([&] { a.refcount(7); }, "refcount of page 7");
  expect_error([] { PageAllocator bad(1); }, "at least 2 pages");
  a.check_invariants();
}

TEST(PageAllocator, PageZeroIsNeverHandedOutAcrossManyCycles) {
  PageAllocator a(9);
  for (int round = 0; round < 50; ++round) {
    std::vector<int32_t> pages;
    // Take a varying number of pages, free every other one, then the rest.
    ASSERT_TRUE(a.allocate(1 + round % 8, &pages));
    std::set<int32_t> unique(pages.begin(), pages.end());
    EXPECT_EQ(unique.size(), pages.size());
    EXPECT_EQ(unique.count(0), 0u);
    for (size_t i = 0; i < pages.size(); i += 2) a.decref(pages[i]);
    a.check_invariants();
    for (size_t i = 1; i < pages.size(); i += 2) a.decref(pages[i]);
    a.check_invariants();
    EXPECT_EQ(a.num_free(), 8);
  }
}

TEST(PageAllocator, OwnershipCrossCheckCountsEveryReference) {
  PageAllocator a(6);
  std::vector<int32_t> seq_a, seq_b;
  ASSERT_TRUE(a.allocate(2, &seq_a));  // 1, 2
  ASSERT_TRUE(a.allocate(1, &seq_b));  // 3
  a.check_invariants({&seq_a, &seq_b});

  // b shares a's first page on purpose.
  a.incref(seq_a[0]);
  seq_b.insert(seq_b.begin(), seq_a[0]);
  a.check_invariants({&seq_a, &seq_b});

  // Forgetting an owner is caught: page 1 has refcount 2 but one reference.
  expect_error([&] { a.check_invariants({&seq_a}); }, "page 1 has refcount 2 but 1");
  // A list naming the same page twice without a second reference is caught.
  std::vector<int32_t> dup = {4, 4};
  ASSERT_EQ(a.allocate(), 4);
  expect_error([&] { a.check_invariants({&seq_a, &seq_b, &dup}); },
               "page 4 has refcount 1 but 2");
  // An owner of a free page is caught.
  std::vector<int32_t> stale = {5};
  std::vector<int32_t> four = {4};
  expect_error([&] { a.check_invariants({&seq_a, &seq_b, &four, &stale}); }, "free page 5");
  a.check_invariants({&seq_a, &seq_b, &four});
}

}  // namespace
}  // namespace pagellm
