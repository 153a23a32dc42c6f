#include "pagellm/kv/forward_batch.h"

#include <algorithm>

namespace pagellm {

int32_t ForwardBatch::max_query_len() const {
  int32_t m = 0;
  for (int b = 0; b < num_seqs(); ++b) m = std::max(m, query_len(b));
  return m;
}

int32_t ForwardBatch::max_kv_len() const {
  int32_t m = 0;
  for (int32_t v : kv_lens) m = std::max(m, v);
  return m;
}

namespace {

// The persistent table's own fields: slots, rows, updates and their value count.
void validate_persistent_fields(const ForwardBatch& b) {
  const int32_t B = b.num_seqs(), rows = b.page_table_rows;
  PAGELLM_CHECK(b.page_table.empty())
      << "forward batch: a batch with seq_slots (the persistent page table) must leave the "
         "dense page_table empty, got "
      << b.page_table.size() << " entries";
  PAGELLM_CHECK(b.seq_slots.size() == static_cast<size_t>(B))
      << "forward batch: seq_slots has " << b.seq_slots.size() << " entries for " << B
      << " sequences";
  PAGELLM_CHECK(rows >= 1) << "forward batch: page_table_rows must be at least 1 (row 0 is "
                              "the padding row), got "
                           << rows;
  for (int32_t s = 0; s < B; ++s) {
    PAGELLM_CHECK(b.seq_slots[s] >= 0 && b.seq_slots[s] < rows)
        << "forward batch: sequence " << s << " reads page-table row " << b.seq_slots[s]
        << ", outside the table's rows 0.." << rows - 1;
  }
  size_t values = 0;
  for (size_t u = 0; u < b.page_table_updates.size(); ++u) {
    const PageTableUpdate& up = b.page_table_updates[u];
    PAGELLM_CHECK(up.row >= 1 && up.row < rows)
        << "forward batch: page-table update " << u << " writes row " << up.row
        << "; rows 1.." << rows - 1 << " can be written (row 0 stays all zeros)";
    PAGELLM_CHECK(up.begin >= 0 && up.begin < up.end && up.end <= b.max_pages_per_seq)
        << "forward batch: page-table update " << u << " writes entries [" << up.begin << ", "
        << up.end << ") of a row of " << b.max_pages_per_seq
        << " (need 0 <= begin < end <= max_pages_per_seq)";
    values += static_cast<size_t>(up.end - up.begin);
  }
  PAGELLM_CHECK(values == b.page_table_values.size())
      << "forward batch: page-table updates cover " << values << " entries but "
      << b.page_table_values.size() << " values are given";
  for (int32_t v : b.page_table_values) {
    PAGELLM_CHECK(v >= 0) << "forward batch: page-table value " << v << " is negative";
  }
}

}  // namespace

void ForwardBatch::validate(const std::vector<int32_t>& table) const {
  validate();
  if (!persistent_page_table()) return;
  PAGELLM_CHECK(table.size() == static_cast<size_t>(page_table_rows) * max_pages_per_seq)
      << "forward batch: the page table to check against has " << table.size()
      << " entries, expected " << page_table_rows << " x " << max_pages_per_seq;
  for (int32_t b = 0; b < num_seqs(); ++b) {
    const size_t row = static_cast<size_t>(seq_slots[b]) * max_pages_per_seq;
    for (int32_t t = query_start[b]; t < query_start[b + 1]; ++t) {
      const int32_t page = table[row + positions[t] / page_size];
      PAGELLM_CHECK(page > 0 && slot_mapping[t] == page * page_size + positions[t] % page_size)
          << "forward batch: token " << t << " slot " << slot_mapping[t]
          << " disagrees with page-table row " << seq_slots[b] << " (page " << page << ")";
    }
  }
  for (int32_t b = 0; b < static_cast<int32_t>(shared_prefix_group.size()); ++b) {
    const int32_t g = shared_prefix_group[b];
    const size_t rb = static_cast<size_t>(seq_slots[b]) * max_pages_per_seq;
    const size_t rg = static_cast<size_t>(seq_slots[g]) * max_pages_per_seq;
    for (int32_t j = 0; j < shared_prefix_tokens[b] / page_size; ++j) {
      PAGELLM_CHECK(table[rb + j] == table[rg + j])
          << "forward batch: sequence " << b << " claims a shared prefix of "
          << shared_prefix_tokens[b] << " tokens with sequence " << g << " but their page " << j
          << " differs in the page table";
    }
  }
}

bool ForwardBatch::has_shared_prefix() const {
  for (int32_t n : shared_prefix_tokens) {
    if (n > 0) return true;
  }
  return false;
}

bool ForwardBatch::has_lora() const {
  for (int32_t slot : lora_slots) {
    if (slot != 0) return true;
  }
  return false;
}

void ForwardBatch::lora_token_slots(int32_t* out) const {
  if (lora_slots.empty()) return;
  PAGELLM_CHECK(lora_slots.size() == kv_lens.size())
      << "forward batch: " << lora_slots.size() << " LoRA slots for " << kv_lens.size()
      << " sequences";
  for (int32_t b = 0; b < num_seqs(); ++b) {
    std::fill(out + query_start[b], out + query_start[b + 1], lora_slots[b]);
  }
}

void ForwardBatch::validate() const {
  const int32_t T = num_tokens(), B = num_seqs();
  PAGELLM_CHECK(page_size > 0) << "forward batch: page_size must be positive";
  PAGELLM_CHECK(positions.size() == token_ids.size() && slot_mapping.size() == token_ids.size())
      << "forward batch: token_ids, positions and slot_mapping differ in length";
  PAGELLM_CHECK(query_start.size() == static_cast<size_t>(B) + 1)
      << "forward batch: query_start has " << query_start.size() << " entries for " << B
      << " sequences";
  if (persistent_page_table()) {
    validate_persistent_fields(*this);
  } else {
    PAGELLM_CHECK(page_table.size() == static_cast<size_t>(B) * max_pages_per_seq)
        << "forward batch: page table has " << page_table.size() << " entries, expected "
        << B << " x " << max_pages_per_seq;
  }
  PAGELLM_CHECK(query_start[0] == 0 && query_start[B] == T)
      << "forward batch: query offsets must run from 0 to " << T;
  PAGELLM_CHECK(lora_slots.empty() || lora_slots.size() == static_cast<size_t>(B))
      << "forward batch: lora_slots has " << lora_slots.size() << " entries for " << B
      << " sequences (give one per sequence, or none)";
  for (int32_t slot : lora_slots) {
    PAGELLM_CHECK(slot >= 0) << "forward batch: LoRA slot " << slot << " is negative";
  }
  for (int32_t b = 0; b < B; ++b) {
    const int32_t q = query_len(b), kv = kv_lens[b];
    PAGELLM_CHECK(q > 0 && q <= kv) << "forward batch: sequence " << b << " has query length "
                                    << q << " and KV length " << kv << " (need 0 < q <= kv)";
    PAGELLM_CHECK((kv + page_size - 1) / page_size <= max_pages_per_seq)
        << "forward batch: sequence " << b << " KV length " << kv << " exceeds "
        << max_pages_per_seq << " pages of " << page_size;
    for (int32_t i = 0; i < q; ++i) {
      const int32_t t = query_start[b] + i, pos = kv - q + i;
      PAGELLM_CHECK(positions[t] == pos) << "forward batch: token " << t << " has position "
                                         << positions[t] << ", expected " << pos;
      if (persistent_page_table()) {
        // The pages are in the persistent table (validate(table) checks them): here only
        // that the slot is at pos's offset of a page other than the reserved page 0.
        PAGELLM_CHECK(slot_mapping[t] >= page_size &&
                      slot_mapping[t] % page_size == pos % page_size)
            << "forward batch: token " << t << " at position " << pos << " has slot "
            << slot_mapping[t] << ", which is not at offset " << pos % page_size
            << " of a page other than 0";
        continue;
      }
      const int32_t page = page_table[b * max_pages_per_seq + pos / page_size];
      PAGELLM_CHECK(page > 0 && slot_mapping[t] == page * page_size + pos % page_size)
          << "forward batch: token " << t << " slot " << slot_mapping[t]
          << " disagrees with the page table (page " << page << ")";
    }
  }
  for (int32_t r : logits_indices) {
    PAGELLM_CHECK(r >= 0 && r < T) << "forward batch: logits row " << r << " outside [0, " << T
                                   << ")";
  }
  validate_shared_prefixes();
}

void ForwardBatch::validate_shared_prefixes() const {
  const int32_t B = num_seqs();
  PAGELLM_CHECK(shared_prefix_group.size() == shared_prefix_tokens.size() &&
                (shared_prefix_group.empty() ||
                 shared_prefix_group.size() == static_cast<size_t>(B)))
      << "forward batch: shared_prefix_group has " << shared_prefix_group.size()
      << " entries and shared_prefix_tokens " << shared_prefix_tokens.size() << " for " << B
      << " sequences (give one of each per sequence, or none)";
  for (int32_t b = 0; b < static_cast<int32_t>(shared_prefix_group.size()); ++b) {
    const int32_t g = shared_prefix_group[b], n = shared_prefix_tokens[b];
    PAGELLM_CHECK(g >= 0 && g <= b && shared_prefix_group[g] == g)
        << "forward batch: sequence " << b << " names sequence " << g
        << " as its shared-prefix group, which is not a group's first sequence at or before it";
    PAGELLM_CHECK(n >= 0 && n % page_size == 0 && n <= kv_lens[b] - query_len(b) &&
                  n == shared_prefix_tokens[g])
        << "forward batch: sequence " << b << " shares " << n << " prefix tokens (need a "
        << "multiple of " << page_size << ", at most the " << kv_lens[b] - query_len(b)
        << " tokens before its query, and the " << shared_prefix_tokens[g]
        << " of its group's first sequence " << g << ")";
    if (persistent_page_table() || g == b) continue;
    for (int32_t j = 0; j < n / page_size; ++j) {
      PAGELLM_CHECK(page_table[b * max_pages_per_seq + j] == page_table[g * max_pages_per_seq + j])
          << "forward batch: sequence " << b << " claims a shared prefix of " << n
          << " tokens with sequence " << g << " but their page " << j << " differs";
    }
  }
}

}  // namespace pagellm
