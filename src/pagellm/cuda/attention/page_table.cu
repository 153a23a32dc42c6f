// The device side of the persistent page table (ForwardBatch::seq_slots): apply the runs of
// entries the engine changed since the last step, then gather the batch's rows into the
// per-batch page-table buffer that attention (native and cuDNN) reads.
//
// Why this shape: the engine keeps one row per sequence slot for the sequence's whole life
// and sends only what changed (a decode step: one entry per sequence that crossed a page
// boundary), so the host no longer rebuilds and copies B x max_pages_per_seq entries every
// step. The attention kernels keep reading a dense [B, max_pages_per_seq] table at a fixed
// address, so they and the graphs captured over them stay as they are; the gather runs on
// the stream before the forward, never inside a captured graph.
//
// Updates: one CTA per run when no row is named twice in a step (the runs then touch
// disjoint entries); otherwise one CTA applies every run in order (a later run overwrites
// an earlier one), with a barrier between runs. Gather: one CTA per batch row, each thread
// copying 16-byte chunks where the rows allow it.
//
// Roofline: both kernels move a few hundred KB at most (B = 256 rows of 256 entries read
// and written: 512 KB), well under a microsecond of HBM time at 4.8 TB/s; their cost is
// the launch (~2-3 µs each on the stream), paid once per step, not per layer.
#include <cuda_runtime.h>

#include <cstdint>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/attention/page_table.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA per run (runs of distinct rows: disjoint entries).
__global__ void apply_runs_parallel_kernel(int32_t* __restrict__ table, int64_t table_cols,
                                           const int32_t* __restrict__ runs,
                                           const int32_t* __restrict__ values) {
  const int32_t* run = runs + 4 * static_cast<int64_t>(blockIdx.x);
  const int32_t row = run[0], begin = run[1], end = run[2], offset = run[3];
  int32_t* dst = table + static_cast<int64_t>(row) * table_cols;
  for (int32_t j = begin + static_cast<int32_t>(threadIdx.x); j < end; j += kThreads) {
    dst[j] = values[offset + (j - begin)];
  }
}

// One CTA, runs in order: a later run overwrites what an earlier one wrote.
__global__ void apply_runs_in_order_kernel(int32_t* __restrict__ table, int64_t table_cols,
                                           const int32_t* __restrict__ runs, int32_t num_runs,
                                           const int32_t* __restrict__ values) {
  for (int32_t u = 0; u < num_runs; ++u) {
    const int32_t* run = runs + 4 * static_cast<int64_t>(u);
    const int32_t row = run[0], begin = run[1], end = run[2], offset = run[3];
    int32_t* dst = table + static_cast<int64_t>(row) * table_cols;
    for (int32_t j = begin + static_cast<int32_t>(threadIdx.x); j < end; j += kThreads) {
      dst[j] = values[offset + (j - begin)];
    }
    __syncthreads();  // the next run may write the same entries
  }
}

// out[b, j] = table[seq_slots[b], j] for j < cols; one CTA per batch row.
__global__ void gather_rows_kernel(const int32_t* __restrict__ table, int64_t table_cols,
                                   const int32_t* __restrict__ seq_slots,
                                   int32_t* __restrict__ out, int32_t cols) {
  const int64_t b = blockIdx.x;
  const int32_t* src = table + static_cast<int64_t>(seq_slots[b]) * table_cols;
  int32_t* dst = out + b * cols;
  // 16-byte chunks when both rows are 16-byte aligned (the usual case: widths that are
  // multiples of 4 entries), else one entry per thread step.
  const bool vec = (cols % 4) == 0 && (table_cols % 4) == 0 &&
                   (reinterpret_cast<uintptr_t>(src) % 16) == 0 &&
                   (reinterpret_cast<uintptr_t>(dst) % 16) == 0;
  if (vec) {
    const int4* s4 = reinterpret_cast<const int4*>(src);
    int4* d4 = reinterpret_cast<int4*>(dst);
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < cols / 4; j += kThreads) d4[j] = s4[j];
  } else {
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < cols; j += kThreads) dst[j] = src[j];
  }
}

}  // namespace

void launch_apply_page_table_runs(int32_t* table, int64_t table_cols, const int32_t* runs,
                                  int32_t num_runs, const int32_t* values, bool in_order,
                                  cudaStream_t stream) {
  if (num_runs <= 0) return;
  if (in_order) {
    apply_runs_in_order_kernel<<<1, kThreads, 0, stream>>>(table, table_cols, runs, num_runs,
                                                            values);
  } else {
    apply_runs_parallel_kernel<<<static_cast<unsigned>(num_runs), kThreads, 0, stream>>>(
        table, table_cols, runs, values);
  }
  PAGELLM_CUDA_CHECK_LAUNCH();
}

void launch_gather_page_table_rows(const int32_t* table, int64_t table_cols,
                                   const int32_t* seq_slots, int32_t num_seqs, int32_t* out,
                                   int32_t cols, cudaStream_t stream) {
  if (num_seqs <= 0 || cols <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(num_seqs), kThreads, 0, stream>>>(
      table, table_cols, seq_slots, out, cols);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
