// The sampling rules both samplers share (sampling/rules.h): the penalty of one logit, the
// penalty counting, and the Gumbel race's pruning (never prunes a token that could win).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/common/random.h"
#include "pagellm/sampling/rules.h"

namespace pagellm {
namespace {

TEST(SamplingRules, PenaltiesEnabledOnlyWhenOneIsNotNeutral) {
  EXPECT_FALSE(penalties_enabled(1.0f, 0.0f, 0.0f));
  EXPECT_TRUE(penalties_enabled(1.1f, 0.0f, 0.0f));
  EXPECT_TRUE(penalties_enabled(1.0f, 0.5f, 0.0f));
  EXPECT_TRUE(penalties_enabled(1.0f, 0.0f, -0.5f));
}

TEST(SamplingRules, PenalisedLogit) {
  // Repetition divides positive logits and multiplies negative ones.
  EXPECT_FLOAT_EQ(penalised_logit(3.0f, 1.5f, 0.0f, 0.0f, 0), 2.0f);
  EXPECT_FLOAT_EQ(penalised_logit(-3.0f, 1.5f, 0.0f, 0.0f, 0), -4.5f);
  // Frequency and presence apply only to tokens in the output, after repetition.
  EXPECT_FLOAT_EQ(penalised_logit(3.0f, 1.5f, 0.25f, 0.5f, 0), 2.0f);
  EXPECT_FLOAT_EQ(penalised_logit(3.0f, 1.5f, 0.25f, 0.5f, 4), 2.0f - 1.0f - 0.5f);
  EXPECT_FLOAT_EQ(penalised_logit(3.0f, 1.0f, -0.5f, -1.0f, 2), 3.0f + 1.0f + 1.0f);
  // Neutral parameters leave the logit as it was, bit for bit.
  EXPECT_EQ(penalised_logit(0.1f, 1.0f, 0.0f, 0.0f, 0), 0.1f);
}

TEST(SamplingRules, PenaltyCounterListsDistinctTokensWithOutputCounts) {
  PenaltyCounter counter;
  const std::vector<int32_t> prompt = {4, 4, 9, 1};
  const std::vector<int32_t> output = {1, 7, 1, 1, 7};
  std::vector<PenaltyCount> got;
  counter.count(&prompt, &output, /*repetition=*/true, 10, got);
  ASSERT_EQ(got.size(), 4u);
  // Output tokens first in first-seen order, then the prompt's new ones.
  EXPECT_EQ(got[0].token, 1);
  EXPECT_EQ(got[0].output_count, 3);
  EXPECT_EQ(got[1].token, 7);
  EXPECT_EQ(got[1].output_count, 2);
  EXPECT_EQ(got[2].token, 4);
  EXPECT_EQ(got[2].output_count, 0);
  EXPECT_EQ(got[3].token, 9);
  EXPECT_EQ(got[3].output_count, 0);

  // Without the repetition penalty the prompt is not listed; the counts start from zero
  // again (the scratch is clean between rows), and entries are appended.
  counter.count(&prompt, &output, /*repetition=*/false, 10, got);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[4].token, 1);
  EXPECT_EQ(got[4].output_count, 3);
  EXPECT_EQ(got[5].token, 7);
  EXPECT_EQ(got[5].output_count, 2);
}

TEST(SamplingRules, PenaltyCounterRejectsOutOfVocabularyIdsAndStaysClean) {
  PenaltyCounter counter;
  const std::vector<int32_t> prompt = {2, 12};
  const std::vector<int32_t> output = {3, 3};
  std::vector<PenaltyCount> got;
  try {
    counter.count(&prompt, &output, true, 10, got);
    ADD_FAILURE() << "prompt id 12 of a 10-token vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt token id 12 is outside the vocabulary [0, 10)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(got.empty());
  // The prompt is not checked when the repetition penalty is off (it is not read), and a
  // clean scratch gives the output's true counts.
  counter.count(&prompt, &output, false, 10, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].token, 3);
  EXPECT_EQ(got[0].output_count, 2);
}

TEST(SamplingRules, PenaltyCounterListsBannedTokensOnceAsBanned) {
  PenaltyCounter counter;
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> output = {3, 3, 4};
  const std::vector<int32_t> banned = {4, 9};
  std::vector<PenaltyCount> got;
  counter.count(&prompt, &output, /*repetition=*/true, 10, got, &banned);
  ASSERT_EQ(got.size(), 5u);  // 3, 4 (banned), 1, 2, 9 (banned): each token once
  for (const PenaltyCount& e : got) {
    if (e.token == 4 || e.token == 9) EXPECT_EQ(e.output_count, kBannedToken) << e.token;
    if (e.token == 3) EXPECT_EQ(e.output_count, 2);
  }
  EXPECT_EQ(penalised_logit(5.0f, 1.2f, 0.1f, 0.2f, kBannedToken),
            -std::numeric_limits<float>::infinity());
  // The scratch is clean: without the ban, token 4 counts once again.
  got.clear();
  counter.count(nullptr, &output, false, 10, got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].token, 4);
  EXPECT_EQ(got[1].output_count, 1);
  const std::vector<int32_t> outside = {10};
  EXPECT_THROW(counter.count(nullptr, &output, false, 10, got, &outside), Error);
}

TEST(SamplingRules, PruneTableNeverPrunesATokenThatCouldWin) {
  std::vector<uint64_t> table(kPruneTableSize);
  for (int j = 0; j < kPruneTableSize; ++j) {
    table[j] = prune_table_entry(j);
    if (j > 0) EXPECT_GE(table[j], table[j - 1]) << j;
  }
  EXPECT_GT(table[kPruneTableSize - 1], uint64_t{1} << 52);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> gaps(0.0, kGumbelMax);
  int64_t pruned = 0;
  for (int i = 0; i < 200000; ++i) {
    const double gap = gaps(rng);
    const uint64_t bits = rng();
    ASSERT_FALSE(race_out_of_reach(gap));
    if (race_pruned(gap, bits, table.data())) {
      ++pruned;
      // A pruned token's noise cannot bridge the gap.
      ASSERT_LT(gumbel_from_bits(bits), gap) << "gap " << gap << " bits " << bits;
    }
  }
  EXPECT_GT(pruned, 100000);  // and most tokens are pruned without a logarithm
  EXPECT_TRUE(race_out_of_reach(kGumbelMax + 1e-6));
  EXPECT_FALSE(race_pruned(0.0, 0, table.data()));
}

}  // namespace
}  // namespace pagellm
