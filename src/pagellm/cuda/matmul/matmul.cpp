#include "pagellm/cuda/matmul/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pagellm/common/hash.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"

namespace pagellm::cuda {
namespace {

// Warm-up and timed launches per autotuning candidate.
constexpr int kTuneWarmups = 2;
constexpr int kTuneReps = 10;
// A candidate replaces the best so far only if it is this much faster: timing noise then
// rarely overturns the heuristic's ranking, which keeps the choice stable between runs.
constexpr float kTuneMargin = 0.02f;

// Largest power of two dividing a byte offset (an address, a row pitch), capped at 256
// (cuBLASLt's default assumption).
int alignment_of(uintptr_t bytes) {
  int align = 256;
  while (align > 1 && (bytes % static_cast<uintptr_t>(align)) != 0) align /= 2;
  return align;
}
int alignment_of(const void* p) { return alignment_of(reinterpret_cast<uintptr_t>(p)); }

const char* type_name(int t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "f32";
    default: return "?";
  }
}

const char* reduction_name(int scheme) {
  switch (scheme) {
    case CUBLASLT_REDUCTION_SCHEME_NONE: return "none";
    case CUBLASLT_REDUCTION_SCHEME_INPLACE: return "inplace";
    case CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: return "compute";
    case CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE: return "output";
    default: return "?";
  }
}

// Reads one algorithm configuration attribute of type T (0 if cuBLASLt does not report it).
template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return value;
}

MatmulPlanInfo describe(const cublasLtMatmulAlgo_t& algo) {
  MatmulPlanInfo info;
  info.algo_id = algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID);
  info.tile_id = static_cast<int>(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
  info.stages_id = static_cast<int>(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  info.splitk = std::max(1, algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
  info.reduction_scheme =
      static_cast<int>(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  return info;
}

// Run-to-run deterministic and float32 all the way: no split-K, or split-K whose float32
// partials a separate kernel sums in a fixed order.
bool deterministic_float32_reduction(const MatmulPlanInfo& info) {
  return info.splitk <= 1 || info.reduction_scheme == CUBLASLT_REDUCTION_SCHEME_NONE ||
         info.reduction_scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
}

// Whether `stream` (or, for the legacy stream, the device) is being captured into a graph.
// An error reads as "capturing": the caller then does nothing that capture would forbid.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

std::string MatmulPlanInfo::summary() const {
  char text[160];
  int n = std::snprintf(text, sizeof(text), "algo %d tile %d stages %d splitk %d red %s, rank %d/%d",
                        algo_id, tile_id, stages_id, splitk, reduction_name(reduction_scheme),
                        heuristic_rank, candidates);
  if (tuned && n > 0 && static_cast<size_t>(n) < sizeof(text)) {
    std::snprintf(text + n, sizeof(text) - n, " tuned %.1f vs top %.1f us", chosen_us, top_us);
  }
  return text;
}

bool skinny_gemm_preferred(int64_t M, int64_t N, int64_t K) {
  (void)N;
  (void)K;
  return M <= kSkinnyAutoMaxM;
}

size_t LtMatmul::KeyHash::operator()(const Key& k) const {
  return hash_values(k.m, k.n, k.k, k.out_type, k.align, k.in_type, k.accumulate, k.ldc);
}

LtMatmul::LtMatmul(void* workspace, size_t workspace_bytes, MatmulPath path, bool autotune)
    : workspace_(workspace), workspace_bytes_(workspace_bytes), path_(path), autotune_(autotune) {
  PAGELLM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  try {
    prepare_skinny_gemm();
  } catch (...) {
    cublasLtDestroy(handle_);
    throw;
  }
}

LtMatmul::~LtMatmul() {
  for (auto& entry : plans_) destroy(entry.second);
  if (handle_) cublasLtDestroy(handle_);  // nothing useful to do with a failure here
}

void LtMatmul::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

LtMatmul::Key LtMatmul::key_of(const void* x, const void* w, const void* out,
                               cudaDataType_t out_type, int64_t M, int64_t N, int64_t K,
                               int64_t ld_out) {
  PAGELLM_CHECK(ld_out == 0 || ld_out >= N)
      << "matmul: an output of " << N << " columns cannot have rows " << ld_out << " apart";
  Key key{M, N, K, static_cast<int>(out_type),
          std::min({alignment_of(x), alignment_of(w), alignment_of(out)})};
  if (ld_out != 0 && ld_out != N) {
    // Every row must start as aligned as the first for the alignment to hold.
    key.ldc = ld_out;
    const int64_t elem = out_type == CUDA_R_32F ? 4 : 2;
    key.align = std::min(key.align, alignment_of(static_cast<uintptr_t>(ld_out * elem)));
  }
  return key;
}

float LtMatmul::time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* x,
                          const void* w, void* out, float beta, cudaStream_t stream,
                          void* flush, size_t flush_bytes, cudaEvent_t* events, int reps) {
  const float alpha = 1.0f;
  auto launch = [&] {
    return cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c,
                          &algo, workspace_, workspace_bytes_, stream);
  };
  for (int i = 0; i < kTuneWarmups; ++i) {
    if (launch() != CUBLAS_STATUS_SUCCESS) return -1.0f;
  }
  for (int r = 0; r < reps; ++r) {
    if (flush) PAGELLM_CUDA_CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
    PAGELLM_CUDA_CHECK(cudaEventRecord(events[2 * r], stream));
    const cublasStatus_t st = launch();
    PAGELLM_CUDA_CHECK(cudaEventRecord(events[2 * r + 1], stream));
    if (st != CUBLAS_STATUS_SUCCESS) {
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      return -1.0f;
    }
  }
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(events[2 * reps - 1]));
  std::vector<float> us(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    float ms = 0.0f;
    PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
    us[static_cast<size_t>(r)] = ms * 1e3f;
  }
  std::nth_element(us.begin(), us.begin() + reps / 2, us.end());
  return us[static_cast<size_t>(reps / 2)];
}

const LtMatmul::Plan& LtMatmul::plan_for(const Key& key, const void* x, const void* w,
                                         void* out, cudaStream_t stream) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  void* flush = nullptr;
  void* scratch_out = nullptr;  // accumulating plans are timed on this, not on `out`
  std::vector<cudaEvent_t> events;
  auto release_tuning = [&] {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    events.clear();
    if (flush) cudaFree(flush);
    flush = nullptr;
    if (scratch_out) cudaFree(scratch_out);
    scratch_out = nullptr;
  };
  try {
    const auto out_type = static_cast<cudaDataType_t>(key.out_type);
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &trans_a, sizeof(trans_a)));
    PAGELLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &trans_b, sizeof(trans_b)));
    // Column-major views: A = w as [K, N] (ld K), B = x as [K, M] (ld K), C = outᵀ [N, M].
    const auto in_type = static_cast<cudaDataType_t>(key.in_type);
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_type, key.k, key.n, key.k));
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_type, key.k, key.m, key.k));
    const int64_t ldc = key.ldc > 0 ? key.ldc : key.n;
    PAGELLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, key.n, key.m, ldc));

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

    // Candidates, best first by the heuristic, keeping only float32 fixed-order reductions.
    // The filter is applied here rather than through CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK
    // so that it holds whatever the mask does with split-K-free algorithms; twice the
    // candidates are asked for to leave kAutotuneCandidates after it.
    std::vector<cublasLtMatmulHeuristicResult_t> results(2 * kAutotuneCandidates);
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                       static_cast<int>(results.size()), results.data(), &count);
    PAGELLM_CHECK(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED)
        << "cuBLAS error: " << cublas_status_name(st)
        << " in cublasLtMatmulAlgoGetHeuristic for matmul [" << key.m << ", " << key.k
        << "] x [" << key.n << ", " << key.k << "]^T";
    if (st != CUBLAS_STATUS_SUCCESS) count = 0;
    std::vector<cublasLtMatmulHeuristicResult_t> usable, candidates;
    for (int i = 0; i < count; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          results[i].workspaceSize <= workspace_bytes_) {
        usable.push_back(results[i]);
      }
    }
    for (const auto& r : usable) {
      if (deterministic_float32_reduction(describe(r.algo)) &&
          candidates.size() < static_cast<size_t>(kAutotuneCandidates)) {
        candidates.push_back(r);
      }
    }
    // None of that kind (not seen on the shapes we run): the heuristic's first choice, still
    // deterministic run to run per cuBLAS; info.reduction_scheme records what it does.
    if (candidates.empty() && !usable.empty()) candidates.push_back(usable.front());
    PAGELLM_CHECK(!candidates.empty())
        << "cuBLASLt has no algorithm for matmul x[" << key.m << ", " << key.k << "] ("
        << type_name(key.in_type) << ") x w[" << key.n << ", " << key.k << "]^T ("
        << type_name(key.in_type) << ") -> " << type_name(key.out_type)
        << " with " << key.align << "-byte aligned pointers and a " << workspace_bytes_
        << "-byte workspace";
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;

    size_t chosen = 0;
    bool tuned = false;
    float top_us = 0, chosen_us = 0;
    if (autotune_ && key.m <= autotune_max_m_ && candidates.size() > 1 && !capturing(stream)) {
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      // Flush L2 before each timed launch (a decode step streams every layer's weights from
      // HBM). Without memory for the buffer, time with a warm L2 rather than fail.
      int device = 0, l2_bytes = 0;
      PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
      PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
      const size_t flush_bytes = 2 * static_cast<size_t>(std::max(l2_bytes, 0));
      if (flush_bytes > 0 && cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        flush = nullptr;
      }
      // An accumulating product would add to `out` at every timed launch: time it on a
      // zeroed scratch output of the same shape instead (no tuning without the memory).
      void* timed_out = out;
      if (key.accumulate) {
        const size_t out_bytes = static_cast<size_t>(key.m) * static_cast<size_t>(ldc) *
                                 (out_type == CUDA_R_32F ? 4 : 2);
        if (cudaMalloc(&scratch_out, out_bytes) != cudaSuccess) {
          (void)cudaGetLastError();
          scratch_out = nullptr;
        } else {
          PAGELLM_CUDA_CHECK(cudaMemsetAsync(scratch_out, 0, out_bytes, stream));
        }
        timed_out = scratch_out;
      }
      events.resize(2 * kTuneReps, nullptr);
      for (cudaEvent_t& e : events) PAGELLM_CUDA_CHECK(cudaEventCreate(&e));
      float best_us = -1.0f;
      for (size_t i = 0; timed_out != nullptr && i < candidates.size(); ++i) {
        const float us = time_algo(p, candidates[i].algo, x, w, timed_out,
                                   key.accumulate ? 1.0f : 0.0f, stream, flush, flush_bytes,
                                   events.data(), kTuneReps);
        if (i == 0) top_us = us;
        if (us < 0) continue;
        if (best_us < 0 || us < best_us * (1.0f - kTuneMargin)) {
          best_us = us;
          chosen = i;
        }
      }
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      release_tuning();
      tuned = best_us >= 0;
      chosen_us = best_us;
    }
    p.algo = candidates[chosen].algo;
    p.info = describe(p.algo);
    p.info.heuristic_rank = static_cast<int>(chosen);
    p.info.candidates = static_cast<int>(candidates.size());
    p.info.tuned = tuned;
    p.info.top_us = top_us;
    p.info.chosen_us = chosen_us;
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    release_tuning();
    destroy(p);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

const MatmulPlanInfo* LtMatmul::plan_info(const void* x, const void* w, const void* out,
                                          cudaDataType_t out_type, int64_t M, int64_t N,
                                          int64_t K, bool accumulate) const {
  Key key = key_of(x, w, out, out_type, M, N, K);
  key.accumulate = accumulate;
  const auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : &it->second.info;
}

MatmulPath LtMatmul::path_for(const void* x, const void* w, const void* out,
                              cudaDataType_t out_type, int64_t M, int64_t N, int64_t K) const {
  if (batch_invariant_) {
    return (out_type == CUDA_R_16BF || out_type == CUDA_R_32F) &&
                   skinny_gemm_supported(x, w, out, M, N, K)
               ? MatmulPath::kSkinny
               : MatmulPath::kCublasLt;
  }
  if (path_ == MatmulPath::kCublasLt) return MatmulPath::kCublasLt;
  if (out_type != CUDA_R_16BF && out_type != CUDA_R_32F) return MatmulPath::kCublasLt;
  if (!skinny_gemm_supported(x, w, out, M, N, K)) return MatmulPath::kCublasLt;
  if (path_ == MatmulPath::kAuto && !skinny_gemm_preferred(M, N, K)) return MatmulPath::kCublasLt;
  return MatmulPath::kSkinny;
}

void LtMatmul::check_invariant_path(int64_t M, int64_t N, int64_t K) const {
  PAGELLM_CHECK(!batch_invariant_)
      << "batch-invariant mode: the product x[" << M << ", " << K << "] w[" << N << ", " << K
      << "]^T cannot run on the skinny kernel (it needs an sm_90 GPU, K a multiple of 8, "
         "16-byte aligned x and w and a bf16 or float32 output), and cuBLASLt's per-row bits "
         "depend on M; run without --batch-invariant";
}

bool LtMatmul::run_silu_mul(const void* x, const void* w_gate_up, void* out, int64_t M,
                            int64_t inter, int64_t K, cudaStream_t stream,
                            const void* w_packed) {
  if (path_for(x, w_gate_up, out, CUDA_R_16BF, M, 2 * inter, K) != MatmulPath::kSkinny) {
    check_invariant_path(M, 2 * inter, K);
    return false;
  }
  if (M > 0 && inter > 0) {
    launch_skinny_gemm_silu_mul(x, w_gate_up, out, M, inter, K, stream, 0, w_packed,
                                batch_invariant_);
  }
  return true;
}

void LtMatmul::run(const void* x, const void* w, void* out, cudaDataType_t out_type, int64_t M,
                   int64_t N, int64_t K, cudaStream_t stream, const void* w_packed,
                   int64_t ld_out) {
  const Key key = key_of(x, w, out, out_type, M, N, K, ld_out);
  if (M == 0 || N == 0) return;
  // The skinny kernel writes whole rows: a wider output always takes cuBLASLt.
  if (key.ldc == 0 && path_for(x, w, out, out_type, M, N, K) == MatmulPath::kSkinny) {
    launch_skinny_gemm(x, w, out, out_type == CUDA_R_32F, M, N, K, stream, 0, w_packed,
                       batch_invariant_);
    return;
  }
  check_invariant_path(M, N, K);
  const Plan& p = plan_for(key, x, w, out, stream);
  launch_plan(p, x, w, out, 0.0f, stream);
}

void LtMatmul::launch_plan(const Plan& p, const void* x, const void* w, void* out, float beta,
                           cudaStream_t stream) {
  const float alpha = 1.0f;
  PAGELLM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c,
                                      out, p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

bool LtMatmul::run_accumulate(const void* x, const void* w, void* out, int64_t M, int64_t N,
                              int64_t K, cudaStream_t stream, int64_t ld_out) {
  Key key = key_of(x, w, out, CUDA_R_16BF, M, N, K, ld_out);
  key.accumulate = true;
  // The skinny kernel writes whole rows: a wider output always takes cuBLASLt.
  if (key.ldc == 0 && path_for(x, w, out, CUDA_R_16BF, M, N, K) == MatmulPath::kSkinny) {
    return false;
  }
  check_invariant_path(M, N, K);
  if (M == 0 || N == 0 || K == 0) return true;  // nothing to add
  const Plan& p = plan_for(key, x, w, out, stream);
  launch_plan(p, x, w, out, 1.0f, stream);
  return true;
}

void LtMatmul::run_f32(const float* x, const float* w, float* out, int64_t M, int64_t N,
                       int64_t K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  Key key = key_of(x, w, out, CUDA_R_32F, M, N, K);
  key.in_type = CUDA_R_32F;
  const Plan& p = plan_for(key, x, w, out, stream);
  launch_plan(p, x, w, out, 0.0f, stream);
}

}  // namespace pagellm::cuda
