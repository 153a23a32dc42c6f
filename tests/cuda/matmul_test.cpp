// cuBLASLt matrix products against the CPU backend's sgemm: out[M, N] = x[M, K] · w[N, K]ᵀ
// for the fused q/k/v, o_proj, gate/up, down and lm_head shapes of Qwen3 0.6B..14B, token
// counts 1..4096, bf16 and float32 outputs, and views that are not 256-byte aligned.
//
// Bounds: both sides multiply the same bf16-representable values and accumulate in
// float32, so a float32 output differs only by summation order (relative L2 <= 1e-4); a
// bf16 output adds one rounding (<= 1e-2).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"

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
