// Memory-bound CUDA ops against the CPU backend: embedding, gather_rows, rms_norm,
// add_rms_norm and silu_mul, over row counts 1..4096 and hidden sizes that take both the
// vectorised (multiple of 8) and the scalar paths.
//
// Bounds: copies (embedding, gather_rows) must be exact, since both backends hold the same
// bf16-representable values. The bf16 ops round their output once: relative L2 error
// <= 1e-2 against the float32 CPU reference (one bf16 rounding is ~2e-3).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace pagellm {
namespace {

using test::relative_close;

class ElementwiseTest : public test::CudaOpTest {};

constexpr double kBf16Tol = 1e-2;

std::string shape_note(const char* op, int64_t rows, int64_t cols) {
  return std::string(op) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

TEST_F(ElementwiseTest, EmbeddingMatchesCpuExactly) {
  for (int64_t vocab : {1, 50, 3000}) {
    for (int64_t hidden : {8, 100, 1024}) {
      for (int64_t tokens : {1, 7, 64, 1000}) {
        const std::string what = shape_note("embedding", tokens, hidden) + " vocab " +
                                 std::to_string(vocab);
        const std::vector<float> table = randn_bf16(static_cast<size_t>(vocab * hidden));
        std::vector<int32_t> ids(static_cast<size_t>(tokens));
        for (int32_t& id : ids) id = uniform_int(0, static_cast<int>(vocab - 1));
        Tensor gt = put(gpu(), DType::BF16, {vocab, hidden}, table);
        Tensor ct = put(cpu(), DType::F32, {vocab, hidden}, table);
        Tensor gids = alloc_i32(gpu(), ids), cids = alloc_i32(cpu(), ids);
        Tensor gout = alloc(gpu(), DType::BF16, {tokens, hidden});
        Tensor cout = alloc(cpu(), DType::F32, {tokens, hidden});
        poison(gpu(), gout);
        gpu().embedding(gt, gids, gout);
        cpu().embedding(ct, cids, cout);
        ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), 0.0, what,
                                   seed_note()));
      }
    }
  }
}

TEST_F(ElementwiseTest, GatherRowsMatchesCpuExactlyForAnyRowSize) {
  // Row sizes in bytes: 4 (f32 x1), 6 (bf16 x3: byte copies), 8, 200 (bf16 x100),
  // 2048 and 607,744 (a float32 logits row of Qwen3's vocabulary).
  struct Case {
    DType dtype;
    int64_t cols;
  };
  for (Case c : {Case{DType::F32, 1}, Case{DType::BF16, 3}, Case{DType::BF16, 4},
                 Case{DType::BF16, 100}, Case{DType::BF16, 1024}, Case{DType::F32, 151936}}) {
    for (int64_t src_rows : {1, 9, 300}) {
      if (c.cols > 100000 && src_rows > 9) continue;
      const int64_t out_rows = src_rows == 1 ? 3 : src_rows / 2 + 1;
      const std::string what = std::string("gather_rows ") + dtype_name(c.dtype) + " " +
                               shape_note("", src_rows, c.cols) + " -> " +
                               std::to_string(out_rows) + " rows";
      const std::vector<float> x = randn_bf16(static_cast<size_t>(src_rows * c.cols));
      std::vector<int32_t> idx(static_cast<size_t>(out_rows));
      for (int32_t& i : idx) i = uniform_int(0, static_cast<int>(src_rows - 1));
      Tensor gx = put(gpu(), c.dtype, {src_rows, c.cols}, x);
      Tensor cx = put(cpu(), DType::F32, {src_rows, c.cols}, x);
      Tensor gi = alloc_i32(gpu(), idx), ci = alloc_i32(cpu(), idx);
      Tensor gout = alloc(gpu(), c.dtype, {out_rows, c.cols});
      Tensor cout = alloc(cpu(), DType::F32, {out_rows, c.cols});
      poison(gpu(), gout);
      gpu().gather_rows(gx, gi, gout);
      cpu().gather_rows(cx, ci, cout);
      ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), 0.0, what,
                                 seed_note()));
    }
  }
}

TEST_F(ElementwiseTest, RmsNormMatchesCpu) {
  for (int64_t hidden : {17, 100, 1024, 2560, 4096, 5120}) {
    for (int64_t rows : {1, 2, 33, 64, 4096}) {
      if (rows == 4096 && hidden > 1024) continue;
      const std::string what = shape_note("rms_norm", rows, hidden);
      const std::vector<float> x = randn_bf16(static_cast<size_t>(rows * hidden), 2.0f);
      const std::vector<float> w = randn_bf16(static_cast<size_t>(hidden), 0.2f, 1.0f);
      Tensor gx = put(gpu(), DType::BF16, {rows, hidden}, x);
      Tensor cx = put(cpu(), DType::F32, {rows, hidden}, x);
      Tensor gw = put(gpu(), DType::BF16, {hidden}, w);
      Tensor cw = put(cpu(), DType::F32, {hidden}, w);
      Tensor gout = alloc(gpu(), DType::BF16, {rows, hidden});
      Tensor cout = alloc(cpu(), DType::F32, {rows, hidden});
      poison(gpu(), gout);
      gpu().rms_norm(gx, gw, 1e-6f, gout);
      cpu().rms_norm(cx, cw, 1e-6f, cout);
      const std::vector<float> ref = cpu().download_f32(cout);
      ASSERT_TRUE(relative_close(gpu().download_f32(gout), ref, kBf16Tol, what, seed_note()));
      // In place (out == x) gives the same result.
      gpu().rms_norm(gx, gw, 1e-6f, gx);
      ASSERT_TRUE(relative_close(gpu().download_f32(gx), ref, kBf16Tol, what + " in place",
                                 seed_note()));
    }
  }
}

// Prefill-sized batches (at least 1,024 rows) run the plain norm one warp per row, smaller
// ones one block per row; a row's output must be the same bits either way (a row's result
// may not depend on its batch). Rows of a large batch against the same rows normalised as
// a small batch, for hidden sizes of the warp kernel's three register layouts, one past its
// range (8,192) and one on the scalar path (1,000).
TEST_F(ElementwiseTest, RmsNormRowsAreTheSameBitsInLargeAndSmallBatches) {
  const int64_t rows = 1500;
  for (int64_t hidden : {1024, 2560, 4096, 5120, 6144, 8192, 1000}) {
    const std::string what = shape_note("rms_norm", rows, hidden);
    const std::vector<float> x = randn_bf16(static_cast<size_t>(rows * hidden), 2.0f);
    const std::vector<float> w = randn_bf16(static_cast<size_t>(hidden), 0.2f, 1.0f);
    Tensor gx = put(gpu(), DType::BF16, {rows, hidden}, x);
    Tensor cx = put(cpu(), DType::F32, {rows, hidden}, x);
    Tensor gw = put(gpu(), DType::BF16, {hidden}, w);
    Tensor cw = put(cpu(), DType::F32, {hidden}, w);
    Tensor all = alloc(gpu(), DType::BF16, {rows, hidden});
    Tensor cout = alloc(cpu(), DType::F32, {rows, hidden});
    poison(gpu(), all);
    gpu().rms_norm(gx, gw, 1e-6f, all);
    cpu().rms_norm(cx, cw, 1e-6f, cout);
    const std::vector<float> large = gpu().download_f32(all);
    ASSERT_TRUE(relative_close(large, cpu().download_f32(cout), kBf16Tol, what, seed_note()));
    const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 1}, {0, 32}, {700, 300}, {1499, 1}};
    for (auto [begin, count] : parts) {
      Tensor part = alloc(gpu(), DType::BF16, {count, hidden});
      poison(gpu(), part);
      gpu().rms_norm(gx.rows(begin, count), gw, 1e-6f, part);
      const std::vector<float> small = gpu().download_f32(part);
      for (size_t i = 0; i < small.size(); ++i) {
        const float want = large[static_cast<size_t>(begin * hidden) + i];
        ASSERT_EQ(std::memcmp(&small[i], &want, sizeof(float)), 0)
            << what << ": row " << begin + static_cast<int64_t>(i) / hidden << " element "
            << static_cast<int64_t>(i) % hidden << " is " << small[i]
            << " normalised in a batch of " << count << " and " << want << " in a batch of "
            << rows << "; " << seed_note();
      }
    }
  }
}

TEST_F(ElementwiseTest, AddRmsNormMatchesCpu) {
  for (int64_t hidden : {17, 100, 1024, 4096, 5120}) {
    for (int64_t rows : {1, 5, 64, 2048}) {
      if (rows == 2048 && hidden > 1024) continue;
      const std::string what = shape_note("add_rms_norm", rows, hidden);
      const std::vector<float> r = randn_bf16(static_cast<size_t>(rows * hidden), 4.0f);
      const std::vector<float> d = randn_bf16(static_cast<size_t>(rows * hidden), 1.0f);
      const std::vector<float> w = randn_bf16(static_cast<size_t>(hidden), 0.2f, 1.0f);
      Tensor gr = put(gpu(), DType::BF16, {rows, hidden}, r);
      Tensor cr = put(cpu(), DType::F32, {rows, hidden}, r);
      Tensor gd = put(gpu(), DType::BF16, {rows, hidden}, d);
      Tensor cd = put(cpu(), DType::F32, {rows, hidden}, d);
      Tensor gw = put(gpu(), DType::BF16, {hidden}, w);
      Tensor cw = put(cpu(), DType::F32, {hidden}, w);
      Tensor gout = alloc(gpu(), DType::BF16, {rows, hidden});
      Tensor cout = alloc(cpu(), DType::F32, {rows, hidden});
      poison(gpu(), gout);
      gpu().add_rms_norm(gr, gd, gw, 1e-6f, gout);
      cpu().add_rms_norm(cr, cd, cw, 1e-6f, cout);
      ASSERT_TRUE(relative_close(gpu().download_f32(gr), cpu().download_f32(cr), kBf16Tol,
                                 what + " residual", seed_note()));
      ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), kBf16Tol,
                                 what + " output", seed_note()));
    }
  }
}

TEST_F(ElementwiseTest, SiluMulMatchesCpu) {
  for (int64_t inter : {3, 24, 100, 3072, 9728}) {
    for (int64_t rows : {1, 3, 64, 1024}) {
      if (rows == 1024 && inter > 3072) continue;
      const std::string what = shape_note("silu_mul", rows, inter);
      const std::vector<float> gu = randn_bf16(static_cast<size_t>(rows * 2 * inter), 3.0f);
      Tensor g = put(gpu(), DType::BF16, {rows, 2 * inter}, gu);
      Tensor c = put(cpu(), DType::F32, {rows, 2 * inter}, gu);
      Tensor gout = alloc(gpu(), DType::BF16, {rows, inter});
      Tensor cout = alloc(cpu(), DType::F32, {rows, inter});
      poison(gpu(), gout);
      gpu().silu_mul(g, gout);
      cpu().silu_mul(c, cout);
      ASSERT_TRUE(relative_close(gpu().download_f32(gout), cpu().download_f32(cout), kBf16Tol,
                                 what, seed_note()));
    }
  }
}

TEST_F(ElementwiseTest, OpsRejectWrongDtypesAndShapesClearly) {
  Tensor x32 = alloc(gpu(), DType::F32, {4, 64});
  Tensor x = alloc(gpu(), DType::BF16, {4, 64});
  Tensor w = alloc(gpu(), DType::BF16, {64});
  Tensor w_bad = alloc(gpu(), DType::BF16, {63});
  Tensor out = alloc(gpu(), DType::BF16, {4, 64});
  EXPECT_THROW(gpu().rms_norm(x32, w, 1e-6f, out), Error);
  EXPECT_THROW(gpu().rms_norm(x, w_bad, 1e-6f, out), Error);
  Tensor gu_bad = alloc(gpu(), DType::BF16, {4, 100});
  EXPECT_THROW(gpu().silu_mul(gu_bad, out), Error);
  Tensor ids = alloc(gpu(), DType::F32, {4});
  EXPECT_THROW(gpu().embedding(x, ids, out), Error);
}

}  // namespace
}  // namespace pagellm
