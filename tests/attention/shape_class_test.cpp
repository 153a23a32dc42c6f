// Shape classes (attention/shape_class.h): the bucket edges, decode as one class, names and
// their parsing, and the class the planner computes for a batch.
#include <gtest/gtest.h>

#include <set>

#include "fixtures.h"
#include "pagellm/attention/shape_class.h"

namespace pagellm {
namespace {

TEST(ShapeClass, QueryBucketsArePowersOfFourWithInclusiveUpperEdges) {
  const std::vector<std::pair<int64_t, int>> cases = {
      {1, 0},    {2, 1},    {64, 1},    {65, 2},    {256, 2},    {257, 3},
      {1024, 3}, {1025, 4}, {4096, 4},  {4097, 5},  {32768, 5},  {int64_t{1} << 40, 5}};
  for (auto [q, bucket] : cases) EXPECT_EQ(query_bucket(q), bucket) << q;
}

TEST(ShapeClass, KvBucketsArePowersOfFourFrom256) {
  const std::vector<std::pair<int64_t, int>> cases = {
      {1, 0},      {256, 0},     {257, 1},     {1024, 1},    {1025, 2},  {4096, 2},
      {4097, 3},   {16384, 3},   {16385, 4},   {65536, 4},   {65537, 5}, {1 << 30, 5}};
  for (auto [kv, bucket] : cases) EXPECT_EQ(kv_bucket(kv), bucket) << kv;
}

TEST(ShapeClass, DecodeIsOneClassWhateverTheKvAndRaggedness) {
  const ShapeClass d = classify_shape(1, 1, 1, false);
  EXPECT_TRUE(d.decode());
  EXPECT_EQ(d, ShapeClass{});
  for (int64_t kv : {1, 256, 257, 8192, 65537}) {
    EXPECT_EQ(classify_shape(1, 64, kv, false), d) << kv;
    EXPECT_EQ(classify_shape(1, 64, kv, true), d) << kv;
  }
  EXPECT_EQ(shape_class_name(d), "decode");
  EXPECT_EQ(shape_class_phase(d), AttentionPhase::kDecode);
}

TEST(ShapeClass, PrefillClassesSeparateChunksFromFreshPromptsAndMixedSteps) {
  // The H200 measurements of issue 20: each lands in its own class.
  const ShapeClass chunk = classify_shape(512, 512, 8192 + 512, false);
  const ShapeClass fresh = classify_shape(2048, 2048, 2048, false);
  const ShapeClass mixed = classify_shape(2048, 2048 + 63, 2048, true);
  EXPECT_EQ(shape_class_name(chunk), "q257-1024 kv4097-16384 uniform");
  EXPECT_EQ(shape_class_name(fresh), "q1025-4096 kv1025-4096 uniform");
  EXPECT_EQ(shape_class_name(mixed), "q1025-4096 kv1025-4096 ragged");
  EXPECT_NE(chunk, fresh);
  EXPECT_NE(fresh, mixed);
  EXPECT_EQ(shape_class_phase(chunk), AttentionPhase::kPrefill);
}

TEST(ShapeClass, TheQueryAxisCountsEveryTokenNotTheLongestQuery) {
  // One 512-token chunk after 4,096 cached tokens and sixteen of them share their largest
  // query and KV lengths but not their parallelism (H200: cuDNN won the first, lost the
  // second): they are different classes.
  const ShapeClass one = classify_shape(512, 512, 4096 + 512, false);
  const ShapeClass sixteen = classify_shape(512, 16 * 512, 4096 + 512, false);
  EXPECT_EQ(shape_class_name(one), "q257-1024 kv4097-16384 uniform");
  EXPECT_EQ(shape_class_name(sixteen), "q4097+ kv4097-16384 uniform");
  // 32 chunks of 32 tokens sit with one 1,024-token chunk.
  EXPECT_EQ(classify_shape(32, 32 * 32, 4096 + 32, false), classify_shape(1024, 1024, 5120, false));
}

TEST(ShapeClass, NamesAndCodesRoundTripForEveryClass) {
  std::vector<ShapeClass> all = test::all_prefill_classes();
  all.push_back(ShapeClass{});
  std::set<std::string> names;
  std::set<int32_t> codes;
  for (const ShapeClass& c : all) {
    const std::string name = shape_class_name(c);
    names.insert(name);
    codes.insert(c.code());
    EXPECT_EQ(parse_shape_class(name), c) << name;
    EXPECT_EQ(ShapeClass::from_code(c.code()), c) << name;
  }
  EXPECT_EQ(names.size(), all.size());  // distinct
  EXPECT_EQ(codes.size(), all.size());
  EXPECT_EQ(all.size(), 61u);
}

TEST(ShapeClass, ParseNamesWhatIsAccepted) {
  for (const char* bad : {"", "prefill", "q1 kv1-256 uniform", "q2-64 kv1-256", "q2-64 kv1-512 uniform",
                          "q2-64 kv1-256 jagged", "q2-64 kv1-256 uniform extra"}) {
    try {
      parse_shape_class(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("\"") + bad + "\""), std::string::npos) << m;
      EXPECT_NE(m.find("q257-1024"), std::string::npos) << m;
    }
  }
}

TEST(ShapeClass, ThePlannerClassifiesQueryTokensTheRealMaxKvAndQueryRaggedness) {
  const AttentionDomain d = test::standard_domain();
  AttentionPlannerConfig config;
  config.device = test::h200();
  AttentionPlanner planner(config);
  struct Case {
    std::vector<int32_t> q, kv;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{512}, {8704}, "q257-1024 kv4097-16384 uniform"},
      {{256, 256}, {256, 4096}, "q257-1024 kv1025-4096 uniform"},  // 512 tokens; KV may differ
      {{2048, 1, 1}, {2048, 40, 9000}, "q1025-4096 kv4097-16384 ragged"},
      {{1, 1}, {40000, 3}, "decode"},
      {{65, 64}, {257, 300}, "q65-256 kv257-1024 ragged"},
  };
  for (const Case& c : cases) {
    test::OwnedBatch b = test::make_batch(c.q, c.kv);
    const AttentionPlan& p = planner.plan(d, b.view());
    ASSERT_TRUE(p.class_known) << c.expected;
    EXPECT_EQ(shape_class_name(p.shape_class), c.expected);
  }
  // Inconsistent metadata: no class is claimed.
  test::OwnedBatch b = test::make_batch({4}, {8});
  AttentionBatchView v = b.view();
  v.max_query_len = 5;
  EXPECT_FALSE(planner.plan(d, v).class_known);
}

}  // namespace
}  // namespace pagellm
