// Selectable implementations of paged_decode_attention, for tests and benchmarks.
//
// paged_decode_attention (attention.h) runs the variant CudaSettings::decode_kernel names
// (PAGELLM_DECODE_KERNEL: tma or cpasync; unset or empty means the default, tma); the CUDA
// backend runs its own settings' variant through paged_decode_attention_with. The test
// runs every variant on every decode case and the benchmark times each of them, so a
// variant that turns out slower or wrong on some GPU can be switched off without a rebuild.
#pragma once

#include <cuda_runtime.h>

#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {

/// The decode kernels (DecodeKernel, cuda_settings.h). Both compute the same thing (the contract of attention.h) with the
/// same CTA layout (one CTA of 4 warps per sequence, KV head and split; each warp streams
/// every 4th 16-key tile through a private 3-stage ring; tensor-core tiles; the warps'
/// softmax states merged at the end). They differ in how K/V reach shared memory:
///  - kCpAsync: every lane copies its share of each tile with 16-byte cp.async, reading the
///    page table per row. Any head_dim (64, 128), any page size, any GPU.
///  - kTma: one lane per warp issues TMA boxes for a whole tile (4 KB of K, 4 KB of V)
///    from tensor maps of the pools. Needs head_dim 128, a page size that is a multiple of
///    16, p.num_pages (the pools' extent) and sm_90; other calls run kCpAsync.

/// Whether kTma can run `p` (head_dim 128, page_size % 16 == 0, num_pages > 0 with fewer
/// than 2^31 pool rows, a device of compute capability 9.0 or newer).
bool decode_tma_supported(const PagedAttentionParams& p);

/// paged_decode_attention with an explicit variant (same contract, same errors); kTma on a
/// call it does not support runs kCpAsync.
void paged_decode_attention_with(const PagedAttentionParams& p, DecodeKernel kernel,
                                 cudaStream_t stream);

}  // namespace pagellm::cuda
