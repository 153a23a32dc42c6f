// Device helpers for Hopper's warpgroup MMA (wgmma, sm_90a) and the warp-specialised
// pipelines around it: shared-memory matrix descriptors for 128-byte-swizzled tiles, the
// fence / commit / wait protocol, the MMA shapes the FA3-class prefill kernel uses,
// register reallocation between warpgroups (setmaxnreg), named barriers, plain mbarrier
// arrivals and the generic-to-async proxy fence. The TMA side (mbarrier waits with
// transaction bytes, tensor-map loads) is tma.cuh.
//
// Only compiled for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): wgmma and setmaxnreg do not exist in
// the portable compute_90 PTX. Kernels that use them guard their bodies with
// PAGELLM_WGMMA_AVAILABLE and trap otherwise.
//
// Layout the descriptors describe (one "atom" of the 128-byte swizzle): 8 rows of 128 bytes,
// 1024 bytes in all, 16-byte chunk c of row r stored at chunk c ^ (r % 8); atoms of
// consecutive 8-row groups 1024 bytes apart. A [rows][64] bf16 tile in that layout is what a
// TMA box of 64 columns with CU_TENSOR_MAP_SWIZZLE_128B writes at a 1024-byte aligned address.
//  - K-major operand (the reduction index contiguous, e.g. Q or K rows with d contiguous):
//    a k16 step is 32 bytes of each row; step s of a 64-wide half starts 32 s bytes in.
//  - MN-major operand (the output index contiguous, e.g. V [keys][d] as the B of P V): a
//    k16 step is 16 rows (two atoms, 2048 bytes); N = 64 spans one 128-byte row, and a
//    wider N takes 64-wide column blocks the leading byte offset apart
//    (wgmma_desc_sw128_mn).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGELLM_WGMMA_AVAILABLE 1
#endif

namespace pagellm::cuda {

#ifdef PAGELLM_WGMMA_AVAILABLE

/// Descriptor of a 128-byte-swizzled operand starting at shared address `addr` (inside a
/// 1024-byte aligned atom layout): stride byte offset 1024 (next 8-row group), leading byte
/// offset 16 bytes (unused by the shapes here), swizzle mode 128B.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

/// As wgmma_desc_sw128, for an MN-major operand wider than one 128-byte row: N = 64 · m
/// spans m column blocks of 64 elements, block b at `addr + b · block_bytes` (the leading
/// byte offset; CUTLASS's canonical MN-major SW128 layout ((8,8,m),(8,k)) : ((1,8,LBO),
/// (64,SBO)) in elements), rows of consecutive k 128 bytes apart within each block.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t addr, uint32_t block_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((block_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

/// Descriptor of a K-major operand in the 64-byte swizzle starting at shared address `addr`
/// (512-byte aligned): rows of 64 bytes (32 bf16), 16-byte chunk c of row r stored at chunk
/// c ^ ((r / 2) % 4), what a TMA box with CU_TENSOR_MAP_SWIZZLE_64B writes; stride byte
/// offset 512 (next 8-row group), swizzle mode 64B. A k16 step is 32 bytes of each row.
__device__ __forceinline__ uint64_t wgmma_desc_sw64(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{512 >> 4} << 32) | (uint64_t{2} << 62);
}

/// Orders this thread's register (accumulator / A fragment) writes before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most N committed wgmma groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// d[64 x 128] (+)= A[64 x 16] · B[16 x 128], A and B K-major in shared memory (descriptors);
/// `accumulate` false overwrites d (its old contents are ignored).
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

/// d[64 x 128] += A[64 x 16] · B[16 x 128]: A in registers (the m16n8k16 A fragment of
/// each warp's 16 rows), B MN-major in shared memory (wgmma_desc_sw128_mn: two 64-wide
/// column blocks; transposed on the fly), d as two halves (d0: columns 0..63, d1: 64..127,
/// each in the accumulator layout of an m64n64 product). One instruction where two
/// m64n64k16 products would send the same A registers twice.
__device__ __forceinline__ void wgmma_m64n128k16_rs_tn(float (&d0)[32], float (&d1)[32],
                                                       const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d0[0]), "+f"(d0[1]), "+f"(d0[2]), "+f"(d0[3]), "+f"(d0[4]), "+f"(d0[5]), "+f"(d0[6]), "+f"(d0[7]), "+f"(d0[8]), "+f"(d0[9]), "+f"(d0[10]), "+f"(d0[11]), "+f"(d0[12]), "+f"(d0[13]), "+f"(d0[14]), "+f"(d0[15]), "+f"(d0[16]), "+f"(d0[17]), "+f"(d0[18]), "+f"(d0[19]), "+f"(d0[20]), "+f"(d0[21]), "+f"(d0[22]), "+f"(d0[23]), "+f"(d0[24]), "+f"(d0[25]), "+f"(d0[26]), "+f"(d0[27]), "+f"(d0[28]), "+f"(d0[29]), "+f"(d0[30]), "+f"(d0[31]),
        "+f"(d1[0]), "+f"(d1[1]), "+f"(d1[2]), "+f"(d1[3]), "+f"(d1[4]), "+f"(d1[5]), "+f"(d1[6]), "+f"(d1[7]), "+f"(d1[8]), "+f"(d1[9]), "+f"(d1[10]), "+f"(d1[11]), "+f"(d1[12]), "+f"(d1[13]), "+f"(d1[14]), "+f"(d1[15]), "+f"(d1[16]), "+f"(d1[17]), "+f"(d1[18]), "+f"(d1[19]), "+f"(d1[20]), "+f"(d1[21]), "+f"(d1[22]), "+f"(d1[23]), "+f"(d1[24]), "+f"(d1[25]), "+f"(d1[26]), "+f"(d1[27]), "+f"(d1[28]), "+f"(d1[29]), "+f"(d1[30]), "+f"(d1[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

/// Pins accumulator registers at this point of the program: the compiler may not move
/// their reads or writes across it (CUTLASS's warpgroup_fence_operand). Used after
/// wgmma_wait (nothing touches a result before the MMA is done) and before wgmma_fence
/// (every update of an accumulator happens before the next MMA is issued).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// Lowers (dec) or raises (inc) the registers per thread of the calling warpgroup to N
/// (a multiple of 8 in 24..256); every warp of the warpgroup must execute it.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Arrives at barrier `id` without waiting: counts the calling warp's threads towards the
/// `threads` that a named_barrier_sync(id, threads) elsewhere waits for.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// One arrival on an mbarrier (no transaction bytes).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/// Makes this thread's generic-proxy shared-memory writes visible to the async proxy
/// (wgmma operand reads, TMA writes that follow).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#endif  // PAGELLM_WGMMA_AVAILABLE

}  // namespace pagellm::cuda
