// LoRA's shrink and expand for one group of modules (Backend::lora_add; docs/design.md
// "LoRA"), graph-capturable: which adapter a row uses, and where each adapter's factors
// live, are read from device memory at run time (BatchTensors::lora_slots and the model's
// slot tables), so one captured decode graph serves any mix of adapters.
//
// Shape of the work. A decode step has tens to hundreds of rows; adapters have rank <= 64;
// a group has up to three modules (q/k/v) sharing an input of `in` columns. The factors are
// a few MB per layer and adapter, the flops tiny: the kernels must read each adapter's
// factors once per step, not once per row, and spread that over many SMs.
//
// Shrink (s = x·Aᵀ): CTA (chunk of the inputs, block of 64 of the group's M·r shrink
//   outputs, adapter slot, block of 32 of that slot's rows). A chunk is whole 256-input
//   pieces, as few as keep a group's chunks at most 24 (a function of `in` only). The CTA
//   gathers its rows (scanning the step's row slots), stages each piece of A (the first
//   before the PDL wait: weights) and of the rows' x in shared memory and multiplies them
//   on the tensor cores (WMMA bf16, float32 accumulation across the pieces), writing one
//   float32 partial per chunk: work[chunk][row][m · 64 + i].
// Expand (out += scale · s·Bᵀ): CTA (64 output columns, slot, 32 rows). It stages its
//   columns of Bᵀ (rows i < r, coalesced: Bᵀ is stored [r, width]) before the PDL wait, sums
//   its rows' partials in chunk order (float32, the same order for every row whatever the
//   batch: batch-invariant), multiplies s [32, r] by that [r, 64] tile on the tensor cores
//   (TF32 inputs, float32 accumulation), and adds scale · delta into each row's output,
//   rounding once to bf16. (A thread per column looping over rows and ranks on the CUDA
//   cores ran 34 µs a call at W1: 1000 dependent FMAs per thread at 2 warps a scheduler.)
// CTAs of slots without rows (and blocks past a slot's rank) exit after the scan, before
// reading any factor, so a decode graph captured for max_loras slots costs little when fewer
// adapters run, and rows without an adapter cost nothing but their entry in the scan.
// Steps of kPlannedRows rows or more (prefill chunks) are planned instead: every CTA's scan
// of the row slots costs O(T) and their number grows with T and the slots, so an 8,160-token
// prefill with 8 adapters spent 38 ms a layer scanning (H100, 2026-12-05). There a one-CTA
// plan kernel groups the rows by slot into blocks of kRows once per call (the shrink and the
// expand read their block's slot and rows from it), and a reduce kernel sums the shrink's
// partials in chunk order once per row, where each expand CTA summed them again for its
// columns. The same sums in the same order: the same bits as the scanning path.
// Where the caller can (CudaBackend::lora_add on cuBLASLt), a prefill chunk instead runs
// as dense tensor-core products (launch_lora_dense_*): every slot's A stacked into one
// matrix (one product gives each row its shrink for every slot), the row's own slot's
// block kept, scaled and rounded to bf16 in a dense operand (zeros elsewhere), and the
// slots' B gathered into one weight that the operand multiplies, accumulating into the
// output. slots · rank-deep products at the tensor cores' rate, where the shrink and expand
// kernels' CTAs of 32 rows re-read their factors: the planned prefill spent 36 % of its
// time in the expand kernel and 10 % in the shrink (H100, 2026-12-05).
// Measured on the H200 (docs/PERFORMANCE.md, "LoRA inside decode graphs"): 8.5-12 µs an
// expand and 6-15 µs a shrink at W1, latency-bound; the design notes say what comes next.
#include "pagellm/cuda/lora/lora.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "pagellm/common/check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/support/pdl.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 32;      // rows of one slot per CTA
constexpr int kChunk = 256;    // inputs per piece a shrink CTA stages at once
constexpr int kJBlock = 64;    // shrink outputs per shrink CTA
constexpr int kMaxRank = 64;
constexpr int kMaxModules = 3;
constexpr int kCols = 64;                         // output columns per expand CTA
constexpr int kPad = 8;                           // bf16 elements of row padding in smem

constexpr int kShrinkSmem = (kRows + kJBlock) * (kChunk + kPad) * 2 + kRows * (kJBlock + 4) * 4;
constexpr int kExpandSmem =
    (kRows * kMaxModules * kMaxRank + kMaxRank * (kCols + 4) + kRows * (kCols + 4)) * 4;

constexpr int kMaxChunks = 24;  // a row's partial sums per group (bounds the expand's reads)
constexpr int64_t kPlannedRows = 1024;  // steps from this many rows take the planned path
constexpr int kPlanThreads = 1024;
constexpr int kPlanMaxSlots = 1024;     // more slots than this keep the scanning path

// The inputs one shrink CTA covers: whole 256-input pieces, as few as keep the chunks at
// most kMaxChunks. A function of `in` alone, so a row's sums never depend on the batch.
__host__ __device__ inline int64_t chunk_elems(int64_t in) {
  const int64_t pieces = (in + kChunk - 1) / kChunk;
  return kChunk * ((pieces + kMaxChunks - 1) / kMaxChunks);
}
__host__ __device__ inline int64_t chunks_of(int64_t in) {
  return (in + chunk_elems(in) - 1) / chunk_elems(in);
}

// Collects, in row order, the rows whose slot is `slot`, keeping those with ordinal in
// [block·kRows, (block+1)·kRows) in rows[]; returns how many it kept. Every thread of
// the CTA calls it (it synchronises).
__device__ int collect_rows(const int32_t* __restrict__ row_slots, int64_t T, int slot,
                            int block, int* rows) {
  __shared__ int warp_hits[kWarps];
  __shared__ int found_total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) found_total = 0;
  __syncthreads();
  const int first = block * kRows;
  for (int64_t t0 = 0; t0 < T; t0 += kThreads) {
    const int64_t t = t0 + threadIdx.x;
    const bool hit = t < T && row_slots[t] == slot;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[warp] = __popc(ballot);
    __syncthreads();
    int before = found_total;
    for (int w = 0; w < warp; ++w) before += warp_hits[w];
    const int ordinal = before + __popc(ballot & ((1u << lane) - 1u));
    if (hit && ordinal >= first && ordinal < first + kRows) rows[ordinal - first] = static_cast<int>(t);
    __syncthreads();
    if (threadIdx.x == 0) {
      int total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_hits[w];
      found_total += total;
    }
    __syncthreads();
    if (found_total >= first + kRows) break;  // uniform: every thread reads the same value
  }
  return max(0, min(found_total - first, kRows));
}

// The planned path's row plan, in the scratch after the partial and reduced sums (ints):
// [0] the number of blocks; then the rows grouped by slot (T entries, those of rows with a
// live adapter); then per block its slot, its first entry in that list and its row count
// (num_blocks_max entries each: a slot's rows make ceil(count / kRows) blocks).
struct RowPlan {
  int* p = nullptr;
  int64_t T = 0;
  int64_t num_blocks_max = 0;
  __host__ __device__ static int64_t ints(int64_t T, int64_t num_blocks_max) {
    return 1 + T + 3 * num_blocks_max;
  }
  __device__ int* rows() const { return p + 1; }
  __device__ int* block_slot() const { return p + 1 + T; }
  __device__ int* block_first() const { return block_slot() + num_blocks_max; }
  __device__ int* block_rows() const { return block_first() + num_blocks_max; }
};

// Groups the rows by slot (rows of slot 0, of slots outside the table and of empty slots
// are left out) and cuts each slot's rows into blocks of kRows. One CTA. A slot's rows land
// in any order (atomics): each row's sums depend only on its own inputs, whichever block
// and place it takes.
__global__ void __launch_bounds__(kPlanThreads)
    lora_plan_kernel(const LoraSlotRef* __restrict__ slots, int num_slots,
                     const int32_t* __restrict__ row_slots, RowPlan plan) {
  __shared__ int count[kPlanMaxSlots], cursor[kPlanMaxSlots], first_block[kPlanMaxSlots];
  __shared__ bool live[kPlanMaxSlots];
  const int tid = threadIdx.x, lane = tid % 32;
  for (int q = tid; q < num_slots; q += kPlanThreads) {
    count[q] = 0;
    live[q] = q >= 1 && slots[q].a != nullptr && slots[q].rank > 0;  // tables: weights
  }
  pdl_wait();  // the previous call's kernels are done with the scratch
  __syncthreads();
  for (int64_t t = tid; t < plan.T; t += kPlanThreads) {
    const int q = row_slots[t];
    if (q >= 0 && q < num_slots && live[q]) atomicAdd(&count[q], 1);
  }
  __syncthreads();
  if (tid < 32) {  // exclusive prefix sums of rows and blocks over the slots, 32 at a time
    int rows_before = 0, blocks_before = 0;
    for (int base = 0; base < num_slots; base += 32) {
      const int q = base + lane;
      const int c = q < num_slots ? count[q] : 0, b = (c + kRows - 1) / kRows;
      int ic = c, ib = b;
      for (int o = 1; o < 32; o <<= 1) {
        const int uc = __shfl_up_sync(0xffffffffu, ic, o), ub = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
          ic += uc;
          ib += ub;
        }
      }
      if (q < num_slots) {
        cursor[q] = rows_before + ic - c;
        first_block[q] = blocks_before + ib - b;
      }
      rows_before += __shfl_sync(0xffffffffu, ic, 31);
      blocks_before += __shfl_sync(0xffffffffu, ib, 31);
    }
    if (lane == 0) plan.p[0] = blocks_before;
  }
  __syncthreads();
  for (int q = tid; q < num_slots; q += kPlanThreads) {
    for (int j = 0; j * kRows < count[q]; ++j) {
      const int b = first_block[q] + j;
      plan.block_slot()[b] = q;
      plan.block_first()[b] = cursor[q] + j * kRows;
      plan.block_rows()[b] = min(kRows, count[q] - j * kRows);
    }
  }
  __syncthreads();  // cursor is advanced below
  for (int64_t t = tid; t < plan.T; t += kPlanThreads) {
    const int q = row_slots[t];
    if (q >= 0 && q < num_slots && live[q]) {
      plan.rows()[atomicAdd(&cursor[q], 1)] = static_cast<int>(t);
    }
  }
  pdl_launch_dependents();
}

// The planned path's block of this CTA (blockIdx.z): its slot, and its rows into rows[];
// returns the row count, 0 past the plan's blocks. After pdl_wait (the plan is a kernel's
// output). Every thread of the CTA calls it (it synchronises).
__device__ int planned_rows(const RowPlan& plan, int& slot, int* rows) {
  const int z = static_cast<int>(blockIdx.z);
  if (z >= plan.p[0]) return 0;
  slot = plan.block_slot()[z];
  const int n = plan.block_rows()[z], first = plan.block_first()[z];
  for (int i = threadIdx.x; i < n; i += blockDim.x) rows[i] = plan.rows()[first + i];
  __syncthreads();
  return n;
}

// The planned path's sums: sums[t][j] = Σ over chunks, in chunk order, of work[c][t][j]
// (float32), as the scanning path's expand adds them for each row it reads.
__global__ void __launch_bounds__(kThreads)
    lora_reduce_kernel(const float* __restrict__ work, int64_t chunks, int64_t n,
                       float* __restrict__ sums) {
  pdl_wait();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 4;
  if (i < n) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t c = 0; c < chunks; ++c) {
      const float4 v = *reinterpret_cast<const float4*>(work + c * n + i);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    *reinterpret_cast<float4*>(sums + i) = acc;
  }
  pdl_launch_dependents();
}

// launch_lora_dense_factors' A: one CTA a row of a_all (j = m · K + (q − 1) · k_slot + i),
// A_q's row m · rank_q + i copied 8 elements a thread, or zeros.
__global__ void __launch_bounds__(kThreads)
    lora_dense_a_kernel(const LoraSlotRef* __restrict__ slots, LoraDenseShape d,
                        bf16* __restrict__ a_all) {
  const int64_t j = blockIdx.x, K = d.K();
  const int m = static_cast<int>(j / K);
  const int64_t c = j % K;
  const int i = static_cast<int>(c % d.k_slot);
  const LoraSlotRef f = slots[c / d.k_slot + 1];
  const bool live = f.a != nullptr && i < f.rank;
  const uint4* src = live ? reinterpret_cast<const uint4*>(static_cast<const bf16*>(f.a) +
                                                           (int64_t{m} * f.rank + i) * d.in)
                          : nullptr;
  uint4* dst = reinterpret_cast<uint4*>(a_all + j * d.in);
  pdl_wait();  // the previous call's products may still read a_all
  for (int64_t v = threadIdx.x; v < d.in / 8; v += kThreads) {
    dst[v] = live ? src[v] : make_uint4(0, 0, 0, 0);
  }
  pdl_launch_dependents();
}

// launch_lora_dense_factors' B: a CTA transposes a 64 x 64 tile of w through shared
// memory, reading 64 columns c of Bᵀ rows along n and writing 64 rows n of w along c (both
// coalesced).
constexpr int kTile = 64;
__global__ void __launch_bounds__(kThreads)
    lora_dense_b_kernel(const LoraSlotRef* __restrict__ slots, LoraDenseShape d,
                        bf16* __restrict__ w) {
  __shared__ bf16 tile[kTile][kTile + 2];  // [c][n]; the odd word stride keeps banks apart
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t K = d.K();
  pdl_wait();  // the previous call's products may still read w
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int cc = e / kTile, nn = e % kTile;
    const int64_t c = c0 + cc, n = n0 + nn;
    bf16 v = __float2bfloat16(0.0f);
    if (c < K && n < d.width) {
      const LoraSlotRef f = slots[c / d.k_slot + 1];
      const int i = static_cast<int>(c % d.k_slot);
      if (f.a != nullptr && i < f.rank) v = static_cast<const bf16*>(f.bt)[i * d.width + n];
    }
    tile[cc][nn] = v;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int nn = e / kTile, cc = e % kTile;
    const int64_t c = c0 + cc, n = n0 + nn;
    if (c < K && n < d.width) w[n * K + c] = tile[cc][nn];
  }
  pdl_launch_dependents();
}

// launch_lora_dense_operand: a thread writes 8 columns of one row and module.
__global__ void __launch_bounds__(kThreads)
    lora_dense_operand_kernel(const LoraSlotRef* __restrict__ slots, LoraDenseShape d,
                              const int32_t* __restrict__ row_slots, int64_t T,
                              const float* __restrict__ s_all, bf16* __restrict__ s) {
  const int64_t K = d.K(), vecs = K / 8;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  pdl_wait();  // s_all is the shrink product's, and the previous products read s
  if (v < T * d.num_modules * vecs) {
    const int64_t m = v / (T * vecs), t = v / vecs % T, c0 = v % vecs * 8;
    const int q = row_slots[t];
    const int i0 = static_cast<int>(c0 % d.k_slot);
    alignas(16) bf16 vals[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) vals[e] = __float2bfloat16(0.0f);
    if (q >= 1 && q < d.num_slots && c0 / d.k_slot == q - 1) {
      const LoraSlotRef f = slots[q];
      if (f.a != nullptr && i0 < f.rank) {
        const float4* src = reinterpret_cast<const float4*>(s_all + t * d.J() + m * K + c0);
        const float4 lo = src[0], hi = src[1];
        const float in8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (i0 + e < f.rank) vals[e] = __float2bfloat16(f.scale * in8[e]);
        }
      }
    }
    *reinterpret_cast<uint4*>(s + (m * T + t) * K + c0) = *reinterpret_cast<const uint4*>(vals);
  }
  pdl_launch_dependents();
}

__global__ void __launch_bounds__(kThreads)
    lora_shrink_kernel(const bf16* __restrict__ x, int64_t in, const LoraSlotRef* __restrict__ slots,
                       const int32_t* __restrict__ row_slots, int64_t T, int num_modules,
                       float* __restrict__ work, RowPlan plan) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int rows[kRows];
  bf16* xs = reinterpret_cast<bf16*>(smem);                     // [kRows][kChunk + kPad]
  bf16* as = xs + kRows * (kChunk + kPad);                       // [kJBlock][kChunk + kPad]
  float* cs = reinterpret_cast<float*>(as + kJBlock * (kChunk + kPad));  // [kRows][kJBlock + 4]
  const int64_t chunks = chunks_of(in);
  const int64_t chunk = blockIdx.x % chunks;
  const int jblock = static_cast<int>(blockIdx.x / chunks);
  // The planned path knows its slot and rows only from the plan, after the wait.
  int slot = static_cast<int>(blockIdx.y) + 1, planned_n = 0;
  if (plan.p != nullptr) {
    pdl_wait();
    planned_n = planned_rows(plan, slot, rows);
    if (planned_n == 0) return;
  }
  const LoraSlotRef f = slots[slot];
  const int jmax = f.a == nullptr ? 0 : num_modules * f.rank;
  const int j0 = jblock * kJBlock;
  if (j0 >= jmax) {
    pdl_wait();
    return;
  }
  const int64_t k_begin = chunk * chunk_elems(in);
  const int64_t k_end = k_begin + chunk_elems(in) < in ? k_begin + chunk_elems(in) : in;
  const int vecs = kChunk / 8;  // 16-byte vectors per smem row
  const bf16* a = static_cast<const bf16*>(f.a);
  // Stages A's piece [k0, k0 + 256) (zeros past the rank and the input).
  auto stage_a = [&](int64_t k0, int klen) {
#pragma unroll
    for (int v = threadIdx.x; v < kJBlock * vecs; v += kThreads) {
      const int jj = v / vecs, c = (v % vecs) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (j0 + jj < jmax && c < klen) {
        val = *reinterpret_cast<const uint4*>(a + static_cast<int64_t>(j0 + jj) * in + k0 + c);
      }
      *reinterpret_cast<uint4*>(as + jj * (kChunk + kPad) + c) = val;
    }
  };
  // 8 warps, one 16 x 16 output tile each: rows (warp / 4) · 16, outputs (warp % 4) · 16.
  const int warp = threadIdx.x / 32;
  const int mt = warp / 4, nt = warp % 4;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  // Rows first (slot tables and row slots are written by copies before the step, never by
  // a kernel), so that a loaded adapter no row of the step uses reads none of its factors;
  // then the first piece of A, weights, before the wait.
  const int n = plan.p != nullptr
                    ? planned_n
                    : collect_rows(row_slots, T, slot, static_cast<int>(blockIdx.z), rows);
  if (n == 0) {
    pdl_wait();
    return;
  }
  stage_a(k_begin, static_cast<int>(k_end - k_begin < kChunk ? k_end - k_begin : kChunk));
  pdl_wait();
  const bool tile_live = mt * 16 < n && j0 + nt * 16 < jmax;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk) {
    const int klen = static_cast<int>(k_end - k0 < kChunk ? k_end - k0 : kChunk);
    if (k0 != k_begin) {
      __syncthreads();  // the previous piece's products are done with the buffers
      stage_a(k0, klen);
    }
#pragma unroll
    for (int v = threadIdx.x; v < kRows * vecs; v += kThreads) {
      const int ri = v / vecs, c = (v % vecs) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (ri < n && c < klen) {
        val = *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(rows[ri]) * in + k0 + c);
      }
      *reinterpret_cast<uint4*>(xs + ri * (kChunk + kPad) + c) = val;
    }
    __syncthreads();
    if (tile_live) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      const int ksteps = (klen + 15) / 16;
      for (int ks = 0; ks < ksteps; ++ks) {
        wmma::load_matrix_sync(fa, xs + mt * 16 * (kChunk + kPad) + ks * 16, kChunk + kPad);
        wmma::load_matrix_sync(fb, as + nt * 16 * (kChunk + kPad) + ks * 16, kChunk + kPad);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
  }
  wmma::store_matrix_sync(cs + mt * 16 * (kJBlock + 4) + nt * 16, acc, kJBlock + 4,
                          wmma::mem_row_major);
  __syncthreads();
  const int64_t js = static_cast<int64_t>(num_modules) * kMaxRank;
  for (int v = threadIdx.x; v < n * kJBlock; v += kThreads) {
    const int ri = v / kJBlock, jj = v % kJBlock;
    if (j0 + jj >= jmax) continue;
    // Module m's outputs at m · 64 (aligned for the expand's vector loads).
    const int j = j0 + jj, m = j / f.rank, i = j - m * f.rank;
    work[(chunk * T + rows[ri]) * js + m * kMaxRank + i] = cs[ri * (kJBlock + 4) + jj];
  }
  pdl_launch_dependents();
}

__global__ void __launch_bounds__(kThreads)
    lora_expand_kernel(const LoraSlotRef* __restrict__ slots,
                       const int32_t* __restrict__ row_slots, int64_t T, int num_modules,
                       int64_t w0, int64_t w1, int64_t w2, const float* __restrict__ work,
                       int64_t chunks, bf16* __restrict__ out, int64_t ld_out,
                       int64_t col_offset, RowPlan plan) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int rows[kRows];
  // s [kRows][modules · 64]: the rows' shrink outputs by module, zeros past the rank;
  // bt [64][kCols + 4]: this tile's columns of Bᵀ (float); d [kRows][kCols + 4]: deltas.
  float* s = reinterpret_cast<float*>(smem);
  float* bts = s + kRows * kMaxModules * kMaxRank;
  float* d = bts + kMaxRank * (kCols + 4);
  int slot = static_cast<int>(blockIdx.y) + 1, n = 0;
  if (plan.p != nullptr) {
    pdl_wait();
    n = planned_rows(plan, slot, rows);
    if (n == 0) return;
  }
  const LoraSlotRef f = slots[slot];
  const int64_t width = w0 + w1 + w2;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCols;
  if (plan.p == nullptr) {
    n = f.a == nullptr ? 0 : collect_rows(row_slots, T, slot, static_cast<int>(blockIdx.z), rows);
  }
  if (n == 0) {
    pdl_wait();
    return;
  }
  const int r = f.rank;
  const int r8 = (r + 7) / 8 * 8;  // the K of the product, in steps of 8
  auto module_of = [&](int64_t c) { return c < w0 ? 0 : (c < w0 + w1 ? 1 : 2); };
  const int64_t tile_cols = c0 + kCols < width ? kCols : width - c0;
  // Bᵀ's rows i < r8 for this tile (weights: before the wait), zeros past r and width.
  const bf16* bt = static_cast<const bf16*>(f.bt);
#pragma unroll 4
  for (int v = threadIdx.x; v < r8 * kCols; v += kThreads) {
    const int i = v / kCols, cc = v % kCols;
    bts[i * (kCols + 4) + cc] =
        i < r && cc < tile_cols ? __bfloat162float(bt[static_cast<int64_t>(i) * width + c0 + cc]) : 0.0f;
  }
  const int m_lo = module_of(c0), m_hi = module_of(c0 + tile_cols - 1);
  const int64_t js = static_cast<int64_t>(num_modules) * kMaxRank;
  pdl_wait();
  // Partials summed in chunk order, in float32, the same order for every row (on the
  // planned path the reduce kernel has summed them: one chunk). A thread
  // takes 8 consecutive ranks of one row and module (two float4 per chunk, chunks in
  // flight together); rows past n and ranks past r are zeros (the scratch there holds
  // anything).
  static_assert(kRows * kMaxRank / 8 == kThreads, "one thread per 8 ranks of a row");
  {
    const int ri = threadIdx.x / (kMaxRank / 8), i0 = (threadIdx.x % (kMaxRank / 8)) * 8;
    const int64_t stride = T * js;
    for (int mm = m_lo; mm <= m_hi; ++mm) {
      float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
      if (ri < n && i0 < r) {
        const float4* p = reinterpret_cast<const float4*>(
            work + static_cast<int64_t>(rows[ri]) * js + mm * kMaxRank + i0);
#pragma unroll 8
        for (int64_t k = 0; k < chunks; ++k) {
          const float4 a = p[k * stride / 4], b = p[k * stride / 4 + 1];
          lo.x += a.x; lo.y += a.y; lo.z += a.z; lo.w += a.w;
          hi.x += b.x; hi.y += b.y; hi.z += b.z; hi.w += b.w;
        }
      }
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      float* dst = s + ri * (kMaxModules * kMaxRank) + mm * kMaxRank + i0;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = i0 + e < r ? v[e] : 0.0f;
    }
  }
  __syncthreads();
  // d = s_m · Bᵀ on the tensor cores (TF32, float32 accumulation): 8 warps, one 16 x 16
  // tile each (rows (warp / 4) · 16, columns (warp % 4) · 16). A tile whose columns span
  // two modules (widths not multiples of kCols) takes one pass per module.
  const int warp = threadIdx.x / 32;
  const int mt = warp / 4, nt = warp % 4;
  for (int m = m_lo; m <= m_hi; ++m) {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    if (mt * 16 < n) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
      for (int k = 0; k < r8; k += 8) {
        wmma::load_matrix_sync(fa, s + mt * 16 * (kMaxModules * kMaxRank) + m * kMaxRank + k,
                               kMaxModules * kMaxRank);
        wmma::load_matrix_sync(fb, bts + k * (kCols + 4) + nt * 16, kCols + 4);
#pragma unroll
        for (int e = 0; e < fa.num_elements; ++e) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
#pragma unroll
        for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
    wmma::store_matrix_sync(d + mt * 16 * (kCols + 4) + nt * 16, acc, kCols + 4,
                            wmma::mem_row_major);
    __syncthreads();
    // out += scale · d for this module's columns: each thread a column, rows in steps.
    const int cc = threadIdx.x % kCols;
    const int64_t c = c0 + cc;
    if (cc < tile_cols && module_of(c) == m) {
      constexpr int kRowSteps = kThreads / kCols;
      float o[kRows / kRowSteps];
#pragma unroll
      for (int q = 0; q < kRows / kRowSteps; ++q) {
        const int ri = threadIdx.x / kCols + q * kRowSteps;
        o[q] = ri < n ? __bfloat162float(out[static_cast<int64_t>(rows[ri]) * ld_out + col_offset + c])
                      : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kRows / kRowSteps; ++q) {
        const int ri = threadIdx.x / kCols + q * kRowSteps;
        if (ri < n) {
          out[static_cast<int64_t>(rows[ri]) * ld_out + col_offset + c] =
              __float2bfloat16(o[q] + f.scale * d[ri * (kCols + 4) + cc]);
        }
      }
    }
    __syncthreads();  // d is rewritten by the next module's pass
  }
  pdl_launch_dependents();
}

}  // namespace

int64_t lora_work_floats(int64_t rows, int64_t in, int32_t num_modules) {
  return rows * chunks_of(in) * num_modules * kMaxRank;
}

bool lora_add_planned(int64_t rows, int32_t num_slots) {
  return rows >= kPlannedRows && num_slots <= kPlanMaxSlots;
}

namespace {
void check_dense_shape(const LoraDenseShape& d) {
  PAGELLM_CHECK(d.num_slots >= 2 && d.num_modules >= 1 && d.num_modules <= kMaxModules &&
                d.in > 0 && d.in % 8 == 0 && d.width > 0 && d.k_slot >= 8 &&
                d.k_slot <= kMaxRank && d.k_slot % 8 == 0)
      << "cuda lora dense: " << d.num_slots << " slots, " << d.num_modules
      << " modules, input " << d.in << ", width " << d.width << ", " << d.k_slot
      << " columns a slot (want 2+ slots, 1.." << kMaxModules
      << " modules, the input a multiple of 8, a slot's columns a multiple of 8 in 8.."
      << kMaxRank << ")";
}
}  // namespace

void launch_lora_dense_factors(const LoraSlotRef* slots, const LoraDenseShape& d, void* a_all,
                               void* w, cudaStream_t stream) {
  check_dense_shape(d);
  launch_kernel(lora_dense_a_kernel, dim3(static_cast<unsigned>(d.J())), dim3(kThreads), 0,
                stream, 1, slots, d, static_cast<bf16*>(a_all));
  launch_kernel(lora_dense_b_kernel,
                dim3(static_cast<unsigned>((d.width + kTile - 1) / kTile),
                     static_cast<unsigned>((d.K() + kTile - 1) / kTile)),
                dim3(kThreads), 0, stream, 1, slots, d, static_cast<bf16*>(w));
}

void launch_lora_dense_operand(const LoraSlotRef* slots, const LoraDenseShape& d,
                               const int32_t* row_slots, int64_t rows, const float* s_all,
                               void* s, cudaStream_t stream) {
  check_dense_shape(d);
  if (rows <= 0) return;
  const int64_t vecs = rows * d.num_modules * (d.K() / 8);
  launch_kernel(lora_dense_operand_kernel,
                dim3(static_cast<unsigned>((vecs + kThreads - 1) / kThreads)), dim3(kThreads),
                0, stream, 1, slots, d, row_slots, rows, s_all, static_cast<bf16*>(s));
}

void launch_lora_add(const LoraAddArgs& g, cudaStream_t stream) {
  PAGELLM_CHECK(g.in > 0 && g.in % 8 == 0)
      << "cuda lora_add: the input width " << g.in << " is not a positive multiple of 8";
  PAGELLM_CHECK(g.num_modules >= 1 && g.num_modules <= kMaxModules)
      << "cuda lora_add: " << g.num_modules << " modules in a group (1.." << kMaxModules << ")";
  if (g.rows <= 0 || g.num_slots <= 1) return;
  const int64_t width = g.width[0] + g.width[1] + g.width[2];
  if (width == 0) return;
  const int64_t chunks = chunks_of(g.in);
  const int64_t js = static_cast<int64_t>(g.num_modules) * kMaxRank;
  const int64_t per_row = lora_work_floats(1, g.in, g.num_modules);
  // The planned path's scratch for T rows: the partials, the reduced sums, the row plan.
  const int64_t slots = g.num_slots - 1;
  const auto blocks_max = [&](int64_t T) { return (T + kRows - 1) / kRows + slots; };
  const auto planned_floats = [&](int64_t T) {
    return T * per_row + T * js + RowPlan::ints(T, blocks_max(T));
  };
  const bool planned = lora_add_planned(g.rows, g.num_slots);
  int64_t window = std::min<int64_t>(g.rows, g.work_floats / per_row);
  if (planned) {
    window = std::min<int64_t>(g.rows, (g.work_floats - RowPlan::ints(0, slots + 1)) /
                                           (per_row + js + 2));
    while (window > 0 && planned_floats(window) > g.work_floats) --window;
  }
  PAGELLM_CHECK(window >= 1) << "cuda lora_add: " << g.work_floats
                             << " floats of scratch hold less than one row (" << per_row << ")";
  once_per_device(reinterpret_cast<const void*>(lora_shrink_kernel), [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        lora_shrink_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShrinkSmem));
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        lora_expand_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kExpandSmem));
  });
  for (int64_t w = 0; w < g.rows; w += window) {
    const int64_t T = std::min(window, g.rows - w);
    const bf16* x = static_cast<const bf16*>(g.x) + w * g.in;
    const int32_t* row_slots = g.row_slots + w;
    bf16* out = static_cast<bf16*>(g.out) + w * g.ld_out;
    const unsigned col_tiles = static_cast<unsigned>((width + kCols - 1) / kCols);
    const unsigned shrink_x = static_cast<unsigned>(chunks * g.num_modules);
    if (planned) {
      // One CTA column a block of the plan; blocks past the plan's count exit.
      float* sums = g.work + T * per_row;
      RowPlan plan;
      plan.p = reinterpret_cast<int*>(sums + T * js);
      plan.T = T;
      plan.num_blocks_max = blocks_max(T);
      const unsigned zb = static_cast<unsigned>(plan.num_blocks_max);
      launch_kernel(lora_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, 1, g.slots,
                    static_cast<int>(g.num_slots), row_slots, plan);
      launch_kernel(lora_shrink_kernel, dim3(shrink_x, 1, zb), dim3(kThreads), kShrinkSmem,
                    stream, 1, x, g.in, g.slots, row_slots, T, g.num_modules, g.work, plan);
      const int64_t n = T * js;
      launch_kernel(lora_reduce_kernel,
                    dim3(static_cast<unsigned>((n / 4 + kThreads - 1) / kThreads)),
                    dim3(kThreads), 0, stream, 1, static_cast<const float*>(g.work), chunks, n,
                    sums);
      launch_kernel(lora_expand_kernel, dim3(col_tiles, 1, zb), dim3(kThreads), kExpandSmem,
                    stream, 1, g.slots, row_slots, T, g.num_modules, g.width[0], g.width[1],
                    g.width[2], static_cast<const float*>(sums), int64_t{1}, out, g.ld_out,
                    g.col_offset, plan);
      continue;
    }
    const unsigned zb = static_cast<unsigned>((T + kRows - 1) / kRows);
    launch_kernel(lora_shrink_kernel, dim3(shrink_x, static_cast<unsigned>(slots), zb),
                  dim3(kThreads), kShrinkSmem, stream, 1, x, g.in, g.slots, row_slots, T,
                  g.num_modules, g.work, RowPlan{});
    launch_kernel(lora_expand_kernel, dim3(col_tiles, static_cast<unsigned>(slots), zb),
                  dim3(kThreads), kExpandSmem, stream, 1, g.slots, row_slots, T, g.num_modules,
                  g.width[0], g.width[1], g.width[2], static_cast<const float*>(g.work),
                  chunks, out, g.ld_out, g.col_offset, RowPlan{});
  }
}

}  // namespace pagellm::cuda
