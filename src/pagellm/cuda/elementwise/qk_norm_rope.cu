// Fused per-head RMSNorm (q_norm, k_norm) + rotary embedding + paged KV store.
//
// Qwen3 normalises every q and k head vector before RoPE. Done as separate ops that would
// be three passes over qkv plus a scatter; here one warp owns a few (token, head) vectors
// of one token: it loads each head once, reduces the sum of squares with shuffles,
// rotates, and writes q to q_out or k/v straight into their page slots. The K/V pools are laid out
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

/// Loads or stores kN consecutive bf16 of a lane in as few accesses as their alignment
/// allows (the lane's run starts at a multiple of kN elements of a head that starts on a
/// 16-byte boundary).
template <int kN>
__device__ __forceinline__ void load_run(const bf16* p, float (&v)[kN]) {
  if constexpr (kN % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kN; j += 2) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + j));
      v[j] = f.x;
      v[j + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = __bfloat162float(p[j]);
  }
}
template <int kN>
__device__ __forceinline__ void store_run(bf16* p, const float (&v)[kN]) {
  if constexpr (kN % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kN; j += 2) {
      // Each half rounded on its own (round to nearest even), as __float2bfloat16 does.
      *reinterpret_cast<__nv_bfloat162*>(p + j) = __floats2bfloat162_rn(v[j], v[j + 1]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) p[j] = __float2bfloat16(v[j]);
  }
}

/// One warp per (token, run of kHeads consecutive heads of its qkv row). A warp issues all
/// its heads' loads (and the token's position) before any arithmetic, so that each warp has
/// kHeads x 2 x D bytes in flight instead of one head's: with one head per warp the kernel
/// was latency-bound at about a quarter of the copy rate on 8,192-token prefills (H200,
/// docs/PERFORMANCE.md). Every element goes through exactly the operations of the
/// one-head-per-warp kernel, so results do not depend on kHeads.
template <int kHeadDim, int kHeads>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_store_kv_kernel(const QkNormRopeArgs a) {
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kPerLane = kHalf / 32;  // elements per lane in each half
  const int lane = threadIdx.x % 32;
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int groups = (heads + kHeads - 1) / kHeads;
  const bool active = warp < int64_t{a.num_tokens} * groups;  // the last block may have spare warps
  const int64_t t = active ? warp / groups : 0;
  const int h0 = active ? static_cast<int>(warp % groups) * kHeads : 0;

  // Independent of the kernels before: this lane's norm weights (q's and k's) and RoPE
  // inverse frequencies (transformers: inv_freq = 1 / theta^(2i / D) in float32).
  float wq_lo[kPerLane], wq_hi[kPerLane], wk_lo[kPerLane], wk_hi[kPerLane], inv_freq[kPerLane];
  if (active) {
    load_run<kPerLane>(static_cast<const bf16*>(a.q_norm) + lane * kPerLane, wq_lo);
    load_run<kPerLane>(static_cast<const bf16*>(a.q_norm) + kHalf + lane * kPerLane, wq_hi);
    load_run<kPerLane>(static_cast<const bf16*>(a.k_norm) + lane * kPerLane, wk_lo);
    load_run<kPerLane>(static_cast<const bf16*>(a.k_norm) + kHalf + lane * kPerLane, wk_hi);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      inv_freq[j] = rope_inv_freq(a.rope_theta, lane * kPerLane + j, kHeadDim);
    }
  }
  pdl_wait();  // qkv comes from the matrix product before; the pools may still be read
  pdl_launch_dependents();
  if (!active) return;

  // The token's position and KV slot, loaded beside the heads rather than after the math.
  const float position = static_cast<float>(a.positions[t]);
  const int32_t slot = h0 + kHeads > a.num_q_heads ? a.slot_mapping[t] : 0;
  float lo[kHeads][kPerLane], hi[kHeads][kPerLane];
  const bf16* row = static_cast<const bf16*>(a.qkv) + t * heads * kHeadDim;
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (h0 + i >= heads) break;
    const bf16* in = row + (h0 + i) * kHeadDim;
    load_run<kPerLane>(in + lane * kPerLane, lo[i]);
    load_run<kPerLane>(in + kHalf + lane * kPerLane, hi[i]);
  }

#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    const int h = h0 + i;
    if (h >= heads) break;
    const bool is_q = h < a.num_q_heads;
    const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
    if (!is_v) {
      // RMSNorm over the head, then the per-dim weight (same order of operations as the
      // CPU backend: w * (x * inv)).
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) sum_sq += lo[i][j] * lo[i][j] + hi[i][j] * hi[i][j];
      for (int offset = 16; offset > 0; offset >>= 1) {
        sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
      }
      const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(kHeadDim) + a.eps);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const float x1 = (is_q ? wq_lo[j] : wk_lo[j]) * (lo[i][j] * inv);
        const float x2 = (is_q ? wq_hi[j] : wk_hi[j]) * (hi[i][j] * inv);
        float s, c;
        sincosf(position * inv_freq[j], &s, &c);  // angle = position * inv_freq
        lo[i][j] = x1 * c - x2 * s;
        hi[i][j] = x2 * c + x1 * s;
      }
    }
    bf16* out = qk_destination(a, t, h, kHeadDim, slot);
    if (out == nullptr) continue;
    store_run<kPerLane>(out + lane * kPerLane, lo[i]);
    store_run<kPerLane>(out + kHalf + lane * kPerLane, hi[i]);
  }
}

/// Heads per warp: 4 (2 at head_dim 256, whose lanes hold twice the elements).
template <int kHeadDim>
constexpr int heads_per_warp() {
  return kHeadDim >= 256 ? 2 : 4;
}

template <int kHeadDim>
void launch_for(const QkNormRopeArgs& args, cudaStream_t stream) {
  constexpr int kHeads = heads_per_warp<kHeadDim>();
  const int64_t heads = args.num_q_heads + 2 * int64_t{args.num_kv_heads};
  const int64_t warps = int64_t{args.num_tokens} * ((heads + kHeads - 1) / kHeads);
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  PAGELLM_CHECK(blocks <= 0x7fffffff) << "qk_norm_rope_store_kv: " << warps << " warps";
  launch_kernel(qk_norm_rope_store_kv_kernel<kHeadDim, kHeads>,
                dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32), 0, stream, 1,
                args);
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
