// The log-probability contract through the public API: top-k alternatives in
// CompletionOutput (LLM and AsyncEngine streams merge them per token), LLM::score and
// AsyncEngine::score against generate's logprobs, scoring beside running requests, and
// scoring's bad input (an Error naming the sequence; the engine keeps serving).
#include <gtest/gtest.h>

#include <cmath>

#include "api/api_test_util.h"
#include "common/expect_error.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

testing::TinyModelCleanup cleanup;

EngineOptions options() {
  EngineOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.max_model_len = 128;
  o.num_pages = 96;
  return o;
}

SamplingParams seeded(int max_tokens, int logprobs) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 17;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = logprobs;
  return p;
}

// logprobs of two forwards of different shape agree to float32 rounding (engine test
// tests/engine/logprobs_test.cpp says why they are not the same bits on the CPU).
constexpr float kAcrossShapes = 2e-5f;

TEST(LogprobsApi, TopLogprobsAndScoreThroughLLM) {
  LLM llm(testing::tiny_model_dir(), options());
  SamplingParams p = seeded(12, 3);
  p.processed_logprobs = true;
  p.top_k = 2;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  const RequestOutput r = llm.generate(std::vector<std::vector<int32_t>>{prompt}, p)[0];
  const CompletionOutput& o = r.outputs.at(0);
  ASSERT_EQ(o.token_ids.size(), 12u);
  ASSERT_EQ(o.top_logprobs.size(), 12u);
  ASSERT_EQ(o.logprob_ranks.size(), 12u);
  ASSERT_EQ(o.processed_top_logprobs.size(), 12u);
  for (size_t k = 0; k < 12; ++k) {
    ASSERT_EQ(o.top_logprobs[k].size(), 3u);
    EXPECT_GE(o.top_logprobs[k][0].logprob, o.top_logprobs[k][1].logprob);
    EXPECT_GE(o.top_logprobs[k][1].logprob, o.top_logprobs[k][2].logprob);
    // top_k = 2: the sampled token is one of the two best, so it is listed with its logprob.
    EXPECT_LE(o.logprob_ranks[k], 2);
    EXPECT_EQ(o.top_logprobs[k][o.logprob_ranks[k] - 1].token_id, o.token_ids[k]);
    EXPECT_EQ(o.top_logprobs[k][o.logprob_ranks[k] - 1].logprob, o.logprobs[k]);
    ASSERT_EQ(o.processed_top_logprobs[k].size(), 2u);
    double mass = 0.0;
    for (const TokenLogprob& t : o.processed_top_logprobs[k]) mass += std::exp(t.logprob);
    EXPECT_NEAR(mass, 1.0, 1e-5);  // the whole kept set
  }

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), o.token_ids.begin(), o.token_ids.end());
  const std::vector<ScoreOutput> s =
      llm.score({all}, {static_cast<int32_t>(prompt.size())}, 3);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].logprobs.size(), 12u);
  for (size_t k = 0; k < 12; ++k) {
    EXPECT_NEAR(s[0].logprobs[k], o.logprobs[k], kAcrossShapes) << k;
    EXPECT_EQ(s[0].ranks[k], o.logprob_ranks[k]);
    EXPECT_EQ(s[0].top_logprobs[k][0].token_id, o.top_logprobs[k][0].token_id);
  }
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());

  testing::expect_error([&] { llm.score({{}}); }, "sequence 0 has 0 tokens");
  testing::expect_error([&] { llm.score({std::vector<int32_t>(129, 1)}); },
                        "longer than the context (max_model_len 128)");
  testing::expect_error([&] { llm.score({{1, 2, 3}}, {3}); }, "outside [1, 2]");
  testing::expect_error([&] { llm.score({{1, 2, static_cast<int32_t>(llm.vocab_size())}}); },
                        "outside the vocabulary");
  SamplingParams bad = seeded(2, 21);
  testing::expect_error(
      [&] { llm.generate(std::vector<std::vector<int32_t>>{prompt}, bad); }, "logprobs");
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
  // Still serving.
  EXPECT_EQ(llm.generate(std::vector<std::vector<int32_t>>{prompt}, seeded(3, 0))[0]
                .outputs[0]
                .token_ids.size(),
            3u);
}

TEST(LogprobsApi, AsyncEngineScoresBesideRunningRequests) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  const std::vector<int32_t> prompt = {7, 7, 2, 8, 1};
  auto stream = engine.submit(Prompt::from_token_ids(prompt), seeded(40, 2));
  const std::vector<int32_t> other = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<ScoreOutput> mid = engine.score({other, prompt}, {}, 2);
  const RequestOutput out = stream->collect();
  const CompletionOutput& o = out.outputs.at(0);
  ASSERT_EQ(o.token_ids.size(), 40u);
  ASSERT_EQ(o.top_logprobs.size(), 40u);  // merged across deltas, one list per token
  ASSERT_EQ(mid.size(), 2u);
  EXPECT_EQ(mid[0].logprobs.size(), other.size() - 1);
  EXPECT_EQ(mid[1].top_logprobs.size(), prompt.size() - 1);

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), o.token_ids.begin(), o.token_ids.end());
  const ScoreOutput s = engine.score({all}, {static_cast<int32_t>(prompt.size())})[0];
  ASSERT_EQ(s.logprobs.size(), 40u);
  for (size_t k = 0; k < 40; ++k) EXPECT_NEAR(s.logprobs[k], o.logprobs[k], kAcrossShapes);
  testing::expect_error([&] { engine.score({{4}}); }, "needs at least 2");
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  engine.shutdown();
  testing::expect_error([&] { engine.score({all}); }, "shut down");
}

}  // namespace
}  // namespace pagellm
