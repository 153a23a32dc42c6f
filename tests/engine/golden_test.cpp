// The golden test: the paged engine with continuous batching, chunked prefill and forced
// preemption gives the same logits (within float32 rounding) and the same greedy tokens as
// the naive one-sequence-at-a-time reference with a contiguous cache.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "common/reference_qwen3.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

struct GoldenCase {
  int32_t page_size;
  int64_t num_pages;  // small budgets force preemption
  int32_t max_batched_tokens;
  bool tied;
  bool expect_preemption;
};

class Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Golden, EngineMatchesNaiveReference) {
  const GoldenCase gc = GetParam();
  Qwen3Config c = testing::small_config(gc.tied);
  c.eos_token_id = 0;
  c.eos_token_ids = {0};
  testing::HostWeights w = testing::random_weights(c, 1000 + gc.page_size);
  auto backend = create_backend("cpu");
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = gc.page_size;
  ec.num_pages = gc.num_pages;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = gc.max_batched_tokens;
  ec.max_model_len = 160;
  Engine engine(std::move(backend), std::move(model), ec);

  std::map<std::pair<int64_t, int64_t>, std::vector<float>> seen;  // (id, index) -> logits
  engine.set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    auto key = std::make_pair(id, index);
    ASSERT_EQ(seen.count(key), 0u) << "logits for request " << id << " token " << index
                                   << " produced twice";
    seen[key] = std::vector<float>(logits, logits + vocab);
  });

  std::mt19937 rng(gc.page_size * 7 + static_cast<uint32_t>(gc.num_pages));
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(c.vocab_size) - 1);
  const std::vector<int32_t> lengths = {1, 5, 17, 40, 64, 3, 100, 33};
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : lengths) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < n; ++i) p.push_back(tok(rng));
    prompts.push_back(p);
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;

  // Staggered arrivals: half now, the rest while the first ones run.
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size() / 2; ++i) ids.push_back(engine.add_request(prompts[i], greedy));
  int steps = 0;
  while (engine.has_unfinished()) {
    engine.step();
    engine.check_invariants();
    if (++steps == 3) {
      for (size_t i = prompts.size() / 2; i < prompts.size(); ++i)
        ids.push_back(engine.add_request(prompts[i], greedy));
    }
    ASSERT_LT(steps, 10000) << "engine does not finish";
  }
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable())
      << "pages leaked after every request finished";

  for (size_t r = 0; r < ids.size(); ++r) {
    const Sequence& seq = engine.request(ids[r]);
    ASSERT_EQ(seq.finish_reason, FinishReason::kLength) << seq.error;
    ASSERT_EQ(seq.output.size(), 12u);
    testing::ReferenceQwen3 ref(c, w);
    std::vector<double> logits;
    for (int32_t t : seq.prompt) logits = ref.step(t);
    for (size_t i = 0; i < seq.output.size(); ++i) {
      const auto& got = seen.at({seq.id, static_cast<int64_t>(i)});
      double err = 0, norm = 0, best = -1e300;
      int32_t arg = 0;
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        err += (got[v] - logits[v]) * (got[v] - logits[v]);
        norm += logits[v] * logits[v];
        if (logits[v] > best) best = logits[v], arg = static_cast<int32_t>(v);
      }
      EXPECT_LT(std::sqrt(err / norm), 1e-5) << "request " << r << " token " << i;
      EXPECT_EQ(seq.output[i], arg) << "request " << r << " token " << i;
      // The reported log-probability is log_softmax of the raw logits.
      double lse = 0;
      for (int64_t v = 0; v < c.vocab_size; ++v) lse += std::exp(logits[v] - best);
      EXPECT_NEAR(seq.sampled[i].logprob, logits[arg] - best - std::log(lse), 1e-4);
      logits = ref.step(seq.output[i]);
    }
  }
  if (gc.expect_preemption) {
    EXPECT_GT(engine.stats().preemptions, 0) << "the small page budget should force preemption";
  } else {
    EXPECT_EQ(engine.stats().preemptions, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    PageSizes, Golden,
    ::testing::Values(GoldenCase{1, 4000, 64, false, false},
                      GoldenCase{16, 400, 48, false, false},
                      GoldenCase{64, 100, 2048, true, false},
                      // Preemption: 8 requests of up to 112 tokens in a few pages.
                      GoldenCase{1, 130, 32, false, true}, GoldenCase{16, 12, 64, false, true},
                      GoldenCase{64, 4, 128, true, true}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) {
      return "page" + std::to_string(info.param.page_size) + "_pages" +
             std::to_string(info.param.num_pages) + "_budget" +
             std::to_string(info.param.max_batched_tokens);
    });

}  // namespace
}  // namespace pagellm
