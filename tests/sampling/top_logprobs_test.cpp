// Top-k alternatives and scoring of one row (sampling/sampler.h, step 7): score_token and
// add_top_logprobs against a brute-force computation in double over the whole row, their
// order and ties, the rank, non-finite logits, the processed distribution's list, and the
// logprobs parameter's validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/expect_error.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {
namespace {

std::vector<float> random_logits(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> body(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (float& v : x) v = body(rng);
  return x;
}

struct Ranked {
  double value;
  int32_t id;
};

// Every finite entry of x, larger first, lower id first on ties.
std::vector<Ranked> brute_force_order(const std::vector<float>& x) {
  std::vector<Ranked> all;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isfinite(x[i])) all.push_back({x[i], static_cast<int32_t>(i)});
  std::sort(all.begin(), all.end(), [](const Ranked& a, const Ranked& b) {
    return a.value > b.value || (a.value == b.value && a.id < b.id);
  });
  return all;
}

// log-softmax in double over the finite entries of x (the set in `kept`, when given).
double brute_force_logprob(const std::vector<float>& x, int32_t id,
                           const std::vector<bool>* kept = nullptr) {
  double m = -INFINITY;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isfinite(x[i]) && (!kept || (*kept)[i])) m = std::max(m, double(x[i]));
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isfinite(x[i]) && (!kept || (*kept)[i])) sum += std::exp(double(x[i]) - m);
  return double(x[static_cast<size_t>(id)]) - m - std::log(sum);
}

TEST(TopLogprobs, ScoreTokenMatchesBruteForce) {
  const int64_t vocab = 5000;
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<float> x = random_logits(vocab, seed);
    const std::vector<Ranked> order = brute_force_order(x);
    for (int k : {1, 5, 20}) {
      const int32_t token = static_cast<int32_t>(seed * 17);
      const TokenScore s = score_token(x.data(), vocab, token, k);
      ASSERT_EQ(static_cast<int>(s.top.size()), k);
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(s.top[j].token_id, order[j].id) << "seed " << seed << " k " << k << " #" << j;
        EXPECT_NEAR(s.top[j].logprob, brute_force_logprob(x, order[j].id), 2e-6);
        // The same number the sampler (and score_token of that token) reports, bit for bit.
        EXPECT_EQ(s.top[j].logprob, score_token(x.data(), vocab, order[j].id, 0).logprob);
      }
      EXPECT_NEAR(s.logprob, brute_force_logprob(x, token), 2e-6);
      const auto at = std::find_if(order.begin(), order.end(),
                                   [&](const Ranked& r) { return r.id == token; });
      EXPECT_EQ(s.rank, static_cast<int32_t>(at - order.begin()) + 1);
    }
  }
}

TEST(TopLogprobs, TiesListLowerIdsFirstAndShareTheRank) {
  // Ids 7, 3 and 9 tie for the largest logit; 5 and 2 tie below them.
  std::vector<float> x(12, -5.0f);
  x[7] = x[3] = x[9] = 4.0f;
  x[5] = x[2] = 1.0f;
  const TokenScore s = score_token(x.data(), 12, 9, 5);
  ASSERT_EQ(s.top.size(), 5u);
  const int32_t expected[] = {3, 7, 9, 2, 5};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(s.top[j].token_id, expected[j]) << j;
  EXPECT_EQ(s.top[0].logprob, s.top[2].logprob);
  EXPECT_EQ(s.rank, 1);  // tied for the best: the better rank
  EXPECT_EQ(score_token(x.data(), 12, 2, 0).rank, 4);
  EXPECT_EQ(score_token(x.data(), 12, 0, 0).rank, 6);
}

TEST(TopLogprobs, NonFiniteLogitsAreNeverListed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, 1.0f, -INFINITY, 0.5f, nan};
  const TokenScore s = score_token(x.data(), 5, 1, 4);
  ASSERT_EQ(s.top.size(), 2u);  // only two finite logits
  EXPECT_EQ(s.top[0].token_id, 1);
  EXPECT_EQ(s.top[1].token_id, 3);
  EXPECT_NEAR(std::exp(s.top[0].logprob) + std::exp(s.top[1].logprob), 1.0, 1e-6);
}

TEST(TopLogprobs, ScoreTokenRejectsBadInput) {
  std::vector<float> x(10, 0.0f);
  testing::expect_error([&] { score_token(x.data(), 10, 10, 0); }, "outside the vocabulary");
  testing::expect_error([&] { score_token(x.data(), 10, -1, 0); }, "outside the vocabulary");
  testing::expect_error([&] { score_token(x.data(), 10, 0, 21); }, "top-k");
}

TEST(TopLogprobs, SampledTokensListsAgreeWithTheSampler) {
  const int64_t vocab = 4000;
  const std::vector<float> x = random_logits(vocab, 11);
  SamplerWorkspace ws;
  SamplingParams p;
  p.logprobs = 8;
  p.processed_logprobs = true;
  p.temperature = 0.7f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = {int32_t(brute_force_order(x)[0].id), 5, 6};
  const std::vector<int32_t> output = {int32_t(brute_force_order(x)[1].id)};
  for (int64_t index = 0; index < 20; ++index) {
    SamplingRow row;
    row.params = &p;
    row.seed = 99;
    row.output_index = index;
    row.prompt_tokens = &prompt;
    row.output_tokens = &output;
    SampledToken t = sample_row(x.data(), vocab, row, ws);
    add_top_logprobs(x.data(), vocab, row, ws, t);

    // Raw list: the brute-force order of the raw logits; the sampled token's rank.
    const std::vector<Ranked> raw = brute_force_order(x);
    ASSERT_EQ(t.top.size(), 8u);
    for (int j = 0; j < 8; ++j) EXPECT_EQ(t.top[j].token_id, raw[j].id);
    const auto at = std::find_if(raw.begin(), raw.end(),
                                 [&](const Ranked& r) { return r.id == t.token; });
    EXPECT_EQ(t.rank, static_cast<int32_t>(at - raw.begin()) + 1);

    // Processed list: only kept tokens, in processed order, with step 6's logprobs.
    const ProcessedRow pr = process_logits(x.data(), vocab, row, true, ws);
    const std::vector<float> processed = ws.processed();
    std::vector<bool> kept(static_cast<size_t>(vocab));
    std::vector<float> kept_values(static_cast<size_t>(vocab), -INFINITY);
    for (int64_t i = 0; i < vocab; ++i) {
      kept[i] = std::isfinite(processed[i]) && double(processed[i]) >= pr.threshold;
      if (kept[i]) kept_values[i] = processed[i];
    }
    const std::vector<Ranked> order = brute_force_order(kept_values);
    ASSERT_EQ(t.processed_top.size(), std::min<size_t>(8, order.size()));
    for (size_t j = 0; j < t.processed_top.size(); ++j) {
      EXPECT_EQ(t.processed_top[j].token_id, order[j].id) << j;
      EXPECT_NEAR(t.processed_top[j].logprob, brute_force_logprob(processed, order[j].id, &kept),
                  2e-6);
      if (t.processed_top[j].token_id == t.token) {
        EXPECT_EQ(t.processed_top[j].logprob, t.processed_logprob);  // bit for bit
      }
    }
  }
}

TEST(TopLogprobs, GreedyProcessedListIsTheChosenToken) {
  const std::vector<float> x = random_logits(300, 4);
  SamplerWorkspace ws;
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 3;
  p.processed_logprobs = true;
  SamplingRow row;
  row.params = &p;
  SampledToken t = sample_row(x.data(), 300, row, ws);
  add_top_logprobs(x.data(), 300, row, ws, t);
  ASSERT_EQ(t.processed_top.size(), 1u);
  EXPECT_EQ(t.processed_top[0].token_id, t.token);
  EXPECT_EQ(t.processed_top[0].logprob, 0.0f);
  EXPECT_EQ(t.top[0].token_id, t.token);  // greedy picks the raw argmax
  EXPECT_EQ(t.top[0].logprob, t.logprob);
  EXPECT_EQ(t.rank, 1);
}

TEST(TopLogprobs, WithoutLogprobsNothingIsAdded) {
  const std::vector<float> x = random_logits(100, 5);
  SamplerWorkspace ws;
  SamplingParams p;  // logprobs = 0
  SamplingRow row;
  row.params = &p;
  SampledToken t = sample_row(x.data(), 100, row, ws);
  add_top_logprobs(x.data(), 100, row, ws, t);
  EXPECT_TRUE(t.top.empty());
  EXPECT_TRUE(t.processed_top.empty());
  EXPECT_EQ(t.rank, 0);
}

TEST(TopLogprobs, LogprobsParameterIsValidated) {
  SamplingParams p;
  p.logprobs = 21;
  testing::expect_error([&] { validate_sampling_params(p); }, "logprobs");
  p.logprobs = -1;
  testing::expect_error([&] { validate_sampling_params(p); }, "[0, 20]");
  p.logprobs = 20;
  validate_sampling_params(p);
}

}  // namespace
}  // namespace pagellm
