// Device side of the tensor memory accelerator (TMA, sm_90): mbarriers that count the bytes
// an asynchronous copy delivers, 2-D tensor-map loads into shared memory and 2-D stores out
// of it. Shared by the skinny decode GEMM (skinny_gemm.cu), the TMA decode-attention kernel
// (attention_decode.cu) and the Hopper prefill attention kernel (attention_prefill_sm90.cu,
// which also stores its O tiles with tma_store); the host side (tensor maps) is tma.h.
//
// The loads' protocol: one thread arms a stage's mbarrier with the bytes it expects
// (mbar_arrive_expect_tx) and issues the copies that complete them; every consumer waits on
// the barrier's phase parity (mbar_wait), which flips once per use of the stage, so the n-th
// use of a stage waits for parity n & 1.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pagellm::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ uint32_t tma_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes initialised mbarriers visible to the async proxy (and the cluster); once, after
/// the inits and before the CTA barrier that publishes them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
/// A 2-D box of `map` at (col, row) into shared memory at dst; completes bytes on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int col, int row,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}
/// tma_load with an L2 cache policy (createpolicy).
__device__ __forceinline__ void tma_load_hint(uint32_t dst, const CUtensorMap* map, int col,
                                              int row, uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar), "l"(policy)
      : "memory");
}
/// `bytes` contiguous bytes from global memory (16-byte aligned, a multiple of 16) into
/// shared memory at dst with one bulk copy; completes the bytes on `bar`; L2 policy as for
/// tma_load_hint.
__device__ __forceinline__ void bulk_load_hint(uint32_t dst, const void* src, uint32_t bytes,
                                               uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
/// A 2-D box of shared memory at src (laid out as `map`'s box, swizzle included) into
/// `map` at (col, row), in this thread's bulk async-group; then tma_store_commit and, before
/// src is overwritten or the CTA exits, tma_store_wait_read. Needs a
/// fence_proxy_async_smem after the generic-proxy writes of src and a barrier between them.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, int col, int row,
                                          uint32_t src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::
                   "l"(reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/// Waits until this thread's committed TMA stores have read their shared memory (their
/// global writes may still be landing; the grid's completion covers them).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/// An L2 policy that evicts the lines it loads first (data read once: weights, K/V).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

#endif  // __CUDA_ARCH__ >= 900

}  // namespace pagellm::cuda
