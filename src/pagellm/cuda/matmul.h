// Matrix products: out[M, N] = x[M, K] · w[N, K]ᵀ, bf16 inputs, float32 accumulation, bf16
// or float32 output, through the weight-streaming skinny kernel (skinny_gemm.h) for decode
// shapes and cuBLASLt otherwise.
//
// Dispatch (MatmulPath::kAuto): the skinny kernel when M <= kSkinnyAutoMaxM and the kernel
// supports the operands (K % 8 == 0, x and w 16-byte aligned), cuBLASLt otherwise. The
// environment variable PAGELLM_MATMUL=cublaslt|skinny|auto, read when an LtMatmul is made,
// forces a path (benchmarks, debugging); "skinny" still falls back to cuBLASLt where the
// kernel does not apply. Both paths are deterministic run to run.
//
// Row-major out = x · wᵀ is, in cuBLASLt's column-major terms, outᵀ[N, M] = w[K, N]ᵀ ·
// xᵀ[K, M]: A = w with op T, B = x with op N (the "TN" layout tensor cores like best), all
// leading dimensions the row lengths. Each distinct (M, N, K, output type, pointer
// alignment) gets its descriptors and the heuristic's best algorithm computed once and
// cached, so run() is a hash lookup plus cublasLtMatmul: no allocation, no sync, safe to
// capture in a CUDA graph (the workspace is fixed, owned by the caller).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace pagellm::cuda {

/// Which implementation LtMatmul::run uses.
enum class MatmulPath { kAuto, kCublasLt, kSkinny };

/// Largest M the automatic rule sends to the skinny kernel (its token tile; above it the
/// kernel re-reads the weights per 64-token tile and cuBLASLt's tensor-core GEMMs win).
constexpr int64_t kSkinnyAutoMaxM = 64;

/// "auto", "cublaslt" or "skinny".
const char* matmul_path_name(MatmulPath path);

/// Parses a PAGELLM_MATMUL value; throws Error naming the accepted values otherwise.
MatmulPath parse_matmul_path(const std::string& value);

/// The automatic rule on shape alone: M <= kSkinnyAutoMaxM (N, K any).
inline bool skinny_preferred(int64_t M, int64_t N, int64_t K) {
  return M >= 1 && M <= kSkinnyAutoMaxM && N >= 1 && K >= 8;
}

/// Owns a cuBLASLt handle, a cache of matmul plans and the skinny kernel's split-K
/// workspace (kSkinnyWorkspaceBytes, ~16 MiB, allocated here). Not thread-safe (one per
/// backend); all runs on one stream (the split-K workspace is shared between launches).
class LtMatmul {
 public:
  /// `workspace` (device memory of workspace_bytes) must outlive this object. Reads
  /// PAGELLM_MATMUL (throws Error for a value other than cublaslt, skinny or auto).
  LtMatmul(void* workspace, size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  /// out[M, N] = x[M, K] · w[N, K]ᵀ on `stream`; x and w bf16 with contiguous rows, out
  /// CUDA_R_16BF or CUDA_R_32F. Graph-safe once the shape's cuBLASLt plan exists (the
  /// skinny path has no plan). Throws Error naming the shape if cuBLASLt is needed and has
  /// no algorithm for it.
  void run(const void* x, const void* w, void* out, cudaDataType_t out_type, int64_t M,
           int64_t N, int64_t K, cudaStream_t stream);

  /// The path run() takes for these operands under the current setting (kSkinny or
  /// kCublasLt, never kAuto).
  MatmulPath path_for(const void* x, const void* w, const void* out, cudaDataType_t out_type,
                      int64_t M, int64_t N, int64_t K) const;

  /// Forces a path (tests, benchmarks); the constructor sets it from PAGELLM_MATMUL.
  void set_path(MatmulPath path) { path_ = path; }
  MatmulPath path() const { return path_; }

  /// Number of cached plans (tests, diagnostics).
  size_t num_plans() const { return plans_.size(); }

 private:
  struct Key {
    int64_t m, n, k;
    int out_type;
    int align;  // min(alignment of x, w, out) in bytes, capped at 256
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && out_type == o.out_type && align == o.align;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  const Plan& plan_for(const Key& key);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::unordered_map<Key, Plan, KeyHash> plans_;
  MatmulPath path_ = MatmulPath::kAuto;
  void* skinny_workspace_ = nullptr;  // kSkinnyWorkspaceBytes: split-K partials + counters
};

}  // namespace pagellm::cuda
