// Unit tests of the fixed-capacity page table.
#include "pagellm/kv/page_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "common/expect_error.h"

namespace pagellm {
namespace {

using testing::expect_error;

TEST(PageTable, HandsOutRowsOneUpLowestFirstAndNeverRowZero) {
  PageTable t(4, 3);
  EXPECT_EQ(t.num_free_rows(), 3);
  EXPECT_EQ(t.acquire(), 1);
  EXPECT_EQ(t.acquire(), 2);
  EXPECT_EQ(t.acquire(), 3);
  EXPECT_EQ(t.acquire(), -1);
  EXPECT_EQ(t.num_used_rows(), 3);
  t.release(2);
  t.release(1);
  EXPECT_EQ(t.acquire(), 1);  // lowest free row first, whatever the release order
  EXPECT_EQ(t.acquire(), 2);
  EXPECT_FALSE(t.in_use(0));
  t.check_invariants();
}

TEST(PageTable, EntriesAreRowMajorAndReleaseZeroesTheRow) {
  PageTable t(3, 4);
  int32_t r = t.acquire();
  ASSERT_EQ(r, 1);
  t.set(r, 0, 7);
  t.set(r, 3, 9);
  EXPECT_EQ(t.get(r, 0), 7);
  EXPECT_EQ(t.row(r)[3], 9);
  EXPECT_EQ(t.data().size(), 12u);
  EXPECT_EQ(t.data()[1 * 4 + 0], 7);
  EXPECT_EQ(t.data()[1 * 4 + 3], 9);
  EXPECT_EQ(t.row(r)[1], 0);  // unset entries are padding
  t.check_invariants();
  t.release(r);
  for (int32_t b = 0; b < 4; ++b) EXPECT_EQ(t.get(1, b), 0);
  t.check_invariants();
}

TEST(PageTable, RowZeroIsReservedAndAllZeros) {
  PageTable t(2, 2);
  expect_error([&] { t.release(0); }, "row 0 is reserved");
  expect_error([&] { t.set(0, 0, 5); }, "row 0 is reserved");
  for (int32_t b = 0; b < 2; ++b) EXPECT_EQ(t.row(0)[b], 0);
  expect_error([] { PageTable bad(1, 4); }, "at least 2 rows");
  expect_error([] { PageTable bad(4, 0); }, "max_pages_per_seq must be at least 1");
}

TEST(PageTable, CapacityAndRowOwnershipAreEnforced) {
  PageTable t(3, 2);
  int32_t r = t.acquire();
  t.set(r, 1, 4);
  expect_error([&] { t.set(r, 2, 5); }, "capacity of 2 pages per sequence");
  expect_error([&] { t.set(r, -1, 5); }, "logical block -1");
  expect_error([&] { t.set(2, 0, 5); }, "row 2, which is not in use");
  expect_error([&] { t.set(r, 0, -3); }, "non-negative");
  t.release(r);
  expect_error([&] { t.release(r); }, "row 1, which is not in use");
  expect_error([&] { t.release(3); }, "rows are 1..2");
  expect_error([&] { t.get(3, 0); }, "outside");
  t.check_invariants();
}

struct Taken {
  std::vector<PageTableUpdate> updates;
  std::vector<int32_t> values;
};

Taken take(PageTable& t) {
  Taken k;
  t.take_updates(&k.updates, &k.values);
  EXPECT_EQ(t.num_pending_entries(), 0);
  return k;
}

std::vector<std::vector<int32_t>> runs(const Taken& k) {
  std::vector<std::vector<int32_t>> r;
  for (const PageTableUpdate& u : k.updates) r.push_back({u.row, u.begin, u.end});
  return r;
}

using Runs = std::vector<std::vector<int32_t>>;

// Only changed entries travel: appends give one run per row, a release zeroes the row's
// non-zero span, and a row released and reacquired before the upload sends one merged run
// with its current values.
TEST(PageTable, TakeUpdatesGivesOnlyChangedEntries) {
  PageTable t(4, 6);
  EXPECT_TRUE(take(t).updates.empty());  // a new table equals a zero-filled copy
  const int32_t a = t.acquire(), b = t.acquire();
  t.set(a, 0, 5);
  t.set(a, 1, 6);
  t.set(b, 0, 9);
  EXPECT_EQ(t.num_pending_entries(), 3);
  Taken k = take(t);
  EXPECT_EQ(runs(k), (Runs{{1, 0, 2}, {2, 0, 1}}));
  EXPECT_EQ(k.values, (std::vector<int32_t>{5, 6, 9}));
  EXPECT_TRUE(take(t).updates.empty());  // taken once

  // A decode that crosses into a new page: one entry.
  t.set(b, 1, 11);
  t.set(a, 1, 6);  // unchanged value: nothing to send
  k = take(t);
  EXPECT_EQ(runs(k), (Runs{{2, 1, 2}}));
  EXPECT_EQ(k.values, (std::vector<int32_t>{11}));

  // Both rows released (their non-zero spans zeroed), then row 1 reacquired (lowest free
  // row first) by a sequence with one page: row 1 sends one run over the release and the
  // new page, with the current values; row 2 its zeros.
  t.release(a);
  t.release(b);
  EXPECT_EQ(t.acquire(), 1);
  t.set(1, 0, 3);
  k = take(t);
  EXPECT_EQ(runs(k), (Runs{{1, 0, 2}, {2, 0, 2}}));
  EXPECT_EQ(k.values, (std::vector<int32_t>{3, 0, 0, 0}));
  t.release(1);
  k = take(t);
  EXPECT_EQ(runs(k), (Runs{{1, 0, 1}}));
  EXPECT_EQ(k.values, (std::vector<int32_t>{0}));
  t.check_invariants();
}

// A copy that applies every batch of updates equals the table after random operations.
TEST(PageTable, AppliedUpdatesReproduceTheTable) {
  PageTable t(5, 7);
  std::vector<int32_t> copy(t.data().size(), 0);
  uint32_t state = 12345;
  auto next = [&](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return static_cast<int32_t>((state >> 8) % n);
  };
  for (int round = 0; round < 500; ++round) {
    const int32_t op = next(4);
    const int32_t row = 1 + next(4);
    if (op == 0 && !t.in_use(row)) {
      t.acquire();
    } else if (op == 1 && t.in_use(row)) {
      t.release(row);
    } else if (t.in_use(row)) {
      t.set(row, next(7), next(20));
    }
    if (next(3) == 0) {
      Taken k = take(t);
      size_t v = 0;
      for (const PageTableUpdate& u : k.updates) {
        ASSERT_TRUE(u.row >= 1 && u.row < 5 && 0 <= u.begin && u.begin < u.end && u.end <= 7);
        for (int32_t j = u.begin; j < u.end; ++j) copy[u.row * 7 + j] = k.values[v++];
      }
      ASSERT_EQ(v, k.values.size());
      ASSERT_EQ(copy, t.data()) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace pagellm
