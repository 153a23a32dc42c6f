// AsyncEngine: many threads submitting at once get what LLM gives for the same requests;
// streamed deltas add up to the whole; abort frees pages at once; shutdown, bad input and
// failing callbacks end cleanly. tests/api/extra.cmake runs these under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "api/api_test_util.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

EngineOptions async_options() {
  EngineOptions o;
  o.max_num_seqs = 8;  // fewer than the requests below: some wait and some are preempted
  o.max_num_batched_tokens = 64;
  o.max_model_len = 128;
  o.num_pages = 96;
  return o;
}

// Request k of the many-threads test: seeded sampling for even k, greedy for odd k.
SamplingParams params_for(int k) {
  SamplingParams p;
  p.max_tokens = 6 + k % 5;
  p.ignore_eos = true;
  if (k % 2 == 0) {
    p.temperature = 0.8f;
    p.top_k = 50;
    p.seed = 1000 + static_cast<uint64_t>(k);
  } else {
    p.temperature = 0.0f;
  }
  return p;
}

TEST(AsyncEngine, PrefixCacheStatsAndResetRunOnTheLoopThread) {
  // A budget of the hit (48 tokens): the first prompt is computed as [0, 48) then
  // [48, 50), the second only [48, 50), the same rows in the same steps.
  EngineOptions options = async_options();
  options.max_num_batched_tokens = 48;
  AsyncEngine engine(testing::tiny_model_dir(), options);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 50; ++i) prompt.push_back(1 + (i * 37) % 900);
  const RequestOutput first =
      engine.submit(Prompt::from_token_ids(prompt), params_for(1))->collect();
  const RequestOutput second =
      engine.submit(Prompt::from_token_ids(prompt), params_for(1))->collect();
  EXPECT_EQ(second.outputs[0].token_ids, first.outputs[0].token_ids);
  PrefixCacheStats stats = engine.prefix_cache_stats();
  EXPECT_EQ(stats.queried_tokens, 2 * 49);
  EXPECT_EQ(stats.hit_tokens, 48);  // three full pages of 16
  EXPECT_GT(stats.cached_free_pages, 0);
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());

  engine.reset_prefix_cache();
  stats = engine.prefix_cache_stats();
  EXPECT_EQ(stats.cached_pages, 0);
  engine.submit(Prompt::from_token_ids(prompt), params_for(1))->collect();
  EXPECT_EQ(engine.prefix_cache_stats().hit_tokens, 48);  // no hit after the reset
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());

  engine.shutdown();  // afterwards both run on the caller's thread
  engine.reset_prefix_cache();
  EXPECT_EQ(engine.prefix_cache_stats().cached_pages, 0);
}

std::vector<int32_t> prompt_for(int k) {
  std::vector<int32_t> ids;
  for (int i = 0; i <= k % 7; ++i) ids.push_back(1 + (k * 31 + i * 17) % 1000);
  return ids;
}

TEST(AsyncEngine, LoadCountsRunningWaitingAndFreePages) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  EngineLoad idle = engine.load();
  EXPECT_EQ(idle.running, 0);
  EXPECT_EQ(idle.waiting, 0);
  EXPECT_EQ(idle.free_pages, engine.num_usable_pages());
  EXPECT_EQ(idle.usable_pages, engine.num_usable_pages());
  EXPECT_FALSE(idle.paused);
  EXPECT_EQ(engine.max_model_len(), 128);

  // Paused with kKeep, nothing runs: 12 samples (more than max_num_seqs = 8) all wait.
  engine.pause(PauseMode::kKeep);
  std::vector<std::shared_ptr<RequestStream>> streams;
  SamplingParams params = params_for(1);
  params.n = 4;
  for (int k = 0; k < 3; ++k) {
    streams.push_back(engine.submit(Prompt::from_token_ids({1, 2, 3, 4 + k}), params));
  }
  // The loop publishes after each pass; give it a few.
  EngineLoad held;
  for (int tries = 0; tries < 200; ++tries) {
    held = engine.load();
    if (held.waiting == 12) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(held.paused);
  EXPECT_EQ(held.running, 0);
  EXPECT_EQ(held.waiting, 12);

  engine.resume();
  for (auto& s : streams) s->collect();
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  const EngineLoad done = engine.load();
  EXPECT_EQ(done.running, 0);
  EXPECT_EQ(done.waiting, 0);
  EXPECT_EQ(done.free_pages, engine.num_usable_pages());
  EXPECT_FALSE(done.paused);
}

// Eight threads submit four requests each to an AsyncEngine with `options`; each gets what
// a step-by-step LLM gives the same requests.
void many_threads_get_what_llm_gives(const EngineOptions& options) {
  constexpr int kThreads = 8, kPerThread = 4, kTotal = kThreads * kPerThread;
  std::vector<RequestOutput> expected;
  {
    LLM llm(testing::tiny_model_dir(), async_options());
    std::vector<Prompt> prompts;
    std::vector<SamplingParams> params;
    for (int k = 0; k < kTotal; ++k) {
      prompts.push_back(Prompt::from_token_ids(prompt_for(k)));
      params.push_back(params_for(k));
    }
    expected = llm.generate(prompts, params);
  }
  AsyncEngine engine(testing::tiny_model_dir(), options);
  std::vector<RequestOutput> got(kTotal);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        streams.push_back(engine.submit(Prompt::from_token_ids(prompt_for(k)), params_for(k)));
      }
      for (int i = 0; i < kPerThread; ++i) got[t * kPerThread + i] = streams[i]->collect();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < kTotal; ++k) {
    ASSERT_TRUE(got[k].finished);
    ASSERT_EQ(got[k].outputs.size(), 1u);
    EXPECT_EQ(got[k].prompt_token_ids, prompt_for(k));
    const CompletionOutput& a = got[k].outputs[0];
    const CompletionOutput& b = expected[k].outputs[0];
    EXPECT_EQ(a.token_ids, b.token_ids) << "request " << k;
    EXPECT_EQ(a.text, b.text) << "request " << k;
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-4);
  }
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
}

TEST(AsyncEngine, ManyThreadsGetWhatLlmGives) { many_threads_get_what_llm_gives(async_options()); }

// Pipelined decode under the loop thread: runs of decode steps that submissions from other
// threads interrupt (Engine::set_run_interrupt), the same outputs.
TEST(AsyncEngine, ManyThreadsGetWhatLlmGivesWhenPipelined) {
  EngineOptions options = async_options();
  options.pipelined_decode_steps = 16;
  many_threads_get_what_llm_gives(options);
}

TEST(AsyncEngine, StreamedDeltasAddUpToTheWhole) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  SamplingParams p = params_for(0);
  p.max_tokens = 12;
  p.n = 2;
  auto stream = engine.submit(Prompt::from_text("Hello there"), p, "mine");
  EXPECT_EQ(stream->request_id(), "mine");
  RequestOutput delta, total;
  int deltas = 0;
  while (stream->next(delta)) {
    ++deltas;
    EXPECT_EQ(delta.request_id, "mine");
    if (deltas == 1) {
      EXPECT_EQ(delta.prompt_token_ids, engine.encode("Hello there"));
    } else {
      EXPECT_TRUE(delta.prompt_token_ids.empty()) << "the prompt comes with the first delta only";
    }
    for (const CompletionOutput& o : delta.outputs) {
      EXPECT_TRUE(!o.token_ids.empty() || o.finished()) << "an empty delta";
    }
    merge_delta(total, delta);
  }
  EXPECT_TRUE(stream->finished());
  EXPECT_GT(deltas, 2) << "tokens did not arrive incrementally";
  ASSERT_EQ(total.outputs.size(), 2u);
  for (int j = 0; j < 2; ++j) {
    const CompletionOutput& o = total.outputs[static_cast<size_t>(j)];
    EXPECT_EQ(o.token_ids.size(), 12u);
    EXPECT_EQ(o.text, engine.decode(o.token_ids));
    EXPECT_EQ(o.finish_reason, FinishReason::kLength);
  }
  // The same request again, seeded: same tokens (sample j uses seed + j).
  auto again = engine.submit(Prompt::from_text("Hello there"), p, "mine")->collect();
  EXPECT_EQ(again.outputs[1].token_ids, total.outputs[1].token_ids);
  EXPECT_FALSE(stream->next(delta, std::chrono::milliseconds(1)));
}

TEST(AsyncEngine, AbortMidStreamFreesPagesAtOnce) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 100;
  p.ignore_eos = true;
  auto stream = engine.submit(Prompt::from_token_ids({1, 2, 3, 4, 5}), p);
  RequestOutput delta;
  ASSERT_TRUE(stream->next(delta));
  ASSERT_TRUE(stream->next(delta));
  EXPECT_FALSE(delta.finished);
  EXPECT_LT(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  stream->abort();
  RequestOutput rest;
  while (stream->next(delta)) merge_delta(rest, delta);
  ASSERT_EQ(rest.outputs.size(), 1u);
  EXPECT_EQ(rest.outputs[0].finish_reason, FinishReason::kAborted);
  EXPECT_STREQ(finish_reason_openai(FinishReason::kAborted), "abort");
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  engine.abort("no-such-request");  // ignored
}

TEST(AsyncEngine, CallbacksRunOnTheLoopThreadInOrder) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  std::mutex mu;
  std::condition_variable cv;
  RequestOutput total;
  std::thread::id callback_thread;
  bool done = false;
  int after_finish = 0;
  const std::string id = engine.submit(
      Prompt::from_token_ids({4, 5}), params_for(2), [&](const RequestOutput& delta) {
        std::lock_guard<std::mutex> lock(mu);
        if (done) ++after_finish;
        callback_thread = std::this_thread::get_id();
        merge_delta(total, delta);
        done = delta.finished;
        cv.notify_all();
      });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  EXPECT_NE(callback_thread, std::this_thread::get_id());
  EXPECT_EQ(total.request_id, id);
  EXPECT_EQ(total.outputs[0].token_ids.size(), static_cast<size_t>(params_for(2).max_tokens));
  EXPECT_EQ(after_finish, 0);
}

TEST(AsyncEngine, ThrowingCallbackAbortsItsRequestOnly) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  std::atomic<int> calls{0};
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 50;
  p.ignore_eos = true;
  engine.submit(Prompt::from_token_ids({1, 2}), p, [&](const RequestOutput&) {
    ++calls;
    throw std::runtime_error("caller bug");
  });
  const RequestOutput other = engine.submit(Prompt::from_token_ids({3}), params_for(1))->collect();
  EXPECT_EQ(other.outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  EXPECT_EQ(calls.load(), 1) << "a callback that threw was called again";
}

TEST(AsyncEngine, BadInputAndDuplicateIdsAreRejectedAtSubmit) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  SamplingParams p;
  p.top_p = 2;
  try {
    engine.submit(Prompt::from_token_ids({1}), p);
    ADD_FAILURE() << "top_p 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p must be in (0, 1]"), std::string::npos);
  }
  EXPECT_THROW(engine.submit(Prompt::from_token_ids({1, 99999}), SamplingParams{}), Error);
  SamplingParams slow;
  slow.max_tokens = 100;
  slow.ignore_eos = true;
  auto first = engine.submit(Prompt::from_token_ids({1}), slow, "dup");
  try {
    engine.submit(Prompt::from_token_ids({1}), slow, "dup");
    ADD_FAILURE() << "duplicate id accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request id 'dup' is already in use"), std::string::npos);
  }
  first->abort();
  first->collect();
}

TEST(AsyncEngine, SubmitsAndAbortsFromManyThreadsLeaveNoPage) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  std::atomic<int> aborted{0}, finished{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        SamplingParams p = params_for(t * 5 + i);
        p.max_tokens = 30;
        auto stream = engine.submit(Prompt::from_token_ids(prompt_for(t * 5 + i)), p);
        RequestOutput delta;
        if (i % 2 == 0) {
          ASSERT_TRUE(stream->next(delta));
          if (!delta.finished) engine.abort(stream->request_id());
        }
        const RequestOutput r = stream->collect();
        ASSERT_TRUE(r.finished);
        if (r.outputs[0].finish_reason == FinishReason::kAborted) ++aborted;
        if (r.outputs[0].finish_reason == FinishReason::kLength) ++finished;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(aborted + finished, 40);
  EXPECT_GT(aborted.load(), 0);
  EXPECT_GE(finished.load(), 16) << "requests that were never aborted did not run to length";
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
}

TEST(AsyncEngine, ShutdownAbortsOutstandingRequestsAndRefusesNewOnes) {
  AsyncEngine engine(testing::tiny_model_dir(), async_options());
  SamplingParams p;
  p.max_tokens = 120;
  p.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(engine.submit(Prompt::from_token_ids({1, 2}), p));
  RequestOutput delta;
  ASSERT_TRUE(streams[0]->next(delta));
  engine.shutdown();
  for (auto& s : streams) {
    const RequestOutput r = s->collect();
    EXPECT_TRUE(r.finished);
    EXPECT_EQ(r.outputs[0].finish_reason, FinishReason::kAborted);
  }
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  try {
    engine.submit(Prompt::from_token_ids({1}), p);
    ADD_FAILURE() << "submit after shutdown accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("submit after shutdown"), std::string::npos);
  }
  engine.shutdown();  // idempotent
}

}  // namespace
}  // namespace pagellm
