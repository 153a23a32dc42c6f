// Skinny (decode) matrix product on Hopper: out[M, N] = x[M, K] · w[N, K]ᵀ, M ≤ 64 tokens
// per tile, with TMA loads and warpgroup MMA (wgmma).
//
// Roofline. Bytes: N·K·2 of weights (read once) + M·K·2 of x + M·N·(2|4) of out; flops
// 2·M·N·K, i.e. M flops per weight byte. At 4.3 TB/s that is 134·M TFLOP/s: far under the
// tensor cores up to M ≈ 128, so the whole design is about keeping HBM busy from the first
// microsecond of the kernel to the last, and keeping the SM's own pipes (shared memory,
// instruction issue) out of the way.
//
// Why TMA + wgmma. A first version (mma.sync, cp.async, shared-memory fragment loads)
// matched cuBLASLt at M = 1 but slowed down ~60 % from M = 1 to M = 64: every warp re-read
// the x fragments from shared memory, and the weight bytes went through shared memory
// twice (cp.async in, ld.shared out), so the shared-memory pipe, not HBM, bound it. Here the
// tensor memory accelerator writes both tiles into shared memory with no thread involved,
// and wgmma reads A (weights, 64 rows per warpgroup) and B (the tokens) straight from shared
// memory: each byte is written once and read once per warpgroup.
//
// Work split. A CTA is two warpgroups (256 threads) on a tile of 128 weight rows, over a
// range of 64-wide K chunks; grid = (row tiles, splits, token tiles). For narrow N (o_proj and
// down have N = hidden: 20 tiles on a 132-SM GPU) the K range is split over `splits` CTAs
// that form one thread-block cluster (1, splits, 1). skinny_gemm_plan() picks the splits.
//
// The pipeline. kStages buffers (4 or 5, as two CTAs per SM allow), each a chunk: the weight tile (two TMA boxes of 64 rows x 64
// k, 128-byte swizzle, 16 KiB) and the x tile (tokens x 64 k). One thread issues the TMA
// copies and arms the stage's mbarrier with the byte count; every thread waits on the
// mbarrier, the warpgroups run 4 wgmma m64nT k16 steps, wait for them, and after a CTA
// barrier the stage is refilled with the chunk kStages ahead: all kStages chunks are in
// flight while one is multiplied. Rows past N, tokens past M and k past K are zero-filled
// by TMA (out-of-bounds boxes), never read. Weights carry an L2 evict-first hint.
//
// Packed weights (pack_skinny_weights; the CUDA backend packs a model's layer matrices at
// load, CudaBackend::prepare_matrix): the same stage bytes prepared in global memory, one
// contiguous 16 KiB block per (tile, chunk), so a stage is one bulk copy instead of two
// boxes of 128 bytes from each of 128 rows. Shared memory ends up identical, hence the
// same output bits; HBM serves one long run faster than 128 short ones
// (docs/PERFORMANCE.md).
//
// Programmatic dependent launch (pdl.cuh). The prologue issues the weight boxes of the first
// kStages chunks, then waits for the previous kernel (which produced x), then issues their x
// boxes: the weight stream starts while the previous kernel drains. The CTA lets its
// dependents launch once its main loop is done.
//
// Reduction, deterministic. After the main loop each CTA parks its float32 tile in its own
// shared memory ([tokens][132] floats, padded against bank conflicts), the cluster
// synchronises, and CTA r of the cluster writes its share of the output tile, each element
// the sum over the cluster's CTAs in rank order read through distributed shared memory. The
// order never depends on timing, and there is no workspace or counter to reset.
//
// The gated variant (launch_skinny_gemm_silu_mul) gives a CTA 64 gate rows and the 64 up
// rows that pair with them (one weight box each) and writes silu(gate) · up. The qkv
// variant (launch_skinny_gemm_qk_norm_rope) treats a CTA's 128 rows as one head: its
// reduction gives each warp whole token rows, which it normalises (q_norm / k_norm),
// rotates (RoPE) and stores into q_out or the paged K/V pools instead of writing qkv.
//
// wgmma and the TMA tensor maps need sm_90a; the compute_90 PTX of this file (the portable
// target) carries a kernel that traps, and skinny_gemm_supported() is false off sm_90.
#include "pagellm/cuda/matmul/skinny_gemm.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/elementwise/qk_norm_rope.cuh"
#include "pagellm/cuda/lora/lora.h"
#include "pagellm/cuda/support/tma.cuh"
#include "pagellm/cuda/support/tma.h"
#include "pagellm/cuda/support/wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGELLM_SKINNY_WGMMA 1
#endif

namespace pagellm::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;             // two warpgroups
constexpr int kRows = kSkinnyRowsPerCta;  // 64 per warpgroup
constexpr int kHalf = kRows / 2;
constexpr int kChunk = 64;                // K elements per stage: 128 bytes per row
constexpr int kRowBytes = kChunk * 2;
constexpr int kWeightStageBytes = kRows * kRowBytes;  // 16 KiB
constexpr int kPartialStride = kRows + 4;             // floats per token row of the parked tile
constexpr int kSmemAlign = 1024;                      // 128-byte swizzle atoms

static_assert(kRows == 128, "two warpgroups of 64 rows");

constexpr int stage_bytes(int tokens) { return kWeightStageBytes + tokens * kRowBytes; }
/// Pipeline depth: as many stages as keep two CTAs per SM (5 up to 32 tokens, 4 at 64).
constexpr int num_stages(int tokens) { return tokens <= 32 ? 5 : 4; }
constexpr int smem_bytes(int tokens) {
  const int pipeline = num_stages(tokens) * stage_bytes(tokens);
  const int parked = tokens * kPartialStride * 4;
  return (pipeline > parked ? pipeline : parked) + kSmemAlign;
}

/// What the reduction writes.
enum class Epi : int {
  kBf16,       // out [M, N] bf16
  kF32,        // out [M, N] float32
  kGated,      // w = [gate; up] (2 I rows), out [M, I] = silu(gate·x) · (up·x), bf16
  kQkNormRope  // w = qkv weights, tile = one head of 128: q/k-norm, RoPE, q_out and K/V pools
};

/// What a launch does about LoRA (SkinnyLora): nothing; the shrink tiles and the expand in
/// one launch (the expand waits for the shrink through LoraParams::counters); the shrink
/// tiles alone; or the expand alone, after a shrink-only launch.
enum LoraMode : int { kLoraNone = 0, kLoraFused = 1, kLoraShrink = 2, kLoraExpand = 3 };

struct LoraParams {
  const LoraSlotRef* slots = nullptr;   // [num_slots] (entry 0 unused)
  const int32_t* row_slots = nullptr;   // [M]: each token's slot, 0: none
  float* s = nullptr;                   // [M][modules · 64]: the shrink's sums
  uint32_t* counters = nullptr;         // kLoraFused: [shrink CTAs done, clusters done]
  int mode = kLoraNone;
  int tiles = 0;           // grid.x entries before the row tiles that are LoRA tiles
  int tiles_per_slot = 0;  // ceil(modules · max_rank / 128)
  int max_rank = 0;        // the largest rank a slot may hold (sizes the expand's batches)
  int modules = 0;
  int width[3] = {0, 0, 0};
  int width_total = 0;     // the group's columns
  int row_tiles = 0;       // the product's row tiles (a packed B holds one block each)
  unsigned shrink_ctas = 0;  // kLoraFused: LoRA-tile CTAs the expand waits for
  int num_slots = 0;       // entries of slots (slot 0 unused)
  unsigned long long* stamps = nullptr;  // SkinnyLora::stamps
};

struct Params {
  CUtensorMap w_map;  // bf16 [N, K]: box 64 k x 64 rows, 128-byte swizzle
  CUtensorMap x_map;  // bf16 [M, K]: box 64 k x tokens-per-tile rows, 128-byte swizzle
  void* out;          // [M, N] (or [M, inter] gated), bf16 or f32; unused by kQkNormRope
  int M, N, K;
  int chunks;  // ceil(K / kChunk)
  int splits;  // cluster size along grid.y
  int inter;   // gated products only: I, with w = [gate; up], N = 2 I
  QkNormRopeArgs qk;  // kQkNormRope only (qkv unused)
  const uint8_t* w_packed;  // pack_skinny_weights' blocks, streamed instead of w_map; or null
  LoraParams lora;
};

#ifdef PAGELLM_SKINNY_WGMMA

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return tma_smem_addr(p); }

// ---- wgmma (fence, commit, wait and the 128-byte-swizzle descriptor: support/wgmma.cuh) ------

/// d[64 x 8] += A[64 x 16] · B[16 x 8], both operands in shared memory (descriptors).
__device__ __forceinline__ void wgmma_n8(float (&d)[4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b), "r"(1));
}

/// d[64 x 16] += A[64 x 16] · B[16 x 16], both operands in shared memory (descriptors).
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(1));
}

/// d[64 x 32] += A[64 x 16] · B[16 x 32], both operands in shared memory (descriptors).
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(1));
}

/// d[64 x 64] += A[64 x 16] · B[16 x 64], both operands in shared memory (descriptors).
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(1));
}

template <int kTokens>
__device__ __forceinline__ void wgmma_tile(float (&d)[kTokens / 2], uint64_t a, uint64_t b) {
  if constexpr (kTokens == 8) {
    wgmma_n8(d, a, b);
  } else if constexpr (kTokens == 16) {
    wgmma_n16(d, a, b);
  } else if constexpr (kTokens == 32) {
    wgmma_n32(d, a, b);
  } else {
    wgmma_n64(d, a, b);
  }
}

#endif  // PAGELLM_SKINNY_WGMMA

/// The fused epilogue of the qkv product (Epi::kQkNormRope): the CTA's 128-row tile is head
/// blockIdx.x of [q heads | k heads | v heads], and each warp finishes whole token rows of
/// it, lane l holding columns 4 l .. 4 l + 3. The sums are rounded to bf16 first (what the
/// unfused product writes), q and k heads get RMSNorm with their weight and rotate-half
/// RoPE (column i pairs with i + 64, i.e. lane l with lane l ^ 16), exactly the operations
/// of qk_norm_rope_store_kv; q goes to q_out, k and v to their page slots.
#ifdef PAGELLM_SKINNY_WGMMA
struct QkLane {
  float w[4];         // norm weight of the lane's columns (q or k heads)
  float inv_freq[4];  // RoPE inverse frequency of the lane's columns
};

__device__ __forceinline__ QkLane qk_lane_constants(const QkNormRopeArgs& e, int head,
                                                    int lane) {
  QkLane c{};
  if (head >= e.num_q_heads + e.num_kv_heads) return c;  // v heads: neither
  const auto* w = static_cast<const __nv_bfloat16*>(head < e.num_q_heads ? e.q_norm : e.k_norm);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = 4 * lane + j;
    const int i = col & (kSkinnyQkHeadDim / 2 - 1);
    c.w[j] = __bfloat162float(w[col]);
    c.inv_freq[j] = rope_inv_freq(e.rope_theta, i, kSkinnyQkHeadDim);
  }
  return c;
}

__device__ __forceinline__ float bf16_round(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

/// With LoRA, `sum` already holds the row's delta (the expand runs into the accumulators).
__device__ __forceinline__ void qk_finish_row(const QkNormRopeArgs& e, int head, int token,
                                              float4 sum, const QkLane& c, int lane) {
  float v[4] = {bf16_round(sum.x), bf16_round(sum.y), bf16_round(sum.z), bf16_round(sum.w)};
  if (head < e.num_q_heads + e.num_kv_heads) {  // q and k heads; v heads are stored as is
    const float inv = qk_inv_rms(qk_lane_sum_squares(v), kSkinnyQkHeadDim, e.eps);
    const float position = static_cast<float>(e.positions[token]);
    const bool first_half = lane < 16;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float sn, cs;
      sincosf(position * c.inv_freq[j], &sn, &cs);
      v[j] = qk_norm_rope_element(v[j], c.w[j], inv, sn, cs, first_half);
    }
  }
  __nv_bfloat16* dst = qk_destination(e, token, head, kSkinnyQkHeadDim);
  if (dst == nullptr) return;
  uint2 packed;
  __nv_bfloat162 lo2 = __floats2bfloat162_rn(v[0], v[1]);
  __nv_bfloat162 hi2 = __floats2bfloat162_rn(v[2], v[3]);
  packed.x = *reinterpret_cast<uint32_t*>(&lo2);
  packed.y = *reinterpret_cast<uint32_t*>(&hi2);
  *reinterpret_cast<uint2*>(dst + 4 * lane) = packed;
}
#endif  // PAGELLM_SKINNY_WGMMA

// ---- LoRA inside the product (SkinnyLora) ----------------------------------------------------
//
// The shrink. A LoRA tile is a CTA cluster like a row tile, streaming instead of 128 weight
// rows up to 128 rows of one adapter slot's stacked A (the group's modules · rank rows,
// packed by pack_lora_a in 64-row halves) through the same pipeline against the same x tile,
// and writing the finished sums s = x · Aᵀ (float32) of the tokens that use that slot. In
// one launch (kLoraFused) the LoRA tiles come first in the grid and signal a counter; a row
// tile waits on it only after its own main loop, and only if one of its tokens has an
// adapter. The launcher uses one launch only when the whole grid fits on the GPU at once (so
// a waiting CTA can never keep a LoRA tile from running), and otherwise a shrink-only launch
// followed by an expand-only one: the same arithmetic, so the same bits.
//
// The expand, with the tensor cores. After its main loop a row tile with adapter tokens
// runs a few more wgmma k-steps into the same accumulators: for each slot q its tokens use,
// A = slot q's B rows of the tile (packed by pack_lora_b: per 32 ranks a [128 rows][32]
// block, 64-byte swizzle, one bulk copy) and B = an [tokens][32] tile of bf16(scale_q · s)
// with zeros for every token of another slot (and past the rank), built in shared memory
// from the float32 sums. A token's delta is thus added before the one rounding to bf16, and
// the other slots' steps add exact zeros to it. Each 64-row half of a tile (a warpgroup)
// belongs to one module (widths are multiples of 64), whose sums it multiplies. In a split-K
// cluster, slot q's steps run in the CTA of rank q mod splits: which CTA adds a token's
// delta, and so the order of the cluster's sum, depends on its slot alone, never on which
// other slots share the tile.

/// Bytes of one 32-rank block of a packed B for a row tile: 128 rows of 64 bytes.
constexpr int kLoraBBlockBytes = kRows * 64;  // 8 KiB
constexpr int kLoraRankBlock = 32;            // ranks per block (a 64-byte row)

/// The 32-rank blocks a slot of rank `rank` has per row tile.
__host__ __device__ constexpr int lora_b_blocks(int rank) {
  return (rank + kLoraRankBlock - 1) / kLoraRankBlock;
}

/// Half (64 rows) h of chunk c of a packed A with `halves` halves: 8 KiB at (c · halves + h).
constexpr int kLoraHalfBytes = kHalf * kRowBytes;  // 8 KiB

#ifdef PAGELLM_SKINNY_WGMMA
__device__ __forceinline__ void red_release_gpu_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Starts bringing `bytes` (a multiple of 16) from 16-byte aligned global `p` into L2.
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
/// The module a column of the group belongs to.
__device__ __forceinline__ int lora_module_of(const LoraParams& l, int col) {
  return col < l.width[0] ? 0 : (col < l.width[0] + l.width[1] ? 1 : 2);
}

/// The share [lo, hi) of `count` items that rank `rank` of a cluster of `splits` CTAs takes.
struct RankShare {
  int lo, hi;
};
__device__ __forceinline__ RankShare rank_share(int rank, int count, int splits) {
  return {static_cast<int>(static_cast<int64_t>(rank) * count / splits),
          static_cast<int>(static_cast<int64_t>(rank + 1) * count / splits)};
}

/// Thread 0 records stamp `k` of this CTA (SkinnyLora::stamps), when profiling.
__device__ __forceinline__ void lora_stamp(const LoraParams& l, int k,
                                           unsigned long long value = 0) {
  if (l.stamps == nullptr || threadIdx.x != 0) return;
  if (k != kStampKind) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
  const size_t cta = (static_cast<size_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x +
                     blockIdx.x;
  l.stamps[cta * kSkinnyStamps + k] = value;
}

/// Called once by every cluster (thread 0 of rank 0) at its very end in kLoraFused mode: the
/// last cluster of the launch sets the counters back to zero for the next launch.
__device__ __forceinline__ void lora_cluster_finished(const LoraParams& l) {
  const uint32_t total = gridDim.x * gridDim.z;
  if (atomicAdd(&l.counters[1], 1u) == total - 1) {
    l.counters[0] = 0;
    l.counters[1] = 0;
  }
}
#endif  // PAGELLM_SKINNY_WGMMA

/// First weight row of half `h` (0 or 1) of row tile `tile`: the tile's 128 consecutive
/// rows, or for a gated product (inter > 0: gate rows [0, inter), up rows [inter, 2 inter))
/// 64 gate rows and the 64 up rows of the same intermediate columns. The kernel's two TMA
/// boxes and pack_kernel's layout both come from here, so the packed copy holds exactly what
/// the row-major reads would fetch.
__host__ __device__ constexpr int64_t half_first_row(int64_t tile, int h, int64_t inter) {
  return inter > 0 ? h * inter + tile * kHalf : tile * kRows + h * kHalf;
}

// kLora: the instantiation that can run LoRA tiles and expands (p.lora.mode not kLoraNone).
// The plain products run the kLora = false one, from which every LoRA branch is compiled
// out: their runtime checks alone cost the base decode about 4 % at W1 and 8 % at batch 1
// on the H200 (docs/PERFORMANCE.md).
template <int kTokens, Epi kEpi, bool kLora>
__global__ void __launch_bounds__(kThreads, 2) skinny_gemm_kernel(const __grid_constant__ Params p) {
#ifdef PAGELLM_SKINNY_WGMMA
  constexpr int kStages = num_stages(kTokens);
  constexpr bool kGated = kEpi == Epi::kGated;
  constexpr bool kOutF32 = kEpi == Epi::kF32;
  constexpr int kStageBytes = stage_bytes(kTokens);
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full_bar[kStages];

  const int tid = threadIdx.x;
  const int wg = tid >> 7;              // warpgroup: weight rows [64 wg, 64 wg + 64) of the tile
  const int lane = tid & 31, warp_in_wg = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.y;
  const int m0 = blockIdx.z * kTokens;
  const int valid_tokens = min(kTokens, p.M - m0);
  const int c_begin = static_cast<int>(static_cast<int64_t>(split) * p.chunks / p.splits);
  const int c_end = static_cast<int>(static_cast<int64_t>(split + 1) * p.chunks / p.splits);
  const int num_chunks = c_end - c_begin;
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + kSmemAlign - 1) & ~uint32_t(kSmemAlign - 1);
  uint8_t* const smem = smem_raw + (base - raw);
  const LoraParams& lora = p.lora;
  if constexpr (kLora) lora_stamp(lora, kStampEntry);
  // LoRA tiles (grid.x < lora.tiles) stream `lora_halves` 64-row halves of slot
  // `lora_slot`'s packed A from half `lora_h0`; row tiles are numbered from 0 after them.
  const bool lora_tile = kLora && static_cast<int>(blockIdx.x) < lora.tiles;
  const int tile = static_cast<int>(blockIdx.x) - (kLora ? lora.tiles : 0);
  int lora_slot = 0, lora_rows = 0, lora_all_halves = 0, lora_h0 = 0, lora_halves = 2;
  const uint8_t* lora_a = nullptr;
  __shared__ int lora_token_slot[kTokens];  // each token's slot, 0: none
  if (lora_tile) {
    lora_slot = 1 + static_cast<int>(blockIdx.x) / lora.tiles_per_slot;
    lora_h0 = 2 * (static_cast<int>(blockIdx.x) % lora.tiles_per_slot);
    const LoraSlotRef& f = lora.slots[lora_slot];
    lora_rows = f.a_packed == nullptr ? 0 : lora.modules * f.rank;
    lora_all_halves = (lora_rows + kHalf - 1) / kHalf;
    lora_halves = max(0, min(2, lora_all_halves - lora_h0));
    lora_a = static_cast<const uint8_t*>(f.a_packed);
    // Nothing to do unless a token of this tile uses the slot (row slots are written by a
    // copy before the step: readable before the wait). Uniform over the cluster.
    // (A thread a token: a serial scan would pay the load latency per token.)
    // The tokens' slots stay in shared memory for the end, which writes the sums of
    // this slot's tokens only (a global load there would cost a round trip to L2 that the
    // weight stream of the next kernel makes long).
    const int token_slot = tid < valid_tokens ? __ldg(lora.row_slots + m0 + tid) : 0;
    if (tid < kTokens) lora_token_slot[tid] = token_slot;
    const bool used = __syncthreads_or(lora_halves > 0 && token_slot == lora_slot);
    lora_stamp(lora, kStampKind, 1);
    if (!used) {
      pdl_wait();
      if (tid == 0 && split == 0 && lora.mode == kLoraFused) {
        // The cluster's CTAs of the shrink, none with sums, counted at once (before this
        // cluster can count as finished).
        atomicAdd(&lora.counters[0], static_cast<uint32_t>(p.splits));
        lora_cluster_finished(lora);
      }
      lora_stamp(lora, kStampEnd);
      return;
    }
    // The slot's whole packed B (every row tile's block) starts into L2 now, next to the
    // weight stream, so that the row tiles' copies after their main loops find it there:
    // 16 KiB a request, spread over warp 0 of the cluster's CTAs (of the first LoRA tile of
    // the slot and the first token tile).
    if (lora_h0 == 0 && blockIdx.z == 0 && tid < 32) {
      constexpr uint32_t kPiece = 16384;
      const uint32_t bytes =
          static_cast<uint32_t>(lora.row_tiles) * lora_b_blocks(f.rank) * kLoraBBlockBytes;
      const char* b_packed = static_cast<const char*>(f.b_packed);
      for (uint32_t off = (static_cast<uint32_t>(split) * 32 + tid) * kPiece; off < bytes;
           off += static_cast<uint32_t>(p.splits) * 32 * kPiece) {
        bulk_prefetch_l2(b_packed + off, min(kPiece, bytes - off));
      }
    }
  }
  const int box_row0 = lora_tile ? 0 : static_cast<int>(half_first_row(tile, 0, kGated ? p.inter : 0));
  const int box_row1 = lora_tile ? 0 : static_cast<int>(half_first_row(tile, 1, kGated ? p.inter : 0));
  // Bytes TMA delivers per stage (boxes are full, zero-filled past the edges).
  const uint32_t stage_tx = lora_tile
      ? static_cast<uint32_t>(lora_halves * kLoraHalfBytes + kTokens * kRowBytes)
      : static_cast<uint32_t>(kStageBytes);
  const bool wg_active = !lora_tile || wg < lora_halves;

  // The expand's B copies (row tiles with LoRA) complete on their own barrier.
  __shared__ __align__(8) uint64_t lora_bar;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(smem_addr(&full_bar[s]), 1);
    if constexpr (kLora) mbar_init(smem_addr(&lora_bar), 1);
    mbar_init_fence();
  }
  __syncthreads();

  const uint64_t policy = evict_first_policy();
  auto issue_weights = [&](int it, int stage) {
    const uint32_t dst = base + stage * kStageBytes;
    const uint32_t bar = smem_addr(&full_bar[stage]);
    const int k = (c_begin + it) * kChunk;
    mbar_arrive_expect_tx(bar, stage_tx);
    if (lora_tile) {
      const size_t half = static_cast<size_t>(c_begin + it) * lora_all_halves + lora_h0;
      bulk_load_hint(dst, lora_a + half * kLoraHalfBytes, lora_halves * kLoraHalfBytes, bar,
                     policy);
    } else if (p.w_packed != nullptr) {
      const size_t block = static_cast<size_t>(tile) * p.chunks + c_begin + it;
      bulk_load_hint(dst, p.w_packed + block * kWeightStageBytes, kWeightStageBytes, bar, policy);
    } else {
      tma_load_hint(dst, &p.w_map, k, box_row0, bar, policy);
      tma_load_hint(dst + kWeightStageBytes / 2, &p.w_map, k, box_row1, bar, policy);
    }
  };
  auto issue_x = [&](int it, int stage) {
    tma_load(base + stage * kStageBytes + kWeightStageBytes, &p.x_map, (c_begin + it) * kChunk,
             m0, smem_addr(&full_bar[stage]));
  };

  // Prologue: weights first (they do not depend on the previous kernel), then wait for the
  // previous kernel, then x.
  if (tid == 0) {
    for (int s = 0; s < kStages && s < num_chunks; ++s) issue_weights(s, s);
  }
  // The fused qkv epilogue's per-lane constants come from model weights: read them now.
  [[maybe_unused]] QkLane qk_lane{};
  if constexpr (kEpi == Epi::kQkNormRope) {
    if (!lora_tile) qk_lane = qk_lane_constants(p.qk, tile, lane);
  }
  // LoRA row tiles: each token's slot (row slots are written by copies before the step:
  // readable before the wait), loaded by warps 2-3 into a register now and first used just
  // before the main loop, whose first stage takes longer to land than these loads.
  const bool expand =
      kLora && !lora_tile && (lora.mode == kLoraFused || lora.mode == kLoraExpand);
  __shared__ unsigned long long lora_warp_mask[2];  // warp 2 + w's tokens: bit q, slot q used
  // What the expand needs of each slot q: its packed B, the rank (0: the slot's adapter
  // does not target this group) and the scale.
  __shared__ const uint8_t* lora_q_b[kSkinnyLoraMaxSlots];
  __shared__ int lora_q_rank[kSkinnyLoraMaxSlots];
  __shared__ float lora_q_scale[kSkinnyLoraMaxSlots];
  int my_row_slot = 0;
  // Warpgroup 1's threads 1 .. num_slots - 1 load slot q = tid - 128's entry the same way
  // (the slot table changes only between steps).
  const int my_q = tid - 128;
  const bool loads_slot = expand && my_q >= 1 && my_q < lora.num_slots;
  const uint8_t* my_q_b = nullptr;
  int my_q_rank = 0;
  float my_q_scale = 0.0f;
  if (expand) {
    if (tid >= 64 && tid < 64 + valid_tokens) my_row_slot = __ldg(lora.row_slots + m0 + tid - 64);
    if (loads_slot) {
      const LoraSlotRef& f = lora.slots[my_q];
      my_q_b = static_cast<const uint8_t*>(f.b_packed);
      my_q_rank = f.a == nullptr ? 0 : f.rank;
      my_q_scale = f.scale;
    }
  }
  pdl_wait();
  if constexpr (kLora) lora_stamp(lora, kStampWaited);
  if (tid == 0) {
    for (int s = 0; s < kStages && s < num_chunks; ++s) issue_x(s, s);
  }
  // The expand's slots (see "LoRA inside the product"), known before the main loop so that
  // nothing but the expand itself follows it: this CTA's slots are those of the tile's
  // tokens whose adapter targets the group and whose number is its rank mod splits. The
  // loads above have until the first stage lands to arrive.
  unsigned long long mine = 0;
  if (expand) {
    // Whole warps from thread 64 (kTokens <= 64) OR their tokens' slot bits with two warp
    // reductions. (An atomicOr a token on a shared mask compiled to a compare-and-swap loop
    // that the 32 lanes of a warp took in turn, about 1 us a launch measured by Nsight
    // Compute's stall sampling on the H200.)
    constexpr int kMaskThreads = kTokens < 32 ? 32 : kTokens;
    if (tid >= 64 && tid < 64 + kMaskThreads) {
      if (tid < 64 + kTokens) lora_token_slot[tid - 64] = my_row_slot;
      const unsigned lo = __reduce_or_sync(0xffffffffu, my_row_slot > 0 && my_row_slot < 32
                                                            ? 1u << my_row_slot : 0u);
      const unsigned hi = __reduce_or_sync(0xffffffffu, my_row_slot >= 32
                                                            ? 1u << (my_row_slot - 32) : 0u);
      if (lane == 0) {
        lora_warp_mask[(tid - 64) >> 5] = (static_cast<unsigned long long>(hi) << 32) | lo;
      }
    }
    if (loads_slot) {
      lora_q_b[my_q] = my_q_b;
      lora_q_rank[my_q] = my_q_rank;
      lora_q_scale[my_q] = my_q_scale;
    }
    __syncthreads();
    for (unsigned long long m = lora_warp_mask[0] | (kTokens > 32 ? lora_warp_mask[1] : 0ull);
         m != 0; m &= m - 1) {
      const int q = __ffsll(static_cast<long long>(m)) - 1;
      if (q % p.splits == split && lora_q_rank[q] > 0) mine |= 1ull << q;
    }
  }
  // The expand's layout (see "LoRA inside the product"): shared memory from the pipeline's
  // start, per slot of a batch its B blocks, then per slot its two [kTokens][32] sum tiles
  // (one per warpgroup) per block of 32 ranks. Only read when `mine` is not empty.
  constexpr int kRegionBytes = kStages * kStageBytes;
  constexpr int kSTileBytes = kTokens * 64;
  int blocks_max = 0, slot_b_bytes = 0, per_batch = 0;
  // The slot of the e-th set bit of `mine`.
  auto mine_slot = [&](int e) {
    unsigned long long m = mine;
    for (int i = 0; i < e; ++i) m &= m - 1;
    return __ffsll(static_cast<long long>(m)) - 1;
  };
  // Thread 0: slot q's B blocks of this tile into place b of a batch.
  auto issue_b = [&](int b, int q) {
    const uint32_t slot_bytes = lora_b_blocks(lora_q_rank[q]) * kLoraBBlockBytes;
    bulk_load_hint(base + b * slot_b_bytes, lora_q_b[q] + static_cast<size_t>(tile) * slot_bytes,
                   slot_bytes, smem_addr(&lora_bar), policy);
  };
  if (mine != 0) {
    blocks_max = lora_b_blocks(lora.max_rank);
    slot_b_bytes = blocks_max * kLoraBBlockBytes;
    per_batch = kRegionBytes / (slot_b_bytes + 2 * blocks_max * kSTileBytes);
    if (tid == 0) {
      // The first batch's B bytes, armed now so that only the copies follow the loop.
      // (Issuing them inside the loop's last iterations, as each stage they overwrite is
      // read for the last time, slowed the loop more than it saved: W1 with 8 adapters
      // 69.4 % against 73.3 %, docs/PERFORMANCE.md.)
      const int nb = min(per_batch, __popcll(mine));
      uint32_t bytes = 0;
      for (int b = 0; b < nb; ++b) {
        bytes += lora_b_blocks(lora_q_rank[mine_slot(b)]) * kLoraBBlockBytes;
      }
      mbar_arrive_expect_tx(smem_addr(&lora_bar), bytes);
    }
  }

  float acc[kTokens / 2];
#pragma unroll
  for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.0f;

  for (int it = 0; it < num_chunks; ++it) {
    const int stage = it % kStages;
    mbar_wait(smem_addr(&full_bar[stage]), (it / kStages) & 1);
    const uint32_t a_tile = base + stage * kStageBytes + wg * (kWeightStageBytes / 2);
    const uint32_t b_tile = base + stage * kStageBytes + kWeightStageBytes;
    if (wg_active) {
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kChunk / 16; ++s) {
        // 16 k = 32 bytes further along the swizzled 128-byte rows.
        wgmma_tile<kTokens>(acc, wgmma_desc_sw128(a_tile + s * 32),
                                  wgmma_desc_sw128(b_tile + s * 32));
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
    __syncthreads();  // both warpgroups are done with this stage: refill it
    if (tid == 0 && it + kStages < num_chunks) {
      issue_weights(it + kStages, stage);
      issue_x(it + kStages, stage);
    }
  }

  // The weights are streamed: the next kernel may start its own prologue.
  pdl_launch_dependents();
  if constexpr (kLora) lora_stamp(lora, kStampMainLoop);

  // The expand (see "LoRA inside the product").
  const int s_stride = lora.modules * kHalf;
  if (mine != 0) {
    const int list_size = __popcll(mine);
    const uint32_t s_region = base + per_batch * slot_b_bytes;
    // The module whose sums warpgroup half h multiplies (-1: the half is past the group).
    auto half_module = [&](int h) {
      if constexpr (kGated) {
        return h;
      } else {
        const int col = tile * kRows + h * kHalf;
        return col < lora.width_total ? lora_module_of(lora, col) : -1;
      }
    };
    // A batch's slots and its expand steps (one a 32-rank block of a slot, warpgroup 0's
    // offsets of its B block and sum tile), listed once by thread 0.
    constexpr int kMaxSteps = kRegionBytes / kLoraBBlockBytes;
    __shared__ int lora_batch_q[kMaxSteps];
    __shared__ uint32_t lora_step_a[kMaxSteps], lora_step_s[kMaxSteps];
    __shared__ int lora_num_steps;
    uint32_t phase = 0;
    for (int b0 = 0; b0 < list_size; b0 += per_batch) {
      const int nb = min(per_batch, list_size - b0);
      if (tid == 0) {
        int steps = 0;
        for (int b = 0; b < nb; ++b) {
          const int q = mine_slot(b0 + b);
          lora_batch_q[b] = q;
          for (int kb = 0; kb < lora_b_blocks(lora_q_rank[q]); ++kb, ++steps) {
            lora_step_a[steps] = b * slot_b_bytes + kb * kLoraBBlockBytes;
            lora_step_s[steps] = (b * 2 * blocks_max + kb) * kSTileBytes;
          }
        }
        lora_num_steps = steps;
        // The batch's B blocks (model weights): one bulk copy a slot (the first batch's
        // bytes were armed before the main loop).
        if (b0 > 0) {
          uint32_t bytes = 0;
          for (int b = 0; b < nb; ++b) {
            bytes += lora_b_blocks(lora_q_rank[lora_batch_q[b]]) * kLoraBBlockBytes;
          }
          mbar_arrive_expect_tx(smem_addr(&lora_bar), bytes);
        }
        for (int b = 0; b < nb; ++b) issue_b(b, lora_batch_q[b]);
        if (b0 == 0) lora_stamp(lora, kStampBIssued);
        if (b0 == 0 && lora.mode == kLoraFused) {
          // One launch: wait for every LoRA tile's sums.
          uint32_t spins = 0;
          while (ld_acquire_gpu(lora.counters) < lora.shrink_ctas) {
            __nanosleep(32);
            // A launch that fits the GPU cannot wait this long (seconds): fail loudly
            // rather than hang the stream.
            if (++spins == (1u << 25)) __trap();
          }
          lora_stamp(lora, kStampCounterSeen);
        }
      }
      __syncthreads();  // the sums are complete (and the previous batch's tiles read)
      if (b0 == 0) lora_stamp(lora, kStampShrinkReady);
      // The sum tiles: 16 bytes (8 ranks of one token) a unit, bf16(scale · s) for the
      // tokens of the slot, zeros for the others and past the rank. A thread issues the
      // loads of up to kUnitLoads units before converting any: each is a round trip to L2,
      // and one at a time a thread paid them in series (8 units with 8 slots).
      constexpr int kUnitLoads = 4;
      const int units = nb * 2 * blocks_max * kTokens * 4;
      for (int idx0 = tid; idx0 < units; idx0 += kUnitLoads * kThreads) {
        float4 lo[kUnitLoads], hi[kUnitLoads];
        int rank_of[kUnitLoads];  // the slot's rank past this unit's first: 0, nothing loaded
        float scale_of[kUnitLoads];
#pragma unroll
        for (int j = 0; j < kUnitLoads; ++j) {
          const int idx = idx0 + j * kThreads;
          const int u = idx & 3;
          const int m_local = (idx >> 2) % kTokens;
          const int rest = (idx >> 2) / kTokens;  // ((b · 2) + h) · blocks_max + kb
          const int kb = rest % blocks_max, h = (rest / blocks_max) & 1, b = rest / blocks_max / 2;
          rank_of[j] = 0;
          scale_of[j] = 0.0f;
          lo[j] = hi[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (idx >= units) continue;
          const int q = lora_batch_q[b];
          const int i0 = kb * kLoraRankBlock + u * 8;
          const int module = half_module(h);
          if (module >= 0 && lora_token_slot[m_local] == q && i0 < lora_q_rank[q]) {
            const float* src = lora.s + static_cast<size_t>(m0 + m_local) * s_stride +
                               module * kHalf + i0;
            lo[j] = __ldcg(reinterpret_cast<const float4*>(src));
            hi[j] = __ldcg(reinterpret_cast<const float4*>(src) + 1);
            rank_of[j] = lora_q_rank[q] - i0;
            scale_of[j] = lora_q_scale[q];
          }
        }
#pragma unroll
        for (int j = 0; j < kUnitLoads; ++j) {
          const int idx = idx0 + j * kThreads;
          if (idx >= units) break;
          const int u = idx & 3;
          const int m_local = (idx >> 2) % kTokens;
          const int rest = (idx >> 2) / kTokens;
          const float v[8] = {lo[j].x, lo[j].y, lo[j].z, lo[j].w, hi[j].x, hi[j].y, hi[j].z, hi[j].w};
          uint32_t w[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float a = 2 * e < rank_of[j] ? scale_of[j] * v[2 * e] : 0.0f;
            const float c = 2 * e + 1 < rank_of[j] ? scale_of[j] * v[2 * e + 1] : 0.0f;
            const __nv_bfloat162 pair = __floats2bfloat162_rn(a, c);
            w[e] = *reinterpret_cast<const uint32_t*>(&pair);
          }
          const int offset = rest * kSTileBytes + m_local * 64 + ((u ^ ((m_local >> 1) & 3)) * 16);
          *reinterpret_cast<uint4*>(smem + (s_region - base) + offset) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      fence_proxy_async_smem();  // the tiles are read by wgmma (the async proxy)
      __syncthreads();
      mbar_wait(smem_addr(&lora_bar), phase);
      phase ^= 1;
      if (b0 == 0) lora_stamp(lora, kStampTilesReady);
      // The steps in fence .. wait groups of fixed shape (4 steps, then single ones), with
      // the accumulators pinned around each: with loops of run-time length inside one
      // group, ptxas serialises every wgmma of the kernel, the main loop's too. The steps
      // run in the same order whatever the grouping, so the sums are the same bits.
      const uint32_t a_base = base + wg * (kLoraBBlockBytes / 2);
      const uint32_t s_base = s_region + wg * blocks_max * kSTileBytes;
      const int steps = lora_num_steps;
      int k = 0;
      for (; k + 4 <= steps; k += 4) {
        uint32_t a_tile[4], s_tile[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a_tile[j] = a_base + lora_step_a[k + j];
          s_tile[j] = s_base + lora_step_s[k + j];
        }
        wgmma_fence_operands(acc);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int st = 0; st < kLoraRankBlock / 16; ++st) {
            wgmma_tile<kTokens>(acc, wgmma_desc_sw64(a_tile[j] + st * 32),
                                wgmma_desc_sw64(s_tile[j] + st * 32));
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
      }
      for (; k < steps; ++k) {
        const uint32_t a_tile = a_base + lora_step_a[k], s_tile = s_base + lora_step_s[k];
        wgmma_fence_operands(acc);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < kLoraRankBlock / 16; ++st) {
          wgmma_tile<kTokens>(acc, wgmma_desc_sw64(a_tile + st * 32),
                              wgmma_desc_sw64(s_tile + st * 32));
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
      }
      __syncthreads();  // both warpgroups are done with the tiles (and the lists)
    }
    lora_stamp(lora, kStampExpanded);
    lora_stamp(lora, kStampKind, 2);
  }

  // Accumulator i of a thread: token n = 8 (i / 4) + 2t + i % 2, weight row
  // r = 64 wg + 16 warp_in_wg + g + 8 ((i / 2) % 2) of the tile.
  float* parked = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kTokens / 2; ++i) {
    const int m_local = 8 * (i >> 2) + 2 * t + (i & 1);
    const int r = 64 * wg + 16 * warp_in_wg + g + 8 * ((i >> 1) & 1);
    parked[m_local * kPartialStride + r] = acc[i];
  }

  cg::cluster_group cluster = cg::this_cluster();
  const int splits = p.splits;
  if (splits > 1) {
    cluster.sync();  // every CTA of the cluster has parked its partial tile
  } else {
    __syncthreads();
  }
  const int rank = splits > 1 ? static_cast<int>(cluster.block_rank()) : 0;
  // Four neighbouring rows of the parked tiles summed over the cluster in rank order; the
  // (up to 8) remote loads are issued together so their latency is paid once.
  auto cluster_sum4 = [&](int at) {
    if (splits == 1) return *reinterpret_cast<const float4*>(parked + at);
    float4 part[kSkinnyMaxSplits];
#pragma unroll
    for (int s = 0; s < kSkinnyMaxSplits; ++s) {
      if (s < splits) {
        part[s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(parked, s) + at);
      }
    }
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kSkinnyMaxSplits; ++s) {
      if (s < splits) {
        sum.x += part[s].x;
        sum.y += part[s].y;
        sum.z += part[s].z;
        sum.w += part[s].w;
      }
    }
    return sum;
  };
  const bool fused = kLora && lora.mode == kLoraFused;
  if (lora_tile) {
    // The shrink's sums of the tokens that use this slot: row j of the stacked A is rank
    // i = j mod r of module j / r, stored at s[token][module · 64 + i].
    const int r = lora.slots[lora_slot].rank;
    const RankShare share = rank_share(rank, valid_tokens * (kRows / 4), splits);
    for (int grp = share.lo + tid; grp < share.hi; grp += kThreads) {
      const int m_local = grp / (kRows / 4), c0 = (grp % (kRows / 4)) * 4;
      const int token = m0 + m_local;
      const int j0 = lora_h0 * kHalf + c0;
      if (j0 >= lora_rows || lora_token_slot[m_local] != lora_slot) continue;
      const float4 sum = cluster_sum4(m_local * kPartialStride + c0);
      const float v4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = j0 + c;
        if (j >= lora_rows) break;
        const int m = j / r;
        lora.s[static_cast<size_t>(token) * s_stride + m * kHalf + (j - m * r)] = v4[c];
      }
    }
    if (fused) {
      // Each CTA signals its own sums: the barrier orders its threads' writes before thread
      // 0's release, which publishes them at GPU scope (no cluster-wide wait before it).
      __syncthreads();
      if (tid == 0) red_release_gpu_add(&lora.counters[0], 1u);
    }
    if (splits > 1) {
      cluster.sync();  // keep this CTA's tile alive until the others have read it
    } else {
      __syncthreads();
    }
    if (fused && tid == 0 && rank == 0) lora_cluster_finished(lora);
    lora_stamp(lora, kStampEnd);
    return;
  }
  if constexpr (kEpi == Epi::kQkNormRope) {
    // The cluster's CTAs share the tile's token rows (rank_share), a warp a row.
    const RankShare rows = rank_share(rank, valid_tokens, splits);
    for (int m_local = rows.lo + (tid >> 5); m_local < rows.hi; m_local += kThreads / 32) {
      const float4 sum = cluster_sum4(m_local * kPartialStride + 4 * lane);
      qk_finish_row(p.qk, tile, m0 + m_local, sum, qk_lane, lane);
    }
    if (splits > 1) cluster.sync();
    if (fused && tid == 0 && rank == 0) lora_cluster_finished(lora);
    if constexpr (kLora) lora_stamp(lora, kStampEnd);
    return;
  }
  // The cluster's CTAs share the tile's groups of 4 columns (rank_share).
  constexpr int kGroupsPerToken = (kGated ? kHalf : kRows) / 4;
  const RankShare share = rank_share(rank, valid_tokens * kGroupsPerToken, splits);
  for (int grp = share.lo + tid; grp < share.hi; grp += kThreads) {
    const int m_local = grp / kGroupsPerToken, c0 = (grp % kGroupsPerToken) * 4;
    const size_t out_row = static_cast<size_t>(m0 + m_local);
    if constexpr (kGated) {
      // Rounded to bf16 before the activation, as the unfused matmul + silu_mul would.
      const float4 gate = cluster_sum4(m_local * kPartialStride + c0);
      const float4 up = cluster_sum4(m_local * kPartialStride + kHalf + c0);
      const float g4[4] = {bf16_round(gate.x), bf16_round(gate.y), bf16_round(gate.z),
                           bf16_round(gate.w)};
      const float u4[4] = {bf16_round(up.x), bf16_round(up.y), bf16_round(up.z), bf16_round(up.w)};
      const int i0 = tile * kHalf + c0;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (i0 + c >= p.inter) break;
        const float gv = g4[c], uv = u4[c];
        static_cast<__nv_bfloat16*>(p.out)[out_row * p.inter + i0 + c] =
            __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
      }
    } else {
      const float4 sum = cluster_sum4(m_local * kPartialStride + c0);
      const float v4[4] = {sum.x, sum.y, sum.z, sum.w};
      const int n0 = tile * kRows + c0;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (n0 + c >= p.N) break;
        if constexpr (kOutF32) {
          static_cast<float*>(p.out)[out_row * p.N + n0 + c] = v4[c];
        } else {
          static_cast<__nv_bfloat16*>(p.out)[out_row * p.N + n0 + c] = __float2bfloat16_rn(v4[c]);
        }
      }
    }
  }
  if (splits > 1) cluster.sync();  // keep this CTA's tile alive until the others have read it
  if (fused && tid == 0 && rank == 0) lora_cluster_finished(lora);
  if constexpr (kLora) lora_stamp(lora, kStampEnd);
#else
  // Built for a target without wgmma: the host never launches this (see the file comment).
  __trap();
#endif
}

/// One 16-byte unit per thread: unit u of row r of half h of block (tile, chunk), written
/// where TMA's 128-byte swizzle puts it (pack_skinny_weights).
constexpr int kUnitsPerRow = kRowBytes / 16;              // 8
constexpr int kUnitsPerHalf = kHalf * kUnitsPerRow;       // 512
constexpr int kUnitsPerBlock = kWeightStageBytes / 16;    // 1024
static_assert(kUnitsPerBlock == 2 * kUnitsPerHalf, "a block is two 64-row halves");

__global__ void pack_kernel(const __nv_bfloat16* __restrict__ w, int64_t N, int64_t K,
                            int64_t inter, int chunks, int64_t units, uint4* __restrict__ packed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int u = static_cast<int>(i % kUnitsPerRow);
    const int r = static_cast<int>((i / kUnitsPerRow) % kHalf);
    const int h = static_cast<int>((i / kUnitsPerHalf) % 2);
    const int64_t block = i / kUnitsPerBlock, tile = block / chunks, chunk = block % chunks;
    const int64_t row = half_first_row(tile, h, inter) + r;
    const int64_t k = chunk * kChunk + u * 8;  // 8 bf16 a unit
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < N && k < K) v = *reinterpret_cast<const uint4*>(w + row * K + k);
    packed[block * kUnitsPerBlock + h * kUnitsPerHalf + r * kUnitsPerRow + (u ^ (r % 8))] = v;
  }
}

/// One 16-byte unit per thread of a packed LoRA A (lora_packed_a_bytes): unit u of row r of
/// half h of chunk c at ((c · halves + h) · 64 + r) · 8 + (u ^ (r mod 8)).
__global__ void pack_lora_kernel(const __nv_bfloat16* __restrict__ a, int64_t rows, int64_t in,
                                 int halves, int64_t units, uint4* __restrict__ packed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int u = static_cast<int>(i % kUnitsPerRow);
    const int r = static_cast<int>((i / kUnitsPerRow) % kHalf);
    const int64_t half_block = i / kUnitsPerHalf;  // c · halves + h
    const int h = static_cast<int>(half_block % halves);
    const int64_t c = half_block / halves;
    const int64_t row = static_cast<int64_t>(h) * kHalf + r, k = c * kChunk + u * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < rows && k < in) v = *reinterpret_cast<const uint4*>(a + row * in + k);
    packed[half_block * kUnitsPerHalf + r * kUnitsPerRow + (u ^ (r % 8))] = v;
  }
}

/// One 16-byte unit (8 ranks of one column) per thread of a packed B (lora_packed_b_bytes):
/// unit u of row r of block kb of row tile t at ((t · blocks + kb) · 128 + r) · 4 +
/// (u ^ ((r / 2) mod 4)); row r is the group column half_first_row(t, r / 64, inter) + r mod
/// 64, read from Bᵀ [rank, width_total].
__global__ void pack_lora_b_kernel(const __nv_bfloat16* __restrict__ bt, int rank,
                                   int64_t width_total, int64_t inter, int blocks, int64_t units,
                                   uint4* __restrict__ packed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int u = static_cast<int>(i % 4);
    const int r = static_cast<int>((i / 4) % kRows);
    const int64_t block = i / (4 * kRows);  // t · blocks + kb
    const int kb = static_cast<int>(block % blocks);
    const int64_t t = block / blocks;
    const int64_t within = (inter > 0 ? t * kHalf : t * kRows + (r / kHalf) * kHalf) + r % kHalf;
    const bool valid = inter > 0 ? within < inter : within < width_total;
    const int64_t col = half_first_row(t, r / kHalf, inter) + r % kHalf;
    __align__(16) __nv_bfloat16 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k = kb * kLoraRankBlock + u * 8 + j;
      v[j] = valid && k < rank ? bt[static_cast<int64_t>(k) * width_total + col]
                               : __float2bfloat16_rn(0.0f);
    }
    packed[block * (4 * kRows) + r * 4 + (u ^ ((r >> 1) & 3))] = *reinterpret_cast<const uint4*>(v);
  }
}

// ---- host ----------------------------------------------------------------------------------


/// The TMA map of a row-major bf16 [rows, K] operand read in boxes of 64 k x box_rows rows.
const CUtensorMap& tensor_map(const void* data, int64_t rows, int64_t K, int box_rows) {
  return bf16_tensor_map(data, rows, K, kChunk, box_rows, "skinny gemm");
}

template <int kTokens>
void set_smem_limits() {
  const int bytes = smem_bytes(kTokens);
  for (const void* kernel :
       {reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kBf16, false>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kF32, false>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kGated, false>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kQkNormRope, false>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kBf16, true>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kGated, true>),
        reinterpret_cast<const void*>(skinny_gemm_kernel<kTokens, Epi::kQkNormRope, true>)}) {
    PAGELLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
}

using SkinnyKernel = void (*)(Params);

/// The kernel a launch with `epi` runs: the LoRA-capable instantiation when `lora` (never
/// for kF32, which LoRA does not use), else the plain one.
template <int kTokens>
SkinnyKernel kernel_for(Epi epi, bool lora) {
  if (lora && epi != Epi::kF32) {
    switch (epi) {
      case Epi::kGated: return skinny_gemm_kernel<kTokens, Epi::kGated, true>;
      case Epi::kQkNormRope: return skinny_gemm_kernel<kTokens, Epi::kQkNormRope, true>;
      default: return skinny_gemm_kernel<kTokens, Epi::kBf16, true>;
    }
  }
  switch (epi) {
    case Epi::kGated: return skinny_gemm_kernel<kTokens, Epi::kGated, false>;
    case Epi::kF32: return skinny_gemm_kernel<kTokens, Epi::kF32, false>;
    case Epi::kQkNormRope: return skinny_gemm_kernel<kTokens, Epi::kQkNormRope, false>;
    default: return skinny_gemm_kernel<kTokens, Epi::kBf16, false>;
  }
}

template <int kTokens>
void launch_for_tokens(const Params& p, Epi epi, dim3 grid, cudaStream_t stream) {
  launch_kernel(kernel_for<kTokens>(epi, p.lora.mode != kLoraNone), grid, dim3(kThreads),
                smem_bytes(kTokens), stream, p.splits, p);
}

void launch_params(const Params& p, Epi epi, int tokens, dim3 grid, cudaStream_t stream) {
  switch (tokens) {
    case 8: launch_for_tokens<8>(p, epi, grid, stream); break;
    case 16: launch_for_tokens<16>(p, epi, grid, stream); break;
    case 32: launch_for_tokens<32>(p, epi, grid, stream); break;
    default: launch_for_tokens<64>(p, epi, grid, stream); break;
  }
}

/// Clusters of (1, splits, 1) CTAs of this kernel that the current device holds at once
/// (cached per device, kernel and split count): a fused LoRA launch must fit in it.
int max_resident_clusters(int tokens, Epi epi, int splits) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, int> cache;
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(device, tokens, static_cast<int>(epi), splits);
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const void* kernel = reinterpret_cast<const void*>(
      tokens == 8    ? kernel_for<8>(epi, true)
      : tokens == 16 ? kernel_for<16>(epi, true)
      : tokens == 32 ? kernel_for<32>(epi, true)
                     : kernel_for<64>(epi, true));
  const size_t smem = smem_bytes(tokens);
  int clusters = 0;
  if (splits > 1) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1, static_cast<unsigned>(splits), 1);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = static_cast<unsigned>(splits);
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    PAGELLM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  } else {
    int per_sm = 0, sms = 0;
    PAGELLM_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    current_device_info(&sms);
    clusters = per_sm * sms;
  }
  cache.emplace(key, clusters);
  return clusters;
}

/// The LoRA parameters of a launch with `lora` (null: none), checked against the product.
LoraParams lora_params(const SkinnyLora* lora, Epi epi, int64_t N, int64_t inter) {
  LoraParams l;
  if (lora == nullptr || lora->num_slots <= 1) return l;
  const int64_t width_total = lora->width[0] + lora->width[1] + lora->width[2];
  const int64_t group_cols = epi == Epi::kGated ? 2 * inter : N;
  bool widths_ok = lora->num_modules >= 1 && lora->num_modules <= 3;
  for (int m = 0; m < 3; ++m) {
    widths_ok = widths_ok && lora->width[m] % kSkinnyLoraWidthMultiple == 0 &&
                lora->width[m] >= 0 &&
                (m < lora->num_modules || lora->width[m] == 0);
  }
  PAGELLM_CHECK(epi != Epi::kF32 && widths_ok && width_total == group_cols && lora->slots &&
                lora->num_slots <= kSkinnyLoraMaxSlots &&
                lora->row_slots && lora->s)
      << "skinny gemm: LoRA of " << lora->num_modules << " modules of widths " << lora->width[0]
      << ", " << lora->width[1] << ", " << lora->width[2] << " on a product of " << group_cols
      << " columns with " << lora->num_slots << " slots (needs 1..3 modules of widths a "
         "multiple of " << kSkinnyLoraWidthMultiple << " covering the product, at most " << kSkinnyLoraMaxSlots
      << " slots, a bf16 output, slot table, row slots and scratch)";
  l.slots = lora->slots;
  l.num_slots = lora->num_slots;
  l.row_slots = lora->row_slots;
  l.s = lora->s;
  l.counters = lora->counters;
  l.stamps = lora->stamps;
  l.modules = lora->num_modules;
  for (int m = 0; m < 3; ++m) l.width[m] = static_cast<int>(lora->width[m]);
  l.width_total = static_cast<int>(width_total);
  PAGELLM_CHECK(lora->max_rank >= 1 && lora->max_rank <= kHalf)
      << "skinny gemm: LoRA max rank " << lora->max_rank << " outside 1.." << kHalf;
  l.max_rank = lora->max_rank;
  l.tiles_per_slot = (lora->num_modules * lora->max_rank + kRows - 1) / kRows;
  return l;
}

void launch(const void* x, const void* w, void* out, Epi epi, int64_t M, int64_t N, int64_t K,
            int64_t inter, cudaStream_t stream, int splits, const QkNormRopeArgs* qk = nullptr,
            const void* w_packed = nullptr, bool batch_invariant = false,
            const SkinnyLora* lora = nullptr) {
  PAGELLM_CHECK(reinterpret_cast<uintptr_t>(w_packed) % 16 == 0)
      << "skinny gemm: packed weights must be 16-byte aligned";
  int sms = 0;
  current_device_info(&sms);
  PAGELLM_CHECK(!batch_invariant || splits == 0)
      << "skinny gemm: batch-invariant mode fixes the split count; do not force one";
  // The plan of the product alone: a row's bits do not depend on whether LoRA tiles run.
  const SkinnyPlan plan = batch_invariant ? skinny_gemm_invariant_plan(M, N, K, sms)
                                          : skinny_gemm_plan(M, N, K, sms, splits);
  prepare_skinny_gemm();
  Params p{};
  p.w_map = tensor_map(w, N, K, kHalf);
  p.x_map = tensor_map(x, M, K, plan.tokens_per_tile);
  p.out = out;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.chunks = static_cast<int>((K + kChunk - 1) / kChunk);
  p.splits = plan.splits;
  p.inter = static_cast<int>(inter);
  if (qk) p.qk = *qk;
  p.w_packed = static_cast<const uint8_t*>(w_packed);
  p.lora = lora_params(lora, epi, N, inter);
  p.lora.row_tiles = plan.grid_x;
  const dim3 grid(plan.grid_x, plan.grid_y, plan.grid_z);
  if (p.lora.tiles_per_slot == 0) {
    launch_params(p, epi, plan.tokens_per_tile, grid, stream);
    return;
  }
  const int lora_tiles = (lora->num_slots - 1) * p.lora.tiles_per_slot;
  const int64_t clusters = static_cast<int64_t>(lora_tiles + plan.grid_x) * plan.grid_z;
  if (p.lora.counters != nullptr &&
      clusters <= max_resident_clusters(plan.tokens_per_tile, epi, plan.splits)) {
    // One launch: LoRA tiles first; the row tiles' epilogues wait for them.
    p.lora.mode = kLoraFused;
    p.lora.tiles = lora_tiles;
    p.lora.shrink_ctas = static_cast<unsigned>(lora_tiles * plan.grid_z * plan.grid_y);
    launch_params(p, epi, plan.tokens_per_tile,
                  dim3(lora_tiles + plan.grid_x, plan.grid_y, plan.grid_z), stream);
    return;
  }
  // The grid would not fit at once: the shrink tiles, then the product with the expand.
  Params shrink = p;
  shrink.lora.mode = kLoraShrink;
  shrink.lora.tiles = lora_tiles;
  launch_params(shrink, epi, plan.tokens_per_tile, dim3(lora_tiles, plan.grid_y, plan.grid_z),
                stream);
  p.lora.mode = kLoraExpand;
  p.lora.tiles = 0;
  launch_params(p, epi, plan.tokens_per_tile, grid, stream);
}

}  // namespace

void prepare_skinny_gemm() {
  once_per_device(reinterpret_cast<const void*>(&prepare_skinny_gemm), [] {
    set_smem_limits<8>();
    set_smem_limits<16>();
    set_smem_limits<32>();
    set_smem_limits<64>();
  });
}

bool skinny_gemm_supported(const void* x, const void* w, const void* out, int64_t M, int64_t N,
                           int64_t K) {
  const auto addr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
  // TMA: 16-byte aligned bases and row strides (K % 8), dims under 2^32; sizes travel as
  // int, grid.z (M / 64 tiles) stays under 65,536. wgmma: sm_90 (this binary's sm_90a code).
  return M > 0 && N > 0 && K > 0 && K % 8 == 0 && addr(x) % 16 == 0 && addr(w) % 16 == 0 &&
         addr(out) % 4 == 0 && M <= (int64_t{1} << 22) && N < (int64_t{1} << 30) &&
         K < (int64_t{1} << 30) && current_device_info(nullptr) == 90;
}

SkinnyPlan skinny_gemm_plan(int64_t M, int64_t N, int64_t K, int num_sms, int splits) {
  SkinnyPlan plan;
  plan.tokens_per_tile = M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : kSkinnyMaxTokensPerTile;
  plan.grid_z = static_cast<int>((M + plan.tokens_per_tile - 1) / plan.tokens_per_tile);
  const int64_t row_tiles = (N + kRows - 1) / kRows;
  const int64_t chunks = (K + kChunk - 1) / kChunk;
  const int64_t tiles = row_tiles * plan.grid_z;
  int64_t s = splits;
  if (s <= 0) {
    // The largest power-of-two split up to kSkinnyAutoMaxSplits that keeps the grid within
    // two CTAs per SM, with at least two chunks per split.
    const int64_t slots = 2 * static_cast<int64_t>(std::max(num_sms, 1));
    s = 1;
    while (s * 2 <= kSkinnyAutoMaxSplits && tiles * s * 2 <= slots && chunks / (s * 2) >= 2) {
      s *= 2;
    }
  }
  s = std::clamp<int64_t>(s, 1, std::min<int64_t>(kSkinnyMaxSplits, chunks));
  plan.splits = static_cast<int>(s);
  plan.grid_x = static_cast<int>(row_tiles);
  plan.grid_y = plan.splits;
  return plan;
}

SkinnyPlan skinny_gemm_invariant_plan(int64_t M, int64_t N, int64_t K, int num_sms) {
  // The split count of a single 64-token tile; the token tile itself is fixed at 64.
  SkinnyPlan plan = skinny_gemm_plan(kSkinnyMaxTokensPerTile, N, K, num_sms);
  plan.grid_z = static_cast<int>((M + kSkinnyMaxTokensPerTile - 1) / kSkinnyMaxTokensPerTile);
  return plan;
}

void launch_skinny_gemm(const void* x, const void* w, void* out, bool out_f32, int64_t M,
                        int64_t N, int64_t K, cudaStream_t stream, int splits,
                        const void* w_packed, bool batch_invariant, const SkinnyLora* lora) {
  PAGELLM_CHECK(skinny_gemm_supported(x, w, out, M, N, K))
      << "skinny gemm: unsupported product x[" << M << ", " << K << "] w[" << N << ", " << K
      << "]^T (needs an sm_90 GPU, K a multiple of 8, 16-byte aligned x and w, 4-byte "
         "aligned out)";
  launch(x, w, out, out_f32 ? Epi::kF32 : Epi::kBf16, M, N, K, 0, stream, splits, nullptr,
         w_packed, batch_invariant, lora);
}

void launch_skinny_gemm_silu_mul(const void* x, const void* w_gate_up, void* out, int64_t M,
                                 int64_t inter, int64_t K, cudaStream_t stream, int splits,
                                 const void* w_packed, bool batch_invariant,
                                 const SkinnyLora* lora) {
  PAGELLM_CHECK(inter > 0 && skinny_gemm_supported(x, w_gate_up, out, M, 2 * inter, K))
      << "skinny gemm: unsupported gated product x[" << M << ", " << K << "] w[2 x " << inter
      << ", " << K << "]^T (needs an sm_90 GPU, K a multiple of 8, 16-byte aligned x and w, "
         "4-byte aligned out)";
  launch(x, w_gate_up, out, Epi::kGated, M, 2 * inter, K, inter, stream, splits, nullptr,
         w_packed, batch_invariant, lora);
}

void launch_skinny_gemm_qk_norm_rope(const void* x, const void* w_qkv, int64_t M, int64_t K,
                                     const QkNormRopeArgs& e, cudaStream_t stream, int splits,
                                     const void* w_packed, bool batch_invariant,
                                     const SkinnyLora* lora) {
  const int64_t heads = int64_t{e.num_q_heads} + 2 * int64_t{e.num_kv_heads};
  const int64_t N = heads * kSkinnyQkHeadDim;
  const auto aligned8 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 8 == 0; };
  PAGELLM_CHECK(e.num_tokens == M && e.head_dim == kSkinnyQkHeadDim && e.num_q_heads > 0 &&
                e.num_kv_heads > 0 && e.num_q_heads % e.num_kv_heads == 0 &&
                e.page_size > 0 && e.num_pages > 0 && e.q_norm && e.k_norm && e.positions &&
                e.slot_mapping && aligned8(e.q_out) && aligned8(e.k_pool) && aligned8(e.v_pool) &&
                skinny_gemm_supported(x, w_qkv, e.q_out, M, N, K))
      << "skinny gemm: unsupported fused qkv product x[" << M << ", " << K << "] w[" << N << ", "
      << K << "]^T with " << e.num_tokens << " tokens, " << e.num_q_heads << " q and "
      << e.num_kv_heads << " kv heads of " << e.head_dim << " (needs " << kSkinnyQkHeadDim
      << "), page size " << e.page_size << ", " << e.num_pages
      << " pages (needs an sm_90 GPU, K a multiple of 8, 16-byte aligned x and w, 8-byte "
         "aligned q_out and pools, every pointer set)";
  if (M == 0) return;
  launch(x, w_qkv, nullptr, Epi::kQkNormRope, M, N, K, 0, stream, splits, &e, w_packed,
         batch_invariant, lora);
}

size_t lora_packed_a_bytes(int64_t rows, int64_t in) {
  const auto halves = static_cast<size_t>((rows + kHalf - 1) / kHalf);
  const auto chunks = static_cast<size_t>((in + kChunk - 1) / kChunk);
  return halves * chunks * kLoraHalfBytes;
}

void pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed, cudaStream_t stream) {
  PAGELLM_CHECK(rows > 0 && in > 0 && in % 8 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(packed) % 16 == 0)
      << "pack_lora_a: A [" << rows << ", " << in
      << "] (needs in a multiple of 8 and 16-byte aligned buffers)";
  const int halves = static_cast<int>((rows + kHalf - 1) / kHalf);
  const int64_t units = static_cast<int64_t>(lora_packed_a_bytes(rows, in) / 16);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 65535));
  pack_lora_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(a), rows, in,
                                             halves, units, static_cast<uint4*>(packed));
  PAGELLM_CUDA_CHECK(cudaGetLastError());
}

size_t lora_packed_b_bytes(int32_t rank, int64_t width_total) {
  // The product's row tiles: 128 columns each, for a gated product too (64 gate and 64 up
  // columns, so ceil(2 I / 128) = ceil(I / 64) tiles).
  const auto tiles = static_cast<size_t>((width_total + kRows - 1) / kRows);
  return tiles * static_cast<size_t>(lora_b_blocks(rank)) * kLoraBBlockBytes;
}

void pack_lora_b(const void* bt, int32_t rank, int64_t width_total, int64_t inter, void* packed,
                 cudaStream_t stream) {
  PAGELLM_CHECK(rank >= 1 && width_total > 0 && (inter == 0 || width_total == 2 * inter) &&
                reinterpret_cast<uintptr_t>(bt) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(packed) % 16 == 0)
      << "pack_lora_b: Bᵀ [" << rank << ", " << width_total << "] with inter " << inter
      << " (needs rank >= 1, width_total = 2 inter for a gated product, 16-byte aligned "
         "buffers)";
  const int blocks = lora_b_blocks(rank);
  const int64_t units = static_cast<int64_t>(lora_packed_b_bytes(rank, width_total) / 16);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 65535));
  pack_lora_b_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(bt), rank,
                                               width_total, inter, blocks, units,
                                               static_cast<uint4*>(packed));
  PAGELLM_CUDA_CHECK(cudaGetLastError());
}

size_t skinny_packed_bytes(int64_t N, int64_t K) {
  const auto tiles = static_cast<size_t>((N + kRows - 1) / kRows);
  const auto chunks = static_cast<size_t>((K + kChunk - 1) / kChunk);
  return tiles * chunks * kWeightStageBytes;
}

void pack_skinny_weights(const void* w, int64_t N, int64_t K, int64_t inter, void* packed,
                         cudaStream_t stream) {
  PAGELLM_CHECK(N > 0 && K > 0 && K % 8 == 0 && (inter == 0 || N == 2 * inter) &&
                reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(packed) % 16 == 0)
      << "pack_skinny_weights: w [" << N << ", " << K << "] with inter " << inter
      << " (needs K a multiple of 8, N = 2 inter for a gated product, 16-byte aligned buffers)";
  const int chunks = static_cast<int>((K + kChunk - 1) / kChunk);
  const int64_t units = static_cast<int64_t>(skinny_packed_bytes(N, K) / 16);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 65535));
  pack_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(w), N, K, inter,
                                        chunks, units, static_cast<uint4*>(packed));
  PAGELLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace pagellm::cuda
