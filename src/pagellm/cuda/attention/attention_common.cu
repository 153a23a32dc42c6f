// Host-side checks shared by the paged-attention launchers: parameter validation that
// names what is wrong before any kernel runs. No kernel lives here (so no roofline); the
// device helpers the kernels share are in attention_common.cuh.
#include <cmath>
#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention_common.cuh"

namespace pagellm::cuda::attn {

namespace {
bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
}  // namespace

void validate_params(const PagedAttentionParams& p, const char* what) {
  PAGELLM_CHECK(p.num_seqs >= 0 && p.num_tokens >= 0)
      << what << ": num_seqs and num_tokens must be >= 0, got " << p.num_seqs << " and "
      << p.num_tokens;
  PAGELLM_CHECK(p.head_dim == 64 || p.head_dim == 128)
      << what << ": head_dim " << p.head_dim << " is not supported (64 or 128)";
  PAGELLM_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0)
      << what << ": num_q_heads (" << p.num_q_heads
      << ") must be a positive multiple of num_kv_heads (" << p.num_kv_heads << ")";
  PAGELLM_CHECK(p.num_q_heads <= 65535)
      << what << ": num_q_heads " << p.num_q_heads << " exceeds 65535";
  PAGELLM_CHECK(p.page_size >= 1 && p.page_size <= kMaxPageSize)
      << what << ": page_size " << p.page_size << " is outside 1.." << kMaxPageSize;
  PAGELLM_CHECK(std::isfinite(p.scale) && p.scale > 0.0f)
      << what << ": scale must be finite and positive, got " << p.scale;
  PAGELLM_CHECK(p.max_query_len >= 0 && p.max_kv_len >= 0)
      << what << ": max_query_len and max_kv_len must be >= 0, got " << p.max_query_len << " and "
      << p.max_kv_len;
  PAGELLM_CHECK(p.num_splits >= 0 && p.num_splits <= kMaxDecodeSplits)
      << what << ": num_splits " << p.num_splits << " is outside 0.." << kMaxDecodeSplits
      << " (0 = automatic)";
  PAGELLM_CHECK(p.num_pages >= 0) << what << ": num_pages must be >= 0, got " << p.num_pages;
  if (p.num_seqs == 0 || p.num_tokens == 0) return;  // nothing will be launched
  PAGELLM_CHECK(p.max_pages_per_seq >= 1)
      << what << ": max_pages_per_seq must be >= 1, got " << p.max_pages_per_seq;
  PAGELLM_CHECK(p.q && p.k_pool && p.v_pool && p.out && p.query_start && p.kv_lens && p.page_table)
      << what << ": q, k_pool, v_pool, out, query_start, kv_lens and page_table must all be "
      << "device pointers, one of them is null";
  PAGELLM_CHECK(aligned16(p.q) && aligned16(p.k_pool) && aligned16(p.v_pool) && aligned16(p.out))
      << what << ": q, k_pool, v_pool and out must be 16-byte aligned (the kernels use "
      << "16-byte loads)";
}

}  // namespace pagellm::cuda::attn
