// Paged decode attention: one query token per sequence against its whole paged KV history.
//
// What: out[t, h, :] = softmax(q[t, h, :] · K[0..kv)ᵀ · scale) · V[0..kv) for every query
// token t, reading K/V through the page table, all query heads of a GQA group at once.
//
// Why this shape. Decode attention is memory-bound: each K/V byte is used once per query
// head of its group, far below the ~200 FLOP/B at which the H200 turns compute-bound, so
// the roofline is (bytes of K/V) / (HBM bandwidth). The goals: read each K/V page once,
// with 16-byte loads, many in flight, on every SM, and spend few instructions per byte.
//  - One CTA (4 warps) per (sequence, KV head, split). The CTA's query heads (the GQA
//    group, up to 16; larger groups take several CTAs) are the 16 rows of one mma tile, so
//    each K/V row is read once for all of them, and S = Q Kᵀ and O += P V run on tensor
//    cores (mma.sync m16n8k16, bf16 in, f32 accumulate) like the prefill kernel. With rows
//    padded to 16 the tensor cores do up to 16x the needed work, which still costs less
//    than 1/10 of their rate at full HBM speed; what matters is that a 16-key step costs a
//    warp ~300 instructions instead of ~1,100 on CUDA cores (shuffle reductions, converts),
//    so one or two CTAs per SM keep the memory system busy.
//  - Each warp streams its own 16-key K/V tiles (every 4th tile of the split) through a
//    private 3-stage cp.async ring in shared memory (2 tiles = 16 KB in flight per warp
//    at D = 128); lane l copies half of row l % 16, so each row costs one page-table read
//    and each load instruction fetches 16 whole 32-byte sectors. Warps never wait for one
//    another in the loop (__syncwarp only); each keeps its own online-softmax state, and
//    the four states are merged through shared memory at the end.
//  - Split-KV: at small batch, num_seqs x Hkv CTAs cannot fill 132 SMs, so each sequence's
//    keys are cut into num_splits chunks (a host-side constant, fixed within a CUDA graph);
//    the chunk length comes from the device kv_len, so every split of a sequence gets an
//    equal share of the real length and splits past it exit at once. Each split writes an
//    unnormalised f32 partial output with its (max, sum) in the log2 domain; a second
//    kernel merges them. A sequence that needs only one split is written directly.
//  - Programmatic dependent launch (pdl.cuh): q and the newest K/V rows come from the kernel
//    just before, so they are read after pdl_wait(); but the tiles of a sequence's history
//    (positions before its query tokens, written by earlier steps) go out before the wait,
//    so the first K/V bytes stream in while that kernel still runs. The split kernel lets
//    its dependent (the merge, or the output projection) launch only once a CTA's key loop
//    is done: at large batches its grid has several waves, and even for one wave, letting
//    the output projection in early measured slower (W1 8,161 against 8,451 tok/s, H200,
//    2026-11-29). The merge grid, one wave of one-warp CTAs, lets its dependent launch at
//    once.
// Roofline: Qwen3-8B (8 KV heads, D = 128) reads 4 KB of K/V per cached token, so a batch
// of 64 sequences at 4k context moves 1.07 GB: 0.25 ms at the H200's ~4.3 TB/s copy rate.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention.h"
#include "pagellm/cuda/attention_common.cuh"
#include "pagellm/cuda/cuda_check.h"

namespace pagellm::cuda {
namespace attn {
namespace {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kMergeThreads = 32;
// Query heads per CTA: the rows of one m16 mma tile.
constexpr int kHeadsPerCta = 16;
// Planning: split until the CTAs fill (without exceeding) this many per SM, each split
// holding at least this many keys of max_kv_len.
constexpr int kTargetCtasPerSm = 2;
constexpr int kMinKeysPerSplit = 128;

template <int D>
struct DecodeShape {
  static constexpr int kWarpKeys = 16;                       // keys per warp tile
  static constexpr int kCtaKeys = kDecodeWarps * kWarpKeys;  // split chunks are multiples
  static constexpr int kStages = 3;                          // per-warp cp.async ring
  static constexpr int kChunks = D / 8;                      // 16-byte chunks per row
  static constexpr int kDTiles = D / 8;                      // n8 tiles of O
  static constexpr int kTileElems = kWarpKeys * D;           // one K (or V) warp tile
  static constexpr int kWarpElems = kStages * 2 * kTileElems;
  static constexpr int kQElems = kHeadsPerCta * D;
  static constexpr int kPipeBytes = (kQElems + kDecodeWarps * kWarpElems) * 2;
  // End of the token: per-warp O [warps][16][D] f32 and (max, sum) [warps][16].
  static constexpr int kReduceBytes = kDecodeWarps * kHeadsPerCta * (D * 4 + 8);
  static constexpr int kSmemBytes = kPipeBytes > kReduceBytes ? kPipeBytes : kReduceBytes;
  static_assert(kChunks >= 8 && kChunks % 2 == 0, "the swizzle permutes 8 chunks");
  static_assert(kHeadsPerCta * kChunks % kDecodeThreads == 0, "even q loads");
};

/// How the keys of one sequence are cut: `chunk` keys per split (a multiple of the CTA
/// tile), the first `n_active` splits non-empty. The same function runs in both kernels.
struct SplitPlan {
  int32_t chunk;
  int32_t n_active;
};
__host__ __device__ __forceinline__ SplitPlan plan_split(int32_t kv_len, int32_t num_splits,
                                                         int32_t tile_keys) {
  if (kv_len <= 0) return {tile_keys, 0};
  int32_t chunk = (kv_len + num_splits - 1) / num_splits;
  chunk = (chunk + tile_keys - 1) / tile_keys * tile_keys;
  return {chunk, (kv_len + chunk - 1) / chunk};
}

struct DecodeArgs {
  PagedAttentionParams p;
  float* partial_o;    // [num_splits, num_tokens, Hq, D] f32, unnormalised
  float2* partial_ml;  // [num_splits, num_tokens, Hq] (max, sum), log2 domain
  int32_t num_splits;
  int32_t subgroups;   // CTAs per KV head: ceil(group / kHeadsPerCta)
  int32_t page_shift;  // log2(page_size) or -1
  float scale_log2;    // scale * log2(e)
};

/// Bytes of the two workspace arrays for `splits` splits of `tokens` tokens.
size_t partial_o_bytes(int64_t tokens, int64_t heads, int64_t head_dim, int64_t splits) {
  const size_t raw = static_cast<size_t>(splits * tokens * heads * head_dim) * sizeof(float);
  return (raw + 255) / 256 * 256;
}
size_t partial_ml_bytes(int64_t tokens, int64_t heads, int64_t splits) {
  const size_t raw = static_cast<size_t>(splits * tokens * heads) * sizeof(float2);
  return (raw + 255) / 256 * 256;
}

template <int D>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_split_kernel(const __grid_constant__ DecodeArgs a) {
  using S = DecodeShape<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* q_smem = reinterpret_cast<__nv_bfloat16*>(smem);  // [16][D], swizzled

  // Before pdl_wait() this kernel reads only what no kernel of the step writes: the batch
  // arrays (uploaded by the host) and the K/V rows of positions older than the batch's
  // query tokens. The kernel just before (qk_norm_rope_store_kv) writes q and the new rows;
  // every kernel before that one has finished (pdl.cuh). So the first K/V tiles of the
  // history stream in while that kernel runs.
  const PagedAttentionParams& p = a.p;
  const int b = blockIdx.x;
  const int kv_head = blockIdx.y / a.subgroups;
  const int sub = blockIdx.y - kv_head * a.subgroups;
  const int split = blockIdx.z;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int head0 = kv_head * group + sub * kHeadsPerCta;
  const int n_heads = min(kHeadsPerCta, group - sub * kHeadsPerCta);
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const SeqInfo seq = load_seq_info(p, b);
  const SplitPlan sp = plan_split(seq.kv_len, a.num_splits, S::kCtaKeys);
  auto* out = static_cast<__nv_bfloat16*>(p.out);

  const int32_t* page_row = p.page_table + static_cast<int64_t>(b) * p.max_pages_per_seq;
  const auto* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const auto* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
  __nv_bfloat16* warp_smem = q_smem + S::kQElems + warp * S::kWarpElems;
  const int key_begin = split * sp.chunk;
  const int key_end = min(seq.kv_len, key_begin + sp.chunk);
  // cp.async: lane l copies chunks (l / 16) + 2c of row l % 16 (two lanes = one sector).
  const int copy_row = lane & 15;
  const int copy_chunk0 = lane >> 4;

  // Copies this warp's j-th tile (keys key_begin + (warp + 4 j) * 16 ..) into `stage`;
  // keys >= end are zero-filled, so P V never sees garbage.
  auto issue = [&](int j, int stage, int end) {
    const int pos = key_begin + (warp + j * kDecodeWarps) * S::kWarpKeys + copy_row;
    const bool valid = pos < end;
    const int64_t off = valid ? kv_row_offset(page_row, pos, p.page_size, a.page_shift,
                                              p.num_kv_heads, kv_head, D)
                              : 0;
    // off = 0 when invalid: the address stays inside the pool and is never read.
    const __nv_bfloat16* k_src = k_pool + off + copy_chunk0 * 8;
    const __nv_bfloat16* v_src = v_pool + off + copy_chunk0 * 8;
    const uint32_t ks = smem_addr(warp_smem + stage * 2 * S::kTileElems);
    const uint32_t vs = ks + S::kTileElems * 2;
#pragma unroll
    for (int c = 0; c < S::kChunks / 2; ++c) {
      const uint32_t dst = swizzle<D>(copy_row, copy_chunk0 + 2 * c) * 2;
      cp_async_16(ks + dst, k_src + 16 * c, valid);
      cp_async_16(vs + dst, v_src + 16 * c, valid);
    }
  };
  // The first query token's keys end at end0; positions below `old_end` hold history.
  const bool has_work = seq.q_len > 0 && sp.n_active > 0 && split < sp.n_active;
  const int end0 = min(key_end, seq.kv_len - seq.q_len + 1);
  const int old_end = seq.kv_len - seq.q_len;
  const int n_tiles0 =
      end0 > key_begin ? (end0 - key_begin + S::kWarpKeys - 1) / S::kWarpKeys : 0;
  const int n_mine0 =
      n_tiles0 > warp ? (n_tiles0 - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  // Prologue tiles of token 0 made only of history go out before the wait, one cp.async
  // group each (the same groups the loop below would have committed).
  int early = 0;
  if (has_work) {
    while (early < S::kStages - 1 && early < n_mine0 &&
           key_begin + (warp + early * kDecodeWarps + 1) * S::kWarpKeys <= old_end) {
      issue(early, early, end0);
      cp_async_commit();
      ++early;
    }
  }

  // q and the newest K/V rows come from the kernel before; out and the partials may still
  // be read by the kernels before that.
  pdl_wait();
  if (seq.q_len == 0) return;

  if (sp.n_active == 0) {  // no keys at all: zeros, written once by split 0
    if (split != 0) return;
    const int per_token = n_heads * S::kChunks;
    for (int item = tid; item < seq.q_len * per_token; item += kDecodeThreads) {
      const int i = item / per_token;
      const int h = (item % per_token) / S::kChunks;
      const int c = item % S::kChunks;
      const int64_t row = static_cast<int64_t>(seq.q_begin + i) * p.num_q_heads + head0 + h;
      *reinterpret_cast<uint4*>(out + row * D + c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  if (split >= sp.n_active) return;
  const bool direct = sp.n_active == 1;

  // Fragment coordinates (see mma_bf16_16816): rows g and g + 8, columns 2 t4 (+1).
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int r7 = lane & 7;  // row % 8 of every ldmatrix row this lane addresses
  const uint32_t q_addr = smem_addr(q_smem) + (lane & 15) * D * 2;
  const int q_chunk_hi = lane >> 4;
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_chunk_hi = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int v_chunk_hi = lane >> 4;

  for (int i = 0; i < seq.q_len; ++i) {
    const int token = seq.q_begin + i;
    // Keys this token may see inside this split: [key_begin, end).
    const int end = min(key_end, seq.kv_len - seq.q_len + i + 1);
    const int n_tiles = end > key_begin ? (end - key_begin + S::kWarpKeys - 1) / S::kWarpKeys : 0;
    const int n_mine = n_tiles > warp ? (n_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;

    // Q rows = the CTA's heads of this token (plain loads: q is the previous kernel's
    // output, and it must not join the K/V cp.async groups); rows past n_heads are zeros.
#pragma unroll
    for (int c = 0; c < kHeadsPerCta * S::kChunks / kDecodeThreads; ++c) {
      const int idx = tid + c * kDecodeThreads;
      const int r = idx / S::kChunks;
      const int ch = idx % S::kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < n_heads) {
        v = *reinterpret_cast<const uint4*>(
            qp + (static_cast<int64_t>(token) * p.num_q_heads + head0 + r) * D + ch * 8);
      }
      *reinterpret_cast<uint4*>(q_smem + swizzle<D>(r, ch)) = v;
    }

    // The prologue: tiles 0 .. kStages - 2, one group each (empty groups keep the wait
    // count uniform); token 0's history tiles went out before the wait.
    for (int s = i == 0 ? early : 0; s < S::kStages - 1; ++s) {
      if (s < n_mine) issue(s, s, end);
      cp_async_commit();
    }
    __syncthreads();  // q is in shared memory

    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      ldmatrix_x4(qa[kk], q_addr + (((kk * 2 + q_chunk_hi) ^ r7) << 4));
    }
    float o[S::kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    }
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};

    for (int j = 0; j < n_mine; ++j) {
      if (j + S::kStages - 1 < n_mine) {
        issue(j + S::kStages - 1, (j + S::kStages - 1) % S::kStages, end);
      }
      cp_async_commit();
      cp_async_wait<S::kStages - 1>();  // this lane's part of tile j has landed
      __syncwarp();                     // ... and the other lanes' parts

      const uint32_t k_base = smem_addr(warp_smem + (j % S::kStages) * 2 * S::kTileElems);
      const uint32_t v_base = k_base + S::kTileElems * 2;
      const int n0 = key_begin + (warp + j * kDecodeWarps) * S::kWarpKeys;

      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_base + k_row * D * 2 + (((kk * 2 + k_chunk_hi) ^ r7) << 4));
        mma_bf16_16816(s[0], qa[kk], kb[0], kb[1]);
        mma_bf16_16816(s[1], qa[kk], kb[2], kb[3]);
      }
      if (n0 + S::kWarpKeys > end) {  // the last tile: keys >= end do not exist
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (n0 + nt * 8 + t4 * 2 + (e & 1) >= end) s[nt][e] = -INFINITY;
          }
        }
      }
      // Online softmax for rows g (h = 0) and g + 8 (h = 1); a row lives in one quad. O is
      // rescaled only when some row of the warp raised its running max (else alpha == 1).
      float alpha[2];
      bool max_changed = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(row_max[h], mx * a.scale_log2);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        alpha[h] = fast_exp2(row_max[h] - base);
        max_changed |= new_max != row_max[h];
        row_max[h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = fast_exp2(fmaf(s[nt][2 * h + e], a.scale_log2, -base));
            s[nt][2 * h + e] = pr;
            sum += pr;
          }
        }
        row_sum[h] = row_sum[h] * alpha[h] + sum;
      }
      if (__any_sync(0xffffffffu, max_changed)) {
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e / 2];
        }
      }
      // O += P V: the two n8 tiles of S form the A fragment of one k16 step.
      uint32_t pa[4];
      pa[0] = pack_bf16x2(s[0][0], s[0][1]);
      pa[1] = pack_bf16x2(s[0][2], s[0][3]);
      pa[2] = pack_bf16x2(s[1][0], s[1][1]);
      pa[3] = pack_bf16x2(s[1][2], s[1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_base + v_row * D * 2 + (((dp * 2 + v_chunk_hi) ^ r7) << 4));
        mma_bf16_16816(o[2 * dp], pa, vb[0], vb[1]);
        mma_bf16_16816(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
      __syncwarp();  // every lane is done with this stage before it is refilled
    }
    cp_async_wait<0>();
    // The key loop, this CTA's main work, is done: the next kernel may launch (it waits for
    // this grid to finish before reading the output).
    if (i == seq.q_len - 1) pdl_launch_dependents();
    __syncthreads();  // every warp is done with q and its ring: reuse them below

    // Merge the warps' states: red_o [warps][16][D], red_ml [warps][16].
    float* red_o = reinterpret_cast<float*>(smem);
    float2* red_ml = reinterpret_cast<float2*>(red_o + kDecodeWarps * kHeadsPerCta * D);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      float* dst = red_o + (warp * kHeadsPerCta + r) * D + t4 * 2;
#pragma unroll
      for (int dt = 0; dt < S::kDTiles; ++dt) {
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
      }
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t4 == 0) red_ml[warp * kHeadsPerCta + r] = make_float2(row_max[h], sum);
    }
    __syncthreads();
    for (int item = tid; item < n_heads * (D / 4); item += kDecodeThreads) {
      const int r = item / (D / 4);
      const int d = (item % (D / 4)) * 4;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, red_ml[w * kHeadsPerCta + r].x);
      const float base = mx == -INFINITY ? 0.0f : mx;
      float sum = 0.0f;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float2 ml = red_ml[w * kHeadsPerCta + r];
        const float wt = fast_exp2(ml.x - base);
        sum += wt * ml.y;
        const float4 v = *reinterpret_cast<const float4*>(red_o + (w * kHeadsPerCta + r) * D + d);
        acc.x += wt * v.x;
        acc.y += wt * v.y;
        acc.z += wt * v.z;
        acc.w += wt * v.w;
      }
      const int64_t row = static_cast<int64_t>(token) * p.num_q_heads + head0 + r;
      if (direct) {
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        uint2 packed;
        packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
        packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
        *reinterpret_cast<uint2*>(out + row * D + d) = packed;
      } else {
        const int64_t prow = static_cast<int64_t>(split) * p.num_tokens * p.num_q_heads + row;
        *reinterpret_cast<float4*>(a.partial_o + prow * D + d) = acc;
        if (d == 0) a.partial_ml[prow] = make_float2(mx, sum);
      }
    }
    __syncthreads();  // the next token reuses the buffers
  }
}

/// Merges the splits of one (sequence, query head): out = Σ w_s o_s / Σ w_s l_s with
/// w_s = 2^(m_s - max m). One warp: lane s holds the (max, sum) of splits s and s + 32,
/// and each lane owns 4 dims of the output.
template <int D>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(const __grid_constant__ DecodeArgs a) {
  static_assert(kMaxDecodeSplits <= 64, "two splits per lane");
  pdl_wait();  // the split kernel's partials are complete and visible
  pdl_launch_dependents();
  const PagedAttentionParams& p = a.p;
  const int b = blockIdx.x;
  const int head = blockIdx.y;
  const SeqInfo seq = load_seq_info(p, b);
  if (seq.q_len == 0) return;
  const SplitPlan sp = plan_split(seq.kv_len, a.num_splits, DecodeShape<D>::kCtaKeys);
  if (sp.n_active <= 1) return;  // written directly by the split kernel
  const int lane = threadIdx.x;
  const int d = lane * 4;
  const bool owns_dims = d < D;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int64_t split_stride = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  for (int i = 0; i < seq.q_len; ++i) {
    const int64_t row = static_cast<int64_t>(seq.q_begin + i) * p.num_q_heads + head;
    const float2 ml0 = lane < sp.n_active ? __ldcg(&a.partial_ml[lane * split_stride + row])
                                          : make_float2(-INFINITY, 0.0f);
    const float2 ml1 = lane + 32 < sp.n_active
                           ? __ldcg(&a.partial_ml[(lane + 32) * split_stride + row])
                           : make_float2(-INFINITY, 0.0f);
    float mx = fmaxf(ml0.x, ml1.x);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float base = mx == -INFINITY ? 0.0f : mx;
    const float w0 = fast_exp2(ml0.x - base);
    const float w1 = fast_exp2(ml1.x - base);
    float sum = w0 * ml0.y + w1 * ml1.y;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < sp.n_active; ++s) {
      const float w = __shfl_sync(0xffffffffu, s < 32 ? w0 : w1, s & 31);
      if (owns_dims) {
        const float4 v =
            __ldcg(reinterpret_cast<const float4*>(a.partial_o + (s * split_stride + row) * D + d));
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
    }
    if (owns_dims) {
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      uint2 packed;
      packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
      packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
      *reinterpret_cast<uint2*>(out + row * D + d) = packed;
    }
  }
}

int current_sm_count() {
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <int D>
void launch_decode(const DecodeArgs& args, cudaStream_t stream) {
  using S = DecodeShape<D>;
  static const bool smem_set = [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        decode_split_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
    return true;
  }();
  (void)smem_set;
  const PagedAttentionParams& p = args.p;
  const dim3 grid(p.num_seqs, p.num_kv_heads * args.subgroups, args.num_splits);
  launch_kernel(decode_split_kernel<D>, grid, dim3(kDecodeThreads), S::kSmemBytes, stream, 1,
                args);
  if (args.num_splits == 1) return;
  // With PDL the merge grid launches while the split grid drains, and waits for it.
  launch_kernel(decode_merge_kernel<D>, dim3(p.num_seqs, p.num_q_heads, 1), dim3(kMergeThreads),
                0, stream, 1, args);
}

}  // namespace
}  // namespace attn

size_t paged_attention_workspace_bytes(int32_t max_tokens, int32_t num_q_heads, int32_t head_dim,
                                       int32_t max_splits) {
  PAGELLM_CHECK(max_tokens >= 0 && num_q_heads >= 0 && head_dim >= 0 && max_splits >= 0)
      << "paged_attention_workspace_bytes: arguments must be >= 0, got max_tokens " << max_tokens
      << ", num_q_heads " << num_q_heads << ", head_dim " << head_dim << ", max_splits "
      << max_splits;
  if (max_splits <= 1) return 0;  // one split writes the output directly
  return attn::partial_o_bytes(max_tokens, num_q_heads, head_dim, max_splits) +
         attn::partial_ml_bytes(max_tokens, num_q_heads, max_splits);
}

size_t paged_decode_workspace_bytes(int32_t num_q_heads, int32_t head_dim) {
  return paged_attention_workspace_bytes(128, num_q_heads, head_dim, 8);
}

int32_t plan_decode_splits(const PagedAttentionParams& p) {
  if (p.num_seqs <= 0 || p.num_tokens <= 0 || p.num_kv_heads <= 0 || p.num_q_heads <= 0) {
    return 1;
  }
  const int group = std::max(1, p.num_q_heads / p.num_kv_heads);
  const int subgroups = (group + attn::kHeadsPerCta - 1) / attn::kHeadsPerCta;
  const int64_t ctas = static_cast<int64_t>(p.num_seqs) * p.num_kv_heads * subgroups;
  // One wave: the largest split count whose CTAs still fit the device's CTA slots (a
  // partial second wave would leave SMs idle; fewer, fuller CTAs are cheaper than that).
  const int64_t slots = static_cast<int64_t>(attn::kTargetCtasPerSm) * attn::current_sm_count();
  int64_t splits = slots / ctas;
  splits = std::min<int64_t>(
      splits, (std::max(p.max_kv_len, 1) + attn::kMinKeysPerSplit - 1) / attn::kMinKeysPerSplit);
  splits = std::clamp<int64_t>(splits, 1, kMaxDecodeSplits);
  while (splits > 1 &&
         (p.workspace == nullptr ||
          paged_attention_workspace_bytes(p.num_tokens, p.num_q_heads, p.head_dim,
                                          static_cast<int32_t>(splits)) > p.workspace_bytes)) {
    --splits;
  }
  return static_cast<int32_t>(splits);
}

void paged_decode_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  attn::validate_params(p, "paged_decode_attention");
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  const int32_t splits = p.num_splits > 0 ? p.num_splits : plan_decode_splits(p);
  attn::DecodeArgs args{};
  args.p = p;
  args.num_splits = splits;
  if (splits > 1) {
    const size_t need =
        paged_attention_workspace_bytes(p.num_tokens, p.num_q_heads, p.head_dim, splits);
    PAGELLM_CHECK(p.workspace != nullptr && p.workspace_bytes >= need)
        << "paged_decode_attention: " << splits << " splits over " << p.num_tokens
        << " tokens need a workspace of " << need << " bytes, got " << p.workspace_bytes
        << " (size it with paged_attention_workspace_bytes, or pass num_splits = 0)";
    PAGELLM_CHECK((reinterpret_cast<uintptr_t>(p.workspace) & 255u) == 0)
        << "paged_decode_attention: the workspace must be 256-byte aligned";
    args.partial_o = static_cast<float*>(p.workspace);
    args.partial_ml = reinterpret_cast<float2*>(
        static_cast<char*>(p.workspace) +
        attn::partial_o_bytes(p.num_tokens, p.num_q_heads, p.head_dim, splits));
  }
  const int group = p.num_q_heads / p.num_kv_heads;
  args.subgroups = (group + attn::kHeadsPerCta - 1) / attn::kHeadsPerCta;
  PAGELLM_CHECK(static_cast<int64_t>(p.num_kv_heads) * args.subgroups <= 65535)
      << "paged_decode_attention: num_kv_heads " << p.num_kv_heads << " is too large";
  args.page_shift = attn::page_shift_of(p.page_size);
  args.scale_log2 = p.scale * attn::kLog2e;
  if (p.head_dim == 128) {
    attn::launch_decode<128>(args, stream);
  } else {
    attn::launch_decode<64>(args, stream);
  }
}

}  // namespace pagellm::cuda
