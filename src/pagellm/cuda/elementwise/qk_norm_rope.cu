// Fused per-head RMSNorm (q_norm, k_norm) + rotary embedding + paged KV store.
//
// Qwen3 normalises every q and k head vector before RoPE. Done as separate ops that would
// be three passes over qkv plus a scatter; here one warp owns one (token, head) vector:
// it loads the head once, reduces the sum of squares with shuffles, rotates, and writes q
// to q_out or k/v straight into their page slots. The K/V pools are laid out
// [num_pages, Hkv, page_size, D], so one head vector is D contiguous bf16 and a warp's
// store is fully coalesced.
//
// Lane l holds elements [l*E, l*E + E) of the first half of the head and the same indices
// of the second half (E = D / 64), which is exactly the pair rotate-half RoPE mixes, so no
// data crosses lanes except in the norm reduction.
//
// Roofline: each qkv element is read once and written once (~4 bytes per element). A decode
// step of 64 tokens of Qwen3-8B (48 heads x 128) moves ~1.6 MB: about 0.3 µs of HBM time,
// so the kernel is launch-bound; prefill of 8k tokens moves ~200 MB (~45 µs).
//
// PDL (pdl.cuh): before waiting for the matrix product that wrote qkv, each warp loads its
// norm weights and computes its RoPE inverse frequencies, which depend on the model alone;
// positions, slot_mapping, qkv and the pools are touched only after pdl_wait().
#include <cuda_bf16.h>

#include <cstdint>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/elementwise/qk_norm_rope.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarpsPerBlock = 4;

template <int kHeadDim>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_store_kv_kernel(const QkNormRopeArgs a) {
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kPerLane = kHalf / 32;  // elements per lane in each half
  const int lane = threadIdx.x % 32;
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const bool active = warp < int64_t{a.num_tokens} * heads;  // the last block may have spare warps
  const int64_t t = active ? warp / heads : 0;
  const int h = active ? static_cast<int>(warp % heads) : 0;
  const bool is_q = h < a.num_q_heads;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;

  // Independent of the kernels before: this lane's norm weights and RoPE inverse
  // frequencies (transformers: inv_freq = 1 / theta^(2i / D) in float32).
  float w_lo[kPerLane], w_hi[kPerLane], inv_freq[kPerLane];
  if (active && !is_v) {
    const bf16* w = static_cast<const bf16*>(is_q ? a.q_norm : a.k_norm);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane * kPerLane + j;
      w_lo[j] = __bfloat162float(w[i]);
      w_hi[j] = __bfloat162float(w[kHalf + i]);
      inv_freq[j] = rope_inv_freq(a.rope_theta, i, kHeadDim);
    }
  }
  pdl_wait();  // qkv comes from the matrix product before; the pools may still be read
  pdl_launch_dependents();
  if (!active) return;

  const bf16* in = static_cast<const bf16*>(a.qkv) + (t * heads + h) * kHeadDim;
  float lo[kPerLane], hi[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    lo[j] = __bfloat162float(in[lane * kPerLane + j]);
    hi[j] = __bfloat162float(in[kHalf + lane * kPerLane + j]);
  }

  if (!is_v) {
    // RMSNorm over the head, then the per-dim weight (same order of operations as the CPU
    // backend: w * (x * inv)).
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) sum_sq += lo[j] * lo[j] + hi[j] * hi[j];
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
    }
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(kHeadDim) + a.eps);
    const float position = static_cast<float>(a.positions[t]);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const float x1 = w_lo[j] * (lo[j] * inv);
      const float x2 = w_hi[j] * (hi[j] * inv);
      float s, c;
      sincosf(position * inv_freq[j], &s, &c);  // angle = position * inv_freq
      lo[j] = x1 * c - x2 * s;
      hi[j] = x2 * c + x1 * s;
    }
  }

  bf16* out = qk_destination(a, t, h, kHeadDim);
  if (out == nullptr) return;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    out[lane * kPerLane + j] = __float2bfloat16(lo[j]);
    out[kHalf + lane * kPerLane + j] = __float2bfloat16(hi[j]);
  }
}

template <int kHeadDim>
void launch_for(const QkNormRopeArgs& args, cudaStream_t stream) {
  const int64_t warps =
      int64_t{args.num_tokens} * (args.num_q_heads + 2 * int64_t{args.num_kv_heads});
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  PAGELLM_CHECK(blocks <= 0x7fffffff) << "qk_norm_rope_store_kv: " << warps << " head vectors";
  launch_kernel(qk_norm_rope_store_kv_kernel<kHeadDim>, dim3(static_cast<unsigned>(blocks)),
                dim3(kWarpsPerBlock * 32), 0, stream, 1, args);
}

}  // namespace

bool qk_norm_rope_supports_head_dim(int32_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

void launch_qk_norm_rope_store_kv(const QkNormRopeArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  switch (args.head_dim) {
    case 64: launch_for<64>(args, stream); return;
    case 128: launch_for<128>(args, stream); return;
    case 256: launch_for<256>(args, stream); return;
    default:
      PAGELLM_FAIL() << "qk_norm_rope_store_kv: head_dim " << args.head_dim
                     << " is not compiled (supported: 64, 128, 256)";
  }
}

}  // namespace pagellm::cuda
