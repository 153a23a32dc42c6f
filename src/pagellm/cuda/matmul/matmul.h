// Matrix products: out[M, N] = x[M, K] · w[N, K]ᵀ, bf16 inputs, float32 accumulation, bf16
// or float32 output, through our decode kernel (skinny_gemm.h: TMA + wgmma, programmatic
// dependent launch, optional fused SiLU-and-multiply) or cuBLASLt.
//
// Dispatch: PAGELLM_MATMUL=auto|cublaslt|skinny (CudaSettings::matmul_path). "auto"
// (default) uses the skinny kernel for M <= kSkinnyAutoMaxM where it applies (sm_90,
// aligned operands) and cuBLASLt otherwise; "cublaslt" uses cuBLASLt everywhere; "skinny"
// uses the skinny kernel wherever it applies, any M (docs/design.md has the numbers).
//
// Row-major out = x · wᵀ is, in cuBLASLt's column-major terms, outᵀ[N, M] = w[K, N]ᵀ ·
// xᵀ[K, M]: A = w with op T, B = x with op N (the "TN" layout tensor cores like best), all
// leading dimensions the row lengths. Each distinct (M, N, K, output type, pointer
// alignment) gets a plan (descriptors + one algorithm) made on first use and cached, so
// later runs are a hash lookup plus cublasLtMatmul: no allocation, no sync, graph-safe.
//
// Autotuning (PAGELLM_MATMUL_AUTOTUNE=1, the default; 0 turns it off): when a plan is made
// for M <= kAutotuneMaxM outside CUDA-graph capture of the stream, up to
// kAutotuneCandidates algorithms from cublasLtMatmulAlgoGetHeuristic are each timed on the
// real operands (L2 flushed before every timed launch, as in the decode step where each
// layer's weights come from HBM) and the fastest is cached. Under capture, or for larger
// M, the heuristic's first choice is cached instead. Once cached, a plan never changes, so
// a shape always runs the same algorithm within a process (eager and in graphs alike).
//
// Determinism: candidates (tuned or not) are restricted to reduction schemes NONE (no
// split-K) and COMPUTE_TYPE (split-K partials in float32 in the workspace, summed by a
// separate kernel in a fixed order); INPLACE / OUTPUT_TYPE (partials rounded to the output
// type) are refused. cuBLAS documents bit-wise identical results run to run for a given
// toolkit, GPU architecture and SM count with one stream. So a given plan is bit-identical
// run to run; but the autotuner's *choice* depends on timings and may differ between two
// processes (results then differ by summation order, ~bf16 rounding). For bit-identical
// results across processes, set PAGELLM_MATMUL_AUTOTUNE=0 (the heuristic is deterministic).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {

/// Largest M whose cuBLASLt plan is autotuned (decode graph buckets reach max_num_seqs + 31);
/// larger (prefill) products take the heuristic's first choice, so that each new prefill
/// length does not pay a tuning run.
constexpr int64_t kAutotuneMaxM = 512;

/// Most heuristic candidates timed per shape.
constexpr int kAutotuneCandidates = 16;

/// Largest M that PAGELLM_MATMUL=auto sends to the skinny kernel: one token tile (64 rows).
/// Qwen3-4B decode with the skinny kernel against cuBLASLt (H100, 2026-12-06, `pagellm
/// bench --output-len 256`): +5.8 % at batch 33, +3.1 to +5.0 % at 40, 48 and 64 (two
/// or three rounds); 80-128 rows (two token tiles, each reading the weights) 15-20 % slower.
/// (It was 32 from 2026-11-29, when an older skinny kernel lost 2 % at batch 64.)
constexpr int64_t kSkinnyAutoMaxM = 64;

/// Whether PAGELLM_MATMUL=auto sends this (supported) product to the skinny kernel rather
/// than cuBLASLt: M <= kSkinnyAutoMaxM (docs/design.md has the measurements behind it).
bool skinny_gemm_preferred(int64_t M, int64_t N, int64_t K);

/// What a cached cuBLASLt plan runs (diagnostics, tests, the benchmark).
struct MatmulPlanInfo {
  int algo_id = -1;            // CUBLASLT_ALGO_CONFIG_ID
  int tile_id = 0;             // cublasLtMatmulTile_t
  int stages_id = 0;           // cublasLtMatmulStages_t
  int splitk = 1;              // CUBLASLT_ALGO_CONFIG_SPLITK_NUM
  int reduction_scheme = 0;    // cublasLtReductionScheme_t (NONE or COMPUTE_TYPE)
  int heuristic_rank = 0;      // position of the chosen algorithm in the heuristic's list
  int candidates = 0;          // algorithms the heuristic offered (after the filter)
  bool tuned = false;          // chosen by timing (false: the heuristic's first choice)
  float top_us = 0;            // when tuned: median µs of the heuristic's first choice
  float chosen_us = 0;         // when tuned: median µs of the chosen algorithm

  /// One line, e.g. "algo 66 tile 20 stages 8 splitk 1 red none, rank 3/12 tuned 9.1 vs 9.8 us".
  std::string summary() const;
};

/// Owns a cuBLASLt handle and a cache of matmul plans (the skinny kernel needs no
/// workspace). Not thread-safe (one per backend); all runs on one stream (the cuBLASLt
/// workspace is shared between launches).
class LtMatmul {
 public:
  /// `workspace` (device memory of workspace_bytes) must outlive this object. `path` and
  /// `autotune` as CudaSettings::matmul_path and matmul_autotune (the backend passes its
  /// settings; the defaults are those of an empty environment).
  LtMatmul(void* workspace, size_t workspace_bytes, MatmulPath path = MatmulPath::kAuto,
           bool autotune = true);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  /// out[M, N] = x[M, K] · w[N, K]ᵀ on `stream`; x and w bf16 with contiguous rows, out
  /// CUDA_R_16BF or CUDA_R_32F. The first run of a shape outside capture may autotune: it
  /// synchronises the stream, allocates a scratch buffer of 2x L2 for a while and writes
  /// `out` several times (its final contents are the chosen algorithm's). Graph-safe once
  /// the shape's plan exists. Throws Error naming the shape if cuBLASLt has no algorithm.
  /// `w_packed` (or null): w as pack_skinny_weights(w, N, K, 0) wrote it, which the skinny
  /// kernel then streams instead of w (same bits); cuBLASLt reads w. `ld_out` (0: N):
  /// elements between out's rows, at least N; an output with wider rows always takes
  /// cuBLASLt (LoRA's dense products write a module's columns of a wider output).
  void run(const void* x, const void* w, void* out, cudaDataType_t out_type, int64_t M,
           int64_t N, int64_t K, cudaStream_t stream, const void* w_packed = nullptr,
           int64_t ld_out = 0);

  /// out[M, N] = x[M, K] · w[N, K]ᵀ with x, w and out float32 and CUBLAS_COMPUTE_32F: a
  /// true float32 product (float32 multiplies and accumulation; not TF32, which would
  /// need CUBLAS_COMPUTE_32F_FAST_TF32). The float32 head's product (Backend::float32_head).
  /// Always cuBLASLt, with the same plan cache, autotuning and reduction filter as run().
  void run_f32(const float* x, const float* w, float* out, int64_t M, int64_t N, int64_t K,
               cudaStream_t stream);

  /// out[M, I] = silu(x · gateᵀ) · (x · upᵀ), w_gate_up = [gate; up] ([2 I, K]), out bf16,
  /// in one kernel (launch_skinny_gemm_silu_mul) when run() would take the skinny kernel for
  /// the [M, 2 I] product. Returns false, having enqueued nothing, otherwise: the caller
  /// then runs the product and the activation separately. `w_packed` (or null): w_gate_up
  /// as pack_skinny_weights(w_gate_up, 2 I, K, I) wrote it.
  bool run_silu_mul(const void* x, const void* w_gate_up, void* out, int64_t M, int64_t inter,
                    int64_t K, cudaStream_t stream, const void* w_packed = nullptr);

  /// out[M, N] += x · wᵀ with out bf16, in cuBLASLt's epilogue (beta = 1, C = D = out): the
  /// product's float32 sum plus out's old value, rounded once. Only where run() would take
  /// cuBLASLt for the product (a bf16 output of the same shape); returns false, having
  /// enqueued nothing, on the skinny path, and the caller then runs the product and the add
  /// separately. Autotuning (as run()) times the candidates on a scratch copy of the output,
  /// so out is added to exactly once. Throws Error as run() does in batch-invariant mode.
  /// `ld_out` (0: N): elements between out's rows, at least N (LoRA's dense expand adds a
  /// module's delta into its columns of a wider output); an output with rows wider than N
  /// always takes cuBLASLt.
  bool run_accumulate(const void* x, const void* w, void* out, int64_t M, int64_t N, int64_t K,
                      cudaStream_t stream, int64_t ld_out = 0);

  /// The path run() takes for these operands under the current setting (kSkinny or
  /// kCublasLt, never kAuto).
  MatmulPath path_for(const void* x, const void* w, const void* out, cudaDataType_t out_type,
                      int64_t M, int64_t N, int64_t K) const;

  /// Forces a path (tests, benchmarks); the constructor's `path`.
  void set_path(MatmulPath path) { path_ = path; }
  MatmulPath path() const { return path_; }

  /// Batch-invariant mode (CudaBackend::set_batch_invariant): every product runs the skinny
  /// kernel with skinny_gemm_invariant_plan, whatever the path setting and M, so a row's
  /// output bits do not depend on M or the other rows; run() and run_silu_mul() throw Error
  /// for a product the skinny kernel cannot compute instead of falling back to cuBLASLt.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  /// Turns autotuning of plans made from now on on or off (plans already cached keep their
  /// algorithm); the constructor's `autotune`.
  void set_autotune(bool on) { autotune_ = on; }
  bool autotune() const { return autotune_; }

  /// Largest M whose plan is autotuned (kAutotuneMaxM unless set; benchmarks raise it to
  /// time prefill-sized products).
  void set_autotune_max_m(int64_t m) { autotune_max_m_ = m; }

  /// Number of cached plans (tests, diagnostics).
  size_t num_plans() const { return plans_.size(); }

  /// The cached cuBLASLt plan these operands would use (run_accumulate's with
  /// `accumulate`), or nullptr if none is cached yet.
  const MatmulPlanInfo* plan_info(const void* x, const void* w, const void* out,
                                  cudaDataType_t out_type, int64_t M, int64_t N, int64_t K,
                                  bool accumulate = false) const;

 private:
  struct Key {
    int64_t m, n, k;
    int out_type;
    int align;  // min(alignment of x, w, out) in bytes, capped at 256
    int in_type = CUDA_R_16BF;  // x and w: CUDA_R_16BF (run) or CUDA_R_32F (run_f32)
    bool accumulate = false;    // beta = 1 (run_accumulate): tuned on a scratch output
    int64_t ldc = 0;            // elements between out's rows (0: n)
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && out_type == o.out_type && align == o.align &&
             in_type == o.in_type && accumulate == o.accumulate && ldc == o.ldc;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    MatmulPlanInfo info;
  };

  // The plan key; `ld_out` (0 or N: rows N apart) wider than N sets ldc and counts in the
  // alignment. Throws Error for ld_out under N.
  static Key key_of(const void* x, const void* w, const void* out, cudaDataType_t out_type,
                    int64_t M, int64_t N, int64_t K, int64_t ld_out = 0);
  const Plan& plan_for(const Key& key, const void* x, const void* w, void* out,
                       cudaStream_t stream);
  // Median µs of `reps` launches of `algo` (out = beta · out + x · wᵀ), each after an L2
  // flush (flush may be null); negative if the algorithm fails to launch.
  float time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* x,
                  const void* w, void* out, float beta, cudaStream_t stream, void* flush,
                  size_t flush_bytes, cudaEvent_t* events, int reps);
  // out = x · wᵀ + beta · out with p's algorithm, on `stream`.
  void launch_plan(const Plan& p, const void* x, const void* w, void* out, float beta,
                   cudaStream_t stream);
  static void destroy(Plan& p);
  // Throws Error in batch-invariant mode (a product that would leave the skinny kernel).
  void check_invariant_path(int64_t M, int64_t N, int64_t K) const;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::unordered_map<Key, Plan, KeyHash> plans_;
  MatmulPath path_ = MatmulPath::kAuto;
  bool autotune_ = true;
  int64_t autotune_max_m_ = kAutotuneMaxM;
  bool batch_invariant_ = false;
};

}  // namespace pagellm::cuda
