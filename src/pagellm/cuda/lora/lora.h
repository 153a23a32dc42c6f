// Launcher of LoRA's shrink and expand kernels (Backend::lora_add on the cuda backend;
// docs/design.md "LoRA").
//
// Takes raw device pointers and sizes, never engine types, so that the kernels can be
// tested and benchmarked alone; enqueues on `stream` only (no allocation, copy or
// synchronisation), so it can be captured into a graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagellm::cuda {

/// One adapter slot's factors for one layer and group, as the kernels read them from device
/// memory: the layout of pagellm::LoraSlotFactors (backend.h), checked where both are seen.
struct LoraSlotRef {
  const void* a;   // [modules · rank, in] bf16
  const void* bt;  // [rank, width_total] bf16
  int32_t rank;    // 1..64
  float scale;
  const void* a_packed;  // A as pack_lora_a (skinny_gemm.h) wrote it, or null
  const void* b_packed;  // B as pack_lora_b (skinny_gemm.h) wrote it; set with a_packed
};

/// One group's LoRA for a step of `rows` token rows (all bf16, float32 arithmetic).
struct LoraAddArgs {
  const void* x = nullptr;  // [rows, in]
  int64_t in = 0;           // a multiple of 8
  const LoraSlotRef* slots = nullptr;  // [num_slots], device memory; entry 0 never read
  int32_t num_slots = 0;
  const int32_t* row_slots = nullptr;  // [rows], device memory: each row's slot (0: none)
  int64_t rows = 0;
  int32_t num_modules = 0;   // 1..3
  int64_t width[3] = {0, 0, 0};
  void* out = nullptr;       // rows of ld_out elements; the group writes columns
  int64_t ld_out = 0;        // [col_offset, col_offset + Σ width)
  int64_t col_offset = 0;
  float* work = nullptr;     // float32 scratch (lora_work_floats)
  int64_t work_floats = 0;
};

/// Floats of scratch one window of `rows` rows needs for a group of `num_modules` modules
/// reading `in` columns: the shrink's per-chunk partial sums.
int64_t lora_work_floats(int64_t rows, int64_t in, int32_t num_modules);

/// Enqueues the group's shrink and expand: rows in windows that fit `work` (one window
/// for a decode step), two kernels per window; steps of 1,024 rows or more add a plan
/// kernel (the rows grouped by slot) and a reduce kernel (the partials summed once). Throws Error for shapes the kernels do
/// not take (in not a multiple of 8, more than 3 modules, scratch smaller than one row's).
void launch_lora_add(const LoraAddArgs& args, cudaStream_t stream);

}  // namespace pagellm::cuda
