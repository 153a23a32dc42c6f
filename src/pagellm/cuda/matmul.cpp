#include "pagellm/cuda/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "pagellm/cuda/cuda_check.h"
#include "pagellm/cuda/skinny_gemm.h"

namespace pagellm::cuda {
namespace {

// Largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption).
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && (a % static_cast<uintptr_t>(align)) != 0) align /= 2;
  return align;
}

const char* type_name(int t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "f32";
    default: return "?";
  }
}

}  // namespace

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::kAuto: return "auto";
    case MatmulPath::kCublasLt: return "cublaslt";
    case MatmulPath::kSkinny: return "skinny";
  }
  return "?";
}

MatmulPath parse_matmul_path(const std::string& value) {
  if (value == "auto" || value.empty()) return MatmulPath::kAuto;
  if (value == "cublaslt") return MatmulPath::kCublasLt;
  if (value == "skinny") return MatmulPath::kSkinny;
  PAGELLM_CHECK(false) << "PAGELLM_MATMUL=" << value
                       << " is not a matmul path; use cublaslt, skinny or auto";
  return MatmulPath::kAuto;
}

size_t LtMatmul::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<int64_t>()(k.m);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(std::hash<int64_t>()(k.n));
  mix(std::hash<int64_t>()(k.k));
  mix(static_cast<size_t>(k.out_type));
  mix(static_cast<size_t>(k.align));
  return h;
}

LtMatmul::LtMatmul(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  if (const char* env = std::getenv("PAGELLM_MATMUL")) path_ = parse_matmul_path(env);
  PAGELLM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  try {
    PAGELLM_CUDA_CHECK(cudaMalloc(&skinny_workspace_, kSkinnyWorkspaceBytes));
    // The split-K counters start at zero and every launch leaves them at zero.
    PAGELLM_CUDA_CHECK(cudaMemset(skinny_workspace_, 0, kSkinnyWorkspaceBytes));
    // The memset runs on the legacy stream, which does not order the backend's
    // non-blocking stream: finish it before any launch can read the counters.
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
    prepare_skinny_gemm();
  } catch (...) {
    if (skinny_workspace_) cudaFree(skinny_workspace_);
    cublasLtDestroy(handle_);
    throw;
  }
}

LtMatmul::~LtMatmul() {
  for (auto& entry : plans_) destroy(entry.second);
  if (handle_) cublasLtDestroy(handle_);  // nothing useful to do with a failure here
  if (skinny_workspace_) cudaFree(skinny_workspace_);
}

void LtMatmul::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

const LtMatmul::Plan& LtMatmul::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    const auto out_type = static_cast<cudaDataType_t>(key.out_type);
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &trans_a, sizeof(trans_a)));
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &trans_b, sizeof(trans_b)));
    // Column-major views: A = w as [K, N] (ld K), B = x as [K, M] (ld K), C = outᵀ [N, M].
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, key.k, key.n, key.k));
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, key.k, key.m, key.k));
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, key.n, key.m, key.n));

    PAGELLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_ws = workspace_bytes_;
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
    const uint32_t align = static_cast<uint32_t>(key.align);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      PAGELLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    }

    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c,
                                                             pref, 1, &result, &count);
    PAGELLM_CHECK(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED)
        << "cuBLAS error: " << cublas_status_name(st)
        << " in cublasLtMatmulAlgoGetHeuristic for matmul [" << key.m << ", " << key.k
        << "] x [" << key.n << ", " << key.k << "]^T";
    PAGELLM_CHECK(st == CUBLAS_STATUS_SUCCESS && count > 0)
        << "cuBLASLt has no algorithm for matmul x[" << key.m << ", " << key.k << "] (bf16) x w["
        << key.n << ", " << key.k << "]^T (bf16) -> " << type_name(key.out_type)
        << " with " << key.align << "-byte aligned pointers and a " << workspace_bytes_
        << "-byte workspace";
    p.algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    destroy(p);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

MatmulPath LtMatmul::path_for(const void* x, const void* w, const void* out,
                              cudaDataType_t out_type, int64_t M, int64_t N, int64_t K) const {
  if (path_ == MatmulPath::kCublasLt) return MatmulPath::kCublasLt;
  if (out_type != CUDA_R_16BF && out_type != CUDA_R_32F) return MatmulPath::kCublasLt;
  if (!skinny_gemm_supported(x, w, out, M, N, K)) return MatmulPath::kCublasLt;
  if (path_ == MatmulPath::kSkinny || skinny_preferred(M, N, K)) return MatmulPath::kSkinny;
  return MatmulPath::kCublasLt;
}

void LtMatmul::run(const void* x, const void* w, void* out, cudaDataType_t out_type, int64_t M,
                   int64_t N, int64_t K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  if (path_for(x, w, out, out_type, M, N, K) == MatmulPath::kSkinny) {
    launch_skinny_gemm(x, w, out, out_type == CUDA_R_32F, M, N, K, skinny_workspace_, stream);
    return;
  }
  const int align = std::min({alignment_of(x), alignment_of(w), alignment_of(out)});
  const Plan& p = plan_for(Key{M, N, K, static_cast<int>(out_type), align});
  const float alpha = 1.0f, beta = 0.0f;
  PAGELLM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c,
                                      out, p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace pagellm::cuda
