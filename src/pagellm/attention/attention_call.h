// One paged-attention call as the planner sees it: its static shape (AttentionDomain) and
// its batch metadata, read from host memory only (AttentionBatchView).
//
// The planner never reads the device: every decision comes from these CPU-resident values,
// which the engine built before uploading them (kv/forward_batch.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagellm/attention/provider.h"
#include "pagellm/kv/forward_batch.h"
#include "pagellm/common/dtype.h"

namespace pagellm {

/// The shape of an attention call that is the same for every layer and every step:
/// q [T, num_q_heads, head_dim]; K/V pools [pages, num_kv_heads, page_size, head_dim].
struct AttentionDomain {
  DType dtype = DType::BF16;  // q, pools and output
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  float scale = 0.0f;  // softmax scale (part of a cuDNN plan: it is baked into the graph)

  bool operator==(const AttentionDomain& o) const;
  bool operator!=(const AttentionDomain& o) const { return !(*this == o); }
};

/// Host-side batch metadata of one call, plus the totals and maxima the caller declares it
/// will launch with. The arrays are borrowed (not owned) and must outlive plan().
///
/// Sequence b owns query rows [query_start[b], query_start[b+1]) and has kv_lens[b] keys
/// (its new tokens included): its query i sits at position kv - q + i and sees keys
/// 0 .. kv - q + i (causal, bottom-right aligned).
struct AttentionBatchView {
  const int32_t* query_start = nullptr;  // [query_start_size], expected num_seqs + 1
  size_t query_start_size = 0;
  const int32_t* kv_lens = nullptr;  // [kv_lens_size], expected num_seqs
  size_t kv_lens_size = 0;
  size_t page_table_size = 0;     // entries, expected num_seqs * max_pages_per_seq
  int32_t max_pages_per_seq = 0;  // page-table row length

  // Declared by the caller: what the kernels will be launched with.
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_kv_len = 0;
  /// 0, or an upper bound of kv over every replay of a graph captured with this batch
  /// (ForwardBatch::kv_len_capacity). A cuDNN plan is then sized by it, not by max_kv_len.
  int32_t kv_len_capacity = 0;
};

/// A view of `batch` whose declared values are the batch's own (num_tokens, num_seqs,
/// max_query_len, max_kv_len, kv_len_capacity). `batch` must outlive the view.
AttentionBatchView batch_view(const ForwardBatch& batch);

/// The query-key pairs a causal, bottom-right-aligned call computes for one sequence:
/// q * (2 * kv - q + 1) / 2 (its i-th query sees kv - q + i + 1 keys). Requires 0 < q <= kv.
inline int64_t causal_pairs(int64_t q, int64_t kv) { return q * (2 * kv - q + 1) / 2; }

}  // namespace pagellm
