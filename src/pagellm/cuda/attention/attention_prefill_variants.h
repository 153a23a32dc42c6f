// Selectable implementations of paged_prefill_attention, for tests and benchmarks.
//
// paged_prefill_attention (attention.h) runs the variant named by the environment variable
// PAGELLM_PREFILL_KERNEL (v2 or v3; unset or empty means the default, v2). The test
// runs every variant on every case and the benchmark times each of them, so a variant that
// turns out slower or wrong on some GPU can be switched off without a rebuild.
#pragma once

#include <cuda_runtime.h>

#include "pagellm/cuda/attention/attention.h"

namespace pagellm::cuda {

/// The prefill kernels. All compute the same thing (the contract of attention.h); they
/// differ in tile shapes only. D = 128, more than 64 query rows (the Qwen3 shape):
///  - kV2: 128 x 64, 4 warps x 32 rows, 2-stage ring, two CTAs per SM (FlashAttention-2's
///         shape for D = 128), heavy tiles of every head first.
///  - kV3: 128 x 64, 8 warps x 16 rows with Q held in registers for the whole KV loop
///         (no Q re-reads), 3-stage ring, one CTA of 8 warps per SM, heavy tiles first.
/// Queries of at most 64 rows use 64-row tiles in both (Q in registers). The first kernel
/// (128 x 32 tiles, 208 TFLOP/s at 4k tokens on the H200 against v2's 295 and v3's 215,
/// 2026-11-29) was removed once v2 had passed the GPU suite.
enum class PrefillKernel { kV2, kV3 };

/// The variant paged_prefill_attention uses when PAGELLM_PREFILL_KERNEL is unset.
inline constexpr PrefillKernel kDefaultPrefillKernel = PrefillKernel::kV2;

/// "v2" or "v3".
const char* prefill_kernel_name(PrefillKernel k);

/// paged_prefill_attention with an explicit variant (same contract, same errors).
void paged_prefill_attention_with(const PagedAttentionParams& p, PrefillKernel kernel,
                                  cudaStream_t stream);

}  // namespace pagellm::cuda
