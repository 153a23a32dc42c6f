// LLM (offline generation): output shape and contents, prompts as text, ids and chat, the
// n-samples seed rule, stop strings and tokens, and bad input rejected before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "api/api_test_util.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

testing::TinyModelCleanup cleanup;
using Ids = std::vector<std::vector<int32_t>>;

EngineOptions small_engine() {
  EngineOptions o;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 256;
  o.num_pages = 128;
  return o;
}

LLM& shared_llm() {
  static LLM llm(testing::tiny_model_dir(), small_engine());
  return llm;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

void expect_consistent(const LLM& llm, const RequestOutput& r, const SamplingParams& p) {
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.outputs.size(), static_cast<size_t>(p.n));
  for (size_t j = 0; j < r.outputs.size(); ++j) {
    const CompletionOutput& o = r.outputs[j];
    EXPECT_EQ(o.index, static_cast<int>(j));
    EXPECT_EQ(o.logprobs.size(), o.token_ids.size());
    EXPECT_EQ(o.weights_versions, std::vector<uint64_t>(o.token_ids.size(), 0));
    double sum = 0;
    for (float lp : o.logprobs) {
      EXPECT_LE(lp, 0.0f);
      sum += lp;
    }
    EXPECT_NEAR(o.cumulative_logprob, sum, 1e-9 * (1 + std::abs(sum)));
    if (o.finish_reason != FinishReason::kStopString) {
      EXPECT_EQ(o.text, llm.decode(o.token_ids, p.skip_special_tokens));
    }
  }
}

TEST(Llm, GenerateFromIdsHasVllmShape) {
  LLM& llm = shared_llm();
  const SamplingParams p = greedy(6);
  const std::vector<RequestOutput> out = llm.generate(Ids{{1, 2, 3}, {7, 8}}, p);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].prompt_token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out[1].prompt_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(out[0].prompt.empty());
  EXPECT_NE(out[0].request_id, out[1].request_id);
  for (const RequestOutput& r : out) {
    expect_consistent(llm, r, p);
    EXPECT_EQ(r.outputs[0].token_ids.size(), 6u);
    EXPECT_EQ(r.outputs[0].finish_reason, FinishReason::kLength);
    EXPECT_STREQ(finish_reason_openai(r.outputs[0].finish_reason), "length");
    for (int32_t t : r.outputs[0].token_ids) EXPECT_TRUE(t >= 0 && t < llm.vocab_size());
  }
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(Llm, TextPromptEqualsItsIds) {
  LLM& llm = shared_llm();
  const SamplingParams p = greedy(5);
  const std::string text = "The paged KV cache is";
  const auto from_text = llm.generate(std::vector<std::string>{text}, p);
  const auto from_ids = llm.generate({llm.encode(text)}, p);
  EXPECT_EQ(from_text[0].prompt, text);
  EXPECT_EQ(from_text[0].prompt_token_ids, llm.encode(text));
  EXPECT_EQ(from_text[0].outputs[0].token_ids, from_ids[0].outputs[0].token_ids);
  expect_consistent(llm, from_text[0], p);
}

TEST(Llm, ChatPromptGoesThroughTheTemplate) {
  LLM& llm = shared_llm();
  const std::vector<ChatMessage> conversation = {{"user", "Hello"}};
  const Prompt thinking = Prompt::from_messages(conversation, true);
  const Prompt plain = Prompt::from_messages(conversation, false);
  const std::string rendered = llm.apply_chat_template(plain);
  EXPECT_NE(rendered.find("Hello"), std::string::npos);
  EXPECT_NE(rendered, llm.apply_chat_template(thinking)) << "enable_thinking is not passed";
  const auto out = llm.chat({conversation}, greedy(4), false);
  EXPECT_EQ(out[0].prompt, rendered);
  EXPECT_EQ(out[0].prompt_token_ids, llm.encode(rendered));
  expect_consistent(llm, out[0], greedy(4));
}

TEST(Llm, ChatPromptsCanLeaveTheFinalMessageOpen) {
  LLM& llm = shared_llm();
  const std::string history = R"([{"role": "user", "content": "Hello"},
                                  {"role": "assistant", "content": "The answer is"}])";
  const std::string closed = llm.apply_chat_template(Prompt::from_messages_json(history));
  // The final assistant message continued: the render stops where its content ends.
  const std::string open = llm.apply_chat_template(Prompt::from_messages_json(
      R"({"messages": )" + history + R"(, "continue_final_message": true})"));
  EXPECT_EQ(open.substr(open.size() - 13), "The answer is");
  EXPECT_EQ(closed.compare(0, open.size(), open), 0) << "the open render is not a prefix";
  EXPECT_GT(closed.size(), open.size());
  // No assistant turn opened: the closed history alone.
  const std::string none = llm.apply_chat_template(Prompt::from_messages_json(
      R"({"messages": )" + history + R"(, "add_generation_prompt": false})"));
  EXPECT_EQ(closed.substr(0, none.size()), none);
  EXPECT_EQ(closed.substr(none.size()), "<|im_start|>assistant\n");
  // Both at once is refused, naming them.
  try {
    llm.apply_chat_template(Prompt::from_messages_json(
        R"({"messages": )" + history +
        R"(, "continue_final_message": true, "add_generation_prompt": true})"));
    ADD_FAILURE() << "continue_final_message with add_generation_prompt was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not compatible"), std::string::npos) << e.what();
  }
  // A generation continues the message: its prompt is the open render.
  SamplingParams p = greedy(3);
  const auto out = llm.generate({Prompt::from_messages_json(
                                    R"({"messages": )" + history +
                                    R"(, "continue_final_message": true})")},
                                p);
  EXPECT_EQ(out[0].prompt_token_ids, llm.encode(open));
}

TEST(Llm, SampleJOfNEqualsASingleRequestWithSeedPlusJ) {
  LLM& llm = shared_llm();
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 8;
  p.ignore_eos = true;
  p.n = 3;
  p.seed = 100;
  const auto group = llm.generate(Ids{{5, 6, 7}}, p);
  expect_consistent(llm, group[0], p);
  for (int j = 0; j < 3; ++j) {
    SamplingParams single = p;
    single.n = 1;
    single.seed = 100 + j;
    const auto one = llm.generate(Ids{{5, 6, 7}}, single);
    EXPECT_EQ(group[0].outputs[static_cast<size_t>(j)].token_ids, one[0].outputs[0].token_ids)
        << "sample " << j;
  }
  EXPECT_NE(group[0].outputs[0].token_ids, group[0].outputs[1].token_ids);
}

TEST(Llm, RunsWithoutSeedAreDeterministic) {
  SamplingParams p;
  p.max_tokens = 8;
  p.ignore_eos = true;
  p.n = 2;
  std::vector<std::vector<int32_t>> first;
  for (int run = 0; run < 2; ++run) {
    LLM llm(testing::tiny_model_dir(), small_engine());
    const auto out = llm.generate(Ids{{9, 10}}, p);
    if (run == 0) {
      for (const auto& o : out[0].outputs) first.push_back(o.token_ids);
    } else {
      EXPECT_EQ(out[0].outputs[0].token_ids, first[0]);
      EXPECT_EQ(out[0].outputs[1].token_ids, first[1]);
    }
  }
}

TEST(Llm, StopTokenEndsTheSampleAndIsKept) {
  LLM& llm = shared_llm();
  const auto full = llm.generate(Ids{{3, 4}}, greedy(8))[0].outputs[0].token_ids;
  SamplingParams p = greedy(8);
  p.stop_token_ids = {full[2]};
  const auto out = llm.generate(Ids{{3, 4}}, p)[0].outputs[0];
  const size_t first = static_cast<size_t>(std::find(full.begin(), full.end(), full[2]) - full.begin());
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(full.begin(), full.begin() + first + 1));
  EXPECT_EQ(out.finish_reason, FinishReason::kStopToken);
  EXPECT_STREQ(finish_reason_openai(out.finish_reason), "stop");
}

TEST(Llm, StopStringCutsTheTextAndFreesThePages) {
  LLM& llm = shared_llm();
  const SamplingParams base = greedy(24);
  const CompletionOutput full = llm.generate(Ids{{11, 12, 13}}, base)[0].outputs[0];
  ASSERT_GE(full.text.size(), 6u) << "the tiny model's text is too short for this test";
  // A stop string from the middle of the text: the output ends before its first occurrence.
  size_t at = full.text.size() / 2;
  while (at > 0 && (static_cast<uint8_t>(full.text[at]) & 0xC0) == 0x80) --at;
  const std::string stop = full.text.substr(at, 2);
  SamplingParams p = base;
  p.stop = {"\x01never", stop};
  const RequestOutput r = llm.generate(Ids{{11, 12, 13}}, p)[0];
  const CompletionOutput& out = r.outputs[0];
  EXPECT_EQ(out.finish_reason, FinishReason::kStopString);
  EXPECT_STREQ(finish_reason_name(out.finish_reason), "stop_string");
  EXPECT_STREQ(finish_reason_openai(out.finish_reason), "stop");
  EXPECT_EQ(out.text, full.text.substr(0, full.text.find(stop)));
  ASSERT_LE(out.token_ids.size(), full.token_ids.size());
  EXPECT_TRUE(std::equal(out.token_ids.begin(), out.token_ids.end(), full.token_ids.begin()));
  EXPECT_LT(out.token_ids.size(), full.token_ids.size());
  expect_consistent(llm, r, p);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(Llm, ProcessedLogprobsOnRequest) {
  LLM& llm = shared_llm();
  SamplingParams p = greedy(3);
  EXPECT_TRUE(llm.generate(Ids{{1}}, p)[0].outputs[0].processed_logprobs.empty());
  p.processed_logprobs = true;
  const auto o = llm.generate(Ids{{1}}, p)[0].outputs[0];
  EXPECT_EQ(o.processed_logprobs, std::vector<float>(3, 0.0f));  // greedy: one-hot
}

void expect_rejected(const std::vector<Prompt>& prompts, const SamplingParams& p,
                     const std::string& message) {
  LLM& llm = shared_llm();
  try {
    llm.generate(prompts, std::vector<SamplingParams>{p});
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
  // Nothing was queued: the next request runs alone and the cache is whole.
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(Llm, BadInputIsRejectedBeforeAnyWork) {
  const Prompt ok = Prompt::from_token_ids({1, 2});
  SamplingParams p = greedy(4);
  p.temperature = -1;
  expect_rejected({ok}, p, "prompt 0: invalid sampling parameters: temperature must be a "
                           "finite number >= 0");
  p = greedy(4);
  p.temperature = std::nanf("");
  expect_rejected({ok}, p, "temperature must be a finite number >= 0");
  p = greedy(4);
  p.top_p = 2;
  expect_rejected({ok}, p, "top_p must be in (0, 1]");
  p = greedy(0);
  expect_rejected({ok}, p, "max_tokens must be >= 1, got 0");
  p = greedy(4);
  p.n = 0;
  expect_rejected({ok}, p, "n (samples per prompt) must be >= 1, got 0");
  p = greedy(4);
  p.n = 17;  // small_engine(): max_num_seqs 16
  expect_rejected({ok}, p, "n = 17 samples but max_num_seqs is 16");
  p = greedy(4);
  p.stop = {""};
  expect_rejected({ok}, p, "stop strings must be non-empty");
  // The second prompt is bad: the first must not run either.
  expect_rejected({ok, Prompt::from_token_ids({})}, greedy(4), "prompt 1: the prompt is empty");
  expect_rejected({Prompt::from_token_ids({1, 5000})}, greedy(4),
                  "prompt token 1 has id 5000, outside the vocabulary [0, 1024)");
  expect_rejected({Prompt::from_token_ids(std::vector<int32_t>(256, 1))}, greedy(4),
                  "the prompt has 256 tokens but max_model_len is 256");
  expect_rejected({Prompt::from_text("ok \xff here")}, greedy(4),
                  "not valid UTF-8: byte 3 (0xff)");
  expect_rejected({Prompt::from_messages_json("[{\"role\": \"user\"")}, greedy(4),
                  "chat messages are not JSON");
}

TEST(Llm, MaxModelLenAboveTheModelsIsRejected) {
  EngineOptions o = small_engine();
  o.max_model_len = 4096;
  try {
    LLM llm(testing::tiny_model_dir(), o);
    ADD_FAILURE() << "accepted max_model_len 4096";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len 4096 is above the model's "
                                         "max_position_embeddings 2048"),
              std::string::npos)
        << e.what();
  }
}

TEST(Llm, StepCallbackSeesProgressAndAbortsCleanly) {
  LLM& llm = shared_llm();
  const Ids prompts = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  std::vector<Prompt> p;
  for (const auto& ids : prompts) p.push_back(Prompt::from_token_ids(ids));
  std::vector<SamplingParams> params;
  for (int m : {2, 5, 9}) params.push_back(greedy(m));
  std::vector<size_t> finished_seen;
  const auto full = llm.generate(p, params, [&](size_t finished, size_t total) {
    EXPECT_EQ(total, 3u);
    finished_seen.push_back(finished);
    return true;
  });
  ASSERT_FALSE(finished_seen.empty());
  EXPECT_TRUE(std::is_sorted(finished_seen.begin(), finished_seen.end()));
  EXPECT_EQ(finished_seen.back(), 3u);
  EXPECT_EQ(full[2].outputs[0].token_ids.size(), 9u);

  // Returning false after three steps aborts every unfinished request and frees its pages.
  int steps = 0;
  const auto cut = llm.generate(p, params, [&](size_t, size_t) { return ++steps < 3; });
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(cut[0].outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(cut[2].outputs[0].finish_reason, FinishReason::kAborted);
  EXPECT_LT(cut[2].outputs[0].token_ids.size(), 9u);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());

  // An exception from the callback aborts the same way and propagates.
  EXPECT_THROW(llm.generate(p, params, [](size_t, size_t) -> bool { throw Error("stop"); }),
               Error);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
  EXPECT_EQ(llm.generate(p, params)[1].outputs[0].token_ids, full[1].outputs[0].token_ids);
}

TEST(Llm, MinTokensMasksStopTokensAndStopStrings) {
  LLM& llm = shared_llm();
  SamplingParams p = greedy(12);
  p.ignore_eos = false;
  const auto free_run = llm.generate(Ids{{9, 8, 7}}, p)[0].outputs[0];
  ASSERT_GE(free_run.token_ids.size(), 3u);
  // A stop token that greedy decoding reaches at once ends the sample there...
  p.stop_token_ids = {free_run.token_ids[0]};
  EXPECT_EQ(llm.generate(Ids{{9, 8, 7}}, p)[0].outputs[0].token_ids.size(), 1u);
  // ...and with min_tokens it cannot come before min_tokens outputs.
  p.min_tokens = 5;
  const auto held = llm.generate(Ids{{9, 8, 7}}, p)[0].outputs[0];
  ASSERT_GE(held.token_ids.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(held.token_ids[i], free_run.token_ids[0]) << i;
  EXPECT_EQ(held.finish_reason == FinishReason::kStopToken,
            held.token_ids.back() == free_run.token_ids[0]);
  // Stop strings do not match below min_tokens either.
  SamplingParams s = greedy(12);
  s.min_tokens = 6;
  const std::string text = llm.generate(Ids{{9, 8, 7}}, s)[0].outputs[0].text;
  const auto ascii = std::find_if(text.begin(), text.end(),
                                  [](char c) { return (static_cast<uint8_t>(c) & 0x80) == 0; });
  if (ascii != text.end()) {
    s.stop = {std::string(1, *ascii)};
    const auto stopped = llm.generate(Ids{{9, 8, 7}}, s)[0].outputs[0];
    EXPECT_GE(stopped.token_ids.size(), 6u);
  }
  // min_tokens above max_tokens is refused, naming the field.
  s.min_tokens = 13;
  EXPECT_THROW(
      try { llm.generate(Ids{{1}}, s); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("min_tokens"), std::string::npos);
        throw;
      },
      Error);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(Llm, VersionMatchesTheProject) { EXPECT_STREQ(kVersion, PAGELLM_PROJECT_VERSION); }

TEST(Llm, MergeDeltaAppendsPerSample) {
  RequestOutput total;
  RequestOutput d1;
  d1.request_id = "r";
  d1.prompt_token_ids = {1};
  CompletionOutput a;
  a.index = 1;
  a.token_ids = {5};
  a.text = "x";
  a.logprobs = {-1.0f};
  a.cumulative_logprob = -1.0;
  d1.outputs = {a};
  merge_delta(total, d1);
  RequestOutput d2;
  CompletionOutput b = a;
  b.index = 0;
  CompletionOutput c = a;
  c.token_ids = {6};
  c.text = "y";
  c.cumulative_logprob = -2.0;
  c.finish_reason = FinishReason::kLength;
  d2.outputs = {b, c};
  d2.finished = true;
  merge_delta(total, d2);
  ASSERT_EQ(total.outputs.size(), 2u);
  EXPECT_EQ(total.outputs[0].index, 0);
  EXPECT_EQ(total.outputs[1].token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(total.outputs[1].text, "xy");
  EXPECT_EQ(total.outputs[1].cumulative_logprob, -2.0);
  EXPECT_TRUE(total.finished);
  EXPECT_EQ(total.prompt_token_ids, (std::vector<int32_t>{1}));
}

TEST(Llm, PrefixCacheHitsGiveTheSameOutputAndResetForgetsThem) {
  // Its own LLM, so that the statistics start at zero. A step budget of 32 tokens (the hit
  // below) computes the first run's prompt as [0, 32) then [32, 40), and a hit computes
  // [32, 40) alone: the same rows in the same steps, so the bits compare (the CPU
  // backend's products are not batch-invariant; tests/engine/prefix_cache_test.cpp).
  EngineOptions options = small_engine();
  options.max_num_batched_tokens = 32;
  LLM llm(testing::tiny_model_dir(), options);
  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 11);
  const SamplingParams p = greedy(4);
  const RequestOutput first = llm.generate(Ids{prompt}, p)[0];
  PrefixCacheStats stats = llm.prefix_cache_stats();
  EXPECT_EQ(stats.queried_tokens, 39);
  EXPECT_EQ(stats.hit_tokens, 0);
  EXPECT_EQ(stats.cached_pages, 2);  // 43 tokens computed: two full pages of 16
  EXPECT_EQ(stats.cached_free_pages, 2);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());  // cached-free pages are free

  const RequestOutput again = llm.generate(Ids{prompt}, p)[0];
  EXPECT_EQ(again.outputs[0].token_ids, first.outputs[0].token_ids);
  EXPECT_EQ(again.outputs[0].logprobs, first.outputs[0].logprobs);
  stats = llm.prefix_cache_stats();
  EXPECT_EQ(stats.hit_tokens, 32);
  EXPECT_DOUBLE_EQ(stats.hit_rate(), 32.0 / 78.0);

  llm.reset_prefix_cache();
  stats = llm.prefix_cache_stats();
  EXPECT_EQ(stats.cached_pages, 0);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
  llm.generate(Ids{prompt}, p);
  EXPECT_EQ(llm.prefix_cache_stats().hit_tokens, 32);  // nothing matched after the reset

  EngineOptions off = options;
  off.enable_prefix_caching = false;
  LLM plain(testing::tiny_model_dir(), off);
  const RequestOutput uncached = plain.generate(Ids{prompt}, p)[0];
  EXPECT_EQ(uncached.outputs[0].token_ids, first.outputs[0].token_ids);
  EXPECT_EQ(uncached.outputs[0].logprobs, first.outputs[0].logprobs);
  plain.generate(Ids{prompt}, p);
  EXPECT_EQ(plain.prefix_cache_stats().hit_tokens, 0);
  EXPECT_EQ(plain.prefix_cache_stats().cached_pages, 0);
}

}  // namespace
}  // namespace pagellm
