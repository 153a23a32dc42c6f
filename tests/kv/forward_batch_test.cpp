// ForwardBatch::validate() on the persistent page-table fields: every rule has a batch
// that breaks it and an error that names it.
#include "pagellm/kv/forward_batch.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "common/expect_error.h"

namespace pagellm {
namespace {

using testing::expect_error;

// Two sequences in rows 2 and 1 of a 3-row table of 3 entries, pages of 4 tokens:
// sequence 0 decodes position 4 (page 7, its second page, sent in this batch), sequence 1
// prefills positions 0..1 in page 5.
ForwardBatch persistent_batch() {
  ForwardBatch b;
  b.page_size = 4;
  b.max_pages_per_seq = 3;
  b.token_ids = {10, 11, 12};
  b.positions = {4, 0, 1};
  b.slot_mapping = {7 * 4 + 0, 5 * 4 + 0, 5 * 4 + 1};
  b.query_start = {0, 1, 3};
  b.kv_lens = {5, 2};
  b.logits_indices = {0, 2};
  b.seq_slots = {2, 1};
  b.page_table_rows = 3;
  b.page_table_updates = {{2, 1, 2}, {1, 0, 1}};
  b.page_table_values = {7, 5};
  return b;
}

// The engine's table once the updates are applied: row 2 had page 3 in block 0 already.
std::vector<int32_t> table() { return {0, 0, 0, /*row 1*/ 5, 0, 0, /*row 2*/ 3, 7, 0}; }

TEST(ForwardBatch, PersistentBatchValidates) {
  ForwardBatch b = persistent_batch();
  EXPECT_TRUE(b.persistent_page_table());
  b.validate();
  b.validate(table());
  // Padding rows read row 0.
  b.seq_slots = {0, 1};
  b.validate();
}

TEST(ForwardBatch, PersistentBatchRulesHaveErrors) {
  struct Case {
    const char* needle;
    void (*breaks)(ForwardBatch&);
  };
  const std::vector<Case> cases = {
      {"must leave the dense page_table empty", [](ForwardBatch& b) { b.page_table = {0, 0, 0}; }},
      {"seq_slots has 1 entries for 2 sequences", [](ForwardBatch& b) { b.seq_slots = {1}; }},
      {"page_table_rows must be at least 1", [](ForwardBatch& b) { b.page_table_rows = 0; }},
      {"reads page-table row 3, outside the table's rows 0..2",
       [](ForwardBatch& b) { b.seq_slots = {3, 1}; }},
      {"writes row 0; rows 1..2 can be written",
       [](ForwardBatch& b) { b.page_table_updates[1].row = 0; }},
      {"writes entries [1, 4) of a row of 3",
       [](ForwardBatch& b) { b.page_table_updates[0].end = 4; }},
      {"writes entries [1, 1)", [](ForwardBatch& b) { b.page_table_updates[0].end = 1; }},
      {"cover 2 entries but 3 values", [](ForwardBatch& b) { b.page_table_values.push_back(1); }},
      {"page-table value -2 is negative", [](ForwardBatch& b) { b.page_table_values[0] = -2; }},
      {"which is not at offset 0 of a page other than 0",
       [](ForwardBatch& b) { b.slot_mapping[0] = 7 * 4 + 1; }},
  };
  for (const Case& k : cases) {
    ForwardBatch b = persistent_batch();
    k.breaks(b);
    expect_error([&] { b.validate(); }, k.needle);
  }
}

TEST(ForwardBatch, PersistentSlotsAreCheckedAgainstTheTable) {
  ForwardBatch b = persistent_batch();
  std::vector<int32_t> t = table();
  t[2 * 3 + 1] = 8;  // the table says sequence 0's second page is 8, its slot says 7
  expect_error([&] { b.validate(t); }, "token 0 slot 28 disagrees with page-table row 2 (page 8)");
  t.pop_back();
  expect_error([&] { b.validate(t); }, "has 8 entries, expected 3 x 3");
}

// Three decode rows of pages-of-4 sequences; 0 and 2 share their first two pages.
ForwardBatch shared_batch() {
  ForwardBatch b;
  b.page_size = 4;
  b.max_pages_per_seq = 3;
  b.token_ids = {1, 2, 3};
  b.positions = {9, 5, 8};
  b.slot_mapping = {3 * 4 + 1, 5 * 4 + 1, 6 * 4 + 0};
  b.query_start = {0, 1, 2, 3};
  b.kv_lens = {10, 6, 9};
  b.page_table = {1, 2, 3, /*1*/ 4, 5, 0, /*2*/ 1, 2, 6};
  b.shared_prefix_group = {0, 1, 0};
  b.shared_prefix_tokens = {8, 0, 8};
  return b;
}

TEST(ForwardBatch, SharedPrefixesValidate) {
  ForwardBatch b = shared_batch();
  b.validate();
  EXPECT_TRUE(b.has_shared_prefix());
  b.shared_prefix_group.clear();
  b.shared_prefix_tokens.clear();
  b.validate();
  EXPECT_FALSE(b.has_shared_prefix());
}

TEST(ForwardBatch, SharedPrefixRulesHaveErrors) {
  struct Case {
    const char* needle;
    void (*breaks)(ForwardBatch&);
  };
  const std::vector<Case> cases = {
      {"shared_prefix_group has 2 entries and shared_prefix_tokens 3 for 3 sequences",
       [](ForwardBatch& b) { b.shared_prefix_group = {0, 1}; }},
      {"sequence 0 names sequence 2 as its shared-prefix group",
       [](ForwardBatch& b) { b.shared_prefix_group = {2, 1, 2}; }},
      {"sequence 2 shares 6 prefix tokens (need a multiple of 4",
       [](ForwardBatch& b) { b.shared_prefix_tokens = {8, 0, 6}; }},
      {"sequence 2 shares 4 prefix tokens",  // not its group's 8
       [](ForwardBatch& b) { b.shared_prefix_tokens = {8, 0, 4}; }},
      {"sequence 0 shares 12 prefix tokens (need a multiple of 4, at most the 9 tokens",
       [](ForwardBatch& b) { b.shared_prefix_tokens = {12, 0, 12}; }},
      {"but their page 1 differs", [](ForwardBatch& b) { b.page_table[7] = 7; }},
  };
  for (const Case& c : cases) {
    ForwardBatch b = shared_batch();
    c.breaks(b);
    expect_error([&] { b.validate(); }, c.needle);
  }
}

}  // namespace
}  // namespace pagellm
