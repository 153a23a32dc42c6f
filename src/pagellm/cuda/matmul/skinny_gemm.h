// Weight-streaming matrix product for decode: out[M, N] = x[M, K] · w[N, K]ᵀ with few rows
// M (tokens), bf16 inputs, float32 accumulation, bf16 or float32 output.
//
// At decode M is 1..64 and the product reads every weight byte once for 2·M flops per
// weight: it is bound by HBM bandwidth, not by the tensor cores. The kernel (skinny_gemm.cu,
// whose top comment has the details) streams 128-row weight tiles with TMA through a
// 4- or 5-stage mbarrier pipeline, multiplies with warpgroup MMA (wgmma, operands read straight
// from shared memory, the weights as the 64-row operand), splits K over a thread-block
// cluster for narrow N and reduces the split partial sums through distributed shared memory
// in a fixed order (deterministic, no workspace, nothing to reset between graph replays). It
// is launched with programmatic dependent launch (pdl.cuh): its weight prefetch overlaps the
// tail of the kernel before it. sm_90 only (wgmma). Its reduction can finish the next op
// too: SiLU-and-multiply for the gate|up product, q/k-norm + RoPE + KV store for qkv.
//
// The launcher is graph-safe: the grid is a function of (M, N, K, SM count) only, no
// allocation, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/lora/lora.h"

namespace pagellm::cuda {

/// Largest token count one CTA handles; M above it is covered by more CTAs along grid.z,
/// each re-reading the weights (so the kernel is only worth it up to about this M).
constexpr int kSkinnyMaxTokensPerTile = 64;

/// Weight rows per CTA (8 warps of 16 rows).
constexpr int kSkinnyRowsPerCta = 128;

/// Most CTAs of one cluster (the split-K factor); 8 is the portable cluster size.
constexpr int kSkinnyMaxSplits = 8;

/// Most splits the automatic plan uses: on the H200, clusters of 8 (and of 5..7) ran the
/// narrow Qwen3-4B products 5-15 % slower than clusters of 4 (matmul_bench's split sweep).
constexpr int kSkinnyAutoMaxSplits = 4;


/// A LoRA group added inside a product (the `lora` argument of the launchers below;
/// docs/design.md "LoRA"): for every token t whose slot q = row_slots[t] is not 0 and whose
/// slots[q].a is set, the product's columns get B · bf16(scale · (x · Aᵀ)) of slot q's
/// factors (A read from slots[q].a_packed, B from slots[q].b_packed, written by pack_lora_a
/// and pack_lora_b), summed with the tensor cores into the product's own float32
/// accumulators, so before the one rounding to bf16 and before the fused epilogue (norm +
/// RoPE, SiLU) reads them. The group's modules cover the product's columns (gated: gate then
/// up), each module's width a multiple of kSkinnyLoraWidthMultiple. The shrink runs as extra
/// tiles of the same kernel; with `counters` and a grid that fits the GPU at once, in the
/// same launch (the expand waits for it), otherwise as a launch before the product. Either
/// way the same arithmetic: a token's bits depend on neither the batch nor the launch
/// shape.
struct SkinnyLora {
  const LoraSlotRef* slots = nullptr;  // [num_slots] device memory (entry 0 unused)
  int32_t num_slots = 0;               // adapter slots + 1; <= 1: no LoRA
  const int32_t* row_slots = nullptr;  // [M] device memory
  int32_t num_modules = 0;             // 1..3
  int32_t max_rank = 64;               // no slot's rank exceeds it (1..64): sizes the grid
  int64_t width[3] = {0, 0, 0};        // multiples of 8
  float* s = nullptr;                  // lora_skinny_s_floats(M, num_modules) floats of scratch
  uint32_t* counters = nullptr;        // [2] device zeros (left zero), or null: two launches
  // Profiling only (matmul_bench --lora-timeline), null otherwise: per CTA of the launch
  // (linear block index) kSkinnyStamps globaltimer readings by its thread 0, see
  // SkinnyStamp.
  unsigned long long* stamps = nullptr;
};

/// What SkinnyLora::stamps holds per CTA: globaltimer (ns) at entry, after the wait for the
/// previous kernel, after the main loop, when thread 0 had issued the expand's B copies,
/// when it saw the shrink's counter complete, when the whole CTA passed that wait, after
/// its B copies and sum tiles, after its products, at the end; then kind (1: a LoRA tile,
/// 2: a row tile that ran the expand, 0: one that did not). Stamps a CTA did not reach
/// stay 0.
enum SkinnyStamp : int {
  kStampEntry, kStampWaited, kStampMainLoop, kStampBIssued, kStampCounterSeen,
  kStampShrinkReady, kStampTilesReady, kStampExpanded, kStampEnd, kStampKind, kSkinnyStamps
};

/// Module widths of a fused LoRA group are multiples of this: each 64-row half of a tile
/// (one warpgroup's rows) then belongs to one module, whose shrink sums it multiplies.
constexpr int64_t kSkinnyLoraWidthMultiple = 64;

/// Most entries of SkinnyLora::slots (slot 0 and 63 adapter slots): a tile keeps its
/// tokens' slots as a 64-bit mask.
constexpr int32_t kSkinnyLoraMaxSlots = 64;

/// Floats of SkinnyLora::s a product of M tokens needs.
inline int64_t lora_skinny_s_floats(int64_t M, int32_t num_modules) {
  return M * num_modules * 64;
}

/// Bytes of A [rows, in] packed for the LoRA tiles: per 64-wide chunk of `in`, its 64-row
/// halves of 8 KiB each in the kernel's swizzled stage layout (zeros past rows and in).
size_t lora_packed_a_bytes(int64_t rows, int64_t in);

/// Writes A [rows, in] (bf16, row-major, 16-byte aligned) into `packed`
/// (lora_packed_a_bytes, 16-byte aligned) on `stream`.
void pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed, cudaStream_t stream);

/// Bytes of a group's B packed for the fused expand: per row tile of the product (128
/// columns; a gated product's tile is 64 gate and the 64 matching up columns), per 32
/// ranks, 128 rows of 32 bf16 in the 64-byte-swizzled layout wgmma reads (8 KiB), zeros
/// past the rank and the columns.
size_t lora_packed_b_bytes(int32_t rank, int64_t width_total);

/// Writes B from Bᵀ [rank, width_total] (bf16, row-major, 16-byte aligned) into `packed`
/// (lora_packed_b_bytes, 16-byte aligned) on `stream`; `inter`: the gated product's I
/// (width_total = 2 I), or 0.
void pack_lora_b(const void* bt, int32_t rank, int64_t width_total, int64_t inter, void* packed,
                 cudaStream_t stream);

/// How one product is cut into CTAs: grid (row tiles, splits, token tiles), and a cluster
/// of (1, splits, 1) CTAs that share one output tile and split its K range.
struct SkinnyPlan {
  int tokens_per_tile = 8;  // 8, 16, 32 or 64: M padded to the mma's 8-token tiles
  int splits = 1;           // CTAs along K (grid.y, one cluster)
  int grid_x = 0, grid_y = 0, grid_z = 0;
};

/// Whether the kernel can compute this product: the current device is sm_90 (wgmma), K a
/// multiple of 8 and x, w 16-byte aligned (TMA), out aligned to its element. False, not an
/// error, without a device.
bool skinny_gemm_supported(const void* x, const void* w, const void* out, int64_t M, int64_t N,
                           int64_t K);

/// The plan launch_skinny_gemm uses for this shape on a GPU with `num_sms` multiprocessors.
/// `splits` > 0 forces that split count (clamped to [1, kSkinnyMaxSplits] and to the K
/// chunks; the benchmark sweeps it); 0 picks the largest power of two up to
/// kSkinnyAutoMaxSplits that keeps the grid within two CTAs per SM with at least two K
/// chunks per split.
SkinnyPlan skinny_gemm_plan(int64_t M, int64_t N, int64_t K, int num_sms, int splits = 0);

/// The plan of batch-invariant mode (CudaBackend::set_batch_invariant): 64-token tiles for
/// every M (grid.z = ceil(M / 64)) and the split count skinny_gemm_plan picks for one token
/// tile, so that the wgmma shape, the K range of each split and the order in which the
/// cluster sums the splits are functions of (N, K, SM count) alone. Every output element is
/// then the same sum in the same order whatever M is and whatever the other rows hold.
SkinnyPlan skinny_gemm_invariant_plan(int64_t M, int64_t N, int64_t K, int num_sms);

/// Raises the kernels' dynamic shared-memory limit (once per device, on the current
/// device). launch_skinny_gemm calls it too; calling it at set-up keeps the first launch
/// free of any runtime call but the launch itself (LtMatmul's constructor does).
void prepare_skinny_gemm();

/// Bytes of a weight matrix [N, K] packed for the skinny kernel: one 16 KiB block per
/// (128-row tile, 64-wide K chunk), N and K rounded up.
size_t skinny_packed_bytes(int64_t N, int64_t K);

/// Writes w [N, K] (bf16, row-major) into `packed` (skinny_packed_bytes(N, K), 16-byte
/// aligned) as the kernel's weight stages look in shared memory. Block (tile, chunk) sits at
/// (tile · chunks + chunk) · 16 KiB. Its two 8 KiB halves are the two 64-row boxes the kernel
/// loads: rows tile · 128 + 64 h + r, or, for a gated product (inter = I > 0, w = [gate; up]),
/// gate row tile · 64 + r and up row I + tile · 64 + r. Each holds 64 rows of 128 bytes in the
/// tensor map's 128-byte swizzle (16-byte unit u of row r at u ^ (r mod 8)), zeros where
/// the row or k lies outside w. A product given the packed copy reads one contiguous block
/// per stage instead of 128 bytes from each of 128 rows, and computes the same bits.
/// The CUDA backend packs a model's layer matrices at load (CudaBackend::prepare_matrix).
void pack_skinny_weights(const void* w, int64_t N, int64_t K, int64_t inter, void* packed,
                         cudaStream_t stream);

/// out[M, N] = x[M, K] · w[N, K]ᵀ on `stream`. x, w: bf16, rows contiguous (row stride K);
/// out: bf16 (out_f32 false) or float32, row stride N. `splits` as for skinny_gemm_plan.
/// `w_packed`, when given, is w as pack_skinny_weights(w, N, K, 0) wrote it, and the
/// kernel streams it instead of w.
/// Requires skinny_gemm_supported(); throws Error otherwise or if the launch fails.
/// `batch_invariant`: use skinny_gemm_invariant_plan (`splits` must then be 0).
/// `lora` (or null): a LoRA group added inside the product (out must then be bf16).
void launch_skinny_gemm(const void* x, const void* w, void* out, bool out_f32, int64_t M,
                        int64_t N, int64_t K, cudaStream_t stream, int splits = 0,
                        const void* w_packed = nullptr, bool batch_invariant = false,
                        const SkinnyLora* lora = nullptr);

/// out[M, I] = silu(x · gateᵀ) · (x · upᵀ) with w_gate_up = [gate; up] ([2 I, K], the fused
/// layout the model loads), bf16 out. Each of the two products is rounded to bf16 before the
/// activation, so the result equals launch_skinny_gemm into [M, 2 I] followed by
/// launch_silu_mul, without the intermediate's round trip or the extra kernel. Same
/// requirements and `splits` as launch_skinny_gemm (for N = 2 I).
/// `w_packed`: w_gate_up as pack_skinny_weights(w_gate_up, 2 I, K, I) wrote it, or null.
void launch_skinny_gemm_silu_mul(const void* x, const void* w_gate_up, void* out, int64_t M,
                                 int64_t inter, int64_t K, cudaStream_t stream, int splits = 0,
                                 const void* w_packed = nullptr, bool batch_invariant = false,
                                 const SkinnyLora* lora = nullptr);

/// Head size of the fused qkv product: one head per 128-row tile.
constexpr int kSkinnyQkHeadDim = kSkinnyRowsPerCta;

/// The attention block's first half in one kernel: qkv = x · w_qkvᵀ ([M, (Hq + 2 Hkv) · 128],
/// never written out), then what launch_qk_norm_rope_store_kv(e) does to it: per-head
/// RMSNorm (q_norm, k_norm) and RoPE of q and k at `positions`, q to q_out, k and v into the
/// pools at `slot_mapping` (e.qkv is not read; e.num_tokens must be M and e.head_dim 128).
/// Each product is rounded to bf16 first, so the result equals the two launches up to the
/// float order of the norm's sum of squares. The reduction gives each
/// warp whole 128-column head rows, which is why the head size must be the tile height.
/// Same requirements and `splits` as launch_skinny_gemm; throws Error naming what does not
/// fit. `w_packed`: w_qkv as pack_skinny_weights(w_qkv, N, K, 0) wrote it, or null.
void launch_skinny_gemm_qk_norm_rope(const void* x, const void* w_qkv, int64_t M, int64_t K,
                                     const QkNormRopeArgs& e, cudaStream_t stream,
                                     int splits = 0, const void* w_packed = nullptr,
                                     bool batch_invariant = false,
                                     const SkinnyLora* lora = nullptr);

}  // namespace pagellm::cuda
