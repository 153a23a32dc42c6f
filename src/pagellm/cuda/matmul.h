// Matrix products through cuBLASLt: out[M, N] = x[M, K] · w[N, K]ᵀ, bf16 inputs, float32
// accumulation, bf16 or float32 output.
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
#include <unordered_map>

namespace pagellm::cuda {

/// Owns a cuBLASLt handle and a cache of matmul plans. Not thread-safe (one per backend).
class LtMatmul {
 public:
  /// `workspace` (device memory of workspace_bytes) must outlive this object.
  LtMatmul(void* workspace, size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  /// out[M, N] = x[M, K] · w[N, K]ᵀ on `stream`; x and w bf16, out CUDA_R_16BF or
  /// CUDA_R_32F. Throws Error naming the shape if cuBLASLt has no algorithm for it.
  void run(const void* x, const void* w, void* out, cudaDataType_t out_type, int64_t M,
           int64_t N, int64_t K, cudaStream_t stream);

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
};

}  // namespace pagellm::cuda
