#include "pagellm/engine/batch_builder.h"

#include <algorithm>
#include <unordered_map>

#include "pagellm/common/check.h"

namespace pagellm {

namespace {

// Everything but the page table: tokens, positions, slots, offsets, lengths, logits rows.
ForwardBatch build_batch_without_table(const SchedulerOutput& out, const PageTable& page_table,
                                       int32_t page_size, int32_t shared_prefix_min_seqs) {
  PAGELLM_CHECK(page_size >= 1) << "page_size must be at least 1, got " << page_size;
  ForwardBatch batch;
  batch.page_size = page_size;
  batch.max_pages_per_seq = page_table.max_pages_per_seq();
  const size_t num_seqs = out.scheduled.size();
  batch.token_ids.reserve(static_cast<size_t>(out.num_tokens));
  batch.positions.reserve(static_cast<size_t>(out.num_tokens));
  batch.slot_mapping.reserve(static_cast<size_t>(out.num_tokens));
  batch.query_start.reserve(num_seqs + 1);
  batch.kv_lens.reserve(num_seqs);
  batch.query_start.push_back(0);
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.seq->lora_slot == 0) continue;
    // Some sequence has an adapter: every sequence gets its slot (0: none).
    for (const ScheduledSeq& t : out.scheduled) batch.lora_slots.push_back(t.seq->lora_slot);
    break;
  }

  for (const ScheduledSeq& s : out.scheduled) {
    const Sequence& seq = *s.seq;
    // A step planned ahead (ScheduledSeq::ahead) starts after the token in flight; that
    // token is not known here, and its place holds 0 until the device feeds it.
    const int32_t begin = seq.num_computed + s.ahead;
    const int32_t end = begin + s.num_new_tokens;
    PAGELLM_CHECK(seq.status == SequenceStatus::kRunning && s.num_new_tokens >= 1 &&
                  s.ahead >= 0 && end <= seq.num_tokens() + s.ahead &&
                  static_cast<int64_t>(seq.pages.size()) * page_size >= end)
        << "build_forward_batch(): request " << seq.id
        << " is not as schedule() left it (finished, advanced or without pages for " << end
        << " tokens)";
    for (int32_t p = begin; p < end; ++p) {
      batch.token_ids.push_back(p < seq.num_tokens() ? seq.token_at(p) : 0);
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(seq.pages[p / page_size] * page_size + p % page_size);
    }
    batch.query_start.push_back(batch.num_tokens());
    batch.kv_lens.push_back(end);
    // A fan-out samples every sample's first token from the same row.
    if (s.samples) batch.logits_indices.insert(batch.logits_indices.end(), 1 + s.fan_out.size(),
                                               batch.num_tokens() - 1);
  }
  if (shared_prefix_min_seqs > 0 && num_seqs >= std::max<size_t>(2, shared_prefix_min_seqs) &&
      out.num_tokens == static_cast<int64_t>(num_seqs)) {
    std::vector<const std::vector<int32_t>*> pages;
    pages.reserve(num_seqs);
    for (const ScheduledSeq& s : out.scheduled) pages.push_back(&s.seq->pages);
    assign_shared_prefixes(pages, batch);
  }
  return batch;
}

}  // namespace

void assign_shared_prefixes(const std::vector<const std::vector<int32_t>*>& pages,
                            ForwardBatch& batch) {
  const int32_t B = batch.num_seqs(), P = batch.page_size;
  PAGELLM_CHECK(static_cast<int32_t>(pages.size()) == B && P >= 1)
      << "assign_shared_prefixes: " << pages.size() << " page lists for " << B << " sequences";
  std::vector<int32_t>& group = batch.shared_prefix_group;
  std::vector<int32_t>& tokens = batch.shared_prefix_tokens;
  group.resize(static_cast<size_t>(B));
  tokens.assign(static_cast<size_t>(B), 0);
  // Per leader: the pages every member so far shares with it, and the members.
  std::vector<int32_t> common(static_cast<size_t>(B), 0), members(static_cast<size_t>(B), 0);
  std::unordered_map<int32_t, int32_t> leader_of;
  leader_of.reserve(static_cast<size_t>(B));
  for (int32_t b = 0; b < B; ++b) {
    group[b] = b;
    const std::vector<int32_t>& mine = *pages[b];
    const int32_t full = std::min<int32_t>((batch.kv_lens[b] - batch.query_len(b)) / P,
                                           static_cast<int32_t>(mine.size()));
    if (full <= 0) continue;
    const auto [it, fresh] = leader_of.emplace(mine[0], b);
    if (fresh) {
      common[b] = full;
      members[b] = 1;
      continue;
    }
    const int32_t g = it->second;
    const std::vector<int32_t>& lead = *pages[g];
    int32_t n = 0;
    const int32_t most = std::min(full, common[g]);
    while (n < most && mine[n] == lead[n]) ++n;
    common[g] = n;
    ++members[g];
    group[b] = g;
  }
  for (int32_t b = 0; b < B; ++b) {
    const int32_t g = group[b];
    if (members[g] >= 2) {
      tokens[b] = common[g] * P;
    } else {
      group[b] = b;
    }
  }
}

ForwardBatch build_forward_batch(const SchedulerOutput& out, const PageTable& page_table,
                                 int32_t page_size, int32_t shared_prefix_min_seqs) {
  ForwardBatch batch =
      build_batch_without_table(out, page_table, page_size, shared_prefix_min_seqs);
  batch.page_table.reserve(out.scheduled.size() * static_cast<size_t>(batch.max_pages_per_seq));
  for (const ScheduledSeq& s : out.scheduled) {
    const int32_t* row = page_table.row(s.seq->slot);
    batch.page_table.insert(batch.page_table.end(), row, row + batch.max_pages_per_seq);
  }
  return batch;
}

ForwardBatch build_persistent_forward_batch(const SchedulerOutput& out, PageTable& page_table,
                                            int32_t page_size, int32_t shared_prefix_min_seqs) {
  ForwardBatch batch =
      build_batch_without_table(out, page_table, page_size, shared_prefix_min_seqs);
  // An empty step uploads nothing, so its changes stay pending for the next batch.
  if (out.scheduled.empty()) return batch;
  batch.page_table_rows = page_table.max_slots();
  batch.seq_slots.reserve(out.scheduled.size());
  for (const ScheduledSeq& s : out.scheduled) batch.seq_slots.push_back(s.seq->slot);
  page_table.take_updates(&batch.page_table_updates, &batch.page_table_values);
  return batch;
}

std::vector<SamplingRow> build_sampling_rows(const SchedulerOutput& out) {
  std::vector<SamplingRow> rows;
  for (const ScheduledSeq& s : out.scheduled) {
    if (!s.samples) continue;
    const Sequence& seq = *s.seq;
    SamplingRow row;
    row.params = &seq.params;
    row.seed = seq.seed;
    row.output_index = static_cast<int64_t>(seq.output.size()) + s.ahead;
    row.prompt_tokens = &seq.prompt;
    row.output_tokens = &seq.output;
    row.banned_tokens = row.output_index < seq.params.min_tokens ? &seq.min_tokens_banned : nullptr;
    rows.push_back(row);
    for (const Sequence* sample : s.fan_out) {  // their first token: own seed, index 0
      row.params = &sample->params;
      row.seed = sample->seed;
      row.output_index = 0;
      row.prompt_tokens = &sample->prompt;
      row.output_tokens = &sample->output;
      row.banned_tokens = sample->params.min_tokens > 0 ? &sample->min_tokens_banned : nullptr;
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace pagellm
