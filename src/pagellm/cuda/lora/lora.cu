// LoRA's shrink and expand for one adapter segment, fused per row (Backend::lora_add).
//
// What: for each token row of a segment, s = x·Aᵀ (rank r <= 64 values) then
// out[:, col_offset:] += scale · s·Bᵀ, adding the adapter's delta into the slice of a fused
// q/k/v or gate/up output (or o_proj / down_proj's whole output).
//
// Why this shape: correctness first (docs/design.md "LoRA", not done: batched Punica-style
// kernels). One CTA per row keeps s in shared memory in float32, so the only rounding is
// the one bf16 store of each output (the CPU reference rounds nothing; PEFT in bf16 also
// rounds s). Shrink: each warp takes ranks i = warp, warp + 8, ... and its lanes stride
// over the input (coalesced over x and A's row i). Expand: threads take output columns;
// B's row j (r values) is read whole by one thread, which is uncoalesced across threads
// but B is at most [n_out, 64] bf16 and stays in L2 across the segment's rows.
// Roofline: a row reads r·(in + n_out)·2 bytes of factors (from L2 after the first row)
// plus its x row and output slice; for r = 32, H = 4096, q_proj: ~0.5 MB per row, so a
// 64-row decode step per module costs tens of µs from L2 — a later batched kernel that
// reads each factor once per segment (tiles of rows) is what the W1 target needs.
#include "pagellm/cuda/lora/lora.h"

#include <cuda_bf16.h>

#include "pagellm/common/check.h"
#include "pagellm/cuda/support/pdl.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRank = 64;

__global__ void __launch_bounds__(kThreads)
    lora_add_kernel(const bf16* __restrict__ x, int64_t in, const bf16* __restrict__ a,
                    const bf16* __restrict__ b, int rank, int64_t n_out, float scale,
                    bf16* __restrict__ out, int64_t ld_out, int64_t col_offset,
                    int64_t row_begin) {
  __shared__ float s[kMaxRank];
  // x and out are written by the kernels before this one: wait before reading anything.
  pdl_wait();
  const int64_t row = row_begin + blockIdx.x;
  const bf16* xr = x + row * in;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < rank; i += kWarps) {
    const bf16* ar = a + static_cast<int64_t>(i) * in;
    float acc = 0.0f;
    for (int64_t k = lane; k < in; k += 32) {
      acc += __bfloat162float(xr[k]) * __bfloat162float(ar[k]);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    }
    if (lane == 0) s[i] = acc;
  }
  __syncthreads();
  bf16* orow = out + row * ld_out + col_offset;
  for (int64_t j = threadIdx.x; j < n_out; j += kThreads) {
    const bf16* br = b + j * rank;
    float acc = 0.0f;
    for (int i = 0; i < rank; ++i) acc += s[i] * __bfloat162float(br[i]);
    orow[j] = __float2bfloat16(__bfloat162float(orow[j]) + scale * acc);
  }
  pdl_launch_dependents();
}

}  // namespace

void launch_lora_add(const void* x, int64_t in, const void* a, const void* b, int64_t rank,
                     int64_t n_out, float scale, void* out, int64_t ld_out, int64_t col_offset,
                     int64_t row_begin, int64_t row_end, cudaStream_t stream) {
  if (row_end <= row_begin || n_out == 0) return;
  PAGELLM_CHECK(rank >= 1 && rank <= kMaxRank)
      << "cuda lora_add: rank " << rank << " is outside 1.." << kMaxRank;
  launch_kernel(lora_add_kernel, dim3(static_cast<unsigned>(row_end - row_begin)),
                dim3(kThreads), 0, stream, 1, static_cast<const bf16*>(x), in,
                static_cast<const bf16*>(a), static_cast<const bf16*>(b),
                static_cast<int>(rank), n_out, scale, static_cast<bf16*>(out), ld_out,
                col_offset, row_begin);
}

}  // namespace pagellm::cuda
