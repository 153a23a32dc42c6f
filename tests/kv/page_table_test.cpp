// Unit tests of the fixed-capacity page table.
#include "pagellm/kv/page_table.h"

#include <gtest/gtest.h>

#include <string>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

template <class Fn>
void expect_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

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

}  // namespace
}  // namespace pagellm
