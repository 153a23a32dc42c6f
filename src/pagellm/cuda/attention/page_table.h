// Kernels of the persistent page table (ForwardBatch::seq_slots; page_table.cu says why
// and how). Raw pointers and sizes only, so they can be tested alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagellm::cuda {

/// Applies `num_runs` runs to the device table [rows, table_cols] (int32): run u is
/// runs[4u .. 4u + 3] = {row, begin, end, offset} and sets table[row][begin + i] =
/// values[offset + i] for i < end - begin. `in_order`: the runs may overlap (a row named
/// twice) and are applied one after another, later ones winning; otherwise they touch
/// disjoint entries and run in parallel. The caller has checked every run's bounds.
void launch_apply_page_table_runs(int32_t* table, int64_t table_cols, const int32_t* runs,
                                  int32_t num_runs, const int32_t* values, bool in_order,
                                  cudaStream_t stream);

/// out[b][j] = table[seq_slots[b]][j] for b < num_seqs, j < cols (out is [num_seqs, cols],
/// table [rows, table_cols] with cols <= table_cols; the caller has checked the slots).
void launch_gather_page_table_rows(const int32_t* table, int64_t table_cols,
                                   const int32_t* seq_slots, int32_t num_seqs, int32_t* out,
                                   int32_t cols, cudaStream_t stream);

}  // namespace pagellm::cuda
