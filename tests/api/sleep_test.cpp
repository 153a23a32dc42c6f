// Sleep and wake through the public API: LLM and AsyncEngine release the KV cache, refuse
// what they document they refuse, and give the same outputs after wake as before sleep.
// (The AsyncEngine test keeps the AsyncEngine suite name so that the ThreadSanitizer run,
// tests/api/tsan.cmake, covers sleep and wake on the loop thread too.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "api/api_test_util.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

testing::TinyModelCleanup cleanup;
using Ids = std::vector<std::vector<int32_t>>;

EngineOptions sleep_options() {
  EngineOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 128;
  o.max_model_len = 2048;
  o.num_pages = 160;
  return o;
}

SamplingParams seeded(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.n = 2;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

Ids prompts() { return {{3, 4, 5, 6, 7}, {9, 8, 7}, {20, 21, 22, 23, 24, 25, 26, 27, 28}}; }

std::vector<std::vector<int32_t>> tokens_of(const std::vector<RequestOutput>& outs) {
  std::vector<std::vector<int32_t>> t;
  for (const RequestOutput& r : outs) {
    for (const CompletionOutput& o : r.outputs) t.push_back(o.token_ids);
  }
  return t;
}

TEST(LlmSleep, SameOutputsAfterWakeAndClearErrors) {
  LLM llm(testing::tiny_model_dir(), sleep_options());
  const auto before = llm.generate(prompts(), seeded(10));
  EXPECT_THROW(llm.wake_up(), Error);

  const SleepReport report = llm.sleep();
  EXPECT_TRUE(llm.is_sleeping());
  EXPECT_GT(report.kv_bytes_released, 0u);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
  EXPECT_THROW(llm.sleep(), Error);
  try {
    llm.generate(prompts(), seeded(10));
    FAIL() << "generate while asleep must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("asleep"), std::string::npos) << e.what();
  }
  llm.wake_up();
  EXPECT_FALSE(llm.is_sleeping());
  EXPECT_THROW(llm.wake_up(), Error);
  const auto after = llm.generate(prompts(), seeded(10));
  EXPECT_EQ(tokens_of(after), tokens_of(before));
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after[i].outputs.size(); ++j) {
      EXPECT_EQ(after[i].outputs[j].logprobs, before[i].outputs[j].logprobs);
    }
  }
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(AsyncEngine, SleepWakeAndRequestsWhileAsleep) {
  std::vector<std::vector<int32_t>> expected;
  {
    LLM llm(testing::tiny_model_dir(), sleep_options());
    const Ids first_prompt = {prompts()[0]};
    expected = tokens_of(llm.generate(first_prompt, seeded(12)));
  }
  AsyncEngine engine(testing::tiny_model_dir(), sleep_options());
  const Prompt prompt = Prompt::from_token_ids(prompts()[0]);

  // A long request in flight (2,000 tokens: far from done when sleep is asked): sleep
  // refuses and changes nothing; the request goes on until aborted.
  SamplingParams long_run = seeded(2000);
  long_run.n = 1;
  auto running = engine.submit(prompt, long_run);
  RequestOutput first;
  ASSERT_TRUE(running->next(first));  // it has started
  try {
    engine.sleep();
    FAIL() << "sleep with a running request must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("running"), std::string::npos) << e.what();
  }
  RequestOutput second;
  ASSERT_TRUE(running->next(second));  // still producing tokens
  EXPECT_FALSE(second.outputs.empty());
  running->abort();
  const RequestOutput whole = running->collect();
  EXPECT_EQ(whole.outputs.at(0).finish_reason, FinishReason::kAborted);

  const SleepReport report = engine.sleep(SleepOptions{/*offload_weights=*/true});
  EXPECT_GT(report.kv_bytes_released, 0u);
  EXPECT_THROW(engine.sleep(), Error);
  // Submitted while asleep: ends at once with an error that says why.
  auto rejected = engine.submit(prompt, seeded(12));
  const RequestOutput refused = rejected->collect();
  ASSERT_TRUE(refused.finished);
  ASSERT_FALSE(refused.outputs.empty());
  for (const CompletionOutput& o : refused.outputs) {
    EXPECT_EQ(o.finish_reason, FinishReason::kError);
    EXPECT_NE(o.error.find("asleep"), std::string::npos) << o.error;
    EXPECT_TRUE(o.token_ids.empty());
  }
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());

  engine.wake_up();
  EXPECT_THROW(engine.wake_up(), Error);
  const RequestOutput again = engine.submit(prompt, seeded(12))->collect();
  std::vector<std::vector<int32_t>> got;
  for (const CompletionOutput& o : again.outputs) got.push_back(o.token_ids);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());

  engine.shutdown();
  EXPECT_THROW(engine.sleep(), Error);
  EXPECT_THROW(engine.wake_up(), Error);
}

}  // namespace
}  // namespace pagellm
