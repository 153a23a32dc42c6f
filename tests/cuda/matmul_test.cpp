// cuBLASLt matrix products against the CPU backend's sgemm: out[M, N] = x[M, K] · w[N, K]ᵀ
// for the fused q/k/v, o_proj, gate/up, down and lm_head shapes of Qwen3 0.6B..14B, token
// counts 1..4096, bf16 and float32 outputs, and views that are not 256-byte aligned.
//
// Bounds: both sides multiply the same bf16-representable values and accumulate in
// float32, so a float32 output differs only by summation order (relative L2 <= 1e-4); a
// bf16 output adds one rounding (<= 1e-2).
//
// Autotuning (LtMatmul directly): a tuned plan against the heuristic's first choice, per
// element within one bf16 rounding plus float32 summation-order noise; the tuned plan
// bit-identical on a rerun and inside a CUDA graph; shapes first seen under capture or above
// kAutotuneMaxM are not tuned; chosen algorithms use only float32 fixed-order reductions.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/matmul/matmul.h"

namespace pagellm {
namespace {

using test::relative_close;

class MatmulTest : public test::CudaOpTest {
 protected:
  // Runs one product on both backends; x_row_offset > 0 takes x as a view that starts
  // x_row_offset rows into a larger buffer (a pointer that is not 256-byte aligned).
  void check(int64_t M, int64_t N, int64_t K, DType out_dtype, int64_t x_row_offset = 0) {
    const std::string what = std::string("matmul x[") + std::to_string(M) + ", " +
                             std::to_string(K) + "] w[" + std::to_string(N) + ", " +
                             std::to_string(K) + "]^T -> " + dtype_name(out_dtype) +
                             (x_row_offset ? " (offset view)" : "");
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(K));
    const std::vector<float> x = randn_bf16(static_cast<size_t>((M + x_row_offset) * K));
    const std::vector<float> w = randn_bf16(static_cast<size_t>(N * K), w_scale);
    Tensor gx = put(gpu(), DType::BF16, {M + x_row_offset, K}, x).rows(x_row_offset, M);
    Tensor cx = put(cpu(), DType::F32, {M + x_row_offset, K}, x).rows(x_row_offset, M);
    Tensor gw = put(gpu(), DType::BF16, {N, K}, w);
    Tensor cw = put(cpu(), DType::F32, {N, K}, w);
    Tensor gout = alloc(gpu(), out_dtype, {M, N});
    Tensor cout = alloc(cpu(), DType::F32, {M, N});
    poison(gpu(), gout);
    gpu().matmul(gx, gw, gout);
    cpu().matmul(cx, cw, cout);
    const double tol = out_dtype == DType::F32 ? 1e-4 : 1e-2;
    ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), tol, what,
                               seed_note()));
  }
};

TEST_F(MatmulTest, ModelShapesMatchCpu) {
  // (N, K): Qwen3-0.6B qkv, o_proj, gate_up, down; Qwen3-8B qkv, down.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {6144, 4096}, {4096, 12288}};
  for (auto [N, K] : shapes) {
    for (int64_t M : {1, 3, 64, 257}) check(M, N, K, DType::BF16);
  }
  check(4096, 4096, 1024, DType::BF16);  // a long prefill chunk
}

TEST_F(MatmulTest, LogitsInFloat32MatchCpu) {
  for (int64_t M : {1, 8, 64}) check(M, 151936, 1024, DType::F32);
  check(5, 1000, 256, DType::F32);
}

TEST_F(MatmulTest, OddShapesAndUnalignedViewsMatchCpu) {
  check(7, 200, 72, DType::BF16);
  check(1, 8, 8, DType::F32);
  check(33, 1024, 1024, DType::BF16, 1);   // x starts 2 KiB into its buffer
  check(33, 1024, 1032, DType::BF16, 1);   // 2064 bytes: 16-byte alignment only
  check(2, 4096, 1024, DType::F32, 3);
}

TEST_F(MatmulTest, RepeatedShapesReuseThePlanAndStayCorrect) {
  for (int round = 0; round < 3; ++round) check(16, 512, 256, DType::BF16);
}

// Per element: |a - b| <= 2^-7 max(|a|, |b|) + 1e-4 for bf16 outputs (the float32 sums differ
// by summation order, ~1e-6 here, which can move a bf16 rounding by one unit: at most 2^-7
// of the value), |a - b| <= 1e-5 |b| + 1e-4 for float32 outputs.
::testing::AssertionResult within_rounding(const std::vector<float>& a,
                                           const std::vector<float>& b, bool f32,
                                           const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(std::fabs(a[i]), std::fabs(b[i]));
    const double bound = f32 ? 1e-5 * scale + 1e-4 : scale / 128.0 + 1e-4;
    if (!std::isfinite(a[i]) || !std::isfinite(b[i]) || std::fabs(a[i] - b[i]) > bound) {
      return ::testing::AssertionFailure() << what << ": element " << i << " tuned " << a[i]
                                           << " vs heuristic " << b[i] << " (bound " << bound
                                           << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(MatmulTest, AutotunedPlansMatchTheHeuristicAndRepeatBitForBit) {
  using cuda::LtMatmul;
  cudaStream_t stream = nullptr;
  PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  const int64_t ws_floats = int64_t{8} << 20;  // 32 MiB, as the backend
  Tensor ws_tuned = alloc(gpu(), DType::F32, {ws_floats});
  Tensor ws_top = alloc(gpu(), DType::F32, {ws_floats});
  LtMatmul tuned(ws_tuned.data, ws_tuned.nbytes());
  LtMatmul top(ws_top.data, ws_top.nbytes());
  tuned.set_path(cuda::MatmulPath::kCublasLt);
  top.set_path(cuda::MatmulPath::kCublasLt);
  tuned.set_autotune(true);
  top.set_autotune(false);

  struct Case {
    int64_t M, N, K;
    DType out;
  };
  // Qwen3-4B qkv, o_proj, down at decode M; 0.6B lm_head in float32; a prefill-size M.
  const std::vector<Case> cases = {{1, 6144, 2560, DType::BF16},  {32, 2560, 4096, DType::BF16},
                                   {32, 2560, 9728, DType::BF16}, {8, 151936, 1024, DType::F32},
                                   {600, 1024, 1024, DType::BF16}};
  for (const Case& c : cases) {
    const std::string what = "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                             " K=" + std::to_string(c.K) + " " + dtype_name(c.out);
    const bool f32 = c.out == DType::F32;
    const cudaDataType_t out_type = f32 ? CUDA_R_32F : CUDA_R_16BF;
    Tensor x = put(gpu(), DType::BF16, {c.M, c.K}, randn_bf16(static_cast<size_t>(c.M * c.K)));
    Tensor w = put(gpu(), DType::BF16, {c.N, c.K},
                   randn_bf16(static_cast<size_t>(c.N * c.K),
                              1.0f / std::sqrt(static_cast<float>(c.K))));
    Tensor out_tuned = alloc(gpu(), c.out, {c.M, c.N});
    Tensor out_again = alloc(gpu(), c.out, {c.M, c.N});
    Tensor out_top = alloc(gpu(), c.out, {c.M, c.N});
    for (Tensor* t : {&out_tuned, &out_again, &out_top}) poison(gpu(), *t);
    gpu().synchronize();

    tuned.run(x.data, w.data, out_tuned.data, out_type, c.M, c.N, c.K, stream);
    top.run(x.data, w.data, out_top.data, out_type, c.M, c.N, c.K, stream);
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    tuned.run(x.data, w.data, out_again.data, out_type, c.M, c.N, c.K, stream);
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));

    const cuda::MatmulPlanInfo* info =
        tuned.plan_info(x.data, w.data, out_tuned.data, out_type, c.M, c.N, c.K);
    ASSERT_NE(info, nullptr) << what;
    EXPECT_EQ(info->tuned, c.M <= cuda::kAutotuneMaxM && info->candidates > 1)
        << what << ": " << info->summary();
    EXPECT_TRUE(info->splitk <= 1 || info->reduction_scheme == CUBLASLT_REDUCTION_SCHEME_NONE ||
                info->reduction_scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
        << what << ": " << info->summary();
    std::printf("autotune %s: %s\n", what.c_str(), info->summary().c_str());

    const std::vector<float> a = gpu().download_f32(out_tuned);
    const std::vector<float> again = gpu().download_f32(out_again);
    const std::vector<float> b = gpu().download_f32(out_top);
    EXPECT_TRUE(within_rounding(a, b, f32, what)) << seed_note();
    EXPECT_TRUE(bit_identical(a, again)) << what << ": tuned plan not bit-identical on a rerun";
  }

  // Graph capture: a tuned shape replays bit for bit; a shape first seen under capture takes
  // the heuristic's first choice (no timing inside capture) and keeps it afterwards.
  const int64_t N = 2560, K = 4096;
  Tensor w = put(gpu(), DType::BF16, {N, K},
                 randn_bf16(static_cast<size_t>(N * K), 1.0f / std::sqrt(static_cast<float>(K))));
  Tensor x = put(gpu(), DType::BF16, {32, K}, randn_bf16(static_cast<size_t>(32 * K)));
  Tensor eager32 = alloc(gpu(), DType::BF16, {32, N});
  Tensor graph32 = alloc(gpu(), DType::BF16, {32, N});
  Tensor graph3 = alloc(gpu(), DType::BF16, {3, N});
  Tensor eager3 = alloc(gpu(), DType::BF16, {3, N});
  for (Tensor* t : {&eager32, &graph32, &graph3, &eager3}) poison(gpu(), *t);
  gpu().synchronize();
  tuned.run(x.data, w.data, eager32.data, CUDA_R_16BF, 32, N, K, stream);
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  tuned.run(x.data, w.data, graph32.data, CUDA_R_16BF, 32, N, K, stream);
  tuned.run(x.data, w.data, graph3.data, CUDA_R_16BF, 3, N, K, stream);
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  const cuda::MatmulPlanInfo* info3 =
      tuned.plan_info(x.data, w.data, graph3.data, CUDA_R_16BF, 3, N, K);
  ASSERT_NE(info3, nullptr);
  EXPECT_FALSE(info3->tuned) << "a plan made under capture was tuned: " << info3->summary();
  tuned.run(x.data, w.data, eager3.data, CUDA_R_16BF, 3, N, K, stream);
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_FALSE(tuned.plan_info(x.data, w.data, eager3.data, CUDA_R_16BF, 3, N, K)->tuned)
      << "a cached plan changed after capture";
  EXPECT_TRUE(bit_identical(gpu().download_f32(graph32), gpu().download_f32(eager32)))
      << "tuned plan differs between eager run and graph replay";
  EXPECT_TRUE(bit_identical(gpu().download_f32(graph3), gpu().download_f32(eager3)))
      << "plan made under capture differs between graph replay and eager run";
}

// A residual sublayer's product and norm in one op (Backend::matmul_add_rms_norm): the
// residual and the normalised output against the CPU backend's float32 ops, on both paths.
// Decode batches (M <= kSkinnyAutoMaxM = 64) take the skinny kernel, which writes the
// product into `proj` before add_rms_norm; larger M add the product inside cuBLASLt's
// epilogue and leave `proj` alone (still NaN), which shows which path ran. The first run
// of an M <= 512 autotunes the accumulating plan: the residual must still take the
// product exactly once.
TEST_F(MatmulTest, MatmulAddRmsNormMatchesCpuOnBothPaths) {
  const char* path_env = std::getenv("PAGELLM_MATMUL");
  const bool forced_path = path_env != nullptr && std::string(path_env) != "auto";
  int device = 0, major = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const bool skinny_gpu = major == 9;  // the skinny kernel needs sm_90
  // (N, K): Qwen3-0.6B o_proj and down.
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{1024, 2048}, {1024, 3072}}) {
    for (int64_t M : {1, 32, 33, 64, 65, 200, 1300}) {
      const std::string what = "matmul_add_rms_norm x[" + std::to_string(M) + ", " +
                               std::to_string(K) + "] w[" + std::to_string(N) + ", " +
                               std::to_string(K) + "]^T";
      const std::vector<float> x = randn_bf16(static_cast<size_t>(M * K));
      const std::vector<float> w =
          randn_bf16(static_cast<size_t>(N * K), 1.0f / std::sqrt(static_cast<float>(K)));
      const std::vector<float> r = randn_bf16(static_cast<size_t>(M * N), 4.0f);
      const std::vector<float> g = randn_bf16(static_cast<size_t>(N), 0.2f, 1.0f);
      Tensor gx = put(gpu(), DType::BF16, {M, K}, x), cx = put(cpu(), DType::F32, {M, K}, x);
      Tensor gw = put(gpu(), DType::BF16, {N, K}, w), cw = put(cpu(), DType::F32, {N, K}, w);
      Tensor gr = put(gpu(), DType::BF16, {M, N}, r), cr = put(cpu(), DType::F32, {M, N}, r);
      Tensor gg = put(gpu(), DType::BF16, {N}, g), cg = put(cpu(), DType::F32, {N}, g);
      Tensor gproj = alloc(gpu(), DType::BF16, {M, N}), cproj = alloc(cpu(), DType::F32, {M, N});
      Tensor gout = alloc(gpu(), DType::BF16, {M, N}), cout = alloc(cpu(), DType::F32, {M, N});
      poison(gpu(), gproj);
      poison(gpu(), gout);
      gpu().matmul_add_rms_norm(gx, gw, gproj, gr, gg, 1e-6f, gout);
      cpu().matmul_add_rms_norm(cx, cw, cproj, cr, cg, 1e-6f, cout);
      ASSERT_TRUE(relative_close(gpu().download_f32(gr), cpu().download_f32(cr), 1e-2,
                                 what + " residual", seed_note()));
      ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), 1e-2,
                                 what + " output", seed_note()));
      const std::vector<float> proj = gpu().download_f32(gproj);
      size_t nan_count = 0;
      for (float v : proj) nan_count += std::isnan(v) ? 1 : 0;
      if (forced_path) continue;  // PAGELLM_MATMUL names a path: the routing is not auto's
      if (M <= cuda::kSkinnyAutoMaxM && skinny_gpu) {
        EXPECT_EQ(nan_count, 0u) << what << ": the skinny path left proj unwritten";
      } else {
        EXPECT_EQ(nan_count, proj.size()) << what << ": the cuBLASLt path wrote proj";
      }
    }
  }
}

TEST_F(MatmulTest, RejectsMismatchedShapesClearly) {
  Tensor x = alloc(gpu(), DType::BF16, {4, 64});
  Tensor w = alloc(gpu(), DType::BF16, {32, 63});
  Tensor out = alloc(gpu(), DType::BF16, {4, 32});
  try {
    gpu().matmul(x, w, out);
    FAIL() << "mismatched K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
  }
  Tensor w32 = alloc(gpu(), DType::F32, {32, 64});
  EXPECT_THROW(gpu().matmul(x, w32, out), Error);
}

}  // namespace
}  // namespace pagellm
