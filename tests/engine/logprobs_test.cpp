// The log-probability contract in the engine (docs/design.md, "The log-probability
// contract"): top-k alternatives of a generate run against the logits the model produced
// (read through the logits hook), scoring (Engine::score) against the logprobs of the same
// tokens sampled by generate, batched and chunked scoring, the float32 head on the CPU
// backend, and scoring's bad input (a clear error, no page held, the engine still serving).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/expect_error.h"
#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

struct EngineSetup {
  int32_t max_num_seqs = 6;
  int32_t max_batched_tokens = 32;
  int64_t num_pages = 200;
  int32_t max_model_len = 96;
  bool float32_head = false;
};

std::unique_ptr<Engine> make_engine(const EngineSetup& s = {}) {
  Qwen3Config c = testing::small_config(false);
  testing::HostWeights w = testing::random_weights(c, 4242);
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = 4;
  ec.num_pages = s.num_pages;
  ec.max_num_seqs = s.max_num_seqs;
  ec.max_num_batched_tokens = s.max_batched_tokens;
  ec.max_model_len = s.max_model_len;
  ec.float32_head = s.float32_head;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

std::vector<int32_t> prompt_of(int i, int length) {
  std::vector<int32_t> p;
  for (int j = 0; j < length; ++j) p.push_back((j * 13 + i * 29) % 96 + 1);
  return p;
}

SamplingParams seeded(uint64_t seed, int max_tokens) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  return sp;
}

void expect_all_pages_free(const Engine& engine) {
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable());
  engine.check_invariants();
}

TEST(Logprobs, TopKOfAGenerateRunEqualsTheHookLogits) {
  auto engine = make_engine();
  // (request id, output index) -> the logits the token was sampled from.
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> seen;
  engine->set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    seen[{id, index}] = std::vector<float>(logits, logits + vocab);
  });
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    SamplingParams sp = seeded(10 + i, 12);
    sp.logprobs = 5;
    sp.processed_logprobs = i % 2 == 1;
    sp.top_k = i % 2 == 1 ? 3 : 0;  // a processed list shorter than k
    ids.push_back(engine->add_request(prompt_of(i, 5 + 7 * i), sp));
  }
  while (engine->has_unfinished()) engine->step();
  const int64_t vocab = engine->model().config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = engine->request(ids[i]);
    ASSERT_EQ(s.sampled.size(), 12u);
    for (size_t k = 0; k < s.sampled.size(); ++k) {
      const SampledToken& t = s.sampled[k];
      const std::vector<float>& logits = seen.at({ids[i], static_cast<int64_t>(k)});
      const TokenScore expected = score_token(logits.data(), vocab, t.token, 5);
      EXPECT_EQ(t.top, expected.top) << "request " << i << " token " << k;
      EXPECT_EQ(t.rank, expected.rank);
      EXPECT_EQ(t.logprob, expected.logprob);
      for (int j = 1; j < 5; ++j) EXPECT_GE(t.top[j - 1].logprob, t.top[j].logprob);
      if (i % 2 == 1) {
        ASSERT_EQ(t.processed_top.size(), 3u);  // top_k = 3 keeps three tokens
        const auto at = std::find_if(t.processed_top.begin(), t.processed_top.end(),
                                     [&](const TokenLogprob& e) { return e.token_id == t.token; });
        ASSERT_NE(at, t.processed_top.end()) << "the sampled token is one of the kept three";
        EXPECT_EQ(at->logprob, t.processed_logprob);
      } else {
        EXPECT_TRUE(t.processed_top.empty());
      }
    }
  }
}

// Logprobs of two forwards of different shape agree to float32 rounding, not bit for bit:
// OpenBLAS's sgemm picks its kernel and blocking by M (the forward's token count), so a
// logit computed in a 1-token decode and in a 30-token prefill may differ in the last bits.
constexpr float kAcrossShapes = 2e-5f;

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tolerance,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], tolerance) << what << " #" << k;
}

// With the same batch composition the numbers are the same bits: generating one token
// runs one forward over the prompt with its last row sampled; scoring prompt + that token
// runs the same forward (the same tokens, one logits row).
TEST(Logprobs, ScoringEqualsGenerateBitwiseForTheSameForward) {
  auto engine = make_engine();
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = prompt_of(i, 5 + 8 * i);
    SamplingParams sp = seeded(40 + i, 1);
    sp.logprobs = 4;
    const int64_t id = engine->add_request(prompt, sp);
    while (engine->has_unfinished()) engine->step();
    const SampledToken& t = engine->request(id).sampled.at(0);
    std::vector<int32_t> all = prompt;
    all.push_back(t.token);
    const ScoreOutput s =
        engine->score({all}, {static_cast<int32_t>(prompt.size())}, 4)[0];
    ASSERT_EQ(s.logprobs.size(), 1u);
    EXPECT_EQ(s.logprobs[0], t.logprob) << "prompt " << i;
    EXPECT_EQ(s.ranks[0], t.rank);
    EXPECT_EQ(s.top_logprobs[0], t.top);
  }
  expect_all_pages_free(*engine);
}

// Scoring the prompt + output of a generate run gives the logprobs the run reported, to
// float32 rounding (the run's decode forwards and scoring's prefill forwards differ in
// shape; kAcrossShapes says why that matters on the CPU).
TEST(Logprobs, ScoringEqualsTheSampledLogprobsOfGenerate) {
  auto engine = make_engine();
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> prompt_lengths;
  std::vector<std::vector<float>> sampled_logprobs;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = prompt_of(i, 4 + 9 * i);
    const int64_t id = engine->add_request(prompt, seeded(7 + i, 20));
    while (engine->has_unfinished()) engine->step();
    const Sequence& s = engine->request(id);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), s.output.begin(), s.output.end());
    sequences.push_back(all);
    prompt_lengths.push_back(static_cast<int32_t>(prompt.size()));
    std::vector<float> lp;
    for (const SampledToken& t : s.sampled) lp.push_back(t.logprob);
    sampled_logprobs.push_back(lp);
  }
  const std::vector<ScoreOutput> scored = engine->score(sequences, prompt_lengths, 4);
  ASSERT_EQ(scored.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(scored[i].token_ids, sequences[i]);
    expect_close(scored[i].logprobs, sampled_logprobs[i], kAcrossShapes,
                 "sequence " + std::to_string(i));
    EXPECT_EQ(scored[i].top_logprobs.size(), sampled_logprobs[i].size());
    EXPECT_EQ(scored[i].ranks.size(), sampled_logprobs[i].size());
  }
  expect_all_pages_free(*engine);
}

// Several sequences at once, forced into chunks by the token budget (8 per forward) and the
// logits rows (2 per forward), equal each sequence scored alone in a roomy engine (to
// float32 rounding: the forwards differ in shape), and scoring is repeatable bit for bit.
TEST(Logprobs, BatchedAndChunkedScoringEqualsScoringAlone) {
  EngineSetup tight;
  tight.max_num_seqs = 2;
  tight.max_batched_tokens = 8;
  auto chunked = make_engine(tight);
  auto roomy = make_engine();
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> prompt_lengths;
  for (int i = 0; i < 5; ++i) {
    sequences.push_back(prompt_of(i, 3 + 11 * i));
    prompt_lengths.push_back(1 + (i * 5) % static_cast<int>(sequences.back().size() - 1));
  }
  const std::vector<ScoreOutput> together = chunked->score(sequences, prompt_lengths, 3);
  expect_all_pages_free(*chunked);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const ScoreOutput alone = roomy->score({sequences[i]}, {prompt_lengths[i]}, 3)[0];
    ASSERT_EQ(together[i].logprobs.size(), sequences[i].size() - prompt_lengths[i]);
    expect_close(together[i].logprobs, alone.logprobs, kAcrossShapes,
                 "sequence " + std::to_string(i));
    EXPECT_EQ(together[i].ranks, alone.ranks);
    ASSERT_EQ(together[i].top_logprobs.size(), alone.top_logprobs.size());
    for (size_t k = 0; k < alone.top_logprobs.size(); ++k) {
      ASSERT_EQ(together[i].top_logprobs[k].size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(together[i].top_logprobs[k][j].token_id, alone.top_logprobs[k][j].token_id);
        EXPECT_NEAR(together[i].top_logprobs[k][j].logprob, alone.top_logprobs[k][j].logprob,
                    kAcrossShapes);
      }
    }
    for (size_t k = 0; k < alone.logprobs.size(); ++k) {
      EXPECT_LE(alone.logprobs[k], 0.0f);
      EXPECT_GE(alone.ranks[k], 1);
      EXPECT_GE(alone.top_logprobs[k][0].logprob, alone.logprobs[k]);
    }
  }
  // The same call again: the same forwards, the same bits.
  const std::vector<ScoreOutput> again = chunked->score(sequences, prompt_lengths, 3);
  for (size_t i = 0; i < sequences.size(); ++i) {
    EXPECT_EQ(again[i].logprobs, together[i].logprobs);
    EXPECT_EQ(again[i].top_logprobs, together[i].top_logprobs);
  }
  // Default prompt length 1: every token after the first.
  const ScoreOutput all = roomy->score({sequences[2]})[0];
  EXPECT_EQ(all.prompt_length, 1);
  EXPECT_EQ(all.logprobs.size(), sequences[2].size() - 1);
  EXPECT_TRUE(all.top_logprobs.empty());
  expect_all_pages_free(*roomy);
}

TEST(Logprobs, ScoringWhileRequestsRunLeavesThemUndisturbed) {
  auto engine = make_engine();
  auto reference = make_engine();
  const int64_t id = engine->add_request(prompt_of(1, 10), seeded(3, 15));
  const int64_t ref = reference->add_request(prompt_of(1, 10), seeded(3, 15));
  for (int k = 0; k < 4; ++k) engine->step();
  const ScoreOutput mid = engine->score({prompt_of(2, 30)})[0];
  while (engine->has_unfinished()) engine->step();
  while (reference->has_unfinished()) reference->step();
  EXPECT_EQ(engine->request(id).output, reference->request(ref).output);
  EXPECT_EQ(mid.logprobs, reference->score({prompt_of(2, 30)})[0].logprobs);
  expect_all_pages_free(*engine);
}

TEST(Logprobs, ScoringBadInputIsAClearErrorAndHoldsNoPage) {
  auto engine = make_engine();
  const std::vector<int32_t> ok = prompt_of(0, 10);
  using testing::expect_error;
  expect_error([&] { engine->score({ok, {}}); }, "sequence 1 has 0 tokens");
  expect_error([&] { engine->score({{5}}); }, "needs at least 2");
  expect_error([&] { engine->score({prompt_of(0, 97)}); }, "longer than the context");
  expect_error([&] { engine->score({ok}, {0}); }, "outside [1, 9]");
  expect_error([&] { engine->score({ok}, {10}); }, "outside [1, 9]");
  expect_error([&] { engine->score({ok, ok}, {1}); }, "1 prompt lengths for 2 sequences");
  expect_error([&] { engine->score({ok, {1, 2, 100000}}); }, "outside the vocabulary");
  expect_error([&] { engine->score({ok, {1, -3}}); }, "outside the vocabulary");
  expect_error([&] { engine->score({ok}, {}, 21); }, "top_k must be in [0, 20]");
  expect_all_pages_free(*engine);
  // Longer than the whole cache (6 usable pages of 4 tokens).
  EngineSetup small;
  small.num_pages = 7;
  auto tiny = make_engine(small);
  expect_error([&] { tiny->score({prompt_of(0, 40)}); }, "more than the cache's 6");
  // Free pages held by a running request: a clear error, nothing leaked, still serving.
  const int64_t id = tiny->add_request(prompt_of(1, 12), seeded(1, 6));
  tiny->step();
  expect_error([&] { tiny->score({prompt_of(0, 20)}); }, "free KV pages");
  while (tiny->has_unfinished()) tiny->step();
  EXPECT_EQ(tiny->request(id).output.size(), 6u);
  expect_all_pages_free(*tiny);
  EXPECT_EQ(tiny->score({prompt_of(0, 20)})[0].logprobs.size(), 19u);
  expect_all_pages_free(*tiny);
}

// The CPU backend computes in float32 throughout, so the float32 head changes nothing.
TEST(Logprobs, Float32HeadIsANoOpOnTheCpuBackend) {
  EngineSetup f32;
  f32.float32_head = true;
  auto plain = make_engine();
  auto head = make_engine(f32);
  const std::vector<int32_t> p = prompt_of(3, 9);
  const int64_t a = plain->add_request(p, seeded(5, 10));
  const int64_t b = head->add_request(p, seeded(5, 10));
  while (plain->has_unfinished()) plain->step();
  while (head->has_unfinished()) head->step();
  EXPECT_EQ(plain->request(a).output, head->request(b).output);
  for (size_t k = 0; k < 10; ++k)
    EXPECT_EQ(plain->request(a).sampled[k].logprob, head->request(b).sampled[k].logprob);
}

}  // namespace
}  // namespace pagellm
