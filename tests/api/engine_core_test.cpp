// EngineCore (the api layer's request tracker) with a weight update in the middle of a
// request: every token records the version it was sampled under, and the versions a
// stream reports never decrease.
#include <gtest/gtest.h>

#include <map>

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

// Stop strings with pipelined decode: one engine step brings up to N tokens of a sample,
// and the sample must still end at the token that completes its stop string, with the same
// text, tokens, log-probabilities and finish as step by step (batch-invariant engines, so
// the rows the stopped samples keep for the rest of a run change no other sample's bits).
// min_tokens holds a stop string back the same way in both.
TEST(EngineCore, StopStringsEndPipelinedSamplesAtTheSameToken) {
  const std::string dir = testing::tiny_model_dir();
  auto text = std::make_shared<const api::TextModel>(dir);
  const auto run = [&](int32_t pipelined, const std::vector<api::TrackedRequest>& requests,
                       int64_t* pipelined_steps) {
    EngineOptions options;
    options.max_num_seqs = 8;
    options.num_pages = 128;
    options.max_model_len = 128;
    options.batch_invariant = true;
    options.pipelined_decode_steps = pipelined;
    api::EngineCore core(Engine::create(dir, api::to_engine_config(options, dir)), text);
    std::map<std::string, RequestOutput> totals;
    for (api::TrackedRequest r : requests) {
      RequestOutput& total = totals[r.request_id];
      r.sink = [&total](RequestOutput&& d) { merge_delta(total, d); };
      core.add(std::move(r));
    }
    while (core.has_requests()) core.step();
    EXPECT_EQ(core.engine().allocator().num_free(), core.engine().allocator().num_usable());
    if (pipelined_steps != nullptr) *pipelined_steps = core.engine().stats().pipelined_steps;
    return totals;
  };
  // The stop strings come from the middle of the texts the samples make without them.
  std::vector<api::TrackedRequest> requests;
  for (int k = 0; k < 4; ++k) {
    api::TrackedRequest r;
    r.request_id = "r" + std::to_string(k);
    r.prompt.ids = {static_cast<int32_t>(3 + k), 7, 11};
    r.params.n = 2;
    r.params.seed = 40 + k;
    r.params.max_tokens = 48;
    r.params.ignore_eos = true;
    requests.push_back(r);
  }
  const auto free_run = run(1, requests, nullptr);
  for (int k = 0; k < 4; ++k) {
    api::TrackedRequest& r = requests[static_cast<size_t>(k)];
    const std::string& full = free_run.at(r.request_id).outputs.at(0).text;
    ASSERT_GE(full.size(), 8u) << "the tiny model's text is too short for this test";
    size_t at = full.size() / 3 + static_cast<size_t>(k);
    while (at > 0 && (static_cast<uint8_t>(full[at]) & 0xC0) == 0x80) --at;
    r.params.stop = {"\x01never", full.substr(at, 2)};
    if (k == 3) r.params.min_tokens = 30;  // a match before token 30 does not count
  }
  int64_t pipelined_steps = 0;
  const auto want = run(1, requests, nullptr);
  const auto got = run(8, requests, &pipelined_steps);
  EXPECT_GT(pipelined_steps, 0);
  int stopped = 0;
  for (const api::TrackedRequest& r : requests) {
    const RequestOutput& a = got.at(r.request_id);
    const RequestOutput& b = want.at(r.request_id);
    ASSERT_EQ(a.outputs.size(), 2u);
    ASSERT_EQ(b.outputs.size(), 2u);
    for (size_t j = 0; j < 2; ++j) {
      const CompletionOutput& x = a.outputs[j];
      const CompletionOutput& y = b.outputs[j];
      EXPECT_EQ(x.token_ids, y.token_ids) << r.request_id << " sample " << j;
      EXPECT_EQ(x.logprobs, y.logprobs) << r.request_id << " sample " << j;
      EXPECT_EQ(x.text, y.text) << r.request_id << " sample " << j;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << r.request_id << " sample " << j;
      EXPECT_EQ(x.cumulative_logprob, y.cumulative_logprob) << r.request_id;
      if (y.finish_reason == FinishReason::kStopString) {
        ++stopped;
        EXPECT_LT(y.token_ids.size(), 48u);
        if (r.params.min_tokens > 0) {
          EXPECT_GE(y.token_ids.size(), 30u);
        }
      }
    }
  }
  EXPECT_GE(stopped, 4) << "too few samples met their stop string for the test to mean much";
}

}  // namespace
}  // namespace pagellm
