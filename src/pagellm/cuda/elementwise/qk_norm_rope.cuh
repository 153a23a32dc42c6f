// Device helpers shared by the two kernels that store normalised q/k and v rows:
// qk_norm_rope_store_kv_kernel (qk_norm_rope.cu) and the skinny GEMM's fused qkv epilogue
// (skinny_gemm.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "pagellm/cuda/elementwise/kernels.h"

namespace pagellm::cuda {

/// RoPE inverse frequency of pair i (0 <= i < head_dim / 2) as transformers computes it
/// for Qwen3, in float32: 1 / theta^(2i / head_dim).
__device__ __forceinline__ float rope_inv_freq(float theta, int i, int head_dim) {
  return 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
}

// The arithmetic of one head, shared by both kernels so that a token's q and K/V come out
// bit for bit the same whichever of them wrote it (a prefill chunk or a decode step). A
// warp holds one head of D elements, lane l the D / 32 consecutive elements from
// (D / 32) * l, so lane l ^ 16 holds the partner of each of them under rotate-half RoPE.

/// The lane's share of the head's sum of squares, in element order.
template <int kN>
__device__ __forceinline__ float qk_lane_sum_squares(const float (&v)[kN]) {
  float s = v[0] * v[0];
#pragma unroll
  for (int j = 1; j < kN; ++j) s += v[j] * v[j];
  return s;
}

/// 1 / RMS of the head from the lanes' shares (an xor butterfly: every lane gets the same
/// bits, since each step adds the same two values in either order).
__device__ __forceinline__ float qk_inv_rms(float lane_sum_sq, int head_dim, float eps) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    lane_sum_sq += __shfl_xor_sync(0xffffffffu, lane_sum_sq, offset);
  }
  return 1.0f / sqrtf(lane_sum_sq / static_cast<float>(head_dim) + eps);
}

/// RMSNorm with weight w, then rotate-half RoPE at angle (sn, cs): lo' = lo c - hi s,
/// hi' = hi c + lo s, the partner coming from lane l ^ 16. Every lane of the warp calls it.
__device__ __forceinline__ float qk_norm_rope_element(float v, float w, float inv, float sn,
                                                      float cs, bool first_half) {
  const float x = w * (v * inv);  // the CPU backend's order: w * (x * inv)
  const float partner = __shfl_xor_sync(0xffffffffu, x, 16);
  return first_half ? x * cs - partner * sn : x * cs + partner * sn;
}

/// Where head `head` (of the Hq + 2 Hkv heads of a qkv row) of token `token`, whose KV slot
/// is `slot` (slot_mapping[token]), is stored: its q_out row for q heads, its page slot in
/// the K or V pool for k and v heads; nullptr for a k/v head of a padding token (negative
/// slot) or a slot past the pool, which are skipped.
__device__ __forceinline__ __nv_bfloat16* qk_destination(const QkNormRopeArgs& a, int64_t token,
                                                         int head, int head_dim, int32_t slot) {
  if (head < a.num_q_heads) {
    return static_cast<__nv_bfloat16*>(a.q_out) + (token * a.num_q_heads + head) * head_dim;
  }
  if (slot < 0) return nullptr;  // padding token: nothing to cache
  const int64_t page = slot / a.page_size, offset = slot % a.page_size;
  if (page >= a.num_pages) return nullptr;  // never write outside the pool
  const bool is_v = head >= a.num_q_heads + a.num_kv_heads;
  const int kv_head = is_v ? head - a.num_q_heads - a.num_kv_heads : head - a.num_q_heads;
  return static_cast<__nv_bfloat16*>(is_v ? a.v_pool : a.k_pool) +
         ((page * a.num_kv_heads + kv_head) * a.page_size + offset) * head_dim;
}

/// The same, reading the token's slot from slot_mapping only for k/v heads.
__device__ __forceinline__ __nv_bfloat16* qk_destination(const QkNormRopeArgs& a, int64_t token,
                                                         int head, int head_dim) {
  return qk_destination(a, token, head, head_dim,
                        head < a.num_q_heads ? 0 : a.slot_mapping[token]);
}

}  // namespace pagellm::cuda
