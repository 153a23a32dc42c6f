// Host sampler (engine/sampler.h): parameter validation, greedy, penalties, filters at
// their edges, seeded reproducibility, the sampled distribution and log-probabilities.
#include "pagellm/sampling/sampler.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/common/random.h"

namespace pagellm {
namespace {

constexpr int64_t kQwenVocab = 151936;

// Logits shaped roughly like a language model's: a broad body, a few strong candidates.
std::vector<float> lm_like_logits(int64_t vocab, uint64_t seed, float spread = 2.5f,
                                  int strong = 8) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> body(0.0f, spread);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (float& v : x) v = body(rng);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  for (int i = 0; i < strong; ++i) x[pick(rng)] = 12.0f + 1.5f * i;
  return x;
}

SamplingRow make_row(const SamplingParams& params, uint64_t seed, int64_t index,
                     const std::vector<int32_t>* prompt = nullptr,
                     const std::vector<int32_t>* output = nullptr) {
  SamplingRow row;
  row.params = &params;
  row.seed = seed;
  row.output_index = index;
  row.prompt_tokens = prompt;
  row.output_tokens = output;
  return row;
}

SampledToken sample_one(const std::vector<float>& logits, const SamplingRow& row) {
  SamplerWorkspace ws;
  return sample_row(logits.data(), static_cast<int64_t>(logits.size()), row, ws);
}

// Log-probabilities of a distribution given as probabilities (logits = log p).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(static_cast<float>(std::log(p)));
  return x;
}

// Kept set of a non-greedy row, read off process_logits.
std::set<int32_t> kept_set(const std::vector<float>& logits, const SamplingParams& params) {
  SamplerWorkspace ws;
  SamplingRow row = make_row(params, 1, 0);
  const ProcessedRow pr =
      process_logits(logits.data(), static_cast<int64_t>(logits.size()), row, false, ws);
  std::set<int32_t> kept;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = ws.processed()[i];
    if (v > -INFINITY && double(v) >= pr.threshold) kept.insert(static_cast<int32_t>(i));
  }
  return kept;
}

// Double-precision reference of the filters over processed logits x (all finite): the
// number of tokens kept when top-p's target is (top_p - slack) * Z plus `target_shift`
// (in units of Z).
int64_t reference_kept_count(const std::vector<float>& x, const SamplingParams& p,
                             double target_shift) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
  });
  const double m = x[order[0]];
  double threshold = -INFINITY;
  int64_t k_count = n;
  if (p.top_k > 0 && p.top_k < n) {
    threshold = x[order[p.top_k - 1]];
    k_count = 0;
    while (k_count < n && x[order[k_count]] >= threshold) ++k_count;
  }
  if (p.top_p < 1.0f) {
    double z = 0.0;
    for (int64_t i = 0; i < k_count; ++i) z += std::exp(double(x[order[i]]) - m);
    const double target = (double(p.top_p) - 1e-6 + target_shift) * z;
    double cumulative = 0.0;
    for (int64_t i = 0; i < k_count; ++i) {
      cumulative += std::exp(double(x[order[i]]) - m);
      if (cumulative >= target || i == k_count - 1) {
        threshold = std::max(threshold, double(x[order[i]]));
        break;
      }
    }
  }
  if (p.min_p > 0.0f) threshold = std::max(threshold, m + std::log(double(p.min_p)) - 1e-6);
  int64_t kept = 0;
  for (float v : x) kept += double(v) >= threshold;
  return kept;
}

// Token the race must pick, computed without any pruning: argmax over the kept set of
// processed + gumbel(seed, index, id), lowest id on ties.
int32_t brute_force_race(const std::vector<float>& logits, const SamplingParams& params,
                         uint64_t seed, int64_t index) {
  SamplerWorkspace ws;
  SamplingRow row = make_row(params, seed, index);
  const ProcessedRow pr =
      process_logits(logits.data(), static_cast<int64_t>(logits.size()), row, false, ws);
  const uint64_t key = sampling_stream_key(seed, static_cast<uint64_t>(index));
  double best = -INFINITY;
  int32_t best_id = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = ws.processed()[i];
    if (!(v > -INFINITY) || double(v) < pr.threshold) continue;
    const double s = double(v) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(i)));
    if (s > best) {
      best = s;
      best_id = static_cast<int32_t>(i);
    }
  }
  return best_id;
}

double log_softmax_reference(const std::vector<float>& x, int32_t token) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  double s = 0.0;
  for (float v : x) s += std::exp(double(v) - m);
  return double(x[token]) - m - std::log(s);
}

// Chi-square statistic of counts against probabilities (cells with p > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                  int64_t n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) continue;
    const double expected = probs[i] * double(n);
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

void expect_error_mentions(const SamplingParams& p, const std::string& needle) {
  try {
    validate_sampling_params(p);
    ADD_FAILURE() << "expected an Error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- validation ------------------------------------------------------------------------

TEST(SamplingParamsValidation, AcceptsDefaultsAndEdges) {
  SamplingParams p;
  EXPECT_NO_THROW(validate_sampling_params(p));
  p.temperature = 0.0f;
  p.top_k = -1;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 1e-3f;
  p.max_tokens = 1;
  p.stop_token_ids = {0, 151643};
  EXPECT_NO_THROW(validate_sampling_params(p));
  p.top_p = 1e-6f;
  p.min_p = 0.0f;
  p.top_k = 0;
  EXPECT_NO_THROW(validate_sampling_params(p));
}

TEST(SamplingParamsValidation, RejectsEachBadFieldByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto change) {
    SamplingParams p;
    change(p);
    return p;
  };
  expect_error_mentions(with([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature");
  expect_error_mentions(with([&](SamplingParams& p) { p.temperature = nan; }), "temperature");
  expect_error_mentions(with([&](SamplingParams& p) { p.temperature = inf; }), "temperature");
  expect_error_mentions(with([](SamplingParams& p) { p.top_k = -2; }), "top_k");
  expect_error_mentions(with([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p");
  expect_error_mentions(with([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p");
  expect_error_mentions(with([&](SamplingParams& p) { p.top_p = nan; }), "top_p");
  expect_error_mentions(with([](SamplingParams& p) { p.min_p = -0.01f; }), "min_p");
  expect_error_mentions(with([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p");
  expect_error_mentions(with([&](SamplingParams& p) { p.min_p = nan; }), "min_p");
  expect_error_mentions(with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
                        "repetition_penalty");
  expect_error_mentions(with([&](SamplingParams& p) { p.repetition_penalty = inf; }),
                        "repetition_penalty");
  expect_error_mentions(with([&](SamplingParams& p) { p.repetition_penalty = nan; }),
                        "repetition_penalty");
  expect_error_mentions(with([&](SamplingParams& p) { p.presence_penalty = nan; }),
                        "presence_penalty");
  expect_error_mentions(with([](SamplingParams& p) { p.presence_penalty = 2.5f; }),
                        "presence_penalty");
  expect_error_mentions(with([&](SamplingParams& p) { p.frequency_penalty = -inf; }),
                        "frequency_penalty");
  expect_error_mentions(with([](SamplingParams& p) { p.max_tokens = 0; }), "max_tokens");
  expect_error_mentions(with([](SamplingParams& p) { p.stop_token_ids = {5, -1}; }),
                        "stop_token_ids");
}

TEST(SamplingParamsValidation, SamplerRejectsBadParamsAndTokenIds) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  SamplingParams bad;
  bad.top_p = 2.0f;
  EXPECT_THROW(sample_one(logits, make_row(bad, 0, 0)), Error);

  SamplingParams p;
  p.repetition_penalty = 1.2f;
  std::vector<int32_t> prompt = {0, 3};
  EXPECT_THROW(sample_one(logits, make_row(p, 0, 0, &prompt)), Error);
  std::vector<int32_t> output = {-1};
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  EXPECT_THROW(sample_one(logits, make_row(p, 0, 0, nullptr, &output)), Error);
}

// ---- greedy and non-finite logits --------------------------------------------------------

TEST(SamplerGreedy, PicksTheArgmaxWithLowestIdOnTies) {
  for (uint64_t seed = 0; seed < 5; ++seed) {
    std::vector<float> x = lm_like_logits(kQwenVocab, seed);
    SamplingParams p;
    p.temperature = 0.0f;
    const auto best = std::max_element(x.begin(), x.end()) - x.begin();
    for (uint64_t request_seed : {0ULL, 99ULL})
      EXPECT_EQ(sample_one(x, make_row(p, request_seed, 3)).token, best);
  }
  std::vector<float> ties = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_one(ties, make_row(p, 0, 0)).token, 1);
}

TEST(SamplerGreedy, ArgmaxIsTakenAfterPenalties) {
  std::vector<float> x = {4.0f, 3.9f, 1.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  std::vector<int32_t> output = {0};
  const SampledToken t = sample_one(x, make_row(p, 0, 1, nullptr, &output));
  EXPECT_EQ(t.token, 1);
  // The log-probability is of the raw logits, whatever the penalties.
  EXPECT_NEAR(t.logprob, log_softmax_reference(x, 1), 1e-6);
  EXPECT_EQ(t.processed_logprob, 0.0f);
}

TEST(SamplerMinTokens, BannedTokensAreNeverSampledAndRawLogprobsStay) {
  std::vector<float> x = {4.0f, 3.9f, 1.0f, 3.95f};
  std::vector<int32_t> banned = {0, 3};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingRow row = make_row(greedy, 0, 0);
  row.banned_tokens = &banned;
  const SampledToken g = sample_one(x, row);
  EXPECT_EQ(g.token, 1);
  EXPECT_NEAR(g.logprob, log_softmax_reference(x, 1), 1e-6);  // the raw distribution's
  // Random sampling over a wide vocabulary: the banned ids (the two most likely here)
  // never come, the processed logprob is renormalised over the rest.
  std::vector<float> wide = lm_like_logits(4096, 11, 1.0f);
  const auto top = std::max_element(wide.begin(), wide.end()) - wide.begin();
  std::vector<int32_t> wide_banned = {static_cast<int32_t>(top), 7};
  SamplingParams p;
  p.processed_logprobs = true;
  std::vector<int32_t> output = {7, 7};
  for (uint64_t seed = 0; seed < 300; ++seed) {
    SamplingRow r = make_row(p, seed, 2, nullptr, &output);
    r.banned_tokens = &wide_banned;
    const SampledToken t = sample_one(wide, r);
    EXPECT_NE(t.token, top);
    EXPECT_NE(t.token, 7);
    EXPECT_NEAR(t.logprob, log_softmax_reference(wide, t.token), 1e-5);
    std::vector<float> masked = wide;
    masked[static_cast<size_t>(top)] = -std::numeric_limits<float>::infinity();
    masked[7] = -std::numeric_limits<float>::infinity();
    EXPECT_NEAR(t.processed_logprob, log_softmax_reference(masked, t.token), 1e-5);
  }
  // An empty list bans nothing.
  std::vector<int32_t> none;
  row.banned_tokens = &none;
  EXPECT_EQ(sample_one(x, row).token, 0);
}

TEST(SamplerNonFinite, NanAndInfinityNeverPoisonTheResult) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = lm_like_logits(4096, 3, 1.0f);
  for (int i = 0; i < 4096; i += 7) x[i] = nan;
  for (int i = 3; i < 4096; i += 11) x[i] = -inf;
  SamplingParams configs[4];
  configs[0].temperature = 0.0f;
  configs[1].temperature = 0.7f;
  configs[1].processed_logprobs = true;
  configs[2].top_p = 0.9f;
  configs[2].top_k = 2000;
  configs[2].processed_logprobs = true;
  configs[3].min_p = 0.01f;
  configs[3].repetition_penalty = 1.3f;
  std::vector<int32_t> prompt = {0, 7, 14, 1, 2};
  for (const SamplingParams& p : configs) {
    for (int64_t index = 0; index < 200; ++index) {
      const SampledToken t = sample_one(x, make_row(p, 11, index, &prompt));
      ASSERT_TRUE(t.token >= 0 && t.token < 4096);
      EXPECT_TRUE(std::isfinite(x[t.token])) << "picked a non-finite logit at " << t.token;
      EXPECT_TRUE(std::isfinite(t.logprob));
      EXPECT_LE(t.logprob, 0.0f);
      EXPECT_TRUE(std::isfinite(t.processed_logprob));
    }
  }
  // +inf dominates: greedy and sampling pick it, with finite log-probabilities.
  x[100] = inf;
  SamplingParams p;
  const SampledToken t = sample_one(x, make_row(p, 0, 0));
  EXPECT_EQ(t.token, 100);
  EXPECT_TRUE(std::isfinite(t.logprob));
  // No finite logit at all is an error, not a crash.
  std::vector<float> dead(16, nan);
  dead[3] = -inf;
  EXPECT_THROW(sample_one(dead, make_row(p, 0, 0)), Error);
  p.temperature = 0.0f;
  EXPECT_THROW(sample_one(dead, make_row(p, 0, 0)), Error);
}

// ---- penalties ------------------------------------------------------------------------

TEST(SamplerPenalties, ChangeLogitsExactlyAsSpecified) {
  std::vector<float> x = {2.0f, -1.5f, 0.75f, 3.0f, -0.25f, 1.0f, 0.0f, -4.0f};
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = -0.7f;
  std::vector<int32_t> prompt = {0, 1, 1, 6};     // prompt only: 0, 1, 6
  std::vector<int32_t> output = {2, 4, 2, 2, 1};  // 2 three times, 4 once, 1 once
  std::vector<float> expected = x;
  auto repetition = [&](float v) { return v > 0.0f ? v / 1.3f : v * 1.3f; };
  for (int t : {0, 1, 2, 4, 6}) expected[t] = repetition(expected[t]);
  auto freq_presence = [&](float v, int count) {
    v = v - 0.4f * static_cast<float>(count);
    return v - -0.7f;
  };
  expected[2] = freq_presence(expected[2], 3);
  expected[4] = freq_presence(expected[4], 1);
  expected[1] = freq_presence(expected[1], 1);

  SamplerWorkspace ws;
  for (int round = 0; round < 2; ++round) {  // the workspace is clean for reuse
    std::vector<float> y = x;
    apply_penalties(y.data(), 8, p, &prompt, &output, ws);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], expected[i]) << "token " << i;
  }
  // Untouched tokens (3, 5, 7) kept their values bit for bit; no penalty = no change.
  SamplingParams none;
  std::vector<float> y = x;
  apply_penalties(y.data(), 8, none, &prompt, &output, ws);
  EXPECT_EQ(y, x);
  // Repetition alone does not look at counts; a penalty below 1 boosts.
  SamplingParams boost;
  boost.repetition_penalty = 0.5f;
  y = x;
  apply_penalties(y.data(), 8, boost, nullptr, &output, ws);
  EXPECT_EQ(y[2], 0.75f / 0.5f);
  EXPECT_EQ(y[1], -1.5f * 0.5f);
  EXPECT_EQ(y[0], 2.0f);  // in the prompt only, and no prompt was given
  // A bad id throws and leaves the workspace clean.
  std::vector<int32_t> bad = {1, 8};
  y = x;
  EXPECT_THROW(apply_penalties(y.data(), 8, p, &prompt, &bad, ws), Error);
  EXPECT_EQ(y, x);
  apply_penalties(y.data(), 8, p, &prompt, &output, ws);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], expected[i]) << "token " << i;
}

TEST(SamplerPenalties, SamplerUsesPenalisedLogitsBeforeTemperature) {
  // The processed logits equal (penalised logits) / temperature, bit for bit.
  std::vector<float> x = lm_like_logits(1000, 5, 1.0f);
  SamplingParams p;
  p.temperature = 0.6f;
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.3f;
  p.presence_penalty = 0.2f;
  std::vector<int32_t> prompt = {1, 2, 3, 999};
  std::vector<int32_t> output = {3, 3, 500};
  SamplerWorkspace ws, ws2;
  SamplingRow row = make_row(p, 0, 0, &prompt, &output);
  process_logits(x.data(), 1000, row, false, ws);
  std::vector<float> y = x;
  apply_penalties(y.data(), 1000, p, &prompt, &output, ws2);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ws.processed()[i], y[i] / 0.6f) << i;
}

// ---- filters at their edges -----------------------------------------------------------

TEST(SamplerFilters, TopKKeepsTiesAtTheKthValue) {
  std::vector<float> x = {5.0f, 4.0f, 4.0f, 1.0f, 4.0f, 0.0f};
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1, 2, 4}));
  p.top_k = 1;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0}));
  p.top_k = 5;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1, 2, 3, 4}));
  for (int k : {6, 100, 0, -1}) {  // k >= V or disabled: everything
    p.top_k = k;
    EXPECT_EQ(kept_set(x, p).size(), 6u) << k;
  }
}

TEST(SamplerFilters, TopPStopsExactlyOnTheCumulativeBoundary) {
  std::vector<float> x = logits_of({0.5, 0.3, 0.2});
  SamplingParams p;
  auto with_top_p = [&](float top_p) {
    p.top_p = top_p;
    return kept_set(x, p);
  };
  EXPECT_EQ(with_top_p(0.5f), (std::set<int32_t>{0}));  // the first token reaches 0.5
  EXPECT_EQ(with_top_p(0.49f), (std::set<int32_t>{0}));
  EXPECT_EQ(with_top_p(0.51f), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(with_top_p(0.8f), (std::set<int32_t>{0, 1}));  // 0.5 + 0.3 is exactly 0.8
  EXPECT_EQ(with_top_p(0.81f), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(with_top_p(1e-6f), (std::set<int32_t>{0}));  // the top token always stays
  EXPECT_EQ(with_top_p(1.0f), (std::set<int32_t>{0, 1, 2}));
  // Tokens tied with the boundary token are all kept.
  x = logits_of({0.4, 0.2, 0.2, 0.2});
  EXPECT_EQ(with_top_p(0.5f), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(with_top_p(0.4f), (std::set<int32_t>{0}));
  // Temperature first: at T = 0.5 the probabilities are squared and renormalised:
  // 0.5^2 : 0.3^2 : 0.2^2 = 0.658 : 0.237 : 0.105.
  x = logits_of({0.5, 0.3, 0.2});
  p.temperature = 0.5f;
  EXPECT_EQ(with_top_p(0.65f), (std::set<int32_t>{0}));
  EXPECT_EQ(with_top_p(0.66f), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(with_top_p(0.9f), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerFilters, TopPRenormalisesOverTopK) {
  std::vector<float> x = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1}));  // 0.4 < 0.5
  p.top_k = 2;  // over {0, 1}: 4/7 >= 0.5
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0}));
  p.top_k = 3;  // over {0, 1, 2}: 4/9 < 0.5
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1}));
}

TEST(SamplerFilters, MinPKeepsTokensAtTheBoundaryRatio) {
  std::vector<float> x = logits_of({0.5, 0.25, 0.2, 0.05});
  SamplingParams p;
  p.min_p = 0.5f;  // ratios 1, 0.5, 0.4, 0.1
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1}));
  p.min_p = 0.4f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.51f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0}));
  p.min_p = 1.0f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0}));
  p.min_p = 0.1f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1, 2, 3}));
  // On the tempered distribution: at T = 2 the ratios are square roots (0.71, 0.63, 0.32).
  p.temperature = 2.0f;
  p.min_p = 0.6f;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1, 2}));
  // Composition: the smallest of the three upper sets wins.
  p.top_k = 2;
  EXPECT_EQ(kept_set(x, p), (std::set<int32_t>{0, 1}));
}

TEST(SamplerFilters, LargeVocabularyMatchesTheDoubleReference) {
  // Top-k by heap (k <= 1024) and by nth_element, top-p by histogram and over top-k,
  // min-p, at V = 151,936. Where a top-p prefix's cumulative sum lies within 1e-6 of the
  // target, either side of the boundary is accepted (float vs double rounding).
  struct Case {
    int top_k;
    float top_p;
    float min_p;
    float temperature;
  };
  const Case cases[] = {{50, 1.0f, 0.0f, 1.0f},     {5000, 1.0f, 0.0f, 1.0f},
                        {0, 0.9f, 0.0f, 1.0f},      {0, 0.95f, 0.0f, 0.6f},
                        {0, 0.3f, 0.0f, 2.0f},      {20, 0.95f, 0.0f, 0.6f},
                        {3000, 0.8f, 0.0f, 1.5f},   {0, 1.0f, 0.05f, 1.0f},
                        {0, 0.99f, 1e-4f, 1.2f},    {100000, 0.999f, 0.0f, 3.0f}};
  for (uint64_t seed = 0; seed < 3; ++seed) {
    const std::vector<float> x = lm_like_logits(kQwenVocab, 100 + seed, 2.0f);
    for (const Case& c : cases) {
      SamplingParams p;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.temperature = c.temperature;
      SamplerWorkspace ws;
      SamplingRow row = make_row(p, 0, 0);
      process_logits(x.data(), kQwenVocab, row, false, ws);
      const std::vector<float>& processed = ws.processed();
      const int64_t kept = static_cast<int64_t>(kept_set(x, p).size());
      const int64_t low = reference_kept_count(processed, p, -1e-6);
      const int64_t high = reference_kept_count(processed, p, +1e-6);
      EXPECT_GE(kept, low) << "seed " << seed << " k " << c.top_k << " p " << c.top_p;
      EXPECT_LE(kept, high) << "seed " << seed << " k " << c.top_k << " p " << c.top_p;
      EXPECT_GT(kept, 0);
    }
  }
}

TEST(SamplerFilters, ExcludedTokensAreNeverSampled) {
  std::vector<float> x = lm_like_logits(512, 9, 1.5f, 0);
  SamplingParams configs[3];
  configs[0].top_k = 5;
  configs[1].top_p = 0.6f;
  configs[2].min_p = 0.2f;
  configs[2].temperature = 1.5f;
  for (const SamplingParams& p : configs) {
    const std::set<int32_t> kept = kept_set(x, p);
    std::set<int32_t> seen;
    for (int64_t index = 0; index < 4000; ++index) {
      const int32_t t = sample_one(x, make_row(p, 5, index)).token;
      ASSERT_TRUE(kept.count(t)) << "sampled excluded token " << t;
      seen.insert(t);
    }
    EXPECT_EQ(seen, kept) << "every kept token is reachable";
  }
}

// ---- seeds ----------------------------------------------------------------------------

TEST(SamplerSeeds, SameSeedSameTokenWhateverTheBatch) {
  const int64_t vocab = 5000;
  const int rows = 16;
  std::vector<SamplingParams> params(rows);
  std::vector<std::vector<float>> logits(rows);
  std::vector<std::vector<int32_t>> outputs(rows);
  for (int r = 0; r < rows; ++r) {
    params[r].temperature = 0.5f + 0.1f * r;
    params[r].top_k = r % 3 == 0 ? 40 : 0;
    params[r].top_p = r % 4 == 1 ? 0.9f : 1.0f;
    params[r].min_p = r % 5 == 2 ? 0.02f : 0.0f;
    params[r].frequency_penalty = r % 2 ? 0.3f : 0.0f;
    params[r].processed_logprobs = r % 2 == 0;
    logits[r] = lm_like_logits(vocab, 1000 + r, 1.0f);
    outputs[r] = {static_cast<int32_t>(r), 17, 17};
  }
  auto row_of = [&](int r) { return make_row(params[r], 7 + r % 3, 10 + r, nullptr, &outputs[r]); };
  auto run = [&](const std::vector<int>& which, int threads) {
    std::vector<float> flat;
    std::vector<SamplingRow> sampling_rows;
    for (int r : which) {
      flat.insert(flat.end(), logits[r].begin(), logits[r].end());
      sampling_rows.push_back(row_of(r));
    }
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    auto out = sample_rows(flat.data(), static_cast<int64_t>(which.size()), vocab, sampling_rows);
    omp_set_num_threads(saved);
    return out;
  };
  std::vector<int> all(rows);
  std::iota(all.begin(), all.end(), 0);
  const auto reference = run(all, 1);
  auto same = [](const SampledToken& a, const SampledToken& b) {
    return a.token == b.token && a.logprob == b.logprob &&
           a.processed_logprob == b.processed_logprob;
  };
  for (int threads : {2, 4, 7}) {
    const auto out = run(all, threads);
    for (int r = 0; r < rows; ++r) EXPECT_TRUE(same(out[r], reference[r])) << r << " " << threads;
  }
  std::vector<int> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  const auto out = run(shuffled, 3);
  for (size_t i = 0; i < shuffled.size(); ++i)
    EXPECT_TRUE(same(out[i], reference[shuffled[i]])) << shuffled[i];
  const auto pair = run({11, 4}, 2);
  EXPECT_TRUE(same(pair[0], reference[11]));
  EXPECT_TRUE(same(pair[1], reference[4]));
  for (int r = 0; r < rows; ++r) EXPECT_TRUE(same(sample_one(logits[r], row_of(r)), reference[r]));
}

TEST(SamplerSeeds, DifferentSeedsAndIndicesGiveDifferentTokens) {
  const std::vector<float> flat(1000, 0.0f);  // uniform over 1000 tokens
  SamplingParams p;
  std::set<int32_t> by_seed, by_index;
  int repeats_same_seed = 0;
  for (uint64_t s = 0; s < 100; ++s) {
    const int32_t a = sample_one(flat, make_row(p, s, 0)).token;
    repeats_same_seed += a == sample_one(flat, make_row(p, s, 0)).token;
    by_seed.insert(a);
    by_index.insert(sample_one(flat, make_row(p, 12345, static_cast<int64_t>(s))).token);
  }
  EXPECT_EQ(repeats_same_seed, 100);
  // 100 draws from 1000 values: about 95 distinct; 80 is 5 standard deviations below.
  EXPECT_GT(by_seed.size(), 80u);
  EXPECT_GT(by_index.size(), 80u);
}

TEST(SamplerSeeds, PrunedRaceEqualsTheFullGumbelArgmax) {
  // The race skips tokens that provably cannot win; the result must be exactly the
  // unpruned argmax over every kept token, at full vocabulary size.
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f, 0.0f},  {0.3f, 0, 1.0f, 0.0f}, {4.0f, 0, 1.0f, 0.0f},
                        {0.7f, 0, 0.95f, 0.0f}, {1.0f, 50, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.001f}};
  const std::vector<float> x = lm_like_logits(kQwenVocab, 77, 3.0f);
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    for (int64_t index = 0; index < 12; ++index) {
      EXPECT_EQ(sample_one(x, make_row(p, 2024, index)).token,
                brute_force_race(x, p, 2024, index))
          << "T " << c.temperature << " index " << index;
    }
  }
  // A flat distribution, where nothing can be pruned by the logit gap alone.
  const std::vector<float> flat(20000, 1.0f);
  SamplingParams p;
  for (int64_t index = 0; index < 20; ++index)
    EXPECT_EQ(sample_one(flat, make_row(p, 3, index)).token, brute_force_race(flat, p, 3, index));
}

// ---- the sampled distribution ---------------------------------------------------------

TEST(SamplerDistribution, MatchesTemperedSoftmaxAndFilteredRenormalisation) {
  const std::vector<float> x = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f, 0.0f}, {0.8f, 0, 1.0f, 0.0f}, {2.5f, 0, 1.0f, 0.0f},
                        {1.0f, 4, 1.0f, 0.0f}, {1.0f, 0, 0.7f, 0.0f}, {1.3f, 0, 1.0f, 0.2f}};
  const int64_t n = 100000;
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    const std::set<int32_t> kept = kept_set(x, p);
    std::vector<double> probs(x.size(), 0.0);
    double z = 0.0;
    for (int32_t i : kept) z += std::exp(double(x[i]) / c.temperature);
    for (int32_t i : kept) probs[i] = std::exp(double(x[i]) / c.temperature) / z;
    std::vector<int64_t> counts(x.size(), 0);
    SamplerWorkspace ws;
    for (int64_t index = 0; index < n; ++index)
      ++counts[sample_row(x.data(), 8, make_row(p, 31337, index), ws).token];
    for (size_t i = 0; i < x.size(); ++i)
      if (probs[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << i;
      }
    // Critical values of chi-square at p = 1e-4 for df = |kept| - 1 <= 7.
    const double critical[] = {0, 15.1, 18.4, 21.1, 23.5, 25.7, 27.9, 29.9};
    const size_t df = kept.size() - 1;
    ASSERT_GE(df, 1u);
    EXPECT_LT(chi_square(counts, probs, n), critical[df])
        << "T " << c.temperature << " k " << c.top_k << " p " << c.top_p << " min_p " << c.min_p;
  }
}

TEST(SamplerDistribution, LargeVocabularyFrequenciesOfTheLeadingTokens) {
  // V = 151,936: the 8 strong tokens plus "the rest" as a ninth cell.
  const std::vector<float> x = lm_like_logits(kQwenVocab, 4, 2.0f);
  SamplingParams p;
  p.temperature = 2.0f;  // the body carries about 60 % of the mass
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  double z = 0.0;
  for (float v : x) z += std::exp(double(v) / 2.0);
  std::vector<double> probs(9, 0.0);
  std::map<int32_t, int> cell;
  for (int i = 0; i < 8; ++i) {
    probs[i] = std::exp(double(x[order[i]]) / 2.0) / z;
    cell[order[i]] = i;
  }
  probs[8] = 1.0 - std::accumulate(probs.begin(), probs.begin() + 8, 0.0);
  ASSERT_GT(probs[8], 0.05);
  const int64_t n = 4000;
  std::vector<int64_t> counts(9, 0);
  SamplerWorkspace ws;
  for (int64_t index = 0; index < n; ++index) {
    const int32_t t = sample_row(x.data(), kQwenVocab, make_row(p, 8, index), ws).token;
    auto it = cell.find(t);
    ++counts[it == cell.end() ? 8 : it->second];
  }
  EXPECT_LT(chi_square(counts, probs, n), 31.8);  // chi-square, df 8, p = 1e-4
}

// ---- log-probabilities ----------------------------------------------------------------

TEST(SamplerLogprobs, RawEqualsDoubleLogSoftmax) {
  for (uint64_t seed = 0; seed < 3; ++seed) {
    const std::vector<float> x = lm_like_logits(kQwenVocab, 200 + seed, 3.0f);
    SamplingParams configs[4];
    configs[0].temperature = 0.0f;
    configs[1].temperature = 0.5f;
    configs[1].repetition_penalty = 1.5f;  // raw means before penalties
    configs[2].top_p = 0.5f;
    configs[3].temperature = 5.0f;
    std::vector<int32_t> prompt = {1, 2, 3};
    for (const SamplingParams& p : configs) {
      for (int64_t index = 0; index < 5; ++index) {
        const SampledToken t = sample_one(x, make_row(p, seed, index, &prompt));
        EXPECT_NEAR(t.logprob, log_softmax_reference(x, t.token), 2e-5) << seed;
      }
    }
  }
}

TEST(SamplerLogprobs, ProcessedLogprobsAreTheRenormalisedKeptDistribution) {
  const std::vector<float> x = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
  SamplingParams configs[4];
  configs[0].temperature = 0.7f;
  configs[1].top_k = 3;
  configs[2].top_p = 0.8f;
  configs[2].temperature = 1.5f;
  configs[3].min_p = 0.1f;
  configs[3].frequency_penalty = 1.0f;
  std::vector<int32_t> output = {0, 0};
  for (SamplingParams p : configs) {
    p.processed_logprobs = true;
    std::map<int32_t, float> processed;
    for (int64_t index = 0; index < 3000; ++index) {
      const SampledToken t = sample_one(x, make_row(p, 1, index, nullptr, &output));
      auto [it, inserted] = processed.emplace(t.token, t.processed_logprob);
      if (!inserted) {
        EXPECT_EQ(it->second, t.processed_logprob);  // a function of the token
      }
      EXPECT_LE(t.processed_logprob, 1e-6f);
    }
    // Every kept token was drawn; their probabilities sum to 1 and match the reference.
    SamplerWorkspace ws;
    SamplingRow row = make_row(p, 1, 0, nullptr, &output);
    const ProcessedRow pr = process_logits(x.data(), 8, row, true, ws);
    std::set<int32_t> kept;
    double z = 0.0;
    for (int32_t i = 0; i < 8; ++i) {
      if (double(ws.processed()[i]) >= pr.threshold) {
        kept.insert(i);
        z += std::exp(double(ws.processed()[i]));
      }
    }
    ASSERT_EQ(processed.size(), kept.size());
    double total = 0.0;
    for (auto [token, lp] : processed) {
      ASSERT_TRUE(kept.count(token));
      total += std::exp(double(lp));
      EXPECT_NEAR(lp, std::log(std::exp(double(ws.processed()[token])) / z), 1e-5);
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
  // Greedy: one-hot, so 0. Off: reported as 0.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.processed_logprobs = true;
  EXPECT_EQ(sample_one(x, make_row(greedy, 0, 0)).processed_logprob, 0.0f);
  SamplingParams off;
  EXPECT_EQ(sample_one(x, make_row(off, 0, 0)).processed_logprob, 0.0f);
}

TEST(SamplerRows, MismatchedRowCountIsAnError) {
  std::vector<float> x(10, 0.0f);
  SamplingParams p;
  std::vector<SamplingRow> rows = {make_row(p, 0, 0)};
  EXPECT_THROW(sample_rows(x.data(), 2, 5, rows), Error);
  rows[0].params = nullptr;
  EXPECT_THROW(sample_rows(x.data(), 1, 10, rows), Error);
  try {
    std::vector<SamplingRow> two = {make_row(p, 0, 0), make_row(p, 0, 0)};
    std::vector<int32_t> bad = {10};
    SamplingParams pen;
    pen.presence_penalty = 1.0f;
    two[1] = make_row(pen, 0, 0, nullptr, &bad);
    sample_rows(x.data(), 2, 5, two);
    ADD_FAILURE() << "expected an error for row 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagellm
