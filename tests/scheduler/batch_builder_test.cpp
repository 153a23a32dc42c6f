// The ForwardBatch built from a SchedulerOutput, checked array by array on a step that
// mixes a full prefill, a prefill chunk and then a decode with a chunk spanning pages.
#include "pagellm/engine/batch_builder.h"

#include <gtest/gtest.h>

#include <vector>

#include "scheduler/sim.h"

namespace pagellm {
namespace {

using testing::Request;
using testing::Sim;
using testing::small_config;

std::vector<int32_t> prompt_slice(const Sequence& s, int32_t begin, int32_t end) {
  return std::vector<int32_t>(s.prompt.begin() + begin, s.prompt.begin() + end);
}

std::vector<int32_t> row_with(std::vector<int32_t> pages, int32_t width) {
  pages.resize(static_cast<size_t>(width), 0);
  return pages;
}

TEST(BatchBuilder, MixedPrefillChunkAndDecode) {
  Sim sim(small_config(4, 8), 33);  // page_size 4, 16 pages per row
  Sequence* a = sim.make({1, 5, 4});
  Sequence* b = sim.make({2, 10, 4});
  ASSERT_TRUE(sim.scheduler().add(a));
  ASSERT_TRUE(sim.scheduler().add(b));

  // Step 1: a prefills 5 tokens (pages 1, 2; row 1), b a 3-token chunk (page 3; row 2).
  SchedulerOutput out = sim.scheduler().schedule();
  ForwardBatch batch = build_forward_batch(out, sim.table(), 4);
  EXPECT_EQ(batch.page_size, 4);
  EXPECT_EQ(batch.max_pages_per_seq, 16);
  std::vector<int32_t> tokens = prompt_slice(*a, 0, 5);
  for (int32_t t : prompt_slice(*b, 0, 3)) tokens.push_back(t);
  EXPECT_EQ(batch.token_ids, tokens);
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(batch.slot_mapping, (std::vector<int32_t>{4, 5, 6, 7, 8, 12, 13, 14}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 5, 8}));
  EXPECT_EQ(batch.kv_lens, (std::vector<int32_t>{5, 3}));
  std::vector<int32_t> table = row_with({1, 2}, 16);
  for (int32_t p : row_with({3}, 16)) table.push_back(p);
  EXPECT_EQ(batch.page_table, table);
  EXPECT_EQ(batch.logits_indices, (std::vector<int32_t>{4}));  // b's chunk does not sample
  std::vector<SamplingRow> rows = build_sampling_rows(out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].params, &a->params);
  EXPECT_EQ(rows[0].seed, a->seed);
  EXPECT_EQ(rows[0].output_index, 0);
  EXPECT_EQ(rows[0].prompt_tokens, &a->prompt);
  EXPECT_EQ(rows[0].output_tokens, &a->output);

  SampledToken t;
  t.token = 77;
  sim.scheduler().on_step_done(out, {t});

  // Step 2: a decodes position 5 (page 2, offset 1); b gets positions 3..9: the end of
  // page 3, all of a new page 4 and half of page 5, and samples its first token.
  out = sim.scheduler().schedule();
  batch = build_forward_batch(out, sim.table(), 4, /*shared_prefix_min_seqs=*/2);
  tokens = {77};
  for (int32_t tok : prompt_slice(*b, 3, 10)) tokens.push_back(tok);
  EXPECT_EQ(batch.token_ids, tokens);
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{5, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(batch.slot_mapping, (std::vector<int32_t>{9, 15, 16, 17, 18, 19, 20, 21}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 1, 8}));
  EXPECT_EQ(batch.kv_lens, (std::vector<int32_t>{6, 10}));
  table = row_with({1, 2}, 16);
  for (int32_t p : row_with({3, 4, 5}, 16)) table.push_back(p);
  EXPECT_EQ(batch.page_table, table);
  EXPECT_EQ(batch.logits_indices, (std::vector<int32_t>{0, 7}));
  // Not a decode-only step: no shared prefixes are looked for.
  EXPECT_TRUE(batch.shared_prefix_group.empty() && batch.shared_prefix_tokens.empty());
  rows = build_sampling_rows(out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].output_index, 1);
  EXPECT_EQ(rows[1].output_tokens, &b->output);
  EXPECT_EQ(rows[1].output_index, 0);
}

std::vector<std::vector<int32_t>> runs(const ForwardBatch& b) {
  std::vector<std::vector<int32_t>> r;
  for (const PageTableUpdate& u : b.page_table_updates) r.push_back({u.row, u.begin, u.end});
  return r;
}

using Runs = std::vector<std::vector<int32_t>>;

// The same steps on the persistent path: rows by slot, and only the entries that changed.
TEST(BatchBuilder, PersistentTableSendsOnlyChangedEntries) {
  Sim sim(small_config(4, 8), 33);
  Sequence* a = sim.make({1, 5, 4});
  Sequence* b = sim.make({2, 10, 4});
  ASSERT_TRUE(sim.scheduler().add(a));
  ASSERT_TRUE(sim.scheduler().add(b));

  SchedulerOutput out = sim.scheduler().schedule();
  ForwardBatch batch = build_persistent_forward_batch(out, sim.table(), 4);
  batch.validate(sim.table().data());
  EXPECT_TRUE(batch.page_table.empty());
  EXPECT_EQ(batch.seq_slots, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(batch.page_table_rows, 5);  // max_num_seqs + the padding row
  EXPECT_EQ(runs(batch), (Runs{{1, 0, 2}, {2, 0, 1}}));
  EXPECT_EQ(batch.page_table_values, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(batch.slot_mapping, (std::vector<int32_t>{4, 5, 6, 7, 8, 12, 13, 14}));
  SampledToken t;
  t.token = 77;
  sim.scheduler().on_step_done(out, {t});

  // a decodes inside page 2 (nothing to send); b's chunk adds pages 4 and 5.
  out = sim.scheduler().schedule();
  batch = build_persistent_forward_batch(out, sim.table(), 4);
  batch.validate(sim.table().data());
  EXPECT_EQ(runs(batch), (Runs{{2, 1, 3}}));
  EXPECT_EQ(batch.page_table_values, (std::vector<int32_t>{4, 5}));
  sim.scheduler().on_step_done(out, {t, t});

  // Aborting a zeroes its row, sent with the next batch.
  ASSERT_TRUE(sim.scheduler().abort(1));
  out = sim.scheduler().schedule();
  batch = build_persistent_forward_batch(out, sim.table(), 4);
  batch.validate(sim.table().data());
  EXPECT_EQ(batch.seq_slots, (std::vector<int32_t>{2}));
  EXPECT_EQ(runs(batch), (Runs{{1, 0, 2}}));
  EXPECT_EQ(batch.page_table_values, (std::vector<int32_t>{0, 0}));
}

TEST(BatchBuilder, EmptyStepAndStaleOutput) {
  Sim sim(small_config(4, 8), 33);
  SchedulerOutput empty = sim.scheduler().schedule();
  ForwardBatch batch = build_forward_batch(empty, sim.table(), 4);
  EXPECT_EQ(batch.num_seqs(), 0);
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0}));
  EXPECT_TRUE(build_sampling_rows(empty).empty());

  // Building from an output after on_step_done() advanced the sequence is an error.
  ASSERT_TRUE(sim.add({1, 4, 1}));
  SchedulerOutput out = sim.scheduler().schedule();
  SampledToken t;
  sim.scheduler().on_step_done(out, {t});
  EXPECT_THROW(build_forward_batch(out, sim.table(), 4), Error);
}

// A decode batch of pages-of-4 sequences: b's pages are pages[b].
ForwardBatch decode_batch(const std::vector<int32_t>& kv_lens) {
  ForwardBatch batch;
  batch.page_size = 4;
  batch.query_start.push_back(0);
  for (int32_t kv : kv_lens) {
    batch.token_ids.push_back(0);
    batch.query_start.push_back(batch.num_tokens());
    batch.kv_lens.push_back(kv);
  }
  return batch;
}

TEST(BatchBuilder, SharedPrefixesAreTheLeadingPagesEveryMemberHolds) {
  // Sequences 0, 2, 3 and 5 start with page 10; 2 diverges after two pages, so the group
  // shares two pages (8 tokens). 1 and 4 share pages 20, 21 and 22, but 4 has only 9 tokens
  // before its query (two full pages): 8 tokens. 6 starts with page 30 alone. 7 holds 3
  // tokens before its query, no full page.
  std::vector<std::vector<int32_t>> pages = {
      {10, 11, 12, 13}, {20, 21, 22, 23}, {10, 11, 40}, {10, 11, 12, 41},
      {20, 21, 22},     {10, 11, 12, 13, 42}, {30, 31},  {10}};
  ForwardBatch batch = decode_batch({16, 16, 12, 16, 10, 20, 8, 4});
  std::vector<const std::vector<int32_t>*> ptrs;
  for (const auto& p : pages) ptrs.push_back(&p);
  assign_shared_prefixes(ptrs, batch);
  EXPECT_EQ(batch.shared_prefix_group, (std::vector<int32_t>{0, 1, 0, 0, 1, 0, 6, 7}));
  EXPECT_EQ(batch.shared_prefix_tokens, (std::vector<int32_t>{8, 8, 8, 8, 8, 8, 0, 0}));
  EXPECT_TRUE(batch.has_shared_prefix());

  // No sequence shares a first page: every group is a single, nothing is shared.
  pages = {{1, 2}, {3, 4}, {5}};
  batch = decode_batch({8, 8, 4});
  ptrs = {&pages[0], &pages[1], &pages[2]};
  assign_shared_prefixes(ptrs, batch);
  EXPECT_EQ(batch.shared_prefix_group, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(batch.shared_prefix_tokens, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_FALSE(batch.has_shared_prefix());
}

TEST(BatchBuilder, FanOutSamplesShareTheirPromptPagesInDecodeSteps) {
  // One prompt of 10 tokens with n = 3: after the fan-out the samples share the prompt's two
  // full pages (copy-on-write gives each its own third page), so their first decode step
  // groups them with 8 shared tokens, and the batch validates against its page table.
  Sim sim(small_config(4, 8), 33);
  ASSERT_TRUE(sim.add_group({Request(1, 10, 6), Request(2, 10, 6), Request(3, 10, 6)}));
  // The prompt's prefill (in chunks of the small budget); its first tokens fan out.
  for (int step = 0; sim.scheduler().running().size() < 3; ++step) {
    ASSERT_LT(step, 5) << "the group never fanned out";
    sim.step();
  }
  SchedulerOutput out = sim.scheduler().schedule();
  ForwardBatch batch = build_forward_batch(out, sim.table(), 4, /*shared_prefix_min_seqs=*/3);
  batch.validate();
  ASSERT_EQ(batch.num_seqs(), 3);
  ASSERT_EQ(batch.num_tokens(), 3);
  EXPECT_EQ(batch.shared_prefix_group, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(batch.shared_prefix_tokens, (std::vector<int32_t>{8, 8, 8}));
  // A backend that reads no shared prefixes (0), or only from more sequences than the step
  // has, gets none: the engine does not look for them.
  for (const int32_t min_seqs : {0, 4}) {
    const ForwardBatch other = build_forward_batch(out, sim.table(), 4, min_seqs);
    EXPECT_TRUE(other.shared_prefix_group.empty() && other.shared_prefix_tokens.empty())
        << "shared_prefix_min_seqs " << min_seqs;
    EXPECT_EQ(other.token_ids, batch.token_ids);
  }
}

}  // namespace
}  // namespace pagellm
