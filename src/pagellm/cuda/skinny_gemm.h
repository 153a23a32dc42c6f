// Weight-streaming matrix product for decode: out[M, N] = x[M, K] · w[N, K]ᵀ with few rows
// M (tokens), bf16 inputs, float32 accumulation, bf16 or float32 output.
//
// At decode M is 1..64 and the product reads every weight byte once for 2·M flops per
// weight: it is bound by HBM bandwidth, not by the tensor cores. Measured on the H200 this
// kernel is slower than cuBLASLt on every Qwen3-4B decode shape (docs/design.md),
// so LtMatmul uses it only under PAGELLM_MATMUL=skinny. This kernel streams the weights (16-byte
// cp.async, several chunks in flight per warp), keeps x in L1/L2, multiplies on the tensor
// cores (mma.sync m16n8k16 with the weights as the A operand and the tokens as the 8-wide
// B operand) and splits K across warps and, for narrow N, across CTAs so that 132 SMs have
// work. Split-K partial sums are reduced in a fixed order (deterministic: no float atomics).
//
// The launcher is graph-safe: the grid is a function of (M, N, K, SM count) only, no
// allocation, no synchronisation; the split-K workspace is the caller's and its counters
// return to zero after every launch (so graph replays work).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pagellm::cuda {

/// Largest token count one CTA handles; M above it is covered by more CTAs along grid.z,
/// each re-reading the weights (so the kernel is only worth it up to about this M).
constexpr int kSkinnyMaxTokensPerTile = 64;

/// Bytes of the split-K workspace the launcher needs at most (partials plus counters);
/// plans whose partials would not fit use fewer splits, never more memory.
constexpr size_t kSkinnyPartialBytes = size_t{16} << 20;
constexpr int kSkinnyMaxCounters = 16384;
constexpr size_t kSkinnyWorkspaceBytes = kSkinnyPartialBytes + kSkinnyMaxCounters * sizeof(int);

/// How one product is cut into CTAs. A CTA is 4 warps; each warp owns 32 weight rows.
/// `rows_per_cta` / 32 warps share rows (the rest split the CTA's K range); `splits` CTAs
/// along grid.y divide K further and meet in the workspace.
struct SkinnyPlan {
  int tokens_per_tile = 8;  // 8, 16, 32 or 64: M padded to the mma's 8-token tiles
  int row_warps = 1;        // warps of a CTA on distinct rows: 1, 2 or 4 (k_warps = 4 / row_warps)
  int splits = 1;           // CTAs along K (grid.y)
  int grid_x = 0, grid_y = 0, grid_z = 0;
};

/// Whether the kernel can compute this product: K a multiple of 8 and x, w 16-byte aligned
/// (every 16-byte load then stays inside one row), out aligned to its element.
bool skinny_gemm_supported(const void* x, const void* w, const void* out, int64_t M, int64_t N,
                           int64_t K);

/// The plan launch_skinny_gemm uses for this shape on a GPU with `num_sms` multiprocessors
/// (exposed for the benchmark and tests).
SkinnyPlan skinny_gemm_plan(int64_t M, int64_t N, int64_t K, int num_sms);

/// Raises the kernels' dynamic shared-memory limit (once per process, on the current
/// device). launch_skinny_gemm calls it too; calling it at set-up keeps the first launch
/// free of any runtime call but the launch itself (LtMatmul's constructor does).
void prepare_skinny_gemm();

/// out[M, N] = x[M, K] · w[N, K]ᵀ on `stream`. x, w: bf16, rows contiguous (row stride K);
/// out: bf16 (out_f32 false) or float32, row stride N. `workspace` is device memory of
/// kSkinnyWorkspaceBytes whose last kSkinnyMaxCounters ints were zeroed once (cudaMemset)
/// before first use; launches on one workspace must be ordered (one stream). Requires
/// skinny_gemm_supported(); throws Error otherwise or if the launch fails.
void launch_skinny_gemm(const void* x, const void* w, void* out, bool out_f32, int64_t M,
                        int64_t N, int64_t K, void* workspace, cudaStream_t stream);

}  // namespace pagellm::cuda
