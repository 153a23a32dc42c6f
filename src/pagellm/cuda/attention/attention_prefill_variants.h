// Selectable implementations of paged_prefill_attention, for tests and benchmarks.
//
// paged_prefill_attention (attention.h) runs the variant CudaSettings::prefill_kernel names
// (PAGELLM_PREFILL_KERNEL: wgmma, wgmma-headmajor, wgmma-kvmajor, wgmma-serial or v2; unset
// or empty means the default, wgmma); the CUDA backend runs its own settings' variant
// through paged_prefill_attention_with. The test runs every prefill case through every
// variant, and the benchmark times each, so that the Hopper kernel can be switched off
// without a rebuild if it is slower or wrong somewhere.
#pragma once

#include <cuda_runtime.h>

#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {

/// The prefill kernels (PrefillKernel, cuda_settings.h). All compute the same thing (the
/// contract of attention.h) with the same grid (one CTA per query tile and head, tiles
/// found on the device from query_start):
///  - kV2: FlashAttention-2 on mma.sync, cp.async K/V gathers (attention_prefill.cu). Any
///    head_dim (64, 128), any page size, any GPU; 64-row tiles for queries of <= 64 rows.
///  - kWgmma: FlashAttention-3's scheme on Hopper (attention_prefill_sm90.cu): TMA K/V
///    pages, wgmma, a producer warpgroup and two consumer warpgroups. Needs head_dim 128, a
///    page size that is a multiple of 16, p.num_pages (the pools' extent, for the tensor
///    maps) and compute capability 9.0 (sm_90a code); other calls run kV2. The two
///    consumers take turns issuing their products, so that one's softmax runs under the
///    other's (FA3's ping-pong; 3-stage ring). Also for queries of <= 64 rows, where half
///    its 128-row tile idles: v2's 64-row tiles still took 2.0-2.7x as long there (1 to 64
///    tokens per sequence after 2k-32k keys, batches 1, 4 and 32; attention_bench
///    --chunks-only, H200, 2026-12-04).
///    Its grid's order follows prefill_grid_kv_major.
///  - kWgmmaHeadMajor, kWgmmaKvMajor: kWgmma with its grid's order fixed (heads fastest,
///    or KV head by KV head), whatever prefill_grid_kv_major says: to A/B the rule.
///  - kWgmmaSerial: the same kernel with each tile's S, softmax and P V in turn (2-stage
///    ring): the simpler loop, kept to A/B the ring and the turns, and as a fallback.

/// Whether the Hopper variants (kWgmma*) run `p` (the conditions above).
bool prefill_wgmma_supported(const PagedAttentionParams& p);

/// Whether kWgmma takes its grid's (query tile, query head) pairs KV head by KV head rather
/// than heads fastest: when the longest sequence's keys and values (max_kv_len tokens of
/// every KV head in both pools) exceed the L2 (`l2_bytes`; 0: unknown, heads fastest).
/// Heads fastest puts every head's heaviest tile in the first wave, so the CTAs running at
/// once read every KV head's keys; while those fit in L2 each is read from HBM about once
/// whatever the order, and the heads-fastest order balances the waves best. Past the L2,
/// KV head by KV head keeps the CTAs running at once on one or two KV heads' keys, which
/// then stay in L2. Engine prefill, Qwen3-4B, H200, 2026-12-05: +0.7 % at 16k tokens,
/// +1.5 % at 2 x 16k, +1.4 % at 32k, -0.6 % at 16 x 2k, 0 at 4 x 8k (docs/PERFORMANCE.md).
bool prefill_grid_kv_major(const PagedAttentionParams& p, int64_t l2_bytes);

/// paged_prefill_attention with an explicit variant (same contract, same errors); a Hopper
/// variant (kWgmma*) on a call it does not support runs kV2.
void paged_prefill_attention_with(const PagedAttentionParams& p, PrefillKernel kernel,
                                  cudaStream_t stream);

namespace attn {
/// The Hopper kernel's launcher (attention_prefill_sm90.cu); p already validated and
/// supported; `kernel` is one of its variants (kWgmma for anything else).
void launch_prefill_wgmma(const PagedAttentionParams& p, PrefillKernel kernel,
                          cudaStream_t stream);
}  // namespace attn

}  // namespace pagellm::cuda
