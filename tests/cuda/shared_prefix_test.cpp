// Shared-prefix (cascade) decode attention end to end on the CUDA backend: an engine with
// decode graphs generating n = 8 samples for each of three prompts (24 sequences; the pass's
// threshold set to 16 for it; a prompt's samples share its full pages) gives, with the
// shared-prefix pass, the greedy tokens and logits of the same engine without it
// (PAGELLM_DISABLE_DECODE_CASCADE's setting), and the pass really ran: batches carried
// items and captured decode calls held the pass. The kernel itself is
// checked against a double-precision reference in attention_test.cpp
// (PagedAttention.DecodeSharedPrefix*).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

struct SampleRun : test::GreedyRun {
  cuda::AttentionRouteStats stats;
  int64_t graph_steps = 0;
};

SampleRun generate(bool cascade, const Qwen3Config& c, const testing::HostWeights& w,
                   const std::vector<std::vector<int32_t>>& prompts) {
  cuda::CudaSettings settings = cuda::CudaSettings::from_environment();
  settings.decode_cascade = cascade;
  settings.decode_cascade_min_seqs = 16;
  auto backend = std::make_unique<cuda::CudaBackend>(0, settings);
  cuda::CudaBackend* gpu = backend.get();
  EXPECT_EQ(gpu->shared_prefix_min_seqs(), cascade ? 16 : 0);
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.backend = "cuda";
  ec.page_size = 16;
  ec.num_pages = 1200;
  ec.max_num_seqs = 32;
  ec.max_num_batched_tokens = 512;
  ec.max_model_len = 1024;
  Engine engine(std::move(backend), std::move(model), ec);
  SampleRun run;
  engine.set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    run.logits[{id, index}] = std::vector<float>(logits, logits + vocab);
  });
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 40;
  greedy.ignore_eos = true;
  greedy.n = 8;
  std::vector<std::vector<int64_t>> groups;
  for (const auto& p : prompts) groups.push_back(engine.add_request_group(p, greedy));
  int steps = 0;
  while (engine.has_unfinished()) {
    engine.step();
    if (++steps > 10000) break;
  }
  for (const std::vector<int64_t>& g : groups) {
    for (int64_t id : g) {
      const Sequence& s = engine.request(id);
      EXPECT_EQ(s.finish_reason, FinishReason::kLength) << s.error;
      run.ids.push_back(id);
      run.outputs.push_back(s.output);
    }
  }
  run.stats = gpu->attention_route_stats();
  run.graph_steps = engine.stats().graph_steps;
  return run;
}

TEST(SharedPrefixDecode, TheBackendSaysWhenItReadsSharedPrefixes) {
  // What the engine asks before it looks for shared prefixes (build_forward_batch).
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  int cc = 0;
  cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0);
  if (cc < 9) GTEST_SKIP() << "batch-invariant mode needs sm_90";
  cuda::CudaSettings settings = cuda::CudaSettings::from_environment();
  settings.decode_cascade = true;
  settings.decode_kernel = cuda::DecodeKernel::kTma;
  settings.decode_cascade_min_seqs = 40;
  cuda::CudaBackend gpu(0, settings);
  EXPECT_EQ(gpu.shared_prefix_min_seqs(), 40);
  gpu.set_batch_invariant(true);
  EXPECT_EQ(gpu.shared_prefix_min_seqs(), 0) << "batch-invariant mode reads no shared prefix";
  gpu.set_batch_invariant(false);
  EXPECT_EQ(gpu.shared_prefix_min_seqs(), 40);
  settings.decode_kernel = cuda::DecodeKernel::kCpAsync;
  EXPECT_EQ(cuda::CudaBackend(0, settings).shared_prefix_min_seqs(), 0)
      << "the cp.async decode kernel has no shared-prefix pass";
  settings.decode_kernel = cuda::DecodeKernel::kTma;
  settings.decode_cascade = false;
  EXPECT_EQ(cuda::CudaBackend(0, settings).shared_prefix_min_seqs(), 0);
}

TEST(SharedPrefixDecode, SamplesOfAFanOutMatchTheRunWithoutThePass) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  int cc = 0;
  cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0);
  if (cc < 9) GTEST_SKIP() << "the shared-prefix pass runs in the TMA decode kernel (sm_90)";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 5151);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(c.vocab_size) - 1);
  // Prompts of 2, 18 and 6 full pages (plus a partial page each: copy-on-write).
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {40, 300, 100}) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < n; ++i) p.push_back(tok(rng));
    prompts.push_back(p);
  }
  const SampleRun plain = generate(false, c, w, prompts);
  const SampleRun pass = generate(true, c, w, prompts);
  EXPECT_EQ(plain.stats.prefix_pass_calls, 0);
  EXPECT_EQ(plain.stats.prefix_item_batches, 0);
  EXPECT_GT(pass.stats.prefix_pass_calls, 0) << "no decode call held the shared-prefix pass";
  EXPECT_GT(pass.stats.prefix_item_batches, 0) << "no batch carried shared-prefix items";
  EXPECT_GT(pass.graph_steps, 0) << "decode should have replayed captured graphs";
  ASSERT_EQ(plain.outputs.size(), 24u);
  ASSERT_EQ(pass.outputs.size(), 24u);

  test::expect_same_greedy_run(plain, pass, "with the pass");
}

}  // namespace
}  // namespace pagellm
