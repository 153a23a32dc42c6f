// Packed decode weights (CudaBackend::prepare_matrix): the layer matrices the model hands
// to the backend get a copy in the skinny kernel's stage layout, which its decode products
// stream instead of the row-major matrix.
//
// - The engine end to end (ragged prefill, decode through captured graphs) gives the same
//   logits bit for bit with the packed copies in use and with them ignored.
// - Products through a packed copy match the CPU backend; a copy follows a rewrite of its
//   matrix once prepare_matrix runs again (in place, same bytes), and until then the
//   products read the stale copy, which shows that they read it at all.
// - A gated copy serves only the fused SiLU product of its [gate; up] matrix.
// - Freeing the matrix's buffer frees its copy; PAGELLM_PACKED_WEIGHTS=0 packs nothing and
//   an unknown value is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

using test::relative_close;
using test::ScopedEnv;

bool packing_device() { return cuda::current_device_info(nullptr) == 90; }

struct EngineRun {
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> logits;  // (request, index)
  std::vector<int64_t> ids;
  size_t packed_matrices = 0;
  size_t packed_bytes = 0;
  size_t prepared_bytes = 0;
  int64_t graph_steps = 0;
};

EngineRun generate(bool use_packed, const Qwen3Config& c, const testing::HostWeights& w,
                   const std::vector<std::vector<int32_t>>& prompts) {
  auto backend = create_backend("cuda");
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend.get());
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineRun run;
  run.packed_matrices = cuda->packed_matrices();
  run.packed_bytes = cuda->packed_weight_bytes();
  run.prepared_bytes = model->prepared_bytes();
  // Before the engine captures its decode graphs.
  cuda->set_packed_weights_enabled(use_packed);
  EngineConfig ec;
  ec.backend = "cuda";
  ec.page_size = 16;
  ec.num_pages = 200;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 128;
  ec.max_model_len = 512;
  Engine engine(std::move(backend), std::move(model), ec);
  engine.set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    run.logits[{id, index}] = std::vector<float>(logits, logits + vocab);
  });
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 20;
  greedy.ignore_eos = true;
  for (const auto& p : prompts) run.ids.push_back(engine.add_request(p, greedy));
  for (int steps = 0; engine.has_unfinished() && steps < 10000; ++steps) engine.step();
  for (int64_t id : run.ids) {
    const Sequence& s = engine.request(id);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength) << s.error;
  }
  run.graph_steps = engine.stats().graph_steps;
  return run;
}

TEST(PackedWeightsEngine, LogitsAreBitIdenticalWithAndWithoutPacking) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  if (!packing_device()) GTEST_SKIP() << "packing serves the sm_90 decode kernel";
  // The heuristic's first cuBLASLt choice (the prefill products), so that both engines run
  // the same algorithms there and only the packing differs.
  ScopedEnv autotune("PAGELLM_MATMUL_AUTOTUNE", "0");
  ScopedEnv policy("PAGELLM_PACKED_WEIGHTS", "auto");
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, test::test_seed());
  std::mt19937 rng(static_cast<uint32_t>(test::test_seed()));
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {1, 9, 40, 3, 70, 17}) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < n; ++i) p.push_back(tok(rng));
    prompts.push_back(p);
  }
  const EngineRun plain = generate(false, c, w, prompts);
  const EngineRun packed = generate(true, c, w, prompts);

  // qkv, o_proj, gate|up and down of every layer have a copy in both engines.
  EXPECT_EQ(packed.packed_matrices, 4 * static_cast<size_t>(c.num_hidden_layers));
  EXPECT_GT(packed.packed_bytes, 0u);
  EXPECT_EQ(packed.prepared_bytes, packed.packed_bytes);
  EXPECT_GT(packed.graph_steps, 0) << "decode should have replayed captured graphs";
  ASSERT_EQ(plain.logits.size(), packed.logits.size());
  size_t compared = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    for (int64_t i = 0;; ++i) {
      const auto a = plain.logits.find({plain.ids[r], i});
      const auto b = packed.logits.find({packed.ids[r], i});
      if (a == plain.logits.end() || b == packed.logits.end()) {
        EXPECT_EQ(a == plain.logits.end(), b == packed.logits.end());
        break;
      }
      ASSERT_EQ(a->second.size(), b->second.size());
      for (size_t v = 0; v < a->second.size(); ++v) {
        // Bit equality, NaN included.
        ASSERT_EQ(std::memcmp(&a->second[v], &b->second[v], sizeof(float)), 0)
            << "request " << r << " token " << i << " logit " << v << ": " << a->second[v]
            << " unpacked, " << b->second[v] << " packed";
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, prompts.size() * 20);
}

class PackedWeightsTest : public test::CudaOpTest {
 protected:
  void SetUp() override {
    // Read when the backend is made (in the base fixture's SetUp).
    policy_.emplace("PAGELLM_PACKED_WEIGHTS", "auto");
    test::CudaOpTest::SetUp();
    if (IsSkipped()) return;
    if (!packing_device()) GTEST_SKIP() << "packing serves the sm_90 decode kernel";
    cuda_ = dynamic_cast<cuda::CudaBackend*>(&gpu());
    ASSERT_NE(cuda_, nullptr);
  }

  // out = x · wᵀ on the CPU backend (float32), the reference.
  std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w,
                               int64_t M, int64_t N, int64_t K) {
    Tensor cx = put(cpu(), DType::F32, {M, K}, x);
    Tensor cw = put(cpu(), DType::F32, {N, K}, w);
    Tensor out = alloc(cpu(), DType::F32, {M, N});
    cpu().matmul(cx, cw, out);
    return cpu().download_f32(out);
  }

  std::vector<float> gpu_product(const Tensor& x, const Tensor& w, int64_t M, int64_t N) {
    Tensor out = alloc(gpu(), DType::F32, {M, N});
    poison(gpu(), out);
    gpu().matmul(x, w, out);
    return gpu().download_f32(out);
  }

  std::optional<ScopedEnv> policy_;
  cuda::CudaBackend* cuda_ = nullptr;
};

TEST_F(PackedWeightsTest, ProductsFollowARewriteOncePreparedAgain) {
  const int64_t M = 5, N = 384, K = 520;  // a ragged row tile and a K tail
  const std::vector<float> x = randn_bf16(static_cast<size_t>(M * K));
  const std::vector<float> w1 = randn_bf16(static_cast<size_t>(N * K), 0.05f);
  const std::vector<float> w2 = randn_bf16(static_cast<size_t>(N * K), 0.05f);
  Tensor gx = put(gpu(), DType::BF16, {M, K}, x);
  Tensor gw = put(gpu(), DType::BF16, {N, K}, w1);
  const size_t before = cuda_->packed_weight_bytes();
  const size_t made = gpu().prepare_matrix(gw);
  EXPECT_GT(made, 0u);
  EXPECT_EQ(cuda_->packed_weight_bytes(), before + made);
  const std::vector<float> ref1 = reference(x, w1, M, N, K);
  const std::vector<float> ref2 = reference(x, w2, M, N, K);
  ASSERT_TRUE(relative_close(gpu_product(gx, gw, M, N), ref1, 1e-4, "packed product",
                             seed_note()));

  // Rewritten but not prepared again: the products still stream the old copy.
  gpu().upload(gw, 0, w2.data(), DType::F32, N * K);
  ASSERT_TRUE(relative_close(gpu_product(gx, gw, M, N), ref1, 1e-4, "stale packed copy",
                             seed_note()));
  // Prepared again: rewritten in place (nothing allocated), the new weights are read.
  EXPECT_EQ(gpu().prepare_matrix(gw), 0u);
  EXPECT_EQ(cuda_->packed_weight_bytes(), before + made);
  ASSERT_TRUE(relative_close(gpu_product(gx, gw, M, N), ref2, 1e-4, "repacked product",
                             seed_note()));
  // With the copies ignored, the row-major matrix gives the same.
  cuda_->set_packed_weights_enabled(false);
  ASSERT_TRUE(relative_close(gpu_product(gx, gw, M, N), ref2, 1e-4, "row-major product",
                             seed_note()));
}

TEST_F(PackedWeightsTest, AGatedCopyServesOnlyTheFusedSiluProduct) {
  const int64_t M = 3, I = 320, K = 256;
  const std::vector<float> x = randn_bf16(static_cast<size_t>(M * K));
  const std::vector<float> w = randn_bf16(static_cast<size_t>(2 * I * K), 0.06f);
  Tensor gx = put(gpu(), DType::BF16, {M, K}, x);
  Tensor gw = put(gpu(), DType::BF16, {2 * I, K}, w);
  EXPECT_GT(gpu().prepare_matrix(gw, I), 0u);

  // Reference: the CPU backend's product and activation, from the same bf16 inputs.
  Tensor cx = put(cpu(), DType::F32, {M, K}, x);
  Tensor cw = put(cpu(), DType::F32, {2 * I, K}, w);
  Tensor cgu = alloc(cpu(), DType::F32, {M, 2 * I});
  Tensor cact = alloc(cpu(), DType::F32, {M, I});
  cpu().matmul_silu_mul(cx, cw, cgu, cact);
  Tensor ggu = alloc(gpu(), DType::BF16, {M, 2 * I});
  Tensor gact = alloc(gpu(), DType::BF16, {M, I});
  poison(gpu(), gact);
  gpu().matmul_silu_mul(gx, gw, ggu, gact);
  EXPECT_TRUE(relative_close(gpu().download_f32(gact), cpu().download_f32(cact), 1e-2,
                             "fused SiLU product through the gated copy", seed_note()));
  // A plain product of the same matrix must not read the gated (row-interleaved) copy.
  EXPECT_TRUE(relative_close(gpu_product(gx, gw, M, 2 * I), reference(x, w, M, 2 * I, K), 1e-4,
                             "plain product of a gated matrix", seed_note()));
}

TEST_F(PackedWeightsTest, FreeingTheMatrixFreesItsCopy) {
  const size_t matrices = cuda_->packed_matrices(), bytes = cuda_->packed_weight_bytes();
  {
    DeviceBuffer buffer(&gpu(), 2 * 1024 * 2048);
    Tensor w = buffer.tensor(DType::BF16, {1024, 2048});
    gpu().fill(w, 0.5f);
    EXPECT_EQ(gpu().prepare_matrix(w), size_t{1024} * 2048 * 2);
    EXPECT_EQ(cuda_->packed_matrices(), matrices + 1);
  }
  EXPECT_EQ(cuda_->packed_matrices(), matrices);
  EXPECT_EQ(cuda_->packed_weight_bytes(), bytes);
  // A new matrix at what may be the same address gets a fresh copy of its own.
  DeviceBuffer buffer(&gpu(), 2 * 256 * 512);
  Tensor w = buffer.tensor(DType::BF16, {256, 512});
  const std::vector<float> values = randn_bf16(256 * 512, 0.05f);
  gpu().upload(w, 0, values.data(), DType::F32, w.numel());
  EXPECT_GT(gpu().prepare_matrix(w), 0u);
  const std::vector<float> x = randn_bf16(2 * 512);
  Tensor gx = put(gpu(), DType::BF16, {2, 512}, x);
  EXPECT_TRUE(relative_close(gpu_product(gx, w, 2, 256), reference(x, values, 2, 256, 512),
                             1e-4, "product of a matrix prepared after another was freed",
                             seed_note()));
}

TEST(PackedWeightsPolicy, ZeroPacksNothingAndUnknownValuesAreRefused) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  {
    ScopedEnv policy("PAGELLM_PACKED_WEIGHTS", "0");
    auto backend = create_backend("cuda");
    DeviceBuffer buffer(backend.get(), 2 * 256 * 512);
    Tensor w = buffer.tensor(DType::BF16, {256, 512});
    EXPECT_EQ(backend->prepare_matrix(w), 0u);
    EXPECT_EQ(dynamic_cast<cuda::CudaBackend&>(*backend).packed_matrices(), 0u);
  }
  ScopedEnv policy("PAGELLM_PACKED_WEIGHTS", "yes");
  try {
    create_backend("cuda");
    ADD_FAILURE() << "PAGELLM_PACKED_WEIGHTS=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PAGELLM_PACKED_WEIGHTS=yes"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagellm
