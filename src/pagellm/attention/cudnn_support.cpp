#include "pagellm/attention/cudnn_support.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>

#include "pagellm/common/hash.h"

namespace pagellm {

bool AttentionDomain::operator==(const AttentionDomain& o) const {
  return dtype == o.dtype && num_q_heads == o.num_q_heads && num_kv_heads == o.num_kv_heads &&
         head_dim == o.head_dim && page_size == o.page_size &&
         std::memcmp(&scale, &o.scale, sizeof scale) == 0;
}

AttentionBatchView batch_view(const ForwardBatch& batch) {
  AttentionBatchView v;
  v.query_start = batch.query_start.data();
  v.query_start_size = batch.query_start.size();
  v.kv_lens = batch.kv_lens.data();
  v.kv_lens_size = batch.kv_lens.size();
  // The persistent page table leaves ForwardBatch::page_table empty; the per-batch table the
  // kernels read is [B, max_pages_per_seq] all the same (the backend gathers its rows).
  v.page_table_size = batch.persistent_page_table()
                          ? static_cast<size_t>(batch.num_seqs()) *
                                static_cast<size_t>(std::max(batch.max_pages_per_seq, 0))
                          : batch.page_table.size();
  v.max_pages_per_seq = batch.max_pages_per_seq;
  v.num_seqs = batch.num_seqs();
  v.num_tokens = batch.num_tokens();
  const bool well_formed = batch.query_start.size() == batch.kv_lens.size() + 1;
  v.max_query_len = well_formed ? batch.max_query_len() : 0;
  v.max_kv_len = batch.max_kv_len();
  v.kv_len_capacity = batch.kv_len_capacity;
  return v;
}

int32_t cudnn_max_paged_head_dim(CudnnVersion version) { return version <= 90900 ? 128 : 256; }

RuleResult check_cudnn_domain(const AttentionDomain& d, const AttentionBatchView& b,
                              AttentionPhase phase, LaunchMode mode, const DeviceProfile& device) {
  const CudnnVersion v = device.cudnn_version;
  if (v <= 0) return RuleResult::fail(Reason::kNoCudnn);
  const CudnnVersion needed =
      phase == AttentionPhase::kPrefill ? kCudnnPagedRaggedMin : kCudnnPagedMin;
  if (v < needed) return RuleResult::fail(Reason::kCudnnTooOld, v, needed);
  if (v == 91000 || v == 91001) return RuleResult::fail(Reason::kCudnnKnownBad, v);
  const int64_t cc = int64_t{device.cc_major} * 10 + device.cc_minor;
  if (cc < 80) return RuleResult::fail(Reason::kComputeCapability, cc, 80);
  if (d.dtype != DType::BF16 && d.dtype != DType::F16) {
    return RuleResult::fail(Reason::kDtype, static_cast<int64_t>(d.dtype));
  }
  if (d.num_q_heads <= 0 || d.num_kv_heads <= 0) {
    return RuleResult::fail(Reason::kHeadCounts, d.num_q_heads, d.num_kv_heads);
  }
  if (d.num_q_heads % d.num_kv_heads != 0) {
    return RuleResult::fail(Reason::kGqaRatio, d.num_q_heads, d.num_kv_heads);
  }
  const int32_t max_d = cudnn_max_paged_head_dim(v);
  if (d.head_dim < 8 || d.head_dim % 8 != 0 || d.head_dim > max_d) {
    return RuleResult::fail(Reason::kHeadDim, d.head_dim, max_d);
  }
  if (d.page_size < 1 || d.page_size > kCudnnMaxPageSize) {
    return RuleResult::fail(Reason::kPageSize, d.page_size, kCudnnMaxPageSize);
  }
  if (b.num_seqs <= 0) return RuleResult::fail(Reason::kBatchRange, b.num_seqs);
  if (b.max_query_len <= 0 || b.num_tokens <= 0) {
    return RuleResult::fail(Reason::kQueryRange, b.max_query_len, b.num_tokens);
  }
  // The table row bounds every KV length, and cuDNN's graph is declared with the row's
  // capacity as its KV length (its paged loads need ceil(s_kv / page_size) == row length),
  // which is an int in cuDNN's API.
  const int64_t table_tokens = int64_t{b.max_pages_per_seq} * d.page_size;
  const int64_t kv_bound = std::max<int64_t>(b.max_kv_len, b.kv_len_capacity);
  if (b.max_kv_len <= 0 || kv_bound > table_tokens) {
    return RuleResult::fail(Reason::kKvRange, kv_bound, table_tokens);
  }
  if (table_tokens > INT_MAX) return RuleResult::fail(Reason::kKvRange, table_tokens, INT_MAX);
  const int64_t elements = int64_t{b.num_tokens} * d.num_q_heads * d.head_dim;
  if (elements > INT_MAX) return RuleResult::fail(Reason::kOffsetOverflow, elements, INT_MAX);
  if (mode == LaunchMode::kGraph && phase == AttentionPhase::kPrefill) {
    return RuleResult::fail(Reason::kGraphRagged);
  }
  return RuleResult::pass();
}

RuleResult cudnn_static_support(const AttentionDomain& domain, AttentionPhase phase,
                                const DeviceProfile& device) {
  // A minimal well-formed batch of the phase, so that only the static checks can fail.
  const int32_t q = phase == AttentionPhase::kDecode ? 1 : 2;
  AttentionBatchView b;
  b.num_seqs = 1;
  b.num_tokens = q;
  b.max_query_len = q;
  b.max_kv_len = q;
  b.max_pages_per_seq = std::max(1, (q + std::max(domain.page_size, 1) - 1) /
                                        std::max(domain.page_size, 1));
  return check_cudnn_domain(domain, b, phase, LaunchMode::kEager, device);
}

bool CudnnPlanKey::operator==(const CudnnPlanKey& o) const {
  return num_seqs == o.num_seqs && max_query_len == o.max_query_len &&
         max_kv_len == o.max_kv_len && num_q_heads == o.num_q_heads &&
         num_kv_heads == o.num_kv_heads && head_dim == o.head_dim && page_size == o.page_size &&
         max_pages_per_seq == o.max_pages_per_seq && dtype == o.dtype && ragged == o.ragged &&
         std::memcmp(&scale, &o.scale, sizeof scale) == 0;
}

std::string CudnnPlanKey::describe() const {
  std::ostringstream s;
  s << "B=" << num_seqs << " s_q=" << max_query_len << " s_kv=" << max_kv_len
    << " Hq=" << num_q_heads << " Hkv=" << num_kv_heads << " D=" << head_dim
    << " page=" << page_size << " table=" << max_pages_per_seq << " " << dtype_name(dtype)
    << (ragged ? " ragged" : " dense") << " scale=" << scale;
  return s.str();
}

size_t CudnnPlanKeyHash::operator()(const CudnnPlanKey& k) const {
  uint32_t scale_bits = 0;  // operator== compares the scale's bits too
  std::memcpy(&scale_bits, &k.scale, sizeof scale_bits);
  return hash_values(k.num_seqs, k.max_query_len, k.max_kv_len, k.num_q_heads, k.num_kv_heads,
                     k.head_dim, k.page_size, k.max_pages_per_seq, static_cast<int>(k.dtype),
                     k.ragged, scale_bits);
}

int32_t bucket_pow2(int32_t x, int32_t floor) {
  int64_t want = std::max(x, floor);
  int64_t b = 1;
  while (b < want && b < (int64_t{1} << 30)) b <<= 1;
  return static_cast<int32_t>(b);
}

CudnnPlanKey make_cudnn_plan_key(const AttentionDomain& d, const AttentionBatchView& b,
                                 AttentionPhase phase, int32_t actual_max_query_len,
                                 int32_t actual_max_kv_len, int32_t query_capacity) {
  CudnnPlanKey k;
  k.num_seqs = b.num_seqs;
  k.num_q_heads = d.num_q_heads;
  k.num_kv_heads = d.num_kv_heads;
  k.head_dim = d.head_dim;
  k.page_size = d.page_size;
  k.max_pages_per_seq = b.max_pages_per_seq;
  k.dtype = d.dtype;
  k.scale = d.scale;
  k.ragged = phase == AttentionPhase::kPrefill;
  if (!k.ragged) {
    k.max_query_len = 1;
  } else if (query_capacity > 0) {
    k.max_query_len = bucket_pow2(query_capacity, 64);
  } else {
    k.max_query_len = bucket_pow2(actual_max_query_len, 64);
  }
  // cuDNN's paged graph is declared with the page-table row's capacity as its KV length:
  // its paged loads require ceil(s_kv / page_size) to equal the row length, and the real
  // lengths come from seq_len_kv (padding mask), so the kernels stop at each sequence's KV.
  // One plan then serves every KV length the rows can hold, eager or replayed.
  (void)actual_max_kv_len;
  const int64_t table_tokens = int64_t{b.max_pages_per_seq} * d.page_size;
  k.max_kv_len = static_cast<int32_t>(std::min<int64_t>(table_tokens, INT_MAX));
  return k;
}

}  // namespace pagellm
