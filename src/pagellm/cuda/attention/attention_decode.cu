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
//    private 3-stage ring in shared memory (2 tiles = 16 KB in flight per warp at
//    D = 128). Two kernels fill the ring (attention_decode_variants.h): the TMA kernel
//    (D = 128, pages a multiple of 16, sm_90; the default) has lane 0 issue four TMA boxes
//    per tile, since a tile of one KV head is 4 KB of contiguous K and 4 KB of V in a
//    page; the cp.async kernel (any shape) has lane l copy half of row l % 16, so each row
//    costs one page-table read and each load instruction fetches 16 whole 32-byte sectors.
//    The TMA kernel reaches the copy bandwidth from 4k keys where the cp.async one stops
//    near 80 % (H200, 2026-11-29). Warps never wait for one another in the loop
//    (__syncwarp only); each keeps its own online-softmax state, and the four states are
//    merged through shared memory at the end. The tile math and the merge are shared.
//  - Split-KV: at small batch, num_seqs x Hkv CTAs cannot fill 132 SMs, so each sequence's
//    keys are cut into num_splits chunks (a host-side constant, fixed within a CUDA graph);
//    the chunk length comes from the device kv_len, so every split of a sequence gets an
//    equal share of the real length (at least kMinKeysPerSplit keys) and splits past it
//    exit at once. Each split writes an unnormalised f32 partial output with its (max,
//    sum) in the log2 domain and counts itself done on a counter in the workspace; the
//    last split of a (sequence, CTA row) to arrive merges them and resets the counter
//    (merge_if_last_split), so there is no merge kernel and no second grid boundary. A
//    sequence with one split is written directly.
//  - Programmatic dependent launch (pdl.cuh): q and the newest K/V rows come from the kernel
//    just before, so they are read after pdl_wait(); but the tiles of a sequence's history
//    (positions before its query tokens, written by earlier steps) go out before the wait,
//    so the first K/V bytes stream in while that kernel still runs. The split kernel lets
//    its dependent (the output projection) launch only once a CTA's key loop is done: at
//    large batches its grid has several waves, and even for one wave, letting the output
//    projection in early measured slower (W1 8,161 against 8,451 tok/s, H200, 2026-11-29).
//    A grid that fills at most half the SMs (batch 1 or 2 at short contexts) lets it in
//    right after the wait instead, so that the product's CTAs stream their first weight
//    chunks on the idle SMs (releases_dependents_early: batch 1 +1.0 %, H200, 2026-12-06).
//  - Shared-prefix pass (PagedAttentionParams::prefix_tokens; TMA kernel): grid z = 0 holds
//    one CTA per (item, KV head) that reads an item's shared prefix pages once for all its
//    member sequences (prefix_pass); the splits then cut only each member's keys after the
//    prefix, and the pass counts as one more part in the merge (arrive_last). A member
//    with at most prefix_fold_keys keys of its own (a GRPO sample early in its answer) is
//    folded: the pass CTA streams those keys too, for that member's rows, and writes its
//    output; the member's split CTAs exit at once (folds_suffix).
// Roofline: Qwen3-8B (8 KV heads, D = 128) reads 4 KB of K/V per cached token, so a batch
// of 64 sequences at 4k context moves 1.07 GB: 0.25 ms at the H200's ~4.3 TB/s copy rate.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_decode_variants.h"
#include "pagellm/cuda/attention/attention_common.cuh"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/support/tma.cuh"
#include "pagellm/cuda/support/tma.h"

namespace pagellm::cuda {
namespace attn {
namespace {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
// Query heads per CTA: the rows of one m16 mma tile.
constexpr int kHeadsPerCta = 16;
// Rows of a prefix-pass CTA: two m16 tiles, so that a GRPO prompt's 8 samples on a model of
// 4 query heads per KV head are one item, whose prefix the CTA reads once for all 32 rows.
constexpr int kPassRowTiles = 2;
constexpr int kPassRows = kPassRowTiles * kHeadsPerCta;
// Planning: split until the CTAs fill (without exceeding) this many per SM, each split
// holding at least this many keys. The host applies the minimum to max_kv_len (in a
// graph: the capacity), the kernel to each sequence's real kv_len, so a short sequence in
// a graph planned for long ones runs fewer, fuller splits and merges fewer partials
// (batch 1 at ~320 keys: 380.5 against 374.6 tok/s with 64-key chunks, H200, session (f)).
constexpr int kTargetCtasPerSm = 2;
constexpr int kMinKeysPerSplit = 128;

template <int D>
struct DecodeShape {
  static constexpr int kWarpKeys = 16;                       // keys per warp tile
  static constexpr int kCtaKeys = kDecodeWarps * kWarpKeys;  // split chunks are multiples
  static constexpr int kStages = 3;                          // per-warp cp.async ring
  static constexpr int kChunks = D / 8;                      // 16-byte chunks per row
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
// Each split's chunk: an equal share of kv_len, at least min_chunk keys, rounded up to
// whole tiles; n_active splits hold keys, the rest exit at once.
__host__ __device__ __forceinline__ SplitPlan plan_split(int32_t kv_len, int32_t num_splits,
                                                         int32_t tile_keys, int32_t min_chunk) {
  if (kv_len <= 0) return {tile_keys, 0};
  int32_t chunk = max((kv_len + num_splits - 1) / num_splits, min_chunk);
  chunk = (chunk + tile_keys - 1) / tile_keys * tile_keys;
  return {chunk, (kv_len + chunk - 1) / chunk};
}

struct DecodeArgs {
  PagedAttentionParams p;
  float* partial_o;    // [num_splits, num_tokens, Hq, D] f32, unnormalised
  int32_t* counters;   // [kSplitCounters]: splits done per (sequence, CTA row); zero when idle
  float2* partial_ml;  // [num_splits, num_tokens, Hq] (max, sum), log2 domain
  int32_t num_splits;
  int32_t subgroups;   // CTAs per KV head: ceil(group / kHeadsPerCta)
  int32_t page_shift;  // log2(page_size) or -1
  float scale_log2;    // scale * log2(e)
  // Release the dependents right after the wait rather than after the key loop
  // (releases_dependents_early).
  int32_t release_early;
  // Shared-prefix (cascade) decode, when prefix_tokens is not null: the prefix pass's
  // partials per (query token, head), in the workspace slot after the splits', read by
  // the CTA that finishes each row.
  float* prefix_o;    // [num_tokens, Hq, D] f32, unnormalised
  float2* prefix_ml;  // [num_tokens, Hq] (max, sum), log2 domain
  int32_t split_base;  // 1 with a prefix pass (grid z 0 runs it; the splits follow), else 0
  // Members with at most this many keys after their prefix are folded into the pass
  // (PagedAttentionParams::prefix_fold_keys; folds_suffix).
  int32_t fold_keys;
};

/// Whether a decode grid of `ctas` CTAs on a device of `sms` SMs releases its dependents
/// right after its own wait: when it fills at most half the SMs (batches of 1 or 2 at short
/// contexts, where the planner stops at one split per 128 keys). The next kernel, a product,
/// then has idle SMs on which its CTAs start streaming their first weight chunks while the
/// attention, which moves few bytes, runs its key loop and split merge. A fuller grid keeps
/// the release after the key loop: there early CTAs of the next product would take SM
/// slots and bandwidth from the attention on the critical path (W1, 2026-11-29: 8,161
/// against 8,451 tok/s). H200, 2026-12-06: batch 1 +1.0 %, batch 2 +0.5 %.
bool releases_dependents_early(int64_t ctas, int sms) { return sms > 0 && ctas * 2 <= sms; }

/// Bytes of the two workspace arrays for `splits` splits of `tokens` tokens.
size_t partial_o_bytes(int64_t tokens, int64_t heads, int64_t head_dim, int64_t splits) {
  const size_t raw = static_cast<size_t>(splits * tokens * heads * head_dim) * sizeof(float);
  return (raw + 255) / 256 * 256;
}
size_t partial_ml_bytes(int64_t tokens, int64_t heads, int64_t splits) {
  const size_t raw = static_cast<size_t>(splits * tokens * heads) * sizeof(float2);
  return (raw + 255) / 256 * 256;
}
/// The split counters sit at the start of the workspace, the same bytes for every call
/// whatever its shape, so that the zeros each call leaves there are what the next finds.
/// One counter per (sequence, CTA row of the grid) of a call with several splits.
constexpr int64_t kSplitCounters = 65536;
constexpr size_t kCounterBytes = kSplitCounters * sizeof(int32_t);

/// Byte offset of 16-byte chunk `chunk` of row `row` in a 16-key K or V tile in shared
/// memory. Two layouts, both XOR-swizzled by row % 8 so that the 8 rows an ldmatrix reads
/// at one logical chunk sit in 8 different bank groups:
///  - kHalves false (the cp.async kernel): rows of D * 2 bytes, chunk c at (c ^ (row % 8)).
///  - kHalves true (the TMA kernel, D = 128): two [16][64] halves of 2 KB, each as the TMA
///    writes a box of 128-byte rows with 128-byte swizzle (chunk c % 8 of half c / 8 at
///    (c % 8) ^ (row % 8)); the halves must start 1024-byte aligned.
template <int D, bool kHalves>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  if constexpr (kHalves) {
    static_assert(D == 128, "two 64-column halves");
    return ((chunk >> 3) << 11) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  } else {
    return static_cast<uint32_t>(swizzle<D>(row, chunk)) * 2;
  }
}

/// One warp's online-softmax state over its tiles: O (16 query rows x D, mma C fragments),
/// running max (log2 domain) and sum for rows g and g + 8.
template <int D>
struct WarpState {
  float o[D / 8][4];
  float row_max[2];
  float row_sum[2];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    }
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  }
};

/// Folds one 16-key tile (keys n0 .. n0 + 15, those >= end masked out) into the warp's
/// state: S = Q Kᵀ on tensor cores, online softmax, O += P V. k_base / v_base: shared
/// addresses of the K and V tiles in the layout tile_offset<D, kHalves> describes. Rows of V
/// at keys >= end must be finite (zero-filled): P is 0 there, but 0 x NaN is NaN.
/// kRowMask: only rows [row_lo, row_hi) of the tile attend these keys (the prefix pass's
/// tiles of one member's own keys); the other rows' states are left as they were.
template <int D, bool kHalves, bool kRowMask = false>
__device__ __forceinline__ void attend_tile(const uint32_t (&qa)[D / 16][4], uint32_t k_base,
                                            uint32_t v_base, int n0, int end, float scale_log2,
                                            WarpState<D>& st, int row_lo = 0,
                                            int row_hi = kHeadsPerCta) {
  const int lane = threadIdx.x % 32;
  const int t4 = lane % 4;
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_chunk_hi = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int v_chunk_hi = lane >> 4;

  float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t kb[4];
    ldmatrix_x4(kb, k_base + tile_offset<D, kHalves>(k_row, kk * 2 + k_chunk_hi));
    mma_bf16_16816(s[0], qa[kk], kb[0], kb[1]);
    mma_bf16_16816(s[1], qa[kk], kb[2], kb[3]);
  }
  if (n0 + 16 > end) {  // the last tile: keys >= end do not exist
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (n0 + nt * 8 + t4 * 2 + (e & 1) >= end) s[nt][e] = -INFINITY;
      }
    }
  }
  if constexpr (kRowMask) {  // C fragments: e < 2 is row lane / 4, e >= 2 row lane / 4 + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = lane / 4 + 8 * h;
      if (row < row_lo || row >= row_hi) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[nt][2 * h] = s[nt][2 * h + 1] = -INFINITY;
      }
    }
  }
  // Online softmax for rows g (h = 0) and g + 8 (h = 1); a row lives in one quad. O is
  // rescaled only when some row of the warp raised its running max (else alpha == 1).
  float alpha[2];
  bool max_changed = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx =
        fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
    float base;
    alpha[h] = online_softmax_step(mx, st.row_max[h], scale_log2, base, max_changed);
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pr = fast_exp2(fmaf(s[nt][2 * h + e], scale_log2, -base));
        s[nt][2 * h + e] = pr;
        sum += pr;
      }
    }
    st.row_sum[h] = st.row_sum[h] * alpha[h] + sum;
  }
  if (__any_sync(0xffffffffu, max_changed)) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[dt][e] *= alpha[e / 2];
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
    ldmatrix_x4_trans(vb, v_base + tile_offset<D, kHalves>(v_row, dp * 2 + v_chunk_hi));
    mma_bf16_16816(st.o[2 * dp], pa, vb[0], vb[1]);
    mma_bf16_16816(st.o[2 * dp + 1], pa, vb[2], vb[3]);
  }
}

/// Copies q rows row_of(0 .. n_rows - 1) (row = token * Hq + head) into q_smem ([16][D],
/// swizzle<D>; rows past n_rows are zeros). Plain loads: q is the previous kernel's output.
template <int D, typename RowOf>
__device__ __forceinline__ void load_q_rows(const PagedAttentionParams& p, int n_rows,
                                            RowOf&& row_of, __nv_bfloat16* q_smem) {
  using S = DecodeShape<D>;
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
  for (int c = 0; c < kHeadsPerCta * S::kChunks / kDecodeThreads; ++c) {
    const int idx = threadIdx.x + c * kDecodeThreads;
    const int r = idx / S::kChunks;
    const int ch = idx % S::kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < n_rows) v = *reinterpret_cast<const uint4*>(qp + row_of(r) * D + ch * 8);
    *reinterpret_cast<uint4*>(q_smem + swizzle<D>(r, ch)) = v;
  }
}

/// The CTA's query heads head0 .. + n_heads of `token` (load_q_rows).
template <int D>
__device__ __forceinline__ void load_q_tile(const PagedAttentionParams& p, int token, int head0,
                                            int n_heads, __nv_bfloat16* q_smem) {
  load_q_rows<D>(p, n_heads, [&](int r) {
    return static_cast<int64_t>(token) * p.num_q_heads + head0 + r;
  }, q_smem);
}

/// The Q fragments of the warp's mma tiles, from q_smem (after the barrier that published it).
template <int D>
__device__ __forceinline__ void load_q_fragments(const __nv_bfloat16* q_smem,
                                                 uint32_t (&qa)[D / 16][4]) {
  const int lane = threadIdx.x % 32;
  const uint32_t q_addr = smem_addr(q_smem) + (lane & 15) * D * 2;
  const int q_chunk_hi = lane >> 4;
  const int r7 = lane & 7;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    ldmatrix_x4(qa[kk], q_addr + (((kk * 2 + q_chunk_hi) ^ r7) << 4));
  }
}

/// Folds a partial softmax state (its max m_p and sum l_p in the log2 domain at pml[row], its
/// unnormalised output at po[row * D + d ..], written by another CTA) into (mx, sum, acc),
/// whose sum and acc are relative to 2^mx (or to 1 when mx is -inf, and then zero).
template <int D>
__device__ __forceinline__ void fold_partial(const float* po, const float2* pml, int64_t row,
                                             int d, float& mx, float& sum, float4& acc) {
  const float2 ml = __ldcg(&pml[row]);
  const float m = fmaxf(mx, ml.x);
  if (m == -INFINITY) return;  // neither side saw a key
  const float wa = mx == -INFINITY ? 0.0f : fast_exp2(mx - m);
  const float wp = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - m);
  const float4 v = __ldcg(reinterpret_cast<const float4*>(po + row * D + d));
  acc.x = wa * acc.x + wp * v.x;
  acc.y = wa * acc.y + wp * v.y;
  acc.z = wa * acc.z + wp * v.z;
  acc.w = wa * acc.w + wp * v.w;
  sum = wa * sum + wp * ml.y;
  mx = m;
}

/// Output dims d .. d + 3 of `row`: acc / sum in bf16 (zeros when the row saw no key).
template <int D>
__device__ __forceinline__ void store_normalised(__nv_bfloat16* out, int64_t row, int d,
                                                 float sum, float4 acc) {
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(out + row * D + d) = packed;
}

/// The four warps' states of one CTA merged through shared memory at `smem` (kReduceBytes,
/// free to overwrite: every warp is done with its ring): for each of the first n_rows rows
/// and each 4 dims d, emit(r, d, mx, sum, acc) with acc and sum relative to 2^mx (to 1 when
/// mx is -inf). Call with all threads; returns after the CTA's last read of `smem`.
template <int D, typename Emit>
__device__ __forceinline__ void merge_warps(unsigned char* smem, const WarpState<D>& st,
                                            int n_rows, Emit&& emit) {
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  // red_o [warps][16][D], red_ml [warps][16]; rows past n_rows are padding, never read.
  float* red_o = reinterpret_cast<float*>(smem);
  float2* red_ml = reinterpret_cast<float2*>(red_o + kDecodeWarps * kHeadsPerCta * D);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    float sum = st.row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (r >= n_rows) continue;
    float* dst = red_o + (warp * kHeadsPerCta + r) * D + t4 * 2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(st.o[dt][2 * h], st.o[dt][2 * h + 1]);
    }
    if (t4 == 0) red_ml[warp * kHeadsPerCta + r] = make_float2(st.row_max[h], sum);
  }
  __syncthreads();
  for (int item = tid; item < n_rows * (D / 4); item += kDecodeThreads) {
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
    emit(r, d, mx, sum, acc);
  }
  __syncthreads();
}

/// End of one query token: merges the four warps' states (merge_warps) and writes the
/// token's output rows, normalised (one split; with the prefix pass's partial folded in
/// when `fold_prefix`) or as an f32 partial with its (max, sum).
template <int D>
__device__ __forceinline__ void merge_warps_and_store(const DecodeArgs& a, unsigned char* smem,
                                                      const WarpState<D>& st, int token,
                                                      int head0, int n_heads, int split,
                                                      bool direct, bool fold_prefix) {
  const PagedAttentionParams& p = a.p;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  merge_warps<D>(smem, st, n_heads, [&](int r, int d, float mx, float sum, float4 acc) {
    const int64_t row = static_cast<int64_t>(token) * p.num_q_heads + head0 + r;
    if (direct) {
      if (fold_prefix) fold_partial<D>(a.prefix_o, a.prefix_ml, row, d, mx, sum, acc);
      store_normalised<D>(out, row, d, sum, acc);
    } else {
      const int64_t prow = static_cast<int64_t>(split) * p.num_tokens * p.num_q_heads + row;
      *reinterpret_cast<float4*>(a.partial_o + prow * D + d) = acc;
      if (d == 0) a.partial_ml[prow] = make_float2(mx, sum);
    }
  });
}

/// A sequence with no keys at all: its rows get zeros, written once by split 0.
template <int D>
__device__ __forceinline__ void write_zero_rows(const PagedAttentionParams& p, const SeqInfo& seq,
                                                int head0, int n_heads) {
  using S = DecodeShape<D>;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int per_token = n_heads * S::kChunks;
  for (int item = threadIdx.x; item < seq.q_len * per_token; item += kDecodeThreads) {
    const int i = item / per_token;
    const int h = (item % per_token) / S::kChunks;
    const int c = item % S::kChunks;
    const int64_t row = static_cast<int64_t>(seq.q_begin + i) * p.num_q_heads + head0 + h;
    *reinterpret_cast<uint4*>(out + row * D + c * 8) = make_uint4(0, 0, 0, 0);
  }
}

/// Whether a member of a prefix item, `own` > 0 keys of whose history the prefix pass
/// reads, has its keys after the prefix attended by the pass too (folded): one query
/// token, a prefix of whole tiles and at most a.fold_keys keys after it. The pass then
/// writes the member's rows, and its split CTAs exit at once: at the start of a GRPO round
/// the samples' own keys are a few tiles each, and a split CTA per (sample, KV head) would
/// cost more in its fixed work than in its bytes. The pass and the split CTAs decide it
/// from the same values.
__device__ __forceinline__ bool folds_suffix(const DecodeArgs& a, int own, const SeqInfo& seq) {
  return own > 0 && (own & 15) == 0 && seq.q_len == 1 && seq.kv_len - own <= a.fold_keys;
}

/// A decode CTA's place in the grid and its share of the sequence's keys (both kernels).
/// Every tile is 16 keys; warp w owns tiles w, w + 4, w + 8, ... of [key_begin, key_end).
/// With a shared-prefix pass the splits cut only the keys after the prefix: [prefix, kv).
struct DecodeCta {
  int b, kv_head, split, head0, n_heads, warp, lane;
  SeqInfo seq;
  SplitPlan sp;
  int prefix;  // keys [0, prefix) are the prefix pass's (0: none)
  bool folded;  // the prefix pass attends all of the sequence's keys (folds_suffix)
  int key_begin, key_end;
  const int32_t* page_row;

  __device__ __forceinline__ DecodeCta(const DecodeArgs& a, int cta_keys) {
    const PagedAttentionParams& p = a.p;
    b = blockIdx.x;
    kv_head = blockIdx.y / a.subgroups;
    const int sub = blockIdx.y - kv_head * a.subgroups;
    split = blockIdx.z - a.split_base;
    const int group = p.num_q_heads / p.num_kv_heads;
    head0 = kv_head * group + sub * kHeadsPerCta;
    n_heads = min(kHeadsPerCta, group - sub * kHeadsPerCta);
    warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    seq = load_seq_info(p, b);
    // Uploaded by the host (not written by the step's kernels): read before the PDL wait.
    // Clamped to the history, so that a wrong value costs accuracy, never a bad read.
    prefix = a.prefix_ml != nullptr ? min(max(a.p.prefix_tokens[b], 0),
                                          max(seq.kv_len - seq.q_len, 0))
                                    : 0;
    folded = prefix > 0 && folds_suffix(a, prefix, seq);
    sp = plan_split(seq.kv_len - prefix, a.num_splits, cta_keys, kMinKeysPerSplit);
    key_begin = prefix + split * sp.chunk;
    key_end = min(seq.kv_len, key_begin + sp.chunk);
    page_row = p.page_table + static_cast<int64_t>(b) * p.max_pages_per_seq;
  }
  /// Whether this CTA writes its rows normalised: the sequence's only split, no prefix.
  __device__ __forceinline__ bool direct() const { return sp.n_active == 1 && prefix == 0; }
  /// Keys query token i of the sequence may see inside this split: [key_begin, end).
  __device__ __forceinline__ int end_for(int i) const {
    return min(key_end, seq.kv_len - seq.q_len + i + 1);
  }
  /// Tiles this warp owns below `end`.
  __device__ __forceinline__ int my_tiles(int end) const {
    const int n_tiles = end > key_begin ? (end - key_begin + 15) / 16 : 0;
    return n_tiles > warp ? (n_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  }
  /// How many of this warp's first `most` tiles of query token 0 hold only history
  /// (positions before the batch's query tokens, written by earlier steps), which may be
  /// loaded before the PDL wait; 0 for a CTA with nothing to do.
  __device__ __forceinline__ int history_tiles(int most) const {
    if (folded || !(seq.q_len > 0 && sp.n_active > 0 && split < sp.n_active)) return 0;
    const int n = min(most, my_tiles(end_for(0)));
    const int old_end = seq.kv_len - seq.q_len;
    int k = 0;
    while (k < n && key_begin + (warp + k * kDecodeWarps + 1) * 16 <= old_end) ++k;
    return k;
  }
  /// After the PDL wait: whether this CTA has keys to attend. A sequence with no query
  /// token has nothing to write; one with no keys gets zero rows, written here by split 0.
  template <int D>
  __device__ __forceinline__ bool after_wait(const PagedAttentionParams& p) const {
    if (seq.q_len == 0 || folded) return false;
    if (sp.n_active == 0) {
      if (split == 0) write_zero_rows<D>(p, seq, head0, n_heads);
      return false;
    }
    return split < sp.n_active;
  }
};

/// Merges the splits of one output row (query token, head): out = Σ w_s o_s / Σ w_s l_s
/// with w_s = 2^(m_s - max m). One warp: lane s holds the (max, sum) of splits s and s + 32,
/// and each lane owns 4 dims of the output. Reads the partials through L2 (__ldcg): other
/// CTAs wrote them.
template <int D>
__device__ __forceinline__ void merge_split_row(const DecodeArgs& a, int n_active, int64_t row,
                                                bool fold_prefix) {
  static_assert(kMaxDecodeSplits <= 64, "two splits per lane");
  const PagedAttentionParams& p = a.p;
  const int lane = threadIdx.x % 32;
  const int d = lane * 4;
  const bool owns_dims = d < D;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int64_t split_stride = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  const float2 ml0 = lane < n_active ? __ldcg(&a.partial_ml[lane * split_stride + row])
                                     : make_float2(-INFINITY, 0.0f);
  const float2 ml1 = lane + 32 < n_active ? __ldcg(&a.partial_ml[(lane + 32) * split_stride + row])
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
  for (int s = 0; s < n_active; ++s) {
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
    if (fold_prefix) fold_partial<D>(a.prefix_o, a.prefix_ml, row, d, mx, sum, acc);
    store_normalised<D>(out, row, d, sum, acc);
  }
}

/// Counts one more partial of (sequence b, CTA row y) done and returns, to every thread,
/// whether it was the last of `parts` (then resets the counter for the next call). Call with
/// all threads after the CTA's partials are stored.
__device__ __forceinline__ bool arrive_last(const DecodeArgs& a, int b, int y, int parts) {
  __shared__ int last;
  __threadfence();  // this CTA's partials are visible to the CTA that will merge them
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = a.counters + static_cast<int64_t>(b) * gridDim.y + y;
    last = atomicAdd(counter, 1) == parts - 1;
    if (last) atomicExch(counter, 0);  // every part has arrived: ready for the next call
  }
  __syncthreads();
  const bool is_last = last;
  __syncthreads();  // `last` may be reused by the next call
  if (is_last) __threadfence();  // the others' partials, published before their counts
  return is_last;
}

/// Merges the rows of (sequence c, heads head0 .. + n_heads) from its splits' partials and,
/// when it has one, the prefix pass's (all threads; a warp per row).
template <int D>
__device__ __forceinline__ void merge_rows(const DecodeArgs& a, const SeqInfo& seq, int n_active,
                                           int head0, int n_heads, bool fold_prefix) {
  const int rows = seq.q_len * n_heads;
  for (int item = threadIdx.x / 32; item < rows; item += kDecodeWarps) {
    const int i = item / n_heads, h = item % n_heads;
    merge_split_row<D>(a, n_active,
                       static_cast<int64_t>(seq.q_begin + i) * a.p.num_q_heads + head0 + h,
                       fold_prefix);
  }
}

/// End of a split CTA whose rows are not written directly (several active splits, or a
/// prefix pass): the CTA counts itself done on its sequence's counter, and the last part to
/// arrive (a split, or the prefix pass) merges every part into the output for the CTA's
/// heads and tokens. So no merge kernel (and no second grid boundary) is needed; the order
/// of the sum does not depend on which CTA merges.
template <int D>
__device__ __forceinline__ void merge_if_last_split(const DecodeArgs& a, const DecodeCta& c) {
  const bool fold = c.prefix > 0;
  if (!arrive_last(a, c.b, blockIdx.y, c.sp.n_active + (fold ? 1 : 0))) return;
  merge_rows<D>(a, c.seq, c.sp.n_active, c.head0, c.n_heads, fold);
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
  const DecodeCta c(a, S::kCtaKeys);
  const SeqInfo& seq = c.seq;
  const int key_begin = c.key_begin;
  const int warp = c.warp, lane = c.lane;
  const auto* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const auto* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  __nv_bfloat16* warp_smem = q_smem + S::kQElems + warp * S::kWarpElems;
  // cp.async: lane l copies chunks (l / 16) + 2c of row l % 16 (two lanes = one sector).
  const int copy_row = lane & 15;
  const int copy_chunk0 = lane >> 4;

  // Copies this warp's j-th tile (keys key_begin + (warp + 4 j) * 16 ..) into `stage`;
  // keys >= end are zero-filled, so P V never sees garbage.
  auto issue = [&](int j, int stage, int end) {
    const int pos = key_begin + (warp + j * kDecodeWarps) * S::kWarpKeys + copy_row;
    const bool valid = pos < end;
    const int64_t off = valid ? kv_row_offset(c.page_row, pos, p.page_size, a.page_shift,
                                              p.num_kv_heads, c.kv_head, D)
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
  // Prologue tiles of token 0 made only of history go out before the wait, one cp.async
  // group each (the same groups the loop below would have committed).
  const int early = c.history_tiles(S::kStages - 1);
  for (int j = 0; j < early; ++j) {
    issue(j, j, c.end_for(0));
    cp_async_commit();
  }

  // q and the newest K/V rows come from the kernel before; out and the partials may still
  // be read by the kernels before that.
  pdl_wait();
  if (a.release_early) pdl_launch_dependents();
  if (!c.after_wait<D>(p)) return;
  const bool direct = c.direct();

  for (int i = 0; i < seq.q_len; ++i) {
    const int token = seq.q_begin + i;
    const int end = c.end_for(i);
    const int n_mine = c.my_tiles(end);

    // q must not join the K/V cp.async groups, hence plain loads.
    load_q_tile<D>(p, token, c.head0, c.n_heads, q_smem);

    // The prologue: tiles 0 .. kStages - 2, one group each (empty groups keep the wait
    // count uniform); token 0's history tiles went out before the wait.
    for (int s = i == 0 ? early : 0; s < S::kStages - 1; ++s) {
      if (s < n_mine) issue(s, s, end);
      cp_async_commit();
    }
    __syncthreads();  // q is in shared memory

    uint32_t qa[D / 16][4];
    load_q_fragments<D>(q_smem, qa);
    WarpState<D> st;
    st.reset();

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
      attend_tile<D, false>(qa, k_base, v_base, n0, end, a.scale_log2, st);
      __syncwarp();  // every lane is done with this stage before it is refilled
    }
    cp_async_wait<0>();
    // The key loop, this CTA's main work, is done: the next kernel may launch (it waits for
    // this grid to finish before reading the output).
    if (i == seq.q_len - 1 && !a.release_early) pdl_launch_dependents();
    __syncthreads();  // every warp is done with q and its ring: reuse them below
    merge_warps_and_store<D>(a, smem, st, token, c.head0, c.n_heads, c.split, direct,
                             c.prefix > 0);
  }
  if (!direct) merge_if_last_split<D>(a, c);
}

// ---- the TMA variant (D = 128, page_size a multiple of 16, sm_90) -------------------------
//
// The same CTA and warp layout, state and merge as decode_split_kernel; only the way K/V
// tiles reach shared memory differs. A 16-key tile of one KV head is 16 consecutive rows
// of its page ([num_pages, Hkv, page_size, 128] pools), i.e. 4 KB of contiguous K and 4 KB
// of V, so lane 0 of the warp arms the stage's mbarrier with 8 KB and issues four TMA boxes
// (64 columns x 16 rows each, 128-byte swizzle) from tensor maps of the pools seen as
// [num_pages * Hkv * page_size, 128] matrices. The other 31 lanes issue nothing: the
// cp.async kernel spends 16 copy instructions per lane and a page-table read per row on
// each tile. Each lane keeps the pool row of one of the warp's next 32 tiles in a register
// (read before the PDL wait where the tile is history), and lane 0 takes it with a shuffle.
// Keys past the end of the last tile come in as whatever the page holds (the pool is not
// zero-filled there); the warp zeroes those V rows before P V.
struct DecodeTmaArgs {
  CUtensorMap k_map;  // bf16 [num_pages * Hkv * page_size, 128], box 64 x 16
  CUtensorMap v_map;
  DecodeArgs a;
};

struct DecodeTmaShape {
  static constexpr int D = 128;
  // Per-warp ring of 3 stages: 2 tiles in flight, 101 KB of shared memory per CTA. A
  // 2-stage ring (69 KB, so that a product's CTA fits beside two of these) measured 9 %
  // slower on W1 (H200, 2026-11-29).
  static constexpr int kStages = 3;
  static constexpr int kTileBytes = 16 * D * 2;   // one K (or V) tile: 4 KB
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kRingBytes = kDecodeWarps * kStages * kStageBytes;
  static constexpr int kQBytes = kPassRows * D * 2;  // a split CTA uses the first half
  static constexpr int kBarBytes = kDecodeWarps * kStages * 8;
  static constexpr int kAlign = 1024;  // 128-byte swizzle atoms
  static constexpr int kSmemBytes = kRingBytes + kQBytes + kBarBytes + kAlign;
  static_assert(DecodeShape<D>::kReduceBytes <= kRingBytes, "the merge reuses the ring");
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// The prefix pass's tiles, as segments of one list in which warp w takes tiles w, w + 4,
/// w + 8, ...: segment 0 is the item's prefix [0, prefix) for every row, read through the
/// first member's page table row; then one segment per folded member (folds_suffix), its
/// own keys [prefix, kv) for its rows only, through its own row. Built by warp 0 of the
/// pass CTA (plan_pass), read by all its warps.
struct PassSegments {
  static constexpr int kMax = 1 + kPrefixItemMaxMembers;
  int32_t count;             // segments: 1 + folded members
  uint32_t folded;           // bit m: member m is folded
  int32_t start[kMax + 1];   // segment s holds tiles [start[s], start[s + 1])
  int32_t key0[kMax];        // the key of its first tile (a multiple of 16)
  int32_t end[kMax];         // keys >= end are not its
  int32_t seq[kMax];         // the sequence whose page table row it reads
  int32_t row_lo[kMax], row_hi[kMax];  // the CTA's rows (0 .. kPassRows) that attend it
  // Per member m (lane m of plan_pass): its sequence index, its batch row and its keys
  // before its own (the item's prefix, clamped to its history), read again by the pass's
  // q loads and arrivals.
  int32_t member_b[kPrefixItemMaxMembers];
  SeqInfo member_seq[kPrefixItemMaxMembers];
  int32_t member_prefix[kPrefixItemMaxMembers];

  __device__ __forceinline__ int tiles() const { return start[count]; }
  /// The segment of tile g, searching up from segment s (g never below start[s]).
  __device__ __forceinline__ int find(int g, int s = 0) const {
    while (s + 1 < count && g >= start[s + 1]) ++s;
    return s;
  }
  __device__ __forceinline__ int first_key(int g, int s) const {
    return key0[s] + (g - start[s]) * 16;
  }
};

/// One warp's stream of 16-key K/V tiles through its TMA ring (both TMA kernels): tile j
/// of the warp is tile g = warp + 4 j of the CTA's list; without segments it covers keys
/// key_begin + 16 g .. + 15 of the page table row `page_row`, rows of positions >=
/// key_limit not looked up; with them (kSegmented, the prefix pass), what `segs` says.
template <bool kSegmented>
struct TmaTileStreamT {
  const DecodeTmaArgs& t;
  const int32_t* page_row;
  int kv_head, key_begin, key_limit, warp, lane;
  uint32_t ring;  // the warp's ring (kStages stages of K then V)
  uint32_t bars;  // its kStages mbarriers
  uint64_t policy;
  int row_batch = -1;
  int32_t my_row = 0;
  uint32_t phases = 0;  // bit s: the parity the next wait on stage s waits for
  const PassSegments* segs = nullptr;

  /// Pool row of the first key of the warp's tile j; lane l holds tile 32 * batch + l's
  /// (warp-collective).
  __device__ __forceinline__ int tile_row(int j) {
    if ((j >> 5) != row_batch) {
      row_batch = j >> 5;
      const int g = warp + ((row_batch << 5) + lane) * kDecodeWarps;
      const DecodeArgs& a = t.a;
      const int32_t* row = page_row;
      int pos = 0;
      bool valid;
      if constexpr (kSegmented) {
        valid = g < segs->tiles();
        if (valid) {
          const int s = segs->find(g);
          pos = segs->first_key(g, s);
          row = a.p.page_table + static_cast<int64_t>(segs->seq[s]) * a.p.max_pages_per_seq;
        }
      } else {
        pos = key_begin + g * 16;
        valid = pos < key_limit;
      }
      // Rows fit int32: decode_tma_supported checks the pool has fewer than 2^31.
      my_row = valid ? static_cast<int32_t>(kv_row(row, pos, a.p.page_size, a.page_shift,
                                                   a.p.num_kv_heads, kv_head))
                     : 0;
    }
    return __shfl_sync(0xffffffffu, my_row, j & 31);
  }
  /// Loads the warp's tile j into `stage` (warp-collective; lane 0 issues).
  __device__ __forceinline__ void issue(int j, int stage) {
    using T = DecodeTmaShape;
    const int row = tile_row(j);
    if (lane == 0) {
      const uint32_t bar = bars + stage * 8;
      const uint32_t dst = ring + stage * T::kStageBytes;
      mbar_arrive_expect_tx(bar, T::kStageBytes);
      tma_load_hint(dst, &t.k_map, 0, row, bar, policy);
      tma_load_hint(dst + T::kTileBytes / 2, &t.k_map, 64, row, bar, policy);
      tma_load_hint(dst + T::kTileBytes, &t.v_map, 0, row, bar, policy);
      tma_load_hint(dst + T::kTileBytes * 3 / 2, &t.v_map, 64, row, bar, policy);
    }
  }
  /// Runs the warp's n_mine tiles through its ring, tiles 0 .. kStages - 2 already issued:
  /// for each, once it has landed, fn(k_base, v_base, n0, tile_end, seg) with the shared
  /// addresses of its K and V, its first key, the end of its keys (keys below `end` count;
  /// with segments, each segment's end) and its segment (0 without). V rows of keys >=
  /// tile_end are zeroed first. `smem` is the generic address of the CTA's aligned ring base
  /// `ring0`.
  template <typename TileFn>
  __device__ __forceinline__ void for_each_tile(int n_mine, int end, unsigned char* smem,
                                                uint32_t ring0, TileFn&& fn) {
    using T = DecodeTmaShape;
    constexpr int D = T::D;
    constexpr int kStages = T::kStages;
    int seg = 0;
    for (int j = 0; j < n_mine; ++j) {
      if (j + kStages - 1 < n_mine) issue(j + kStages - 1, (j + kStages - 1) % kStages);
      const int stage = j % kStages;
      mbar_wait(bars + stage * 8, (phases >> stage) & 1u);
      phases ^= 1u << stage;
      const uint32_t k_base = ring + stage * T::kStageBytes;
      const uint32_t v_base = k_base + T::kTileBytes;
      const int g = warp + j * kDecodeWarps;
      int n0, tile_end;
      if constexpr (kSegmented) {
        seg = segs->find(g, seg);
        n0 = segs->first_key(g, seg);
        tile_end = segs->end[seg];
      } else {
        n0 = key_begin + g * 16;
        tile_end = end;
      }
      if (n0 + 16 > tile_end) {
        // Rows of keys >= end hold whatever the page holds: zero their V (P is 0 there).
        unsigned char* v_tile = smem + (v_base - ring0);
        for (int idx = lane; idx < 16 * 16; idx += 32) {
          const int r = idx / 16, ch = idx % 16;
          if (n0 + r >= tile_end) {
            *reinterpret_cast<uint4*>(v_tile + tile_offset<D, true>(r, ch)) =
                make_uint4(0, 0, 0, 0);
          }
        }
        // Order these generic writes before the TMA that refills the stage next token.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
      }
      fn(k_base, v_base, n0, tile_end, seg);
      __syncwarp();  // every lane is done with this stage before it is refilled
    }
  }
  /// A split CTA's tiles (no segments) folded into st.
  __device__ __forceinline__ void attend(const uint32_t (&qa)[8][4], int n_mine, int end,
                                         unsigned char* smem, uint32_t ring0, WarpState<128>& st) {
    const float scale_log2 = t.a.scale_log2;
    for_each_tile(n_mine, end, smem, ring0,
                  [&](uint32_t k_base, uint32_t v_base, int n0, int tile_end, int) {
                    attend_tile<128, true>(qa, k_base, v_base, n0, tile_end, scale_log2, st);
                  });
  }
  /// The prefix pass's tiles (segments) folded into the states of its two m16 row tiles
  /// (rows 0-15 and 16-31), each for the rows of the tile's segment only; the second
  /// tile only when the CTA has more than 16 rows. The q fragments are read from q_smem
  /// ([kPassRows][D]) for each tile: two tiles' in registers beside two states would take
  /// the whole kernel's (the split CTAs' too) to 255.
  __device__ __forceinline__ void attend_pass(const __nv_bfloat16* q_smem, int n_rows,
                                              int n_mine, unsigned char* smem, uint32_t ring0,
                                              WarpState<128> (&st)[kPassRowTiles]) {
    static_assert(kSegmented, "the pass's tile list");
    const float scale_log2 = t.a.scale_log2;
    for_each_tile(n_mine, 0, smem, ring0,
                  [&](uint32_t k_base, uint32_t v_base, int n0, int tile_end, int seg) {
#pragma unroll
                    for (int rt = 0; rt < kPassRowTiles; ++rt) {
                      const int lo = max(segs->row_lo[seg] - rt * kHeadsPerCta, 0);
                      const int hi = min(segs->row_hi[seg], n_rows) - rt * kHeadsPerCta;
                      if (lo >= min(hi, kHeadsPerCta)) continue;  // none of its rows
                      uint32_t qa[8][4];
                      load_q_fragments<128>(q_smem + rt * kHeadsPerCta * 128, qa);
                      attend_tile<128, true, true>(qa, k_base, v_base, n0, tile_end,
                                                   scale_log2, st[rt], lo, hi);
                    }
                  });
  }
};
using TmaTileStream = TmaTileStreamT<false>;

/// The TMA kernels' shared memory: the 1024-byte aligned ring, then q, then the mbarriers
/// (initialised here, with the barrier that publishes them).
struct TmaSmem {
  unsigned char* smem;  // generic address of the ring
  uint32_t ring;        // its shared address
  __nv_bfloat16* q;
  uint32_t bars;
  __device__ __forceinline__ explicit TmaSmem(unsigned char* raw_ptr) {
    using T = DecodeTmaShape;
    const uint32_t raw = smem_addr(raw_ptr);
    ring = (raw + T::kAlign - 1) & ~uint32_t(T::kAlign - 1);
    smem = raw_ptr + (ring - raw);
    q = reinterpret_cast<__nv_bfloat16*>(smem + T::kRingBytes);
    bars = ring + T::kRingBytes + T::kQBytes;
    if (threadIdx.x < kDecodeWarps * T::kStages) {
      mbar_init(bars + threadIdx.x * 8, 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  template <bool kSegmented = false>
  __device__ __forceinline__ TmaTileStreamT<kSegmented> stream(const DecodeTmaArgs& t,
                                                               const int32_t* page_row,
                                                               int kv_head, int key_begin,
                                                               int key_limit) const {
    using T = DecodeTmaShape;
    const int warp = threadIdx.x / 32;
    return TmaTileStreamT<kSegmented>{t,
                         page_row,
                         kv_head,
                         key_begin,
                         key_limit,
                         warp,
                         static_cast<int>(threadIdx.x % 32),
                         ring + warp * T::kStages * T::kStageBytes,
                         bars + warp * T::kStages * 8,
                         evict_first_policy()};
  }
};

// ---- the shared-prefix pass (D = 128, TMA) --------------------------------------------------
//
// The CTAs of grid z = 0 of decode_split_tma_kernel when the call has a prefix pass: CTA
// (item, KV head). An item's first prefix keys lie in the same pages for all its members,
// so the CTA reads them once, through the same per-warp TMA ring and tile math as a split
// CTA, for the query heads of all its members (up to 32 / group, group = Hq / Hkv): where
// a split CTA fills one m16 tile with one sequence's `group` heads (4 of 16 rows for
// Qwen3-4B), the pass fills two (rows 0-15 and 16-31; 8 sequences' heads for Qwen3-4B,
// all of a GRPO prompt's samples), and each warp runs every tile it streams through both.
// Items of 16 rows (one tile) are what the host packs while their CTAs fit one wave
// (PrefixItemSizes). A member with few keys after the prefix is
// folded (folds_suffix): the CTA also streams those keys, after the prefix in the same
// tile list, for that member's rows only, and writes its rows normalised. Every other
// member's merged, unnormalised result goes to the prefix partials, and the pass counts
// itself as one more part of its rows (arrive_last): whichever part of a row arrives last,
// a split of the member's own keys [prefix, kv) or this pass, merges them all. CTAs past
// the item count exit at once.

/// Fills `plan` for an item of n_members members (warp 0, all lanes): which members fold,
/// and the segments of the CTA's tile list (PassSegments).
template <typename Member>
__device__ __forceinline__ void plan_pass(const DecodeArgs& a, int prefix, int first,
                                          int n_members, int group, Member&& member,
                                          PassSegments& plan) {
  const PagedAttentionParams& p = a.p;
  const int lane = threadIdx.x % 32;
  bool fold = false;
  int own = 0, kv = 0, tiles = 0, b = 0;
  if (lane < n_members) {
    b = member(lane);
    const SeqInfo seq = load_seq_info(p, b);
    own = min(max(p.prefix_tokens[b], 0), max(seq.kv_len - seq.q_len, 0));
    fold = folds_suffix(a, own, seq);
    kv = seq.kv_len;
    tiles = fold ? (kv - own + 15) / 16 : 0;
    plan.member_b[lane] = b;
    plan.member_seq[lane] = seq;
    plan.member_prefix[lane] = own;
  }
  const uint32_t folded = __ballot_sync(0xffffffffu, fold);
  int upto = tiles;  // inclusive prefix sum of the folded members' tiles
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, upto, off);
    if (lane >= off) upto += v;
  }
  const int total = __shfl_sync(0xffffffffu, upto, 31);
  const int prefix_tiles = (prefix + 15) / 16;
  if (fold) {
    const int sg = 1 + __popc(folded & ((1u << lane) - 1u));
    plan.start[sg] = prefix_tiles + upto - tiles;
    plan.key0[sg] = own;
    plan.end[sg] = kv;
    plan.seq[sg] = b;
    plan.row_lo[sg] = lane * group;
    plan.row_hi[sg] = (lane + 1) * group;
  }
  if (lane == 0) {
    plan.count = 1 + __popc(folded);
    plan.folded = folded;
    plan.start[0] = 0;
    plan.key0[0] = 0;
    plan.end[0] = prefix;
    plan.seq[0] = first;
    plan.row_lo[0] = 0;
    plan.row_hi[0] = kPassRows;
    plan.start[plan.count] = prefix_tiles + total;
  }
}

__device__ __forceinline__ void prefix_pass(const DecodeTmaArgs& t, unsigned char* smem_raw) {
  using T = DecodeTmaShape;
  constexpr int D = T::D;
  constexpr int kStages = T::kStages;
  using S = DecodeShape<D>;
  const DecodeArgs& a = t.a;
  const PagedAttentionParams& p = a.p;
  // The items and the batch arrays are uploaded by the host, not written by the step's
  // kernels: read before the PDL wait.
  const int item = blockIdx.x;
  const int kv_head = blockIdx.y;  // one CTA row per KV head: group <= kHeadsPerCta
  const int group = p.num_q_heads / p.num_kv_heads;
  if (item >= min(p.prefix_items[0], p.max_prefix_items)) return;
  const int32_t* it = p.prefix_items + kPrefixItemsHeader + item * kPrefixItemInts;
  const int n_members = min(it[1], min(kPassRows / group, kPrefixItemMaxMembers));
  if (n_members <= 0) return;
  const int n_rows = n_members * group;
  const int first = it[2];
  if (first < 0 || first >= p.num_seqs) return;
  const SeqInfo lead = load_seq_info(p, first);
  // At most the first member's history (its new rows come from the kernel before).
  const int prefix = min(max(it[0], 0), max(lead.kv_len - lead.q_len, 0));
  auto member = [&](int m) { return min(max(it[2 + m], 0), p.num_seqs - 1); };
  __shared__ PassSegments plan;
  if (threadIdx.x < 32) plan_pass(a, prefix, first, n_members, group, member, plan);
  const TmaSmem sm(smem_raw);  // its barrier publishes the plan
  const int32_t* page_row = p.page_table + static_cast<int64_t>(first) * p.max_pages_per_seq;
  TmaTileStreamT<true> ts = sm.stream<true>(t, page_row, kv_head, 0, prefix);
  ts.segs = &plan;
  const int n_tiles = plan.tiles();
  const int n_mine =
      n_tiles > ts.warp ? (n_tiles - ts.warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  // The prefix is history; a folded member's keys end with its newest row, which the
  // kernel before writes: those tiles go out after the wait.
  const int prefix_tiles = plan.start[1];
  int early = 0;
  while (early < kStages - 1 && early < n_mine &&
         ts.warp + early * kDecodeWarps < prefix_tiles) {
    ts.issue(early, early);
    ++early;
  }

  pdl_wait();  // q and the newest K/V rows come from the kernel before
  if (a.release_early) pdl_launch_dependents();
  for (int j = early; j < kStages - 1 && j < n_mine; ++j) ts.issue(j, j);
  // Row r: member r / group, query head kv_head * group + r % group. Its q row (the
  // member's one query token) and its place in the partials.
  auto q_row = [&](int r) -> int64_t {
    const int token = min(plan.member_seq[r / group].q_begin, p.num_tokens - 1);
    return static_cast<int64_t>(token) * p.num_q_heads + kv_head * group + r % group;
  };
  // Rows 0-15 and 16-31 as two [16][D] q tiles (the second all zeros with <= 16 rows).
#pragma unroll
  for (int rt = 0; rt < kPassRowTiles; ++rt) {
    load_q_rows<D>(p, n_rows - rt * kHeadsPerCta,
                   [&](int r) { return q_row(r + rt * kHeadsPerCta); },
                   sm.q + rt * kHeadsPerCta * D);
  }
  __syncthreads();  // q is in shared memory
  WarpState<D> st[kPassRowTiles];
#pragma unroll
  for (int rt = 0; rt < kPassRowTiles; ++rt) st[rt].reset();
  ts.attend_pass(sm.q, n_rows, n_mine, sm.smem, sm.ring, st);
  if (!a.release_early) pdl_launch_dependents();
  __syncthreads();  // every warp is done with q and its ring: reuse them below
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const uint32_t folded = plan.folded;
#pragma unroll
  for (int rt = 0; rt < kPassRowTiles; ++rt) {
    if (rt * kHeadsPerCta >= n_rows) break;
    merge_warps<D>(sm.smem, st[rt], min(n_rows - rt * kHeadsPerCta, kHeadsPerCta),
                   [&](int tile_row, int d, float mx, float sum, float4 acc) {
                     const int r = tile_row + rt * kHeadsPerCta;
                     const int64_t row = q_row(r);
                     if ((folded >> (r / group)) & 1u) {  // every key of the row is in
                       store_normalised<D>(out, row, d, sum, acc);
                     } else {
                       *reinterpret_cast<float4*>(a.prefix_o + row * D + d) = acc;
                       if (d == 0) a.prefix_ml[row] = make_float2(mx, sum);
                     }
                   });
  }
  // The prefix is one more part of each other member's rows: the last part to arrive
  // merges. The split CTAs count this part exactly when the member's prefix_tokens
  // (clamped as here) is positive and it is not folded, so the pass arrives for those
  // members only.
  for (int m = 0; m < n_members; ++m) {
    if ((folded >> m) & 1u) continue;
    const int b = plan.member_b[m];
    const SeqInfo seq = plan.member_seq[m];
    const int own = plan.member_prefix[m];
    if (own <= 0 || seq.q_len <= 0) continue;
    const int n_active =
        plan_split(seq.kv_len - own, a.num_splits, S::kCtaKeys, kMinKeysPerSplit)
            .n_active;
    if (arrive_last(a, b, kv_head, n_active + 1)) {
      merge_rows<D>(a, seq, n_active, kv_head * group, group, true);
    }
  }
}

#endif  // __CUDA_ARCH__ >= 900

__global__ void __launch_bounds__(kDecodeThreads)
    decode_split_tma_kernel(const __grid_constant__ DecodeTmaArgs t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = DecodeTmaShape;
  constexpr int D = T::D;
  constexpr int kStages = T::kStages;
  using S = DecodeShape<D>;
  extern __shared__ unsigned char smem_raw[];
  if (t.a.split_base == 1 && blockIdx.z == 0) {
    prefix_pass(t, smem_raw);
    return;
  }
  const TmaSmem sm(smem_raw);

  const DecodeArgs& a = t.a;
  const PagedAttentionParams& p = a.p;
  const DecodeCta c(a, S::kCtaKeys);
  if (c.folded) return;  // the prefix pass attends all of this sequence's keys
  const SeqInfo& seq = c.seq;
  TmaTileStream ts = sm.stream(t, c.page_row, c.kv_head, c.key_begin, seq.kv_len);

  // Token 0's first tiles made only of history go out before the wait (as in the cp.async
  // kernel: they do not depend on the kernel before).
  const int early = c.history_tiles(kStages - 1);
  for (int j = 0; j < early; ++j) ts.issue(j, j);

  pdl_wait();
  if (a.release_early) pdl_launch_dependents();
  if (!c.after_wait<D>(p)) return;
  const bool direct = c.direct();

  for (int i = 0; i < seq.q_len; ++i) {
    const int token = seq.q_begin + i;
    const int end = c.end_for(i);
    const int n_mine = c.my_tiles(end);

    load_q_tile<D>(p, token, c.head0, c.n_heads, sm.q);
    for (int s = i == 0 ? early : 0; s < kStages - 1 && s < n_mine; ++s) ts.issue(s, s);
    __syncthreads();  // q is in shared memory

    uint32_t qa[D / 16][4];
    load_q_fragments<D>(sm.q, qa);
    WarpState<D> st;
    st.reset();
    ts.attend(qa, n_mine, end, sm.smem, sm.ring, st);
    if (i == seq.q_len - 1 && !a.release_early) pdl_launch_dependents();
    __syncthreads();  // every warp is done with q and its ring: reuse them below
    merge_warps_and_store<D>(a, sm.smem, st, token, c.head0, c.n_heads, c.split, direct,
                             c.prefix > 0);
    // The merge wrote the ring through the generic proxy; the next token's TMA refills it.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  }
  if (!direct) merge_if_last_split<D>(a, c);
#else
  __trap();  // launched only on sm_90 and newer (decode_tma_supported)
#endif
}

template <int D>
void launch_decode(const DecodeArgs& args, cudaStream_t stream) {
  using S = DecodeShape<D>;
  once_per_device(reinterpret_cast<const void*>(decode_split_kernel<D>), [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        decode_split_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  });
  const PagedAttentionParams& p = args.p;
  const dim3 grid(p.num_seqs, p.num_kv_heads * args.subgroups, args.num_splits);
  launch_kernel(decode_split_kernel<D>, grid, dim3(kDecodeThreads), S::kSmemBytes, stream, 1,
                args);
}

void launch_decode_tma(const DecodeArgs& args, cudaStream_t stream) {
  using T = DecodeTmaShape;
  once_per_device(reinterpret_cast<const void*>(decode_split_tma_kernel), [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        decode_split_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  });
  const PagedAttentionParams& p = args.p;
  const int64_t rows = static_cast<int64_t>(p.num_pages) * p.num_kv_heads * p.page_size;
  DecodeTmaArgs t;
  t.k_map = bf16_tensor_map(p.k_pool, rows, T::D, 64, 16, "paged_decode_attention");
  t.v_map = bf16_tensor_map(p.v_pool, rows, T::D, 64, 16, "paged_decode_attention");
  t.a = args;
  const dim3 grid(p.num_seqs, p.num_kv_heads * args.subgroups, args.num_splits + args.split_base);
  launch_kernel(decode_split_tma_kernel, grid, dim3(kDecodeThreads), T::kSmemBytes, stream, 1, t);
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
  return attn::kCounterBytes + attn::partial_o_bytes(max_tokens, num_q_heads, head_dim, max_splits) +
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
  int sms = 0;
  current_device_info(&sms);
  PAGELLM_CHECK(sms > 0) << "plan_decode_splits: no CUDA device is current";
  const int64_t slots = static_cast<int64_t>(attn::kTargetCtasPerSm) * sms;
  int64_t splits = slots / ctas;
  splits = std::min<int64_t>(
      splits, (std::max(p.max_kv_len, 1) + attn::kMinKeysPerSplit - 1) / attn::kMinKeysPerSplit);
  splits = std::clamp<int64_t>(splits, 1, kMaxDecodeSplits);
  // A shared-prefix pass keeps its partials in one more slot of the workspace.
  const int64_t extra = p.prefix_tokens != nullptr ? 1 : 0;
  while (splits > 1 &&
         (p.workspace == nullptr ||
          paged_attention_workspace_bytes(p.num_tokens, p.num_q_heads, p.head_dim,
                                          static_cast<int32_t>(splits + extra)) >
              p.workspace_bytes)) {
    --splits;
  }
  return static_cast<int32_t>(splits);
}

bool decode_tma_supported(const PagedAttentionParams& p) {
  const int64_t rows = static_cast<int64_t>(p.num_pages) * p.num_kv_heads * p.page_size;
  return p.head_dim == 128 && p.page_size % 16 == 0 && p.num_pages > 0 &&
         rows < (int64_t{1} << 31) && current_device_info(nullptr) >= 90;
}

int32_t decode_prefix_item_members(int32_t num_q_heads, int32_t num_kv_heads, int32_t rows) {
  static_assert(kDecodePassRows == attn::kPassRows, "the kernel's pass rows");
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return 0;
  const int32_t group = num_q_heads / num_kv_heads;
  rows = std::clamp(rows, 0, attn::kPassRows);
  return group <= attn::kHeadsPerCta ? std::min(rows / group, kPrefixItemMaxMembers) : 0;
}

int64_t decode_prefix_half_item_ctas() {
  int sms = 0;
  current_device_info(&sms);
  return static_cast<int64_t>(attn::kTargetCtasPerSm) * std::max(sms, 0);
}

bool decode_cascade_supported(const PagedAttentionParams& p) {
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  const int group = p.num_q_heads / p.num_kv_heads;
  return p.max_query_len == 1 && group <= attn::kHeadsPerCta && decode_tma_supported(p) &&
         p.workspace != nullptr &&
         paged_attention_workspace_bytes(p.num_tokens, p.num_q_heads, p.head_dim, 2) <=
             p.workspace_bytes;
}

bool native_attention_takes_decode(const PagedAttentionParams& p) {
  // max_query_len <= 0 is "unknown" (PagedAttentionParams): then only the token count says.
  return (p.max_query_len > 0 && p.max_query_len <= kDecodeRouteMaxQuery) ||
         p.num_tokens <= kDecodeRouteMaxTokens;
}

MixedDecodeRun find_mixed_decode_run(int32_t num_seqs, const int32_t* query_start,
                                     const int32_t* kv_lens) {
  MixedDecodeRun run;
  int32_t d = 0, max_kv = 0;
  while (d < num_seqs && query_start[d + 1] - query_start[d] == 1) {
    max_kv = std::max(max_kv, kv_lens[d]);
    ++d;
  }
  if (d < kMixedDecodeMinSeqs || d == num_seqs) return run;
  run.seqs = d;
  run.tokens = query_start[d] - query_start[0];
  run.max_kv_len = max_kv;
  return run;
}

NativeAttentionCalls plan_native_attention(const PagedAttentionParams& p,
                                           const MixedDecodeRun& run) {
  NativeAttentionCalls calls;
  if (native_attention_takes_decode(p)) {
    calls.run_decode = true;
    calls.decode = p;
    return calls;
  }
  calls.run_prefill = true;
  calls.prefill = p;
  if (run.seqs <= 0 || run.seqs >= p.num_seqs) return calls;
  const int32_t d = run.seqs;
  calls.run_decode = true;
  calls.decode = p;
  calls.decode.num_seqs = d;
  calls.decode.num_tokens = run.tokens;
  calls.decode.max_query_len = 1;
  calls.decode.max_kv_len = run.max_kv_len;
  calls.prefill.query_start = p.query_start + d;
  calls.prefill.kv_lens = p.kv_lens + d;
  calls.prefill.page_table = p.page_table + static_cast<int64_t>(d) * p.max_pages_per_seq;
  calls.prefill.num_seqs = p.num_seqs - d;
  // num_tokens stays: the prefill kernel bounds the rows it writes by it, as absolute
  // indices like query_start's (its grid gains at most a tile for the rows it skips).
  return calls;
}

void paged_decode_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  paged_decode_attention_with(p, CudaSettings::process().decode_kernel, stream);
}

void paged_decode_attention_with(const PagedAttentionParams& p, DecodeKernel kernel,
                                 cudaStream_t stream) {
  attn::validate_params(p, "paged_decode_attention");
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  const bool cascade = p.prefix_tokens != nullptr;
  if (cascade) {
    PAGELLM_CHECK(p.prefix_items != nullptr && p.max_prefix_items >= 0 &&
                  decode_cascade_supported(p))
        << "paged_decode_attention: a shared-prefix pass needs prefix_items, one query token "
           "per sequence, at most "
        << attn::kHeadsPerCta << " query heads per KV head (got " << p.num_q_heads << " / "
        << p.num_kv_heads << "), the TMA decode kernel's shape (head_dim 128, pages a multiple "
           "of 16, sm_90) and a workspace of two slots (decode_cascade_supported)";
  }
  const int32_t splits = p.num_splits > 0 ? p.num_splits : plan_decode_splits(p);
  attn::DecodeArgs args{};
  args.p = p;
  args.num_splits = splits;
  // The workspace's partial slots: one per split, and the prefix pass's after them.
  const int32_t slots = splits + (cascade ? 1 : 0);
  if (slots > 1) {
    const size_t need =
        paged_attention_workspace_bytes(p.num_tokens, p.num_q_heads, p.head_dim, slots);
    PAGELLM_CHECK(p.workspace != nullptr && p.workspace_bytes >= need)
        << "paged_decode_attention: " << splits << " splits over " << p.num_tokens
        << " tokens need a workspace of " << need << " bytes, got " << p.workspace_bytes
        << " (size it with paged_attention_workspace_bytes, or pass num_splits = 0)";
    PAGELLM_CHECK((reinterpret_cast<uintptr_t>(p.workspace) & 255u) == 0)
        << "paged_decode_attention: the workspace must be 256-byte aligned";
    char* ws = static_cast<char*>(p.workspace);
    args.counters = reinterpret_cast<int32_t*>(ws);
    args.partial_o = reinterpret_cast<float*>(ws + attn::kCounterBytes);
    args.partial_ml = reinterpret_cast<float2*>(
        ws + attn::kCounterBytes +
        attn::partial_o_bytes(p.num_tokens, p.num_q_heads, p.head_dim, slots));
    if (cascade) {
      const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
      args.prefix_o = args.partial_o + splits * rows * p.head_dim;
      args.prefix_ml = args.partial_ml + splits * rows;
    }
  }
  const int group = p.num_q_heads / p.num_kv_heads;
  args.subgroups = (group + attn::kHeadsPerCta - 1) / attn::kHeadsPerCta;
  PAGELLM_CHECK(splits <= 1 || static_cast<int64_t>(p.num_seqs) * p.num_kv_heads * args.subgroups <=
                                   attn::kSplitCounters)
      << "paged_decode_attention: " << splits << " splits over " << p.num_seqs << " sequences x "
      << p.num_kv_heads * args.subgroups << " CTA rows exceed the workspace's "
      << attn::kSplitCounters << " split counters (fewer sequences per call, or one split)";
  PAGELLM_CHECK(static_cast<int64_t>(p.num_kv_heads) * args.subgroups <= 65535)
      << "paged_decode_attention: num_kv_heads " << p.num_kv_heads << " is too large";
  args.page_shift = attn::page_shift_of(p.page_size);
  args.scale_log2 = p.scale * attn::kLog2e;
  int sms = 0;
  current_device_info(&sms);
  args.release_early = attn::releases_dependents_early(
      int64_t{p.num_seqs} * p.num_kv_heads * args.subgroups * splits, sms);
  if (cascade) {
    PAGELLM_CHECK(kernel == DecodeKernel::kTma && p.max_prefix_items <= p.num_seqs)
        << "paged_decode_attention: a shared-prefix pass runs in the TMA kernel, with at most "
           "num_seqs ("
        << p.num_seqs << ") items (got " << p.max_prefix_items << ")";
    args.split_base = 1;
    args.fold_keys = std::max(p.prefix_fold_keys, 0);
  }
  if (kernel == DecodeKernel::kTma && decode_tma_supported(p)) {
    attn::launch_decode_tma(args, stream);
  } else if (p.head_dim == 128) {
    attn::launch_decode<128>(args, stream);
  } else {
    attn::launch_decode<64>(args, stream);
  }
}

}  // namespace pagellm::cuda
