// batch_view: what the planner reads of a ForwardBatch. A batch on the persistent page table
// carries no dense rows on the host, but the table the kernels read is [B, max_pages_per_seq]
// all the same (the backend gathers it), so the planner must see that many entries.
#include <gtest/gtest.h>

#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/planner.h"
#include "pagellm/kv/forward_batch.h"

namespace pagellm {
namespace {

ForwardBatch two_decodes() {
  ForwardBatch b;
  b.page_size = 16;
  b.max_pages_per_seq = 4;
  b.token_ids = {5, 6};
  b.positions = {20, 3};
  b.slot_mapping = {2 * 16 + 4, 3 * 16 + 3};
  b.query_start = {0, 1, 2};
  b.kv_lens = {21, 4};
  b.logits_indices = {0, 1};
  return b;
}

TEST(AttentionBatchView, DenseTableCountsItsEntries) {
  ForwardBatch b = two_decodes();
  b.page_table = {1, 2, 0, 0, 3, 0, 0, 0};
  const AttentionBatchView v = batch_view(b);
  EXPECT_EQ(v.page_table_size, 8u);
  EXPECT_EQ(v.num_seqs, 2);
  EXPECT_EQ(v.max_kv_len, 21);
}

TEST(AttentionBatchView, PersistentTableCountsTheGatheredRows) {
  ForwardBatch b = two_decodes();
  b.seq_slots = {2, 1};
  b.page_table_rows = 5;
  ASSERT_TRUE(b.page_table.empty());
  const AttentionBatchView v = batch_view(b);
  EXPECT_EQ(v.page_table_size, 8u);
  EXPECT_EQ(v.max_pages_per_seq, 4);
}

}  // namespace
}  // namespace pagellm
