// Paged prefill attention: ragged batches of query tokens, causal, over a paged KV cache
// that may already hold a prefix of each sequence (chunked prefill, prefix caching).
//
// What: for each query token i of sequence b (position kv - q + i) and query head h,
// out = softmax(q · K[0..kv-q+i]ᵀ · scale) · V[0..kv-q+i], K/V read through the page table.
//
// Why this shape (FlashAttention-2 on mma.sync). Prefill is compute-bound (a 128-row query
// tile does 4 · 128 · D flops per key it loads: 512 FLOP per K/V byte at D = 128), so the
// design follows FA2:
//  - One CTA per (query tile of BM rows, query head); each warp owns 16 or 32 query rows
//    (one or two m16 tiles: two share every K/V fragment the warp loads, halving
//    shared-memory traffic per flop; one leaves room to keep Q's fragments in registers).
//  - S = Q Kᵀ and O += P V on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate);
//    P never leaves registers: the S accumulator fragment, rounded to bf16, is exactly the
//    A fragment of the P V product. Online softmax in f32, log2 domain (scale · log2 e
//    folded into one FMA), one ex2 per score.
//  - Q (BM x D) is loaded once into shared memory (and, with 16 rows per warp, from there
//    into registers for the whole KV loop); K and V tiles of BN keys are gathered row by
//    row through the page table with 16-byte cp.async into a ring of 2 or 3 stages, one or
//    two tiles ahead of the math, with one barrier per tile. Rows are XOR-swizzled in
//    16-byte chunks (chunk ^ (row % 8)) so that ldmatrix (K plain, V transposed) and the
//    cp.async stores are bank-conflict free.
//  - Causality: KV tiles entirely above the diagonal are never loaded; only tiles that
//    straddle it (or the end of the sequence) pay for masking.
//  - No host sync: the grid is an upper bound on the number of (query tile, head) pairs,
//    (ceil(T / BM) + num_seqs) x Hq, and each CTA finds its (sequence, tile) by a warp-wide
//    prefix sum over query_start. Surplus CTAs exit at once. Within a sequence the tiles
//    run last-first, so the heavy ones (near the end of the causal triangle) start early;
//    the head index is fastest, so that the first wave holds the heaviest tile
//    of every head (and CTAs of one GQA group, which read the same K/V, run together).
//  - When no row of a warp raised its running max, O is not rescaled (alpha would be 1).
//  - Programmatic dependent launch (pdl.cuh): a CTA waits (pdl_wait) before anything else,
//    since q and the new K/V rows come from the kernel just before, and lets the next
//    kernel launch only once its KV loop is done, as pdl.cuh asks of grids with more than
//    one wave (a prefill grid has many).
// Tiles: D = 128 and more than 64 query rows (the Qwen3 shape) use 128 x 64 tiles, 4 warps x
// 32 rows, a 2-stage ring and two CTAs per SM (FlashAttention-2's shape for D = 128; "v2").
// Queries of at most 64 rows use 64 x 64 tiles, 4 warps x 16 rows with Q in registers. Two
// other shapes were measured and removed (docs/PERFORMANCE.md, prefill): 128 x 32 tiles (v1,
// 208 TFLOP/s at 4k tokens on the H200 against v2's 295) and 8 warps x 16 rows with Q in
// registers and a 3-stage ring (v3, 215).
// Roofline: 4 · D · Σ(causal pairs) flops per query head at the mma.sync rate (about 2/3
// of the ~790 TFLOP/s the H200 reaches with wgmma). Shared-memory bandwidth (128 B/clk/SM,
// ~30 TB/s on the H200) is a second ceiling: per tile a warp reads its K and V fragments
// and, unless they live in registers, its Q fragments. At D = 128 that is 26 flops/byte
// (32 rows x 64 keys: 1 MFLOP per 40 KB; ~770 TFLOP/s); 16 rows per warp with Q in
// registers would be 16 (0.5 MFLOP per 32 KB; ~470). wgmma (operands straight from shared
// memory, no per-warp copies) is the way past both ceilings.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_common.cuh"
#include "pagellm/cuda/attention/attention_prefill_variants.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"

namespace pagellm::cuda {
namespace attn {
namespace {

/// Compile-time shape of the prefill kernel: head dim D, BM query rows x BN keys per tile,
/// kWarps warps (BM / kWarps rows each), a kStages-deep K/V ring, Q's fragments in
/// registers (kQInRegs) or re-read from shared memory every tile, and the CTAs per SM the
/// register allocation must allow (kMinBlocks, for __launch_bounds__).
template <int D_, int BM_, int BN_, int kWarps_, int kStages_, bool kQInRegs_, int kMinBlocks_>
struct PrefillShape {
  static constexpr int D = D_;
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = BM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kChunks = D / 8;              // 16-byte chunks per row
  static constexpr int kNTiles = BN / 8;             // n8 tiles of S per m16 tile
  static constexpr int kDTiles = D / 8;              // n8 tiles of O per m16 tile
  static constexpr int kKSteps = D / 16;             // k16 steps of Q Kᵀ
  static constexpr int kQElems = BM * D;
  static constexpr int kKVElems = BN * D;
  static constexpr int kSmemBytes = (kQElems + kStages * 2 * kKVElems) * 2;
  // K/V copies: warp w copies rows (w % kRowBlocks) * 16 + lane % 16, chunks
  // lane / 16 + 2 (w / kRowBlocks) + 2 kWarpsPerRowBlock c: one page-table read per thread
  // and tile, whole 32-byte sectors per load instruction, conflict-free swizzled stores.
  static constexpr int kRowBlocks = BN / 16;
  static constexpr int kWarpsPerRowBlock = kWarps / kRowBlocks;
  static constexpr int kKVChunksPerThread = kChunks / (2 * kWarpsPerRowBlock);
  static constexpr int kQChunksPerThread = BM * kChunks / kThreads;
  static_assert(kRowsPerWarp % 16 == 0, "a warp owns whole m16 tiles");
  static_assert(BN % 16 == 0 && D % 16 == 0, "mma k-steps are 16 wide");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  static_assert(kWarps % kRowBlocks == 0 && kChunks % (2 * kWarpsPerRowBlock) == 0,
                "even K/V copies");
  static_assert((BM * kChunks) % kThreads == 0, "even Q copies");
  static_assert(kStages == 2 || kStages == 3, "the ring is 2 or 3 tiles deep");
  static_assert(8 % (2 * kWarpsPerRowBlock) == 0, "copy steps keep the swizzle in 8 chunks");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM's shared memory");
};

struct PrefillArgs {
  PagedAttentionParams p;
  int32_t page_shift;  // log2(page_size) or -1
  float scale_log2;    // scale * log2(e)
};

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    prefill_kernel(const __grid_constant__ PrefillArgs a) {
  constexpr int D = S::D;
  constexpr int BM = S::BM;
  constexpr int BN = S::BN;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* q_smem = reinterpret_cast<__nv_bfloat16*>(smem);  // [BM][D], swizzled
  __nv_bfloat16* kv_smem = q_smem + S::kQElems;           // [stage][K|V][BN][D], swizzled

  // q and the newest K/V rows come from the kernels before (qk_norm_rope_store_kv); out may
  // still be read by them.
  pdl_wait();

  const PagedAttentionParams& p = a.p;
  PrefillTile tile;
  if (!locate_prefill_tile(p, BM, BN, tile)) return;
  const SeqInfo& seq = tile.seq;
  const int b = tile.b;
  const int kv_head = tile.kv_head;
  const int m0 = tile.m0;
  const int rows = tile.rows;
  const int shift = tile.shift;
  const int n_kv_tiles = tile.n_kv_tiles;
  const int64_t out_row0 = tile.out_row0;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  auto* out = static_cast<__nv_bfloat16*>(p.out);

  if (n_kv_tiles == 0) {  // no query row of this tile sees a key: zeros
    store_zero_rows<D>(out, out_row0, rows, p.num_q_heads, tid, S::kThreads);
    return;
  }

  // ---- async loads ------------------------------------------------------------------
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
  for (int c = 0; c < S::kQChunksPerThread; ++c) {
    const int idx = tid + c * S::kThreads;
    const int r = idx / S::kChunks;
    const int ch = idx % S::kChunks;
    const bool valid = r < rows;
    const __nv_bfloat16* src =
        valid ? qp + (out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * D + ch * 8 : qp;
    cp_async_16(smem_addr(q_smem + swizzle<D>(r, ch)), src, valid);
  }
  const int32_t* page_row = p.page_table + static_cast<int64_t>(b) * p.max_pages_per_seq;
  const auto* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const auto* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  // Gathers K/V tile `t` (keys t*BN ..) into `stage`; keys >= kv_len are zero-filled.
  auto issue_kv = [&](int t, int stage) {
    const int row = (warp % S::kRowBlocks) * 16 + (lane & 15);
    const int chunk0 = (lane >> 4) + 2 * (warp / S::kRowBlocks);
    const int pos = t * BN + row;
    const bool valid = pos < seq.kv_len;
    const int64_t off =
        valid ? kv_row_offset(page_row, pos, p.page_size, a.page_shift, p.num_kv_heads, kv_head, D)
              : 0;
    // off = 0 when invalid: the address stays inside the pool and is never read.
    const __nv_bfloat16* k_src = k_pool + off + chunk0 * 8;
    const __nv_bfloat16* v_src = v_pool + off + chunk0 * 8;
    const uint32_t ks = smem_addr(kv_smem + stage * 2 * S::kKVElems);
    const uint32_t vs = ks + S::kKVElems * 2;
#pragma unroll
    for (int c = 0; c < S::kKVChunksPerThread; ++c) {
      // Chunk chunk0 + step, step a compile-time multiple of 2 kWarpsPerRowBlock (> chunk0,
      // a divisor of 8): the swizzle XOR changes only its low three bits, chunk0 + step % 8.
      const int step = 2 * S::kWarpsPerRowBlock * c;
      const uint32_t dst =
          (row * D + (((chunk0 + (step & 7)) ^ (row & 7)) << 3) + ((step & ~7) << 3)) * 2;
      cp_async_16(ks + dst, k_src + step * 8, valid);
      cp_async_16(vs + dst, v_src + step * 8, valid);
    }
  };
  // Prologue: group 0 = Q and tile 0, then tiles 1 .. kStages - 2 (groups maybe empty).
#pragma unroll
  for (int t = 0; t < S::kStages - 1; ++t) {
    if (t < n_kv_tiles) issue_kv(t, t);
    cp_async_commit();
  }

  // ---- per-thread fragment coordinates -----------------------------------------------
  const int g = lane / 4;   // row within an m16 tile (and +8)
  const int t4 = lane % 4;  // column pair within an n8 tile
  const int r7 = lane & 7;  // row % 8 of every ldmatrix row this lane addresses
  // ldmatrix row addresses (bytes): Q rows warp*R + mt*16 + lane%16, K rows np*16 + lane%8
  // + (lane/16)*8, V rows kk*16 + lane%8 + ((lane/8)%2)*8; logical chunk 2c + hi of each,
  // with hi = lane/16 (Q, V) or (lane/8)%2 (K). The swizzle XOR only touches the low three
  // bits of a chunk, so chunk 2c + hi sits at ((2 (c % 4) + hi) ^ r7) * 16 + (c / 4) * 128
  // bytes: four per-lane offsets plus immediates. (Written as (2c + hi) ^ r7, the compiler
  // keeps one address register per c, which at BN = 64 pushes the kernel into spills.)
  uint32_t q_addr[4], k_off[4], v_off[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    q_addr[c] = smem_addr(q_smem) + (warp * S::kRowsPerWarp + (lane & 15)) * D * 2 +
                (((2 * c + (lane >> 4)) ^ r7) << 4);
    k_off[c] = ((lane & 7) + ((lane >> 4) << 3)) * D * 2 +
               (((2 * c + ((lane >> 3) & 1)) ^ r7) << 4);
    v_off[c] = ((lane & 7) + (((lane >> 3) & 1) << 3)) * D * 2 +
               (((2 * c + (lane >> 4)) ^ r7) << 4);
  }

  // Q's A fragments for the whole KV loop (only when kQInRegs; otherwise re-read per tile).
  uint32_t q_frag[S::kQInRegs ? S::kKSteps : 1][S::kMTiles][4];
  if constexpr (S::kQInRegs) {
    cp_async_wait<S::kStages - 2>();  // group 0 (Q) has landed (this thread's part)
    __syncthreads();                  // ... every thread's part
#pragma unroll
    for (int kk = 0; kk < S::kKSteps; ++kk) {
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
        ldmatrix_x4(q_frag[kk][mt], q_addr[kk % 4] + mt * 16 * D * 2 + (kk / 4) * 128);
      }
    }
  }

  float o[S::kMTiles][S::kDTiles][4];
  float row_max[S::kMTiles][2];
  float row_sum[S::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = -INFINITY;
      row_sum[mt][h] = 0.0f;
    }
  }
  // Smallest position among this tile's query rows: KV tiles ending at or before it need
  // no causal mask.
  const int pos_first = shift + m0;

  for (int it = 0; it < n_kv_tiles; ++it) {
    cp_async_wait<S::kStages - 2>();  // groups 0..it (Q and tile `it`) have landed (ours)
    __syncthreads();  // ... every thread's part, and every warp is done with tile it-1
    // Tile it + kStages - 1 goes into the stage that held tile it-1 (a group, maybe empty).
    if (it + S::kStages - 1 < n_kv_tiles) {
      issue_kv(it + S::kStages - 1, (it + S::kStages - 1) % S::kStages);
    }
    cp_async_commit();

    const uint32_t k_base = smem_addr(kv_smem + (it % S::kStages) * 2 * S::kKVElems);
    const uint32_t v_base = k_base + S::kKVElems * 2;
    const int n0 = it * BN;

    // S = Q Kᵀ
    float s[S::kMTiles][S::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < S::kKSteps; ++kk) {
      uint32_t qa[S::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
        if constexpr (S::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = q_frag[kk][mt][e];
        } else {
          ldmatrix_x4(qa[mt], q_addr[kk % 4] + mt * 16 * D * 2 + (kk / 4) * 128);
        }
      }
#pragma unroll
      for (int np = 0; np < S::kNTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_base + k_off[kk % 4] + np * 16 * D * 2 + (kk / 4) * 128);
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt) {
          mma_bf16_16816(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_bf16_16816(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Causal mask (and the end of the sequence) on the tiles that straddle it.
    if (n0 + BN - 1 > pos_first || n0 + BN > seq.kv_len) {
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * S::kRowsPerWarp + mt * 16 + g + h * 8;
          const int limit = min(pos_first + r, seq.kv_len - 1) - n0;  // last visible key
#pragma unroll
          for (int j = 0; j < S::kNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (j * 8 + t4 * 2 + e > limit) s[mt][j][h * 2 + e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax; each row lives in one quad (4 lanes). O is rescaled only when some
    // row of the warp raised its running max (alpha == 1 exactly otherwise).
    // P is packed to bf16 as soon as it is computed (half the registers of the f32 scores):
    // p_bf[mt][j] = {row g, row g + 8} pairs of n-tile j, the halves of an A fragment.
    uint32_t p_bf[S::kMTiles][S::kNTiles][2];
    float alpha[S::kMTiles][2];
    bool max_changed = false;
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < S::kNTiles; ++j)
          mx = fmaxf(mx, fmaxf(s[mt][j][h * 2], s[mt][j][h * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(row_max[mt][h], mx * a.scale_log2);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        alpha[mt][h] = fast_exp2(row_max[mt][h] - base);
        max_changed |= new_max != row_max[mt][h];
        row_max[mt][h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < S::kNTiles; ++j) {
          const float p0 = fast_exp2(fmaf(s[mt][j][h * 2], a.scale_log2, -base));
          const float p1 = fast_exp2(fmaf(s[mt][j][h * 2 + 1], a.scale_log2, -base));
          p_bf[mt][j][h] = pack_bf16x2(p0, p1);
          sum += p0 + p1;
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
      }
    }
    if (__any_sync(0xffffffffu, max_changed)) {
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e / 2];
        }
      }
    }

    // O += P V. P's accumulator fragments of n-tiles 2kk, 2kk+1 form the A fragment of
    // k-step kk; d-tile pairs outermost so that each V fragment is loaded just before use.
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_base + v_off[dp % 4] + kk * 16 * D * 2 + (dp / 4) * 128);
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt) {
          const uint32_t pa[4] = {p_bf[mt][2 * kk][0], p_bf[mt][2 * kk][1],
                                  p_bf[mt][2 * kk + 1][0], p_bf[mt][2 * kk + 1][1]};
          mma_bf16_16816(o[mt][2 * dp], pa, vb[0], vb[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  // The KV loop, this CTA's main work, is done: the next kernel may launch (it waits for
  // this grid to finish before reading the output).
  pdl_launch_dependents();

  // ---- normalise and store ----------------------------------------------------------
#pragma unroll
  for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int r = warp * S::kRowsPerWarp + mt * 16 + g + h * 8;
      if (r < rows) {
        __nv_bfloat16* dst =
            out + (out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * D + t4 * 2;
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(dst + dt * 8) =
              pack_bf16x2(o[mt][dt][h * 2] * inv, o[mt][dt][h * 2 + 1] * inv);
        }
      }
    }
  }
}

template <class S>
void launch_prefill(const PrefillArgs& args, cudaStream_t stream) {
  once_per_device(reinterpret_cast<const void*>(prefill_kernel<S>), [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  });
  const PagedAttentionParams& p = args.p;
  const int64_t tiles = (static_cast<int64_t>(p.num_tokens) + S::BM - 1) / S::BM + p.num_seqs;
  const int64_t ctas = tiles * p.num_q_heads;
  PAGELLM_CHECK(ctas <= 0x7fffffff)
      << "paged_prefill_attention: " << ctas << " (query tile, head) pairs exceed 2^31 - 1";
  launch_kernel(prefill_kernel<S>, dim3(static_cast<unsigned>(ctas)), dim3(S::kThreads),
                S::kSmemBytes, stream, 1, args);
}

// Template arguments: D, BM, BN, warps, ring stages, Q in registers, min CTAs per SM.
// Long queries: FA2's D = 128 shape; 2 stages keep the CTA at 96 KB so that two share an SM
// (254 registers, no spills).
using LongD128 = PrefillShape<128, 128, 64, 4, 2, false, 2>;
using LongD64 = PrefillShape<64, 128, 64, 4, 3, false, 2>;
// Short queries (at most 64 rows): 4 warps x 16 rows, Q in registers, two CTAs per SM.
using ShortD128 = PrefillShape<128, 64, 64, 4, 3, true, 2>;
using ShortD64 = PrefillShape<64, 64, 64, 4, 3, true, 2>;

}  // namespace
}  // namespace attn

bool prefill_wgmma_supported(const PagedAttentionParams& p) {
  const int64_t rows = static_cast<int64_t>(p.num_pages) * p.num_kv_heads * p.page_size;
  return p.head_dim == 128 && p.page_size % 16 == 0 && p.num_pages > 0 &&
         rows < (int64_t{1} << 31) && current_device_info(nullptr) == 90;
}

bool prefill_grid_kv_major(const PagedAttentionParams& p, int64_t l2_bytes) {
  // Both pools' bytes of the longest sequence: max_kv_len keys of every KV head, bf16.
  const int64_t kv_bytes = int64_t{2} * p.max_kv_len * p.num_kv_heads * p.head_dim * 2;
  return l2_bytes > 0 && kv_bytes > l2_bytes;
}

void paged_prefill_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  paged_prefill_attention_with(p, CudaSettings::process().prefill_kernel, stream);
}

void paged_prefill_attention_with(const PagedAttentionParams& p, PrefillKernel kernel,
                                  cudaStream_t stream) {
  attn::validate_params(p, "paged_prefill_attention");
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  if (kernel != PrefillKernel::kV2 && prefill_wgmma_supported(p)) {
    attn::launch_prefill_wgmma(p, kernel, stream);
    return;
  }
  using namespace attn;
  PrefillArgs args{};
  args.p = p;
  args.page_shift = page_shift_of(p.page_size);
  args.scale_log2 = p.scale * kLog2e;
  // The tile height only changes speed: the grid covers every tile whatever max_query_len says.
  const bool short_queries = p.max_query_len > 0 && p.max_query_len <= 64;
  const bool d128 = p.head_dim == 128;
  if (short_queries) {
    d128 ? launch_prefill<ShortD128>(args, stream) : launch_prefill<ShortD64>(args, stream);
  } else {
    d128 ? launch_prefill<LongD128>(args, stream) : launch_prefill<LongD64>(args, stream);
  }
}

}  // namespace pagellm::cuda
