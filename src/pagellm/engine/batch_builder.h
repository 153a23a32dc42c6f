// Turns a SchedulerOutput into the ForwardBatch (and sampler rows) of one model step.
#pragma once

#include <vector>

#include "pagellm/engine/scheduler.h"
#include "pagellm/kv/forward_batch.h"
#include "pagellm/kv/page_table.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {

/// Builds the host metadata of the step `out` plans, with a dense page table. Call between
/// schedule() and on_step_done(): it reads each sequence's num_computed before the step.
///
/// For scheduled sequence b with c = num_computed + ahead (ScheduledSeq::ahead, 0 but in
/// a step planned ahead) and n new tokens: token_ids and positions are token_at(c ..
/// c+n-1) (0 for a token not known yet, which the device feeds) and c .. c+n-1;
/// slot_mapping[t] = page * page_size +
/// offset of position p in seq->pages; kv_lens[b] = c + n; page_table row b is the
/// sequence's PageTable row (its pages, then zeros); logits_indices holds the last token
/// row of each sequence with samples == true, in scheduled order, 1 + fan_out.size() times
/// (a fan-out samples every sample's first token from it), so logits row r belongs to the
/// r-th sampled token, as on_step_done() expects. lora_slots holds each sequence's
/// lora_slot when any of them is not 0, and is empty otherwise. A decode-only step (one
/// token per sequence) of at least max(2, shared_prefix_min_seqs) sequences gets
/// shared_prefix_group / _tokens (assign_shared_prefixes) when shared_prefix_min_seqs > 0
/// (Backend::shared_prefix_min_seqs: what the backend reads); other steps leave them empty.
ForwardBatch build_forward_batch(const SchedulerOutput& out, const PageTable& page_table,
                                 int32_t page_size, int32_t shared_prefix_min_seqs = 0);

/// Fills batch.shared_prefix_group / _tokens for the sequences of `pages` (pages[b]: the
/// physical pages of the batch's sequence b, in logical order): a group is the sequences
/// whose first page is the same physical page, led by the first of them, and its prefix is
/// the run of leading pages that every member holds in the same place, counting only full
/// pages before each member's query tokens (a page shared through fan-out or the prefix
/// cache is full and never written again). A group of one shares nothing (0 tokens).
/// O(sum of the shared pages); a hash map finds the groups.
void assign_shared_prefixes(const std::vector<const std::vector<int32_t>*>& pages,
                            ForwardBatch& batch);

/// The same batch with the persistent page table instead of the dense one: seq_slots[b] is
/// the sequence's row (seq->slot), page_table_rows is the table's max_slots, and
/// page_table_updates / page_table_values are the entries changed since the previous call
/// (PageTable::take_updates, which marks them uploaded: pass the batch to the backend).
/// For an empty step it takes nothing and returns a batch without a table.
ForwardBatch build_persistent_forward_batch(const SchedulerOutput& out, PageTable& page_table,
                                            int32_t page_size,
                                            int32_t shared_prefix_min_seqs = 0);

/// One SamplingRow per sampled token of `out`, in the order of logits_indices: each
/// sampling sequence's (output index: its outputs plus ScheduledSeq::ahead), then its
/// fan-out samples' (their own seed, output index 0).
/// The rows point into the sequences, so they stay valid until on_step_done().
std::vector<SamplingRow> build_sampling_rows(const SchedulerOutput& out);

}  // namespace pagellm
