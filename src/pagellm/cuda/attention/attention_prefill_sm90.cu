// Paged prefill attention on Hopper (sm_90a): TMA K/V pages, wgmma, warp-specialised
// producer / consumer warpgroups ("wgmma" prefill variant; attention_prefill_variants.h).
//
// What: the contract of paged_prefill_attention (attention.h) for head_dim 128 and pages
// of a multiple of 16 tokens: out = softmax(q · Kᵀ · scale) · V over keys 0 .. kv - q + i
// (bottom-right causal), K/V read through the page table, ragged batches, cached prefixes,
// GQA. The grid, tile order and edge cases are v2's (attention_prefill.cu,
// locate_prefill_tile): one CTA per (128-row query tile, query head), heads fastest, the
// tiles of a sequence last-first, KV tiles above the diagonal never loaded, q == 0 rows
// writing nothing and rows that see no key writing zeros.
//
// Why this shape (FlashAttention-3's scheme). v2 runs mma.sync, which reaches about 2/3 of
// the tensor-core rate and makes every warp copy its K/V fragments out of shared memory
// (ldmatrix): 295-330 TFLOP/s on the H200. wgmma reads both operands of S = Q Kᵀ, and the
// B operand of O += P V, straight from shared memory, 64 query rows per warpgroup, so the
// shared-memory traffic per flop drops by the 4 warps that no longer each load the tile.
//  - CTA = 3 warpgroups (384 threads), one CTA per SM: warpgroup 0 is the producer (one
//    warp issues the TMA copies, the other three exit) and gives its registers to the
//    consumers (setmaxnreg 24 / 240: together exactly the 168 a thread has at launch);
//    warpgroups 1 and 2 consume 64 query rows each (BM = 128).
//  - K/V tiles of BN = 128 keys in a ring of 3 stages (225 KB with Q; "wgmma") or 2
//    (161 KB; "wgmma-serial"), each tile [128 keys][128 d] stored as two [128][64] halves
//    in the 128-byte-swizzled layout that TMA writes and wgmma reads (wgmma.cuh). A 16-key
//    chunk never crosses a page (pages are a multiple of 16 tokens), so the producer
//    warp's lane j loads chunk j of the tile: one page-table read and four TMA boxes
//    (64 d x 16 keys, K and V, both halves) from tensor maps of the pools seen as
//    [num_pages * Hkv * page_size, 128] matrices (the decode TMA kernel's maps). Chunks past
//    kv are not loaded at all (their page id would be garbage); the tile's expected byte
//    count shrinks with them. Full barrier per stage: the producer's arrive with the byte
//    count; empty barrier per stage: one arrival per consumer thread.
//  - Q (this tile's 128 rows of one head, row stride Hq * D in q) is copied once by the
//    consumers with cp.async into the same swizzled layout (rows past the sequence zero).
//    (Loading it by TMA from the producer warpgroup's idle second warp, with or without the
//    next wave's Q tile started towards L2, ran 2-11 % slower at 4k-32k tokens and gained
//    <= 2 % only at 1k: H200, 2026-12-05, docs/PERFORMANCE.md.)
//  - Grid order: one CTA per (query tile, query head), heads fastest, so that the first
//    wave holds every head's heaviest tile (locate_prefill_tile_at). When the longest
//    sequence's K and V outgrow the L2, the same pairs are taken KV head by KV head instead
//    (locate_wgmma_tile, prefill_grid_kv_major): the CTAs running at once then read one or
//    two KV heads' keys, which stay in L2, rather than every head's at once.
//  - S = Q Kᵀ: 8 wgmma m64n128k16 (A = Q, B = K, both K-major in shared memory), f32.
//    Online softmax in f32 in the log2 domain (scale · log2 e folded into one FMA); each
//    row of the accumulator lives in one quad of 4 lanes, as with mma.sync.
//  - O += P V: P stays in registers: the S accumulator fragment, rounded to bf16, is the A
//    fragment of wgmma (register A). V [keys][d] with d contiguous is an MN-major B
//    operand (transpose bit); the 128 columns of O are one m64n128k16 product per 16 keys,
//    its B descriptor stepping from the first 64-wide half of d to the second by the
//    leading byte offset (wgmma_desc_sw128_mn). Two m64n64k16 products per 16 keys, which
//    send the same A registers twice, ran 2-4 % slower (H200, 2026-12-04).
//  - Masking only on KV tiles that straddle the diagonal or the end of the sequence: scores
//    of keys past a row's last key become -inf by a select (so whatever K rows past kv hold,
//    NaN included, never reaches P). V rows past kv (the tail of the last page, or chunks
//    not loaded) are zeroed in shared memory before P V, since 0 · NaN is NaN. A consumer
//    warpgroup skips the math of KV tiles that lie entirely above its own 64 rows'
//    diagonal (it still releases the stage).
//  - Overlap ("wgmma"): each consumer issues S(it) = Q K(it)ᵀ and P(it-1) V(it-1)
//    together, as one turn, and the two consumers take turns issuing (FA3's ping-pong:
//    named barriers 3 and 4), so that one's softmax runs under the other's MMAs rather
//    than both contending for the tensor cores. The source waits for S alone before the
//    softmax of S(it) and for P V after it (FA3's intra-warpgroup overlap), but ptxas
//    schedules the second wait at the top of its basic block, so the softmax runs after
//    both (SASS, CUDA 13.0). Pinning the softmax between the waits (a shared store of its
//    row sums before the second) made the kernel 2-8 % slower (H200, 2026-12-04): with the
//    ping-pong keeping the tensor cores busy, finishing the softmax earlier only moved the
//    wait. "wgmma-serial" runs S, softmax and P V of each tile in turn, without turns.
//  - O leaves through shared memory: a consumer whose 64 rows are all the sequence's writes
//    them, normalised and in bf16, over its own Q rows (the swizzled layout is the out
//    tensor map's box) and one thread stores them by TMA, so the CTA exits once they are
//    read out of shared memory rather than when its per-thread stores have drained (those
//    cost 2.6-4 us a CTA, 8 % of a 4k prefill; H200, 2026-12-04). Partial tiles store per
//    thread.
//  - Programmatic dependent launch as v2: every thread waits first; the consumers let the
//    next kernel launch once their KV loop is done.
// Roofline: 4 · D · Σ(causal pairs) flops per query head at the wgmma rate (806 TFLOP/s
// dense bf16 measured on the H200: ~3,100 flops per clock per SM). Per 128 x 128 tile the CTA
// does 8.4 MFLOP (~2,700 clocks of tensor cores). Shared memory is no ceiling: a consumer
// reads 80 KB (K, V and its Q) per 4.2 MFLOP, 52 flops/byte, twice what 128 B/clock asks.
// The softmax is: 16,384 ex2 per tile at 16 per clock (~1,000 clocks) plus ~5 other FP32
// instructions per score (~650), ~60 % of the MMA time, so without overlap the kernel
// tops out near 500 TFLOP/s and with perfect overlap at the MMA rate.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_common.cuh"
#include "pagellm/cuda/attention/attention_prefill_variants.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/support/tma.cuh"
#include "pagellm/cuda/support/tma.h"
#include "pagellm/cuda/support/wgmma.cuh"

namespace pagellm::cuda {
namespace attn {
namespace {

constexpr int kD = 128;
constexpr int kBM = 128;                // query rows per CTA
constexpr int kBN = 128;                // keys per KV tile
constexpr int kConsumers = 2;           // warpgroups of 64 query rows
constexpr int kWgThreads = 128;
constexpr int kThreads = kWgThreads * (1 + kConsumers);
constexpr int kChunkKeys = 16;          // keys per TMA box (never crosses a page)
constexpr int kRowBytes = 128;          // one swizzled row: 64 bf16 of d
constexpr int kQHalfBytes = kBM * kRowBytes;   // [128 rows][64 d]
constexpr int kQBytes = 2 * kQHalfBytes;       // 32 KB
constexpr int kTileHalfBytes = kBN * kRowBytes;
constexpr int kTileBytes = 2 * kTileHalfBytes;  // one K (or V) tile: 32 KB
constexpr int kStageBytes = 2 * kTileBytes;     // K and V
constexpr int kAlign = 1024;                    // 128-byte swizzle atoms
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
// What __launch_bounds__(kThreads, 1) gives each thread at launch (168): the CTA's whole
// allocation, which setmaxnreg only moves between warpgroups. A consumer's setmaxnreg.inc
// waits until the producer's dec has freed enough, so asking for more hangs the kernel
// (a producer at 32 did, 2026-12-04).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
static_assert(kWgThreads * kProducerRegs + kConsumers * kWgThreads * kConsumerRegs <=
                  kThreads * kLaunchRegs,
              "the CTA's registers at launch hold the rebalanced warpgroups");

/// Compile-time variant: K/V ring depth, whether S(it) overlaps P(it-1) V(it-1), whether
/// the two consumers take turns issuing their products (ping-pong), and the grid's order
/// (kKvMajor: KV head by KV head; locate_wgmma_tile).
template <int kStages_, bool kOverlap_, bool kPingPong_, bool kKvMajor_ = false>
struct WgmmaShape {
  static constexpr int kStages = kStages_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kKvMajor = kKvMajor_;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + kAlign;
  static_assert(kSmemBytes + 2 * kStages * 8 <= 227 * 1024, "fits one SM's shared memory");
  static_assert(!kOverlap || kStages >= 3,
                "the overlapped loop holds two tiles at once: a third stage keeps a load ahead");
  static_assert(!kPingPong || kOverlap, "the consumers take turns in the overlapped loop");
};
// The overlapped loop holds two tiles (P V of one, S of the next) while the producer fills
// a third: 3 stages (225 KB). The serial loop holds one: 2 stages (161 KB).
using Overlapped = WgmmaShape<3, true, true>;
using OverlappedKvMajor = WgmmaShape<3, true, true, true>;
using Serial = WgmmaShape<2, false, false>;

struct WgmmaPrefillArgs {
  CUtensorMap k_map;  // bf16 [num_pages * Hkv * page_size, 128], box 64 x 16, 128B swizzle
  CUtensorMap v_map;
  CUtensorMap o_map;  // bf16 out as [tokens, Hq * 128], box 64 x 64, 128B swizzle (stores)
  PagedAttentionParams p;
  int32_t page_shift;  // log2(page_size) or -1
  float scale_log2;    // scale * log2(e)
};

#ifdef PAGELLM_WGMMA_AVAILABLE

/// The producer warp: loads the CTA's KV tiles 0 .. n_kv_tiles - 1 into the kStages-deep
/// ring, lane j issuing 16-key chunk j of each tile.
template <int kStages>
__device__ __forceinline__ void produce_kv(const WgmmaPrefillArgs& a, const PrefillTile& t,
                                           uint32_t ring, uint32_t full_bar, uint32_t empty_bar) {
  constexpr int kChunkBytes = kChunkKeys * kD * 2 * 2;  // one 16-key chunk of K and of V
  const PagedAttentionParams& p = a.p;
  const int lane = threadIdx.x & 31;
  const int32_t* page_row = p.page_table + static_cast<int64_t>(t.b) * p.max_pages_per_seq;
  for (int it = 0; it < t.n_kv_tiles; ++it) {
    const int stage = it % kStages;
    // The n-th use of a stage waits for the consumers' (n-1)-th release of it.
    if (it >= kStages) mbar_wait(empty_bar + 8 * stage, ((it / kStages) - 1) & 1);
    const int n0 = it * kBN;
    const int chunks = min(kBN / kChunkKeys, (t.seq.kv_len - n0 + kChunkKeys - 1) / kChunkKeys);
    const uint32_t full = full_bar + 8 * stage;
    if (lane == 0) mbar_arrive_expect_tx(full, static_cast<uint32_t>(chunks * kChunkBytes));
    __syncwarp();
    if (lane < chunks) {
      // Rows fit int32: prefill_wgmma_supported checks the pool has fewer than 2^31.
      const int row = static_cast<int>(kv_row(page_row, n0 + lane * kChunkKeys, p.page_size,
                                              a.page_shift, p.num_kv_heads, t.kv_head));
      const uint32_t k_dst = ring + stage * kStageBytes + lane * kChunkKeys * kRowBytes;
      const uint32_t v_dst = k_dst + kTileBytes;
      tma_load(k_dst, &a.k_map, 0, row, full);
      tma_load(k_dst + kTileHalfBytes, &a.k_map, 64, row, full);
      tma_load(v_dst, &a.v_map, 0, row, full);
      tma_load(v_dst + kTileHalfBytes, &a.v_map, 64, row, full);
    }
  }
}

/// CTA `cta`'s tile. The grid holds (query tile, query head) pairs, heads fastest
/// (locate_prefill_tile_at); with S::kKvMajor the same pairs are taken KV head by KV head
/// (slowest), then query tile, then the KV head's query heads. A permutation of the CTA
/// indices, so every pair runs once either way.
template <class S>
__device__ __forceinline__ bool locate_wgmma_tile(const PagedAttentionParams& p, unsigned cta,
                                                  PrefillTile& t) {
  if constexpr (S::kKvMajor) {
    const unsigned group = static_cast<unsigned>(p.num_q_heads / p.num_kv_heads);
    const unsigned tiles = gridDim.x / static_cast<unsigned>(p.num_q_heads);
    const unsigned per_kv = tiles * group;
    const unsigned kv = cta / per_kv, rem = cta % per_kv;
    cta = (rem / group) * static_cast<unsigned>(p.num_q_heads) + kv * group + rem % group;
  }
  return locate_prefill_tile_at(p, kBM, kBN, cta, t);
}

/// Consumer state: 16 rows per warp (g and g + 8 of the warp's m16 slice), O as the two
/// halves of the m64n128 accumulator (d 0..63, 64..127), each laid out as an m64n64 one.
struct ConsumerState {
  float o[2][32];
  float row_max[2];
  float row_sum[2];
};

/// S = Q Kᵀ for one consumer: 64 query rows (q_wg) x 128 keys (k_tile), 8 k16 steps over
/// the two 64-wide halves of d. Issues only (no fence, commit or wait).
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_wg, uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t q_off = (kk / 4) * kQHalfBytes + (kk % 4) * 32;
    const uint32_t k_off = (kk / 4) * kTileHalfBytes + (kk % 4) * 32;
    wgmma_m64n128k16_ss(s, wgmma_desc_sw128(q_wg + q_off), wgmma_desc_sw128(k_tile + k_off),
                        kk > 0);
  }
}

/// O += P V: k-step kk covers keys 16 kk .. 16 kk + 15, i.e. n8 blocks 2 kk, 2 kk + 1 of P,
/// whose accumulator halves are the A fragment's four registers; one m64n128 product over
/// V's two d halves. Issues only.
__device__ __forceinline__ void issue_pv(ConsumerState& st, const uint32_t (&p_bf)[16][2],
                                         uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    const uint32_t pa[4] = {p_bf[2 * kk][0], p_bf[2 * kk][1], p_bf[2 * kk + 1][0],
                            p_bf[2 * kk + 1][1]};
    wgmma_m64n128k16_rs_tn(st.o[0], st.o[1], pa,
                           wgmma_desc_sw128_mn(v_tile + kk * 16 * kRowBytes, kTileHalfBytes));
  }
}

/// Scores of keys a row may not see become -inf: past its causal end (row r of the tile
/// sees keys up to shift + m0 + r) or past kv. `row0` is the thread's first row (g) in the
/// tile, n0 the tile's first key. A select, so NaN scores (K rows past kv) disappear too.
__device__ __forceinline__ void mask_scores(float (&s)[64], const PrefillTile& t, int row0,
                                            int n0) {
  const int t4 = threadIdx.x & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int limit = min(t.shift + t.m0 + row0 + 8 * h, t.seq.kv_len - 1) - n0;  // last key
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * j + 2 * t4 + e > limit) s[4 * j + 2 * h + e] = -INFINITY;
      }
    }
  }
}

/// Online softmax of one S tile, in place: s becomes exp2(s · scale_log2 - new max) (the
/// unnormalised P in f32), the running max and sum are updated, and alpha (the factor O
/// must be scaled by) is returned per row; `changed` says whether any max rose. Each row
/// lives in one quad of 4 lanes.
__device__ __forceinline__ bool softmax_scores(float (&s)[64], ConsumerState& st,
                                               float (&alpha)[2], float scale_log2) {
  bool changed = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    float base;
    alpha[h] = online_softmax_step(mx, st.row_max[h], scale_log2, base, changed);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * h + e];
        x = fast_exp2(fmaf(x, scale_log2, -base));
        sum += x;
      }
    }
    st.row_sum[h] = st.row_sum[h] * alpha[h] + sum;
  }
  return changed;
}

/// O *= alpha per row, skipped when no row of the warp raised its max (alpha == 1).
__device__ __forceinline__ void rescale_o(ConsumerState& st, const float (&alpha)[2],
                                          bool changed) {
  if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
    for (int dh = 0; dh < 2; ++dh) {
#pragma unroll
      for (int i = 0; i < 32; ++i) st.o[dh][i] *= alpha[(i >> 1) & 1];
    }
  }
}

/// P (f32, accumulator layout) -> bf16 pairs: p_bf[j][h] = row g + 8 h, n8 block j.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&p_bf)[16][2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) p_bf[j][h] = pack_bf16x2(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
  }
}

/// Keeps the P registers alive (unmodified) up to this point, so that the compiler reuses
/// none of them while a wgmma that reads them may still run.
__device__ __forceinline__ void fence_p(uint32_t (&p_bf)[16][2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) asm volatile("" : "+r"(p_bf[j][h])::"memory");
  }
}

#endif  // PAGELLM_WGMMA_AVAILABLE

template <class S>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(const __grid_constant__ WgmmaPrefillArgs a) {
#ifdef PAGELLM_WGMMA_AVAILABLE
  constexpr int kStages = S::kStages;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[stage], then empty[stage]
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t q_base = (raw + kAlign - 1) & ~uint32_t(kAlign - 1);
  unsigned char* const smem = smem_raw + (q_base - raw);  // q_base as a pointer
  const uint32_t ring = q_base + kQBytes;  // stage s: K at ring + s * kStageBytes, V after
  const uint32_t full_bar = smem_addr(bars);
  const uint32_t empty_bar = full_bar + 8 * kStages;

  // q and the newest K/V rows come from the kernels before; out may still be read by them.
  pdl_wait();

  const PagedAttentionParams& p = a.p;
  PrefillTile t;
  if (!locate_wgmma_tile<S>(p, blockIdx.x, t)) return;
  const int tid = threadIdx.x;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  if (t.n_kv_tiles == 0) {  // no query row of this tile sees a key: zeros
    store_zero_rows<kD>(out, t.out_row0, t.rows, p.num_q_heads, tid, kThreads);
    return;
  }

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kConsumers * kWgThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = tid / kWgThreads;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid < 32) produce_kv<kStages>(a, t, ring, full_bar, empty_bar);
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int c = wg - 1;              // consumer: query rows 64 c .. 64 c + 63 of the tile
  const int tw = tid - wg * kWgThreads;
  const int warp = tw / 32;
  const int lane = tid & 31;
  const int g = lane / 4;   // rows g and g + 8 of the warp's 16
  const int t4 = lane % 4;  // column pair within each n8 block
  const int row0 = 64 * c + 16 * warp + g;  // this thread's first row within the tile

  // Q rows 64 c .. 64 c + 63 into the two swizzled halves (16 chunks of 16 bytes a row).
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
  for (int i = 0; i < 64 * 16 / kWgThreads; ++i) {
    const int idx = tw + i * kWgThreads;
    const int r = 64 * c + idx / 16;
    const int ch = idx % 16;
    const bool valid = r < t.rows;
    const __nv_bfloat16* src =
        valid ? qp + (t.out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * kD + ch * 8 : qp;
    const uint32_t dst =
        q_base + (ch / 8) * kQHalfBytes + r * kRowBytes + (((ch % 8) ^ (r % 8)) << 4);
    cp_async_16(dst, src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_smem();  // wgmma reads Q through the async proxy
  named_barrier_sync(1 + c, kWgThreads);

  // Keys a consumer's rows see: its tiles end earlier than the CTA's for the first
  // consumer (causal), and there are none when all its rows are past the sequence.
  auto tiles_of = [&](int cc) {
    const int rows = min(64, t.rows - 64 * cc);
    const int key_last =
        rows > 0 ? min(t.seq.kv_len - 1, t.shift + t.m0 + 64 * cc + rows - 1) : -1;
    return key_last >= 0 ? key_last / kBN + 1 : 0;
  };
  const int pos_first = t.shift + t.m0 + 64 * c;  // position of the warpgroup's first row
  const int wg_tiles = tiles_of(c);

  // FlashAttention-3's ping-pong: the consumers take turns issuing their wgmma (S of one
  // tile and P V of the previous), so that one's softmax runs under the other's products
  // instead of both competing for the tensor cores at once. Consumer 0 issues first; each
  // turn ends with an arrival on the other consumer's barrier (ids 3 and 4, 256 threads:
  // 128 waiting, 128 arriving). Both consumers take the same number of turns (a consumer
  // with fewer tiles, at most one fewer, takes its last turn empty); consumer 0's first
  // turn waits for nobody and consumer 1's last arrives for nobody, so every arrival is
  // matched. Only when both consumers have tiles: one with none would have to keep
  // releasing stages between its turns.
  const bool pingpong = S::kPingPong && wg_tiles > 0 && tiles_of(1 - c) > 0;
  const int turns = pingpong ? max(wg_tiles, tiles_of(1 - c)) + 1 : 0;
  int turn = 0;
  auto turn_begin = [&] {
    if (pingpong && (c == 1 || turn > 0)) named_barrier_sync(3 + c, 2 * kWgThreads);
  };
  auto turn_end = [&] {
    if (pingpong && (c == 0 || turn < turns - 1)) named_barrier_arrive(4 - c, 2 * kWgThreads);
    ++turn;
  };

  ConsumerState st;
#pragma unroll
  for (int dh = 0; dh < 2; ++dh) {
#pragma unroll
    for (int i = 0; i < 32; ++i) st.o[dh][i] = 0.0f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.row_max[h] = -INFINITY;
    st.row_sum[h] = 0.0f;
  }
  const uint32_t q_wg = q_base + 64 * c * kRowBytes;
  auto k_tile = [&](int it) { return ring + (it % kStages) * kStageBytes; };
  auto wait_full = [&](int it) { mbar_wait(full_bar + 8 * (it % kStages), (it / kStages) & 1); };
  auto release = [&](int it) { mbar_arrive(empty_bar + 8 * (it % kStages)); };
  // Waits for tile `it` and zeroes the V rows of keys >= kv (page tails or chunks never
  // loaded), since 0 · NaN = NaN. Both consumers write the same zeros; each makes its own
  // writes visible to its wgmma.
  auto acquire = [&](int it) {
    wait_full(it);
    const int keys = t.seq.kv_len - it * kBN;
    if (keys < kBN) {
      unsigned char* v = smem + (k_tile(it) + kTileBytes - q_base);
      for (int idx = tw; idx < (kBN - keys) * 16; idx += kWgThreads) {
        const int r = keys + idx / 16;
        const int half = (idx / 8) % 2;
        *reinterpret_cast<uint4*>(v + half * kTileHalfBytes + r * kRowBytes + (idx % 8) * 16) =
            make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async_smem();
      named_barrier_sync(1 + c, kWgThreads);
    }
  };
  // Tiles that straddle the diagonal (for some row of this warpgroup) or the end of kv.
  auto needs_mask = [&](int it) {
    return it * kBN + kBN - 1 > pos_first || (it + 1) * kBN > t.seq.kv_len;
  };

  float s[64];
  uint32_t p_bf[16][2];
  float alpha[2];
  if constexpr (!S::kOverlap) {
    // One tile at a time: S, softmax, P V, each waited for before the next.
    for (int it = 0; it < wg_tiles; ++it) {
      acquire(it);
      wgmma_fence();
      issue_qk(s, q_wg, k_tile(it));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      if (needs_mask(it)) mask_scores(s, t, row0, it * kBN);
      const bool changed = softmax_scores(s, st, alpha, a.scale_log2);
      rescale_o(st, alpha, changed);
      pack_p(s, p_bf);
      wgmma_fence_operands(st.o[0]);
      wgmma_fence_operands(st.o[1]);
      wgmma_fence();
      issue_pv(st, p_bf, k_tile(it) + kTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(st.o[0]);
      wgmma_fence_operands(st.o[1]);
      release(it);
    }
  } else if (wg_tiles > 0) {
    // S(it) and P(it-1) V(it-1) are issued together, in this consumer's turn; the waits
    // for S and then for P V bracket the softmax of S(it) in the source (FA3's
    // intra-warpgroup overlap), though ptxas moves the second wait above it (header).
    // Tile it-1's stage is released once its P V is done.
    acquire(0);
    turn_begin();
    wgmma_fence();
    issue_qk(s, q_wg, k_tile(0));
    wgmma_commit();
    turn_end();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    if (needs_mask(0)) mask_scores(s, t, row0, 0);
    softmax_scores(s, st, alpha, a.scale_log2);  // O is still zero: no rescale
    pack_p(s, p_bf);
    for (int it = 1; it < wg_tiles; ++it) {
      acquire(it);
      wgmma_fence_operands(st.o[0]);
      wgmma_fence_operands(st.o[1]);
      turn_begin();
      wgmma_fence();
      issue_qk(s, q_wg, k_tile(it));
      wgmma_commit();
      issue_pv(st, p_bf, k_tile(it - 1) + kTileBytes);
      wgmma_commit();
      turn_end();
      wgmma_wait<1>();  // S(it) is done; P(it-1) V(it-1) may still run
      wgmma_fence_operands(s);
      if (needs_mask(it)) mask_scores(s, t, row0, it * kBN);
      const bool changed = softmax_scores(s, st, alpha, a.scale_log2);
      wgmma_wait<0>();
      wgmma_fence_operands(st.o[0]);
      wgmma_fence_operands(st.o[1]);
      fence_p(p_bf);
      release(it - 1);
      rescale_o(st, alpha, changed);
      pack_p(s, p_bf);
    }
    wgmma_fence_operands(st.o[0]);
    wgmma_fence_operands(st.o[1]);
    turn_begin();
    wgmma_fence();
    issue_pv(st, p_bf, k_tile(wg_tiles - 1) + kTileBytes);
    wgmma_commit();
    turn_end();
    wgmma_wait<0>();
    wgmma_fence_operands(st.o[0]);
    wgmma_fence_operands(st.o[1]);
    release(wg_tiles - 1);
  }
  // Tiles wholly above this warpgroup's diagonal: nothing to compute, but the stage must be
  // released by every consumer before the producer refills it.
  for (int it = wg_tiles; it < t.n_kv_tiles; ++it) {
    wait_full(it);
    release(it);
  }
  // The ping-pong's remaining turn of a consumer with one tile fewer (after its releases:
  // the other consumer's last tiles need them).
  while (turn < turns) {
    turn_begin();
    turn_end();
  }
  // The KV loop, this CTA's main work, is done: the next kernel may launch (it waits for
  // this grid to finish before reading the output).
  pdl_launch_dependents();

  // ---- normalise and store ----------------------------------------------------------
  // A consumer whose 64 rows all belong to the sequence writes O (bf16) over its own Q rows
  // (its S products are done; the other consumer reads only its own) in the Q halves'
  // swizzled layout, which is the out map's box, and one thread stores both halves by TMA:
  // the CTA may then exit once they are read out of shared memory. Stored per thread, O
  // held each CTA until its 4-byte stores drained, 2.6-4 us a CTA (H200, 2026-12-04). The
  // last tile of a sequence, whose rows end early, stores per thread.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = st.row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  if (64 * c + 64 <= t.rows) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 8 * h;
#pragma unroll
      for (int dh = 0; dh < 2; ++dh) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<uint32_t*>(smem + dh * kQHalfBytes + r * kRowBytes +
                                       ((j ^ (r % 8)) << 4) + t4 * 4) =
              pack_bf16x2(st.o[dh][4 * j + 2 * h] * inv[h],
                          st.o[dh][4 * j + 2 * h + 1] * inv[h]);
        }
      }
    }
    fence_proxy_async_smem();
    named_barrier_sync(1 + c, kWgThreads);
    if (tw == 0) {
#pragma unroll
      for (int dh = 0; dh < 2; ++dh) {
        tma_store(&a.o_map, t.head * kD + dh * 64, t.seq.q_begin + t.m0 + 64 * c,
                  q_base + dh * kQHalfBytes + 64 * c * kRowBytes);
      }
      tma_store_commit();
      tma_store_wait_read();
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r < t.rows) {
      __nv_bfloat16* dst =
          out + (t.out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * kD + t4 * 2;
#pragma unroll
      for (int dh = 0; dh < 2; ++dh) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<uint32_t*>(dst + dh * 64 + j * 8) =
              pack_bf16x2(st.o[dh][4 * j + 2 * h] * inv[h], st.o[dh][4 * j + 2 * h + 1] * inv[h]);
        }
      }
    }
  }
#else
  __trap();  // launched only on compute capability 9.0 (prefill_wgmma_supported)
#endif
}

template <class S>
void launch(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr int kSmemBytes = S::kSmemBytes;
  once_per_device(reinterpret_cast<const void*>(prefill_wgmma_kernel<S>), [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_wgmma_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  });
  const int64_t pool_rows = static_cast<int64_t>(p.num_pages) * p.num_kv_heads * p.page_size;
  WgmmaPrefillArgs args;
  args.k_map = bf16_tensor_map(p.k_pool, pool_rows, kD, 64, kChunkKeys, "paged_prefill_attention");
  args.v_map = bf16_tensor_map(p.v_pool, pool_rows, kD, 64, kChunkKeys, "paged_prefill_attention");
  // Rows rounded up to 1,024 so that the cache holds a few maps per output buffer, not one
  // per chunk length: the kernel stores only boxes of rows the batch has.
  const int64_t out_rows = (static_cast<int64_t>(p.num_tokens) + 1023) / 1024 * 1024;
  args.o_map = bf16_tensor_map(p.out, out_rows, static_cast<int64_t>(p.num_q_heads) * kD, 64, 64,
                               "paged_prefill_attention");
  args.p = p;
  args.page_shift = page_shift_of(p.page_size);
  args.scale_log2 = p.scale * kLog2e;
  const int64_t tiles = (static_cast<int64_t>(p.num_tokens) + kBM - 1) / kBM + p.num_seqs;
  const int64_t ctas = tiles * p.num_q_heads;
  PAGELLM_CHECK(ctas <= 0x7fffffff)
      << "paged_prefill_attention: " << ctas << " (query tile, head) pairs exceed 2^31 - 1";
  launch_kernel(prefill_wgmma_kernel<S>, dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                kSmemBytes, stream, 1, args);
}

}  // namespace

void launch_prefill_wgmma(const PagedAttentionParams& p, PrefillKernel kernel,
                          cudaStream_t stream) {
  switch (kernel) {
    case PrefillKernel::kWgmmaSerial: return launch<Serial>(p, stream);
    case PrefillKernel::kWgmmaHeadMajor: return launch<Overlapped>(p, stream);
    case PrefillKernel::kWgmmaKvMajor: return launch<OverlappedKvMajor>(p, stream);
    default:
      return prefill_grid_kv_major(p, current_device_l2_bytes())
                 ? launch<OverlappedKvMajor>(p, stream)
                 : launch<Overlapped>(p, stream);
  }
}

}  // namespace attn
}  // namespace pagellm::cuda
