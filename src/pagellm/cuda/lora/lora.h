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

/// Whether launch_lora_add plans a step of `rows` rows over `num_slots` slots (prefill
/// chunks: 1,024 rows or more; the dense products below take such steps where they can).
bool lora_add_planned(int64_t rows, int32_t num_slots);

/// Prefill chunks' LoRA as tensor-core products (docs/design.md, "The CUDA kernels" of
/// "LoRA"), which the caller runs (CudaBackend::lora_add, on cuBLASLt): once per call
/// launch_lora_dense_factors; then per window of rows s_all = x · a_allᵀ (float32),
/// launch_lora_dense_operand, and per module m out[:, its columns] += s_m · w_mᵀ.
/// K = (num_slots − 1) · k_slot columns a module: slot q's block starts at (q − 1) · k_slot.
struct LoraDenseShape {
  int32_t num_slots = 0;
  int32_t num_modules = 0;  // 1..3
  int64_t in = 0;           // the input width (A's row length)
  int64_t width = 0;        // Σ width of the modules (Bᵀ's row length)
  int32_t k_slot = 0;       // a multiple of 8 in 8..64, no less than any slot's rank
  __host__ __device__ int64_t K() const { return (num_slots - 1) * int64_t{k_slot}; }
  /// Columns of s_all: module m's K at m · K.
  __host__ __device__ int64_t J() const { return num_modules * K(); }
};

/// The slots' factors as two dense bf16 matrices: a_all [J, in], row m · K + (q − 1) ·
/// k_slot + i = A_q's row m · rank_q + i; w [width, K], w[n][(q − 1) · k_slot + i] =
/// Bᵀ_q[i][n] (module m's rows start at its column offset in Bᵀ). Rows past a slot's rank
/// and empty slots' are zeros. Throws Error for a shape the kernels do not take.
void launch_lora_dense_factors(const LoraSlotRef* slots, const LoraDenseShape& shape,
                               void* a_all, void* w, cudaStream_t stream);

/// The expand's operand for `rows` rows from their shrink outputs s_all [rows, J]
/// (float32): s [modules][rows][K] bf16, where a row of live slot q holds
/// bf16(scale_q · s_all[m · K + c]) in the columns c of its slot's block below its rank,
/// and zeros elsewhere (a row without an adapter: zeros only, whatever s_all holds).
void launch_lora_dense_operand(const LoraSlotRef* slots, const LoraDenseShape& shape,
                               const int32_t* row_slots, int64_t rows, const float* s_all,
                               void* s, cudaStream_t stream);

/// Enqueues the group's shrink and expand: rows in windows that fit `work` (one window
/// for a decode step), two kernels per window; steps of 1,024 rows or more add a plan
/// kernel (the rows grouped by slot) and a reduce kernel (the partials summed once).
/// Throws Error for shapes the kernels do not take (in not a multiple of 8, more than 3
/// modules, scratch smaller than one row's).
void launch_lora_add(const LoraAddArgs& args, cudaStream_t stream);

}  // namespace pagellm::cuda
