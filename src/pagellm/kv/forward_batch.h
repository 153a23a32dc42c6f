// The description of one forward step over a ragged batch, as the model and backends see it.
#pragma once

#include <cstdint>
#include <vector>

#include "pagellm/common/tensor.h"

namespace pagellm {

/// A run of entries of one row of the engine's persistent page table that changed since the
/// previous batch: entries [begin, end) of row `row` now hold the next end - begin values
/// of ForwardBatch::page_table_values.
struct PageTableUpdate {
  int32_t row = 0;
  int32_t begin = 0;
  int32_t end = 0;
};

/// Host-resident metadata of one forward step: B sequences contributing T tokens in total.
///
/// Sequence b owns tokens [query_start[b], query_start[b+1]) of the step. Its KV length
/// after the step is kv_lens[b], so its new tokens sit at positions
/// kv_lens[b] - q_len(b) ... kv_lens[b] - 1 and attend causally with bottom-right
/// alignment: the token at position p sees keys 0..p. Logical block j of sequence b lives
/// in physical page page_table[b * max_pages_per_seq + j]; unused entries are 0 (the
/// reserved page). The K/V of token t is written to slot slot_mapping[t], that is page
/// slot / page_size at offset slot % page_size.
///
/// The page table comes one of two ways: dense (`page_table`, B rows built for this batch;
/// tests that build batches by hand, and backends without a persistent table) or
/// persistent (`seq_slots` plus the entries changed since the previous batch; the engine's
/// path when the backend supports it). See docs/design.md, "The persistent page table".
struct ForwardBatch {
  int32_t page_size = 16;
  int32_t max_pages_per_seq = 0;
  std::vector<int32_t> token_ids;       // [T]
  std::vector<int32_t> positions;       // [T]
  std::vector<int32_t> slot_mapping;    // [T]
  std::vector<int32_t> query_start;     // [B + 1], query_start[0] == 0
  std::vector<int32_t> kv_lens;         // [B]
  std::vector<int32_t> page_table;      // [B * max_pages_per_seq]
  /// Persistent page table (the engine's path). When seq_slots is non-empty, sequence b's
  /// logical block j lives in page table[seq_slots[b]][j] of a table of page_table_rows rows
  /// that the backend keeps across steps and updates with page_table_updates before the
  /// step; `page_table` above is then empty. Row 0 is the reserved all-zero row (padding).
  std::vector<int32_t> seq_slots;                    // [B]
  int32_t page_table_rows = 0;                       // rows of the persistent table
  std::vector<PageTableUpdate> page_table_updates;   // in order; later runs overwrite earlier
  std::vector<int32_t> page_table_values;            // concatenated values of the updates
  std::vector<int32_t> logits_indices;  // [R] token rows whose logits are wanted
  /// LoRA: the adapter slot of each sequence (0: none; docs/design.md "LoRA"), [B]. Empty:
  /// the forward runs without LoRA's kernels; non-empty (even all zeros, as a graph captured
  /// for LoRA steps is): the forward runs them, and rows of slot 0 skip them.
  std::vector<int32_t> lora_slots;
  /// Shared prefixes (optional; both empty: none known). shared_prefix_group[b] is the
  /// first sequence of b's group (b itself when it leads one or shares nothing), and
  /// shared_prefix_tokens[b] the keys at the start of b's context, a multiple of page_size
  /// and all before its query tokens, that every member of the group holds in the same
  /// physical pages (0: b shares none). A backend may attend such keys once for the whole
  /// group (docs/design.md, "Shared-prefix decode attention"); outputs do not depend on
  /// whether it does beyond float rounding.
  std::vector<int32_t> shared_prefix_group;   // [B] or empty
  std::vector<int32_t> shared_prefix_tokens;  // [B] or empty
  /// 0, or an upper bound of kv_lens over every replay of a graph captured with this batch:
  /// kernels then size their grids from it rather than from max_kv_len().
  int32_t kv_len_capacity = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(kv_lens.size()); }
  int32_t query_len(int b) const { return query_start[b + 1] - query_start[b]; }
  int32_t max_query_len() const;
  int32_t max_kv_len() const;
  bool persistent_page_table() const { return !seq_slots.empty(); }
  /// Whether any sequence runs with a LoRA adapter.
  bool has_lora() const;
  /// Writes the adapter slot of every token row to out[0, T) (lora_slots[b] for the rows of
  /// sequence b); writes nothing when lora_slots is empty.
  void lora_token_slots(int32_t* out) const;
  /// Whether some sequence shares a prefix with another (shared_prefix_tokens).
  bool has_shared_prefix() const;
  /// Throws Error if the arrays disagree with each other (sizes, offsets, 0 < q <= kv,
  /// positions, slots inside the pages the table gives, logits rows in range, shared
  /// prefixes whose groups, lengths and, with a dense table, pages agree). With a
  /// persistent page table it checks the slots and updates (rows 1..page_table_rows-1,
  /// inside a row, value counts), and of each token slot only that it lies at the right
  /// offset of a page other than 0: the pages themselves are in the table, which the
  /// overload below takes.
  void validate() const;
  /// validate(), and with a persistent page table also that every token's slot lies in the
  /// page that `table` ([page_table_rows * max_pages_per_seq], row-major: the engine's host
  /// table, equal to the backend's copy once this batch's updates are applied) gives.
  void validate(const std::vector<int32_t>& table) const;

 private:
  void validate_shared_prefixes() const;
};

/// Device-resident copies of a ForwardBatch's arrays (int32), plus the host original for
/// planning. On the CPU backend the tensors point at the host vectors themselves.
struct BatchTensors {
  const ForwardBatch* host = nullptr;
  Tensor token_ids;       // [T]
  Tensor positions;       // [T]
  Tensor slot_mapping;    // [T]
  Tensor query_start;     // [B + 1]
  Tensor kv_lens;         // [B]
  Tensor page_table;      // [B, max_pages_per_seq]
  Tensor logits_indices;  // [R]
  /// [T] int32, each token row's LoRA slot (ForwardBatch::lora_token_slots); no data when
  /// the batch has no lora_slots.
  Tensor lora_slots;
  /// Shared-prefix decode attention (the CUDA backend's; no data elsewhere): the items that
  /// read a group's shared pages once (int32, layout in cuda/attention/attention.h) and [B]
  /// int32, the keys of each sequence that they cover (0: none). Laid out for every batch
  /// the CUDA backend uploads (zeros and no items when it shares nothing), so that a graph
  /// captured with them reads this step's values. prefix_item_count: the host's count.
  Tensor prefix_items;
  Tensor prefix_tokens;
  int32_t prefix_item_count = 0;
};

}  // namespace pagellm
