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
// Shrink (s = x·Aᵀ): CTA (k chunk of 256 inputs, block of 64 of the group's M·r shrink
//   outputs, adapter slot, block of 32 of that slot's rows). It gathers its rows (scanning
//   the step's row slots), stages A's chunk (before the PDL wait: weights) and the rows' x
//   chunk in shared memory and multiplies them on the tensor cores (WMMA bf16, float32
//   accumulation), writing a float32 partial per chunk: work[chunk][row][j].
// Expand (out += scale · s·Bᵀ): CTA (256 output columns, slot, 32 rows). It sums the
//   partials of its rows in chunk order (float32, the same order for every row whatever
//   the batch: batch-invariant), then each thread takes one column, streams Bᵀ's column
//   (coalesced: Bᵀ is stored [r, width]) and adds scale·Σ_i s[i]·Bᵀ[i, c] into each row's
//   output, rounding once to bf16.
// CTAs of slots without rows (and blocks past a slot's rank) exit after the scan, so a
// decode graph captured for max_loras slots costs little when fewer adapters run, and rows
// without an adapter cost nothing but their entry in the scan.
#include "pagellm/cuda/lora/lora.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "pagellm/common/check.h"
#include "pagellm/cuda/support/pdl.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 32;      // rows of one slot per CTA
constexpr int kChunk = 256;    // inputs per shrink CTA
constexpr int kJBlock = 64;    // shrink outputs per shrink CTA
constexpr int kMaxRank = 64;
constexpr int kMaxModules = 3;
constexpr int kJStride = kMaxModules * kMaxRank;  // partial row stride is modules · 64
constexpr int kCols = kThreads;                   // output columns per expand CTA
constexpr int kPad = 8;                           // bf16 elements of row padding in smem

constexpr int kShrinkSmem = (kRows + kJBlock) * (kChunk + kPad) * 2 + kRows * (kJBlock + 4) * 4;

__host__ __device__ inline int64_t chunks_of(int64_t in) { return (in + kChunk - 1) / kChunk; }

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

__global__ void __launch_bounds__(kThreads)
    lora_shrink_kernel(const bf16* __restrict__ x, int64_t in, const LoraSlotRef* __restrict__ slots,
                       const int32_t* __restrict__ row_slots, int64_t T, int num_modules,
                       float* __restrict__ work) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int rows[kRows];
  bf16* xs = reinterpret_cast<bf16*>(smem);                     // [kRows][kChunk + kPad]
  bf16* as = xs + kRows * (kChunk + kPad);                       // [kJBlock][kChunk + kPad]
  float* cs = reinterpret_cast<float*>(as + kJBlock * (kChunk + kPad));  // [kRows][kJBlock + 4]
  const int64_t chunks = chunks_of(in);
  const int64_t chunk = blockIdx.x % chunks;
  const int jblock = static_cast<int>(blockIdx.x / chunks);
  const int slot = static_cast<int>(blockIdx.y) + 1;
  const LoraSlotRef f = slots[slot];
  const int jmax = f.a == nullptr ? 0 : num_modules * f.rank;
  const int j0 = jblock * kJBlock;
  // Slot tables and row slots are written by copies before the step, never by a kernel.
  const int n = j0 < jmax ? collect_rows(row_slots, T, slot, static_cast<int>(blockIdx.z), rows) : 0;
  if (n == 0) {
    pdl_wait();
    return;
  }
  const int64_t k0 = chunk * kChunk;
  const int klen = static_cast<int>(in - k0 < kChunk ? in - k0 : kChunk);
  const int vecs = kChunk / 8;  // 16-byte vectors per smem row
  // A's chunk: weights, staged before the wait. Zeros past the rank and the input.
  const bf16* a = static_cast<const bf16*>(f.a);
  for (int v = threadIdx.x; v < kJBlock * vecs; v += kThreads) {
    const int jj = v / vecs, c = (v % vecs) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (j0 + jj < jmax && c < klen) {
      val = *reinterpret_cast<const uint4*>(a + static_cast<int64_t>(j0 + jj) * in + k0 + c);
    }
    *reinterpret_cast<uint4*>(as + jj * (kChunk + kPad) + c) = val;
  }
  pdl_wait();
  for (int v = threadIdx.x; v < kRows * vecs; v += kThreads) {
    const int ri = v / vecs, c = (v % vecs) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (ri < n && c < klen) {
      val = *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(rows[ri]) * in + k0 + c);
    }
    *reinterpret_cast<uint4*>(xs + ri * (kChunk + kPad) + c) = val;
  }
  __syncthreads();
  // 8 warps, one 16 x 16 output tile each: rows (warp / 4) · 16, outputs (warp % 4) · 16.
  const int warp = threadIdx.x / 32;
  const int mt = warp / 4, nt = warp % 4;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  if (mt * 16 < n && j0 + nt * 16 < jmax) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
    const int ksteps = (klen + 15) / 16;
    for (int ks = 0; ks < ksteps; ++ks) {
      wmma::load_matrix_sync(fa, xs + mt * 16 * (kChunk + kPad) + ks * 16, kChunk + kPad);
      wmma::load_matrix_sync(fb, as + nt * 16 * (kChunk + kPad) + ks * 16, kChunk + kPad);
      wmma::mma_sync(acc, fa, fb, acc);
    }
  }
  wmma::store_matrix_sync(cs + mt * 16 * (kJBlock + 4) + nt * 16, acc, kJBlock + 4,
                          wmma::mem_row_major);
  __syncthreads();
  const int64_t js = static_cast<int64_t>(num_modules) * kMaxRank;
  for (int v = threadIdx.x; v < n * kJBlock; v += kThreads) {
    const int ri = v / kJBlock, jj = v % kJBlock;
    if (j0 + jj >= jmax) continue;
    work[(chunk * T + rows[ri]) * js + j0 + jj] = cs[ri * (kJBlock + 4) + jj];
  }
  pdl_launch_dependents();
}

__global__ void __launch_bounds__(kThreads)
    lora_expand_kernel(int64_t in, const LoraSlotRef* __restrict__ slots,
                       const int32_t* __restrict__ row_slots, int64_t T, int num_modules,
                       int64_t w0, int64_t w1, int64_t w2, const float* __restrict__ work,
                       bf16* __restrict__ out, int64_t ld_out, int64_t col_offset) {
  __shared__ int rows[kRows];
  __shared__ float s[kRows][kJStride];
  const int slot = static_cast<int>(blockIdx.y) + 1;
  const LoraSlotRef f = slots[slot];
  const int64_t width = w0 + w1 + w2;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int n = f.a == nullptr ? 0 : collect_rows(row_slots, T, slot, static_cast<int>(blockIdx.z), rows);
  if (n == 0) {
    pdl_wait();
    return;
  }
  const int r = f.rank;
  auto module_of = [&](int64_t c) { return c < w0 ? 0 : (c < w0 + w1 ? 1 : 2); };
  const int m_lo = module_of(c0), m_hi = module_of(min(c0 + kCols, width) - 1);
  const int j_lo = m_lo * r, j_span = (m_hi + 1) * r - j_lo;
  const int64_t chunks = chunks_of(in);
  const int64_t js = static_cast<int64_t>(num_modules) * kMaxRank;
  pdl_wait();
  // The rows' shrink outputs this tile needs: partials summed in chunk order.
  for (int v = threadIdx.x; v < n * j_span; v += kThreads) {
    const int ri = v / j_span, j = j_lo + v % j_span;
    const float* p = work + static_cast<int64_t>(rows[ri]) * js + j;
    float sum = 0.0f;
#pragma unroll 8
    for (int64_t k = 0; k < chunks; ++k) sum += p[k * T * js];
    s[ri][j] = sum;
  }
  __syncthreads();
  const int64_t c = c0 + threadIdx.x;
  if (c < width) {
    const int m = module_of(c);
    const bf16* bt = static_cast<const bf16*>(f.bt) + c;
    float acc[kRows];
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) acc[ri] = 0.0f;
    for (int i = 0; i < r; ++i) {
      const float b = __bfloat162float(bt[static_cast<int64_t>(i) * width]);
      const int j = m * r + i;
#pragma unroll
      for (int ri = 0; ri < kRows; ++ri) {
        if (ri < n) acc[ri] += s[ri][j] * b;
      }
    }
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) {
      if (ri < n) {
        bf16* o = out + static_cast<int64_t>(rows[ri]) * ld_out + col_offset + c;
        *o = __float2bfloat16(__bfloat162float(*o) + f.scale * acc[ri]);
      }
    }
  }
  pdl_launch_dependents();
}

}  // namespace

int64_t lora_work_floats(int64_t rows, int64_t in, int32_t num_modules) {
  return rows * chunks_of(in) * num_modules * kMaxRank;
}

void launch_lora_add(const LoraAddArgs& g, cudaStream_t stream) {
  PAGELLM_CHECK(g.in > 0 && g.in % 8 == 0)
      << "cuda lora_add: the input width " << g.in << " is not a positive multiple of 8";
  PAGELLM_CHECK(g.num_modules >= 1 && g.num_modules <= kMaxModules)
      << "cuda lora_add: " << g.num_modules << " modules in a group (1.." << kMaxModules << ")";
  if (g.rows <= 0 || g.num_slots <= 1) return;
  const int64_t width = g.width[0] + g.width[1] + g.width[2];
  if (width == 0) return;
  const int64_t per_row = lora_work_floats(1, g.in, g.num_modules);
  const int64_t window = std::min<int64_t>(g.rows, g.work_floats / per_row);
  PAGELLM_CHECK(window >= 1) << "cuda lora_add: " << g.work_floats
                             << " floats of scratch hold less than one row (" << per_row << ")";
  static const bool smem_set = [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        lora_shrink_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShrinkSmem));
    return true;
  }();
  (void)smem_set;
  const unsigned slots = static_cast<unsigned>(g.num_slots - 1);
  for (int64_t w = 0; w < g.rows; w += window) {
    const int64_t T = std::min(window, g.rows - w);
    const unsigned zb = static_cast<unsigned>((T + kRows - 1) / kRows);
    const bf16* x = static_cast<const bf16*>(g.x) + w * g.in;
    const int32_t* row_slots = g.row_slots + w;
    bf16* out = static_cast<bf16*>(g.out) + w * g.ld_out;
    const dim3 shrink_grid(static_cast<unsigned>(chunks_of(g.in) * g.num_modules), slots, zb);
    launch_kernel(lora_shrink_kernel, shrink_grid, dim3(kThreads), kShrinkSmem, stream, 1, x,
                  g.in, g.slots, row_slots, T, g.num_modules, g.work);
    const dim3 expand_grid(static_cast<unsigned>((width + kCols - 1) / kCols), slots, zb);
    launch_kernel(lora_expand_kernel, expand_grid, dim3(kThreads), 0, stream, 1, g.in, g.slots,
                  row_slots, T, g.num_modules, g.width[0], g.width[1], g.width[2], g.work, out,
                  g.ld_out, g.col_offset);
  }
}

}  // namespace pagellm::cuda
