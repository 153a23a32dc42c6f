// Skinny (decode) matrix product: out[M, N] = x[M, K] · w[N, K]ᵀ, M ≤ 64 tokens per tile.
//
// Roofline. Bytes: N·K·2 of weights (read once) + M·K·2 of x + M·N·(2|4) of out; flops
// 2·M·N·K, i.e. M flops per weight byte. At 4.2 TB/s that is 134·M TFLOP/s: under the
// mma.sync rate up to M ≈ 64..128, so the whole design is about keeping HBM busy.
//
// Shape of the work. The product is computed transposed, outᵀ[N, M] = w · xᵀ, so that the
// weights are the mma's 16-row A operand and the tokens its 8-wide B operand (an 8-token
// tile wastes little at M = 1..8, where cuBLASLt pads M to 64 or more). Each warp owns 32
// weight rows (two m16 tiles) over a set of 64-wide K chunks; a CTA is 4 warps, which either
// share rows and split the CTA's K range (row_warps < 4) or own distinct rows and share x
// through L1 (row_warps > 1); grid.y splits K further for narrow N (o_proj, down at N =
// hidden), grid.z tiles M beyond 64 tokens.
//
// The k permutation. mma.m16n8k16 gives lane (g = lane/4, t = lane%4) the k indices
// {2t, 2t+1, 2t+8, 2t+9} of each 16-wide step. A dot product does not care which physical
// k is called which logical k, as long as A and B agree, so lane t takes the physical
// elements [q·32 + t·8, +8) of each 64-wide chunk (q = 0, 1) for both w and x: every load is
// one 16-byte vector, 4 lanes cover 64 contiguous bytes of a row, and the loaded registers
// are the mma fragments as they are (step s = 2q + e/4 uses elements e..e+3 of piece q).
//
// The weight pipeline. Each thread cp.async's its own 8 × 16-byte pieces of a chunk into a
// warp-private shared-memory slot and later reads back exactly those pieces, so a stage
// needs only cp.async.wait_group (no barrier); kStages chunks are in flight per warp, ~96 KB
// per SM at 2 CTAs. Weights carry an L2 evict-first hint (read once; keep x and the split-K
// partials in L2). x fragments are plain 16-byte loads (L1/L2 hits), issued before the wait
// on the chunk's weights so their latency hides behind it.
//
// Reductions, deterministic. Warps of a CTA that split K add through shared memory in warp
// order; CTAs that split K write float32 partials to the workspace, and the last CTA of a
// tile to arrive (a counter per tile, atomicAdd) sums all partials in split order and resets
// the counter to zero, so the sum never depends on timing and graph replays see clean
// counters.
#include "pagellm/cuda/skinny_gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "pagellm/cuda/cuda_check.h"

namespace pagellm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 32;
constexpr int kChunk = 64;   // K elements per pipeline stage
constexpr int kStages = 4;   // chunks in flight per warp (kStages - 1 ahead of the one in use)
constexpr int kPieces = 8;   // 16-byte weight pieces per thread per chunk: 2 m-tiles x 2 halves x 2 k halves
constexpr int kPieceStride = 32 * 16;                     // bytes: one piece for every lane
constexpr int kWarpStageBytes = kPieces * kPieceStride;  // 4 KiB: 32 rows x 64 k x 2 B
constexpr int kSmemBytes = kWarps * kStages * kWarpStageBytes;  // 64 KiB

struct Params {
  const __nv_bfloat16* x;  // [M, K]
  const __nv_bfloat16* w;  // [N, K]
  void* out;               // [M, N], bf16 or f32
  float* partials;         // [splits, M, N] when splits > 1
  int* counters;           // one per (grid.x, grid.z) tile when splits > 1, zero between launches
  int M, N, K;
  int row_warps, k_warps, splits;
  int chunks;  // ceil(K / kChunk)
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes,
                                            uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void ld_shared_v4(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/// d += A · B for one m16n8k16 bf16 tile (f32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int kTokens, bool kOutF32>
__global__ void __launch_bounds__(kThreads, 2) skinny_gemm_kernel(const __grid_constant__ Params p) {
  constexpr int kTiles = kTokens / 8;                    // 8-token mma tiles
  constexpr int kGroup = kTiles < 4 ? kTiles : 4;        // token tiles per x-load group
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int is_last_cta;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rw = warp % p.row_warps, kw = warp / p.row_warps;
  const int row0 = (blockIdx.x * p.row_warps + rw) * kRowsPerWarp;
  const int m0 = blockIdx.z * kTokens;
  const int split = blockIdx.y;
  const int c_begin = static_cast<int>(static_cast<int64_t>(split) * p.chunks / p.splits);
  const int c_end = static_cast<int>(static_cast<int64_t>(split + 1) * p.chunks / p.splits);
  const int c_first = c_begin + kw;  // this warp's chunks: c_first, + k_warps, ... < c_end
  const int num_chunks = c_first < c_end ? (c_end - c_first + p.k_warps - 1) / p.k_warps : 0;

  // Weight rows of this lane: r = 2·m_tile + half -> row row0 + 16·m_tile + 8·half + g.
  const __nv_bfloat16* w_row[4];
  bool row_ok[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = row0 + (r >> 1) * 16 + (r & 1) * 8 + g;
    row_ok[r] = row < p.N;
    w_row[r] = p.w + static_cast<size_t>(row_ok[r] ? row : 0) * p.K + t * 8;
  }
  const uint64_t policy = evict_first_policy();
  const uint32_t slot = smem_addr(smem) + warp * kStages * kWarpStageBytes + lane * 16;

  // Piece pc = 2·r + q of chunk `it` (the it-th of this warp) -> stage `stage`.
  auto issue_chunk = [&](int it, int stage) {
    const int k = (c_first + it * p.k_warps) * kChunk;
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      const int r = pc >> 1, q = pc & 1;
      const bool ok = row_ok[r] && k + q * 32 + t * 8 < p.K;  // K % 8 == 0: all or nothing
      const void* src = ok ? static_cast<const void*>(w_row[r] + k + q * 32) : p.w;
      cp_async_16(slot + (stage * kPieces + pc) * kPieceStride, src, ok ? 16 : 0, policy);
    }
  };
  // x fragments of token tiles [j0, j0 + kGroup) for the chunk starting at k: b[j][q] holds
  // x[m0 + 8j + g, k + 32q + 8t .. +8), zero past M or K.
  auto load_x = [&](int j0, int k, uint32_t (&b)[kGroup][2][4]) {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int m = m0 + (j0 + j) * 8 + g;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int kk = k + q * 32 + t * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (m < p.M && kk < p.K) {
          v = __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(m) * p.K + kk));
        }
        b[j][q][0] = v.x;
        b[j][q][1] = v.y;
        b[j][q][2] = v.z;
        b[j][q][3] = v.w;
      }
    }
  };

  float acc[2][kTiles][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_chunks) issue_chunk(s, s);
    cp_async_commit();  // empty groups keep the wait_group count uniform
  }
  for (int it = 0; it < num_chunks; ++it) {
    {
      const int ahead = it + kStages - 1;
      if (ahead < num_chunks) issue_chunk(ahead, ahead % kStages);
      cp_async_commit();
    }
    const int k = (c_first + it * p.k_warps) * kChunk;
    uint32_t b[kGroup][2][4];
    load_x(0, k, b);
    cp_async_wait<kStages - 1>();  // this thread's pieces of chunk `it` have landed
    uint32_t a[kPieces][4];
    const int stage = it % kStages;
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      ld_shared_v4(slot + (stage * kPieces + pc) * kPieceStride, a[pc]);
    }
#pragma unroll
    for (int j0 = 0; j0 < kTiles; j0 += kGroup) {
      if (j0 > 0) load_x(j0, k, b);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int q = s >> 1, e = (s & 1) * 2;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t* lo = a[(2 * i + 0) * 2 + q];  // row g of m-tile i
          const uint32_t* hi = a[(2 * i + 1) * 2 + q];  // row g + 8
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            mma_bf16(acc[i][j0 + j], lo[e], hi[e], lo[e + 1], hi[e + 1], b[j][q][e],
                     b[j][q][e + 1]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its pipeline slots: reuse them for the reduction

  // Warps that split the CTA's K range: kw > 0 park their sums, kw == 0 adds them in order.
  if (p.k_warps > 1) {
    float* park = reinterpret_cast<float*>(smem);
    constexpr int kPerWarp = 2 * kTiles * 4 * 32;
    if (kw > 0) {
      float* mine = park + ((kw - 1) * p.row_warps + rw) * kPerWarp + lane;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) mine[((i * kTiles + j) * 4 + e) * 32] = acc[i][j][e];
    }
    __syncthreads();
    if (kw == 0) {
      for (int o = 1; o < p.k_warps; ++o) {
        const float* theirs = park + ((o - 1) * p.row_warps + rw) * kPerWarp + lane;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < kTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += theirs[((i * kTiles + j) * 4 + e) * 32];
      }
    }
  }

  // Accumulator (i, j, e) is out[m, n] with n = row0 + 16i + 8(e/2) + g, m = m0 + 8j + 2t + e%2.
  auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = row0 + i * 16 + (e >> 1) * 8 + g;
          const int m = m0 + j * 8 + 2 * t + (e & 1);
          if (n < p.N && m < p.M) f(acc[i][j][e], static_cast<size_t>(m) * p.N + n);
        }
  };
  auto store = [&](float v, size_t at) {
    if constexpr (kOutF32) {
      static_cast<float*>(p.out)[at] = v;
    } else {
      static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(v);
    }
  };

  if (p.splits == 1) {
    if (kw == 0) for_each_output(store);
    return;
  }

  // Split-K across CTAs: publish this split's partial, then the last CTA sums all in order.
  const size_t split_stride = static_cast<size_t>(p.M) * p.N;
  if (kw == 0) {
    float* mine = p.partials + split * split_stride;
    for_each_output([&](float v, size_t at) { __stcg(mine + at, v); });
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.counters + blockIdx.z * gridDim.x + blockIdx.x;
    const int arrived = atomicAdd(counter, 1);
    is_last_cta = arrived == p.splits - 1;
    if (is_last_cta) *counter = 0;  // every split has arrived: ready for the next launch
  }
  __syncthreads();
  if (!is_last_cta) return;
  __threadfence();
  if (kw == 0) {
    for_each_output([&](float& v, size_t at) {
      float sum = 0.0f;
#pragma unroll 4
      for (int s = 0; s < p.splits; ++s) sum += __ldcg(p.partials + s * split_stride + at);
      v = sum;
    });
    for_each_output(store);
  }
}

template <int kTokens, bool kOutF32>
void set_smem_limit() {
  PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<kTokens, kOutF32>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kSmemBytes));
}

}  // namespace

void prepare_skinny_gemm() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_smem_limit<8, false>();
    set_smem_limit<16, false>();
    set_smem_limit<32, false>();
    set_smem_limit<64, false>();
    set_smem_limit<8, true>();
    set_smem_limit<16, true>();
    set_smem_limit<32, true>();
    set_smem_limit<64, true>();
  });
}

namespace {

int current_sm_count() {
  static int cached_device = -1, cached_sms = 0;
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    PAGELLM_CUDA_CHECK(
        cudaDeviceGetAttribute(&cached_sms, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_sms;
}

template <int kTokens>
void launch_for_tokens(const Params& p, bool out_f32, dim3 grid, cudaStream_t stream) {
  if (out_f32) {
    skinny_gemm_kernel<kTokens, true><<<grid, kThreads, kSmemBytes, stream>>>(p);
  } else {
    skinny_gemm_kernel<kTokens, false><<<grid, kThreads, kSmemBytes, stream>>>(p);
  }
}

}  // namespace

bool skinny_gemm_supported(const void* x, const void* w, const void* out, int64_t M, int64_t N,
                           int64_t K) {
  const auto addr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
  // Sizes travel as int; grid.z (M / 64 tiles) must stay under 65,536.
  return M > 0 && N > 0 && K > 0 && K % 8 == 0 && addr(x) % 16 == 0 && addr(w) % 16 == 0 &&
         addr(out) % 4 == 0 && M <= (int64_t{1} << 22) && N < (int64_t{1} << 30) &&
         K < (int64_t{1} << 30);
}

SkinnyPlan skinny_gemm_plan(int64_t M, int64_t N, int64_t K, int num_sms) {
  SkinnyPlan plan;
  plan.tokens_per_tile = M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : kSkinnyMaxTokensPerTile;
  plan.grid_z = static_cast<int>((M + plan.tokens_per_tile - 1) / plan.tokens_per_tile);
  const int64_t row_tiles = (N + kRowsPerWarp - 1) / kRowsPerWarp;
  const int64_t chunks = (K + kChunk - 1) / kChunk;
  // At least two 4-warp CTAs per SM: with kStages - 1 chunks of 4 KiB ahead per warp that
  // is ~96 KiB in flight per SM, several times what Little's law asks of HBM.
  const int64_t target_ctas = 2 * static_cast<int64_t>(std::max(num_sms, 1));

  // Prefer more warps on distinct rows (x shared through L1), as long as the grid fills
  // the GPU and every k-warp gets two chunks.
  for (int row_warps : {4, 2}) {
    const int64_t ctas = (row_tiles + row_warps - 1) / row_warps;
    if (ctas >= target_ctas && chunks >= 2 * (kWarps / row_warps)) {
      plan.row_warps = row_warps;
      plan.splits = 1;
      plan.grid_x = static_cast<int>(ctas);
      plan.grid_y = 1;
      return plan;
    }
  }
  // Narrow N: every warp of a CTA on the same rows, and K split across CTAs too. Each warp
  // keeps >= 2 chunks, and the partials (written, then read back, mostly through L2) stay
  // under half the weight bytes: 2·splits·M·N·4 B <= N·K·2 B / 2, splits <= K / (8·M).
  plan.row_warps = 1;
  plan.grid_x = static_cast<int>(row_tiles);
  int64_t splits = (target_ctas + row_tiles - 1) / row_tiles;
  splits = std::min(splits, std::max<int64_t>(1, chunks / (2 * kWarps)));
  splits = std::min(splits, std::max<int64_t>(1, K / (8 * M)));
  while (splits > 1 && static_cast<size_t>(splits * M * N) * sizeof(float) > kSkinnyPartialBytes) {
    --splits;
  }
  if (row_tiles * plan.grid_z > kSkinnyMaxCounters) splits = 1;
  plan.splits = static_cast<int>(std::max<int64_t>(splits, 1));
  plan.grid_y = plan.splits;
  return plan;
}

void launch_skinny_gemm(const void* x, const void* w, void* out, bool out_f32, int64_t M,
                        int64_t N, int64_t K, void* workspace, cudaStream_t stream) {
  PAGELLM_CHECK(skinny_gemm_supported(x, w, out, M, N, K))
      << "skinny gemm: unsupported product x[" << M << ", " << K << "] w[" << N << ", " << K
      << "]^T (needs K a multiple of 8, 16-byte aligned x and w, 4-byte aligned out)";
  const SkinnyPlan plan = skinny_gemm_plan(M, N, K, current_sm_count());
  PAGELLM_CHECK(plan.splits == 1 || workspace != nullptr)
      << "skinny gemm: a split-K plan needs the workspace";
  prepare_skinny_gemm();

  Params p;
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.w = static_cast<const __nv_bfloat16*>(w);
  p.out = out;
  p.partials = static_cast<float*>(workspace);
  p.counters = workspace ? reinterpret_cast<int*>(static_cast<char*>(workspace) +
                                                  kSkinnyPartialBytes)
                         : nullptr;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.row_warps = plan.row_warps;
  p.k_warps = kWarps / plan.row_warps;
  p.splits = plan.splits;
  p.chunks = static_cast<int>((K + kChunk - 1) / kChunk);
  const dim3 grid(plan.grid_x, plan.grid_y, plan.grid_z);
  switch (plan.tokens_per_tile) {
    case 8: launch_for_tokens<8>(p, out_f32, grid, stream); break;
    case 16: launch_for_tokens<16>(p, out_f32, grid, stream); break;
    case 32: launch_for_tokens<32>(p, out_f32, grid, stream); break;
    default: launch_for_tokens<64>(p, out_f32, grid, stream); break;
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
