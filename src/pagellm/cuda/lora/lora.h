// Launcher of the LoRA kernel (Backend::lora_add on the cuda backend; docs/design.md "LoRA").
//
// Takes raw device pointers and sizes, never engine types, so that the kernel can be tested
// and benchmarked alone; enqueues on `stream` only (no allocation, copy or synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagellm::cuda {

/// For rows t in [row_begin, row_end) (all bf16, float32 arithmetic):
///   s[i] = Σ_k x[t, k] · a[i, k]                    (shrink, i < rank, kept in float32)
///   out[t, col_offset + j] = bf16(out[...] + scale · Σ_i s[i] · b[j, i])   (expand, j < n_out)
/// x is [rows, in] row-major, a [rank, in], b [n_out, rank], out rows of ld_out elements.
/// rank is 1..64. One CTA per row; does nothing for an empty range.
void launch_lora_add(const void* x, int64_t in, const void* a, const void* b, int64_t rank,
                     int64_t n_out, float scale, void* out, int64_t ld_out, int64_t col_offset,
                     int64_t row_begin, int64_t row_end, cudaStream_t stream);

}  // namespace pagellm::cuda
