// Fused per-head RMSNorm (q_norm, k_norm) + rotary embedding + paged KV store.
//
// Qwen3 normalises every q and k head vector before RoPE. Done as separate ops that would
// be three passes over qkv plus a scatter; here one warp owns a run of (token, head)
// vectors of one token: it loads each head once, reduces the sum of squares with shuffles,
// rotates, and writes q to q_out or k/v straight into their page slots. The K/V pools are
// laid out [num_pages, Hkv, page_size, D], so one head vector is D contiguous bf16 and a
// warp's store is fully coalesced.
//
// Lane l holds elements [l*E, l*E + E) of the head (E = D / 32, one 4-, 8- or 16-byte
// access); the element rotate-half RoPE pairs with each of them is in lane l ^ 16, one
// shuffle away. The skinny product's fused qkv epilogue uses the same layout and the same
// helpers (qk_norm_rope.cuh), so the two write the same bits.
//
// Roofline: each qkv element is read once and written once (~4 bytes per element). A decode
// step of 64 tokens of Qwen3-8B (48 heads x 128) moves ~1.6 MB: about 0.3 µs of HBM time,
// so the kernel is launch-bound; prefill of 8k tokens moves ~200 MB (~45 µs).
//
// PDL (pdl.cuh): before waiting for the matrix product that wrote qkv, each warp loads its
// norm weights and computes its RoPE inverse frequencies, which depend on the model alone;
// positions, slot_mapping, qkv and the pools are touched only after pdl_wait().
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/elementwise/qk_norm_rope.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarpsPerBlock = 4;

/// Loads kN consecutive bf16 (kN = 2, 4 or 8, aligned to their size) in one access.
template <int kN>
__device__ __forceinline__ void load_raw(const bf16* p, uint32_t (&r)[kN / 2]) {
  if constexpr (kN == 2) {
    r[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (kN == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r[0] = v.x;
    r[1] = v.y;
  } else {
    static_assert(kN == 8, "2, 4 or 8 elements per lane");
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    r[0] = v.x;
    r[1] = v.y;
    r[2] = v.z;
    r[3] = v.w;
  }
}

/// Stores kN floats as bf16 pairs (each rounded to nearest even) in one access.
template <int kN>
__device__ __forceinline__ void store_raw(bf16* p, const float (&v)[kN]) {
  uint32_t r[kN / 2];
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    r[j] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  if constexpr (kN == 2) {
    *reinterpret_cast<uint32_t*>(p) = r[0];
  } else if constexpr (kN == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(r[0], r[1]);
  } else {
    *reinterpret_cast<uint4*>(p) = make_uint4(r[0], r[1], r[2], r[3]);
  }
}

/// Heads a warp takes at once: their loads are all in flight together, 32 registers of raw
/// bf16 per lane whatever the head dim.
template <int kHeadDim>
constexpr int heads_per_item() {
  return 2048 / kHeadDim;
}

/// One warp per item: a token and a run of heads_per_item consecutive heads of its qkv row
/// (grid: x over tokens, 4 a block, y over the runs). The warp issues the loads of all its
/// heads at once, works out the token's RoPE angles, q row and page slot once, then finishes
/// the heads one by one, lane l holding the D / 32 consecutive elements from (D / 32) l
/// (qk_norm_rope.cuh; the skinny product's fused epilogue has the same layout and
/// arithmetic, so both give the same bits). Instructions, not bytes, bounded the kernel
/// before: with two elements of each half of a head in a lane, four heads a warp and the
/// angles computed per head, it ran at about 1.5 TB/s on 8,192-token prefills (~135 µs a
/// Qwen3-4B layer on the H200; sass ~700 instructions per 1 KB moved); this layout runs
/// ~80 µs. `early`: the grid is one wave, so the next kernel may launch at once (pdl.cuh,
/// rule 3); otherwise a warp lets it launch when its work is done.
template <int kHeadDim>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_norm_rope_store_kv_kernel(const QkNormRopeArgs a, bool early) {
  constexpr int kPerLane = kHeadDim / 32;  // consecutive elements per lane
  constexpr int kHeads = heads_per_item<kHeadDim>();
  const int lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int h0 = static_cast<int>(blockIdx.y) * kHeads;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const bool active = t < a.num_tokens;  // the last block may have spare warps
  const int col0 = kPerLane * lane;
  const bool first_half = lane < 16;

  // Independent of the kernels before: this lane's norm weights (q's and k's) and RoPE
  // inverse frequencies (transformers: inv_freq = 1 / theta^(2i / D) in float32).
  float wq[kPerLane], wk[kPerLane], inv_freq[kPerLane];
  if (active) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      wq[j] = __bfloat162float(static_cast<const bf16*>(a.q_norm)[col0 + j]);
      wk[j] = __bfloat162float(static_cast<const bf16*>(a.k_norm)[col0 + j]);
      inv_freq[j] = rope_inv_freq(a.rope_theta, (col0 + j) % (kHeadDim / 2), kHeadDim);
    }
  }
  pdl_wait();  // qkv comes from the matrix product before; the pools may still be read
  if (early) pdl_launch_dependents();
  if (!active) return;

  // The token's position and KV slot, and every head's elements, loaded before any math.
  const float position = static_cast<float>(a.positions[t]);
  const int32_t slot = h0 + kHeads > a.num_q_heads ? a.slot_mapping[t] : -1;
  const bf16* row = static_cast<const bf16*>(a.qkv) + t * heads * kHeadDim;
  uint32_t raw[kHeads][kPerLane / 2];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (h0 + i < heads) load_raw<kPerLane>(row + (h0 + i) * kHeadDim + col0, raw[i]);
  }
  // Where the run's heads go, worked out once: q rows from q_out's row of the token, K/V
  // rows from the token's page slot (kv_off < 0: a padding token or a slot past the pool,
  // whose K/V are skipped, as qk_destination says).
  bf16* const q_row = static_cast<bf16*>(a.q_out) + t * a.num_q_heads * kHeadDim;
  int64_t kv_off = -1;
  if (slot >= 0) {
    const int64_t page = slot / a.page_size;
    if (page < a.num_pages) {
      kv_off = (page * a.num_kv_heads * a.page_size + slot % a.page_size) * kHeadDim;
    }
  }
  const int64_t kv_head_stride = int64_t{a.page_size} * kHeadDim;
  float sn[kPerLane], cs[kPerLane];
  if (h0 < a.num_q_heads + a.num_kv_heads) {  // some q or k head: angles needed
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) sincosf(position * inv_freq[j], &sn[j], &cs[j]);
  }

#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    const int h = h0 + i;  // uniform over the warp, like every branch below
    if (h >= heads) break;
    float v[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane / 2; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[i][j]));
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
    const bool is_q = h < a.num_q_heads;
    if (h < a.num_q_heads + a.num_kv_heads) {  // q and k heads; v heads are stored as is
      const float inv = qk_inv_rms(qk_lane_sum_squares(v), kHeadDim, a.eps);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        v[j] = qk_norm_rope_element(v[j], is_q ? wq[j] : wk[j], inv, sn[j], cs[j], first_half);
      }
    }
    if (is_q) {
      store_raw<kPerLane>(q_row + h * kHeadDim + col0, v);
    } else if (kv_off >= 0) {
      const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
      const int kv_head = h - a.num_q_heads - (is_v ? a.num_kv_heads : 0);
      store_raw<kPerLane>(static_cast<bf16*>(is_v ? a.v_pool : a.k_pool) + kv_off +
                              kv_head * kv_head_stride + col0,
                          v);
    }
  }
  if (!early) pdl_launch_dependents();
}

template <int kHeadDim>
void launch_for(const QkNormRopeArgs& args, cudaStream_t stream) {
  constexpr int kHeads = heads_per_item<kHeadDim>();
  const int64_t heads = args.num_q_heads + 2 * int64_t{args.num_kv_heads};
  const int64_t runs = (heads + kHeads - 1) / kHeads;
  const int64_t blocks_x = (int64_t{args.num_tokens} + kWarpsPerBlock - 1) / kWarpsPerBlock;
  PAGELLM_CHECK(runs <= 65535 && blocks_x <= 0x7fffffff)
      << "qk_norm_rope_store_kv: " << args.num_tokens << " tokens x " << heads << " heads";
  // One wave: as many blocks as stay resident at once (queried once per thread, which
  // drives one device).
  static thread_local int64_t wave = 0;
  if (wave == 0) {
    int sms = 0, per_sm = 0;
    current_device_info(&sms);
    PAGELLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, qk_norm_rope_store_kv_kernel<kHeadDim>, kWarpsPerBlock * 32, 0));
    wave = std::max<int64_t>(1, int64_t{sms} * per_sm);
  }
  const bool early = blocks_x * runs <= wave;
  launch_kernel(qk_norm_rope_store_kv_kernel<kHeadDim>,
                dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(runs)),
                dim3(kWarpsPerBlock * 32), 0, stream, 1, args, early);
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
