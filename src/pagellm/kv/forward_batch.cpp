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

void ForwardBatch::validate() const {
  const int32_t T = num_tokens(), B = num_seqs();
  PAGELLM_CHECK(page_size > 0) << "forward batch: page_size must be positive";
  PAGELLM_CHECK(positions.size() == token_ids.size() && slot_mapping.size() == token_ids.size())
      << "forward batch: token_ids, positions and slot_mapping differ in length";
  PAGELLM_CHECK(query_start.size() == static_cast<size_t>(B) + 1)
      << "forward batch: query_start has " << query_start.size() << " entries for " << B
      << " sequences";
  PAGELLM_CHECK(page_table.size() == static_cast<size_t>(B) * max_pages_per_seq)
      << "forward batch: page table has " << page_table.size() << " entries, expected "
      << B << " x " << max_pages_per_seq;
  PAGELLM_CHECK(query_start[0] == 0 && query_start[B] == T)
      << "forward batch: query offsets must run from 0 to " << T;
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
}

}  // namespace pagellm
