// The attention dispatcher end to end: the engine on the CUDA backend with
// `--attention-backend cudnn` and with `native` gives the same greedy tokens on a small
// random-weight Qwen3 (ragged prefill batches run eagerly, decode through captured graphs
// whose page-table rows hold max_model_len tokens), and `auto` without a measured table
// stays native.
//
// bf16 rounding differs between the two providers, so two argmaxes may legitimately differ
// where the top two logits are within rounding of each other. Tokens are compared while the
// histories agree; where native's top-two gap is below kTieGap a difference ends the
// comparison of that request (its later tokens depend on the tie), anywhere else it fails.
// Logits are compared too while the histories agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "pagellm/attention/planner.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

constexpr double kTieGap = 0.05;

struct ProviderRun : test::GreedyRun {
  cuda::AttentionRouteStats stats;
  int64_t graph_steps = 0;
  std::string last_plan;
};

ProviderRun generate(const std::string& attention_backend, const Qwen3Config& c,
             const testing::HostWeights& w, const std::vector<std::vector<int32_t>>& prompts) {
  auto backend = create_backend("cuda");
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend.get());
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.backend = "cuda";
  ec.page_size = 16;
  ec.num_pages = 400;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 256;
  // Not a multiple of the page size: rows hold 63 pages (1008 tokens), decode graphs
  // declare a KV capacity of 1000.
  ec.max_model_len = 1000;
  ec.attention_backend = attention_backend;
  Engine engine(std::move(backend), std::move(model), ec);
  ProviderRun run;
  engine.set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    run.logits[{id, index}] = std::vector<float>(logits, logits + vocab);
  });
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 24;
  greedy.ignore_eos = true;
  for (const auto& p : prompts) run.ids.push_back(engine.add_request(p, greedy));
  int steps = 0;
  while (engine.has_unfinished()) {
    engine.step();
    if (++steps > 10000) break;
  }
  for (int64_t id : run.ids) {
    const Sequence& s = engine.request(id);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength) << attention_backend << ": " << s.error;
    run.outputs.push_back(s.output);
  }
  run.stats = cuda->attention_route_stats();
  run.graph_steps = engine.stats().graph_steps;
  if (const AttentionPlan* plan = cuda->last_attention_plan()) run.last_plan = plan->summary();
  return run;
}

class EngineAttentionBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    config_ = testing::small_gpu_config();
    weights_ = testing::random_weights(config_, 4242);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(config_.vocab_size) - 1);
    // Ragged prefill (one long prompt among short ones, chunked by the 256-token budget),
    // then decode of up to 8 requests through the captured graphs.
    for (int32_t n : {1, 5, 17, 40, 300, 3, 100, 33}) {
      std::vector<int32_t> p;
      for (int32_t i = 0; i < n; ++i) p.push_back(tok(rng));
      prompts_.push_back(p);
    }
  }

  Qwen3Config config_;
  testing::HostWeights weights_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(EngineAttentionBackend, CudnnAndNativeGiveTheSameGreedyTokens) {
  const ProviderRun native = generate("native", config_, weights_, prompts_);
  EXPECT_EQ(native.stats.cudnn_calls, 0);
  EXPECT_GT(native.stats.native_calls, 0);
  ProviderRun cudnn;
  try {
    cudnn = generate("cudnn", config_, weights_, prompts_);
  } catch (const Error& e) {
    if (std::getenv("PAGELLM_ALLOW_NO_CUDNN")) GTEST_SKIP() << e.what();
    FAIL() << e.what();
  }
  // Every attention call went through cuDNN: the eager prefills and the captured decodes.
  EXPECT_GT(cudnn.stats.cudnn_calls, 0) << cudnn.last_plan;
  EXPECT_EQ(cudnn.stats.native_calls, 0) << cudnn.last_plan;
  EXPECT_GT(cudnn.graph_steps, 0) << "decode should have replayed captured graphs";
  EXPECT_GT(native.graph_steps, 0);

  test::expect_same_greedy_run(native, cudnn, "between the providers (native, cudnn)",
                               2e-2, kTieGap);
}

TEST_F(EngineAttentionBackend, AutoNeverFailsAndStaysNativeWithoutATable) {
  const ProviderRun run = generate("auto", config_, weights_, {prompts_[0], prompts_[4], prompts_[6]});
  EXPECT_GT(run.stats.forwards_planned, 0);
  EXPECT_EQ(run.stats.native_calls + run.stats.cudnn_calls > 0, true);
  // Where no crossover table was measured for this GPU and cuDNN (or no cuDNN loads), auto
  // runs every call natively; the last plan says which rule decided.
  const bool no_table = run.last_plan.find("no crossover table") != std::string::npos ||
                        run.last_plan.find("no cuDNN library") != std::string::npos;
  if (no_table) {
    EXPECT_EQ(run.stats.cudnn_calls, 0) << run.last_plan;
  }
  std::cout << "[ auto     ] " << run.last_plan << "\n";
}

TEST_F(EngineAttentionBackend, UnknownChoiceIsAClearError) {
  try {
    generate("flash", config_, weights_, {prompts_[0]});
    ADD_FAILURE() << "an unknown attention backend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, native or cudnn"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagellm
