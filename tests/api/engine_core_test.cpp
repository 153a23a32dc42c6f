// EngineCore (the api layer's request tracker) with a weight update in the middle of a
// request: every token records the version it was sampled under, and the versions a
// stream reports never decrease.
#include <gtest/gtest.h>

#include "api/api_test_util.h"
#include "pagellm/api/engine_core.h"
#include "pagellm/async_engine.h"

namespace pagellm {
namespace {

TEST(EngineCore, TokensCarryTheWeightsVersionTheyWereSampledUnder) {
  EngineOptions options;
  options.max_num_seqs = 4;
  options.num_pages = 64;
  options.max_model_len = 128;
  const std::string dir = testing::tiny_model_dir();
  auto text = std::make_shared<const api::TextModel>(dir);
  api::EngineCore core(Engine::create(dir, api::to_engine_config(options, dir)), text);
  std::vector<RequestOutput> deltas;
  api::TrackedRequest r;
  r.request_id = "w";
  r.prompt.ids = {1, 2, 3};
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  r.sink = [&](RequestOutput&& d) { deltas.push_back(std::move(d)); };
  core.add(std::move(r));
  for (int i = 0; i < 4; ++i) core.step();
  core.engine().bump_weights_version();
  while (core.has_requests()) core.step();

  RequestOutput total;
  uint64_t last = 0;
  for (const RequestOutput& d : deltas) {
    EXPECT_GE(d.weights_version, last);
    last = d.weights_version;
    merge_delta(total, d);
  }
  ASSERT_EQ(total.outputs.size(), 1u);
  const std::vector<uint64_t>& v = total.outputs[0].weights_versions;
  ASSERT_EQ(v.size(), 10u);
  // Step 1 prefills and samples the first token; steps 2-4 sample tokens 2-4 (version 0).
  EXPECT_EQ(std::vector<uint64_t>(v.begin(), v.begin() + 4), std::vector<uint64_t>(4, 0));
  EXPECT_EQ(std::vector<uint64_t>(v.begin() + 4, v.end()), std::vector<uint64_t>(6, 1));
  EXPECT_EQ(total.weights_version, 1u);
  EXPECT_EQ(core.engine().allocator().num_free(), core.engine().allocator().num_usable());
}

// A request with n = 3 becomes one engine group: the prompt is prefilled once, the samples
// are forked, and the request reports 3 outputs (indices 0..2) like 3 requests would.
TEST(EngineCore, NSamplesArePrefilledOnceAndForked) {
  EngineOptions options;
  options.max_num_seqs = 4;
  options.num_pages = 64;
  options.max_model_len = 128;
  const std::string dir = testing::tiny_model_dir();
  auto text = std::make_shared<const api::TextModel>(dir);
  api::EngineCore core(Engine::create(dir, api::to_engine_config(options, dir)), text);
  RequestOutput total;
  api::TrackedRequest r;
  r.request_id = "fan";
  r.prompt.ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  r.params.n = 3;
  r.params.seed = 21;
  r.params.max_tokens = 6;
  r.params.ignore_eos = true;
  r.sink = [&](RequestOutput&& d) { merge_delta(total, d); };
  core.add(std::move(r));
  while (core.has_requests()) core.step();
  ASSERT_EQ(total.outputs.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(total.outputs[static_cast<size_t>(j)].index, j);
    EXPECT_EQ(total.outputs[static_cast<size_t>(j)].token_ids.size(), 6u);
  }
  const EngineStats& stats = core.engine().stats();
  EXPECT_EQ(stats.prefill_tokens, 9);  // once, not 3 times
  EXPECT_EQ(stats.forked_samples, 2);
  EXPECT_EQ(core.engine().allocator().num_free(), core.engine().allocator().num_usable());
}

}  // namespace
}  // namespace pagellm
