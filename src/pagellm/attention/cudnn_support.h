// What cuDNN's paged SDPA forward supports, by version, checked on the host at run time.
//
// The cuDNN route (src/pagellm/cuda/attention/cudnn_attention.h) builds one graph per shape:
//   Q, O      bf16 [B, Hq, s_q, D], token-major (strides D for heads, Hq*D for tokens);
//             prefill: ragged, per-sequence element offsets query_start[b] * Hq * D;
//             decode:  dense, one token per sequence (s_q = 1)
//   K, V      the pools as paged containers [num_pages, Hkv, page_size, D]
//   tables    the batch's page table [B, 1, max_pages_per_seq, 1] for both K and V
//   lengths   seq_len_q [B], seq_len_kv [B] (padding mask), causal bottom-right
// This file knows which cuDNN releases can build that graph, so that `auto` declines
// (fails closed) before the library is asked, and `cudnn` can say why it cannot.
//
// Version facts, from the cuDNN frontend's support checks (sdpa_support_surface.h, 1.32):
//   9.5.0   paged K/V caches
//   9.6.0   bottom-right causal masks with arbitrary lengths (9.5: multiples of 64 only)
//   9.8.0   paged caches together with ragged Q (the frontend's paged prefill sample needs
//           9.8; the support check alone says 9.7)
//   9.10.0, 9.10.1   fp16/bf16 SDPA forward excluded for known bugs
//   head_dim: a multiple of 8; paged caches allow at most 128 through 9.9, 256 after
//   compute capability 8.0 or newer for fp16/bf16 SDPA
#pragma once

#include <cstdint>
#include <string>

#include "pagellm/attention/admission.h"
#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/device_profile.h"

namespace pagellm {

inline constexpr CudnnVersion kCudnnPagedMin = 90500;        // dense decode over paged K/V
inline constexpr CudnnVersion kCudnnPagedRaggedMin = 90800;  // ragged prefill over paged K/V
/// Largest page size the cuDNN route accepts (the native kernels' limit too, so that a
/// table measured on both compares like with like).
inline constexpr int32_t kCudnnMaxPageSize = 1024;

/// Largest head_dim cuDNN `version` supports over paged caches (128 through 9.9, then 256).
int32_t cudnn_max_paged_head_dim(CudnnVersion version);

/// Rule 1 (static domain) for one call: dtype, head dim, GQA ratio, page size, the declared
/// batch, query and KV ranges, the int32 offset range, and the cuDNN version against the
/// features the call needs (ragged Q for prefill). `batch` supplies declared values only.
/// Returns a passing result or the first violation.
RuleResult check_cudnn_domain(const AttentionDomain& domain, const AttentionBatchView& batch,
                              AttentionPhase phase, LaunchMode mode,
                              const DeviceProfile& device);

/// Rule 1's static part alone (version, compute capability, dtype, head dim, GQA ratio,
/// page size) for `phase`, with no batch: what a backend can check once at start-up.
RuleResult cudnn_static_support(const AttentionDomain& domain, AttentionPhase phase,
                                const DeviceProfile& device);

/// The shape a cuDNN execution plan is built for. Plans are cached by it, so it buckets the
/// variable lengths: the batch size is exact (its arrays are the batch's own), the query
/// dimension is 1 for decode and a power of two >= 64 covering every query for prefill,
/// and the KV dimension is the page-table row's capacity, max_pages_per_seq x page_size
/// (cuDNN's paged loads require ceil(s_kv / page_size) == the row length; the real lengths
/// are seq_len_kv), so one plan serves every KV length, and every replay of a captured
/// graph uses the plan it was captured with. The pool size (num_pages) is added by the
/// CUDA side, which knows it.
struct CudnnPlanKey {
  int32_t num_seqs = 0;
  int32_t max_query_len = 0;  // Q's s dimension
  int32_t max_kv_len = 0;     // s_kv: max_pages_per_seq * page_size (set_paged_attention_max_seq_len_kv)
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  int32_t max_pages_per_seq = 0;
  DType dtype = DType::BF16;
  bool ragged = false;  // prefill: ragged Q/O with seq_len_q; decode: dense
  float scale = 0.0f;

  bool operator==(const CudnnPlanKey& o) const;
  bool operator!=(const CudnnPlanKey& o) const { return !(*this == o); }
  /// For example "B=64 s_q=1 s_kv=4096 Hq=32 Hkv=8 D=128 page=16 table=256 bf16 dense".
  std::string describe() const;
};

struct CudnnPlanKeyHash {
  size_t operator()(const CudnnPlanKey& k) const;
};

/// Smallest power of two >= max(x, floor); saturates at 2^30.
int32_t bucket_pow2(int32_t x, int32_t floor);

/// The plan key of a call that passed rules 1 and 2 (actual_max_query_len and
/// actual_max_kv_len are the real maxima; the KV dimension is the table row's capacity
/// whatever they are). query_capacity, when positive, replaces the query bucket
/// (graph-bound planners pin it to their capacity).
CudnnPlanKey make_cudnn_plan_key(const AttentionDomain& domain, const AttentionBatchView& batch,
                                 AttentionPhase phase, int32_t actual_max_query_len,
                                 int32_t actual_max_kv_len, int32_t query_capacity = 0);

/// Where the planner asks whether a cuDNN plan is already built (the CUDA route's plan
/// cache implements it). Host-only, so that the planner can be tested with a fake.
class CudnnPlanRegistry {
 public:
  virtual ~CudnnPlanRegistry() = default;
  /// True when a plan for `key` is built and can run now (also inside stream capture).
  virtual bool has_plan(const CudnnPlanKey& key) const = 0;
  /// `auto` wanted `key` but it was not built: remember it, so that the owner can build it
  /// off the hot path (at warm-up or between steps). Must be cheap.
  virtual void request_plan(const CudnnPlanKey& key) = 0;
};

}  // namespace pagellm
