// Prefix caching in the engine (CPU backend, small random model): outputs with the cache on
// are bitwise those with it off, a request whose prefix is cached computes only the rest,
// a fully cached prompt still samples its first token correctly, preempted requests resume
// from their cached pages, a weights-version bump or a reset makes old pages unmatchable,
// and every page is free when the engine is idle. check_invariants after every step.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

struct EngineSetup {
  bool caching = true;
  int32_t page_size = 4;
  int64_t num_pages = 0;  // 0: plenty
  int32_t max_batched_tokens = 64;
  int32_t max_num_seqs = 8;
};

std::unique_ptr<Engine> make_engine(const EngineSetup& s) {
  Qwen3Config c = testing::small_config(false);
  testing::HostWeights w = testing::random_weights(c, 777);
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.enable_prefix_caching = s.caching;
  ec.page_size = s.page_size;
  ec.num_pages = s.num_pages > 0 ? s.num_pages : 400;
  ec.max_num_seqs = s.max_num_seqs;
  ec.max_num_batched_tokens = s.max_batched_tokens;
  ec.max_model_len = 160;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

SamplingParams params(bool seeded, int32_t max_tokens, uint64_t seed = 1) {
  SamplingParams sp;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  sp.processed_logprobs = true;
  if (seeded) {
    sp.temperature = 0.9f;
    sp.top_k = 30;
    sp.seed = seed;
  } else {
    sp.temperature = 0.0f;
  }
  return sp;
}

std::vector<int32_t> tokens(int32_t n, int32_t salt) {
  std::vector<int32_t> t;
  for (int32_t j = 0; j < n; ++j) t.push_back((j * 7 + salt * 31 + 3) % 96 + 1);
  return t;
}

void step_until_done(Engine& engine) {
  int steps = 0;
  while (engine.has_unfinished()) {
    engine.step();
    engine.check_invariants();
    ASSERT_LT(++steps, 10000);
  }
}

/// What a request produced, bit for bit.
struct Result {
  std::vector<int32_t> output;
  std::vector<float> logprobs;  // raw and processed, per token
  bool operator==(const Result& o) const { return output == o.output && logprobs == o.logprobs; }
};

Result result_of(const Sequence& s) {
  Result r{s.output, {}};
  for (const SampledToken& t : s.sampled) {
    r.logprobs.push_back(t.logprob);
    r.logprobs.push_back(t.processed_logprob);
  }
  return r;
}

int64_t run_one(Engine& engine, const std::vector<int32_t>& prompt, const SamplingParams& sp,
                Result* out = nullptr) {
  const int64_t id = engine.add_request(prompt, sp);
  step_until_done(engine);
  if (out != nullptr) *out = result_of(engine.request(id));
  return id;
}

void expect_close(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.output, b.output) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-4) << what << ", logprob " << i;
  }
}

// Bitwise comparisons need the same batch composition: the CPU backend's matrix products
// (OpenBLAS) are not batch-invariant, so a row's bits depend on the step's row count and
// the row's place in it. The runs below are built so that every row computed with the
// cache sits at the same place in a step of the same rows without it: requests run one at
// a time, and the step budget equals the cached prefix, so that without the cache the
// prefix is one chunk of its own, computed exactly as the request that cached it did.
struct AlignedOutcome {
  std::vector<Result> results;
  EngineStats stats;
  PrefixCacheStats prefix;
};

AlignedOutcome run_aligned(bool caching, int32_t page_size, bool seeded) {
  EngineSetup s;
  s.caching = caching;
  s.page_size = page_size;
  s.max_batched_tokens = 20;  // the prefix: 5 pages of 4, or 4 of 5
  std::unique_ptr<Engine> engine = make_engine(s);
  const std::vector<int32_t> system = tokens(20, 1);
  AlignedOutcome o;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = system;
    const std::vector<int32_t> user = tokens(1 + 5 * i, 10 + i);  // 1 .. 26 tokens: chunked too
    prompt.insert(prompt.end(), user.begin(), user.end());
    Result r;
    run_one(*engine, prompt, params(seeded, 5 + i, 100 + i), &r);
    o.results.push_back(r);
  }
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  o.stats = engine->stats();
  o.prefix = engine->prefix_cache_stats();
  return o;
}

void expect_bitwise_on_equals_off(int32_t page_size, bool seeded) {
  const AlignedOutcome off = run_aligned(false, page_size, seeded);
  const AlignedOutcome on = run_aligned(true, page_size, seeded);
  ASSERT_EQ(on.results.size(), off.results.size());
  for (size_t i = 0; i < on.results.size(); ++i) {
    EXPECT_EQ(on.results[i].output, off.results[i].output) << "request " << i;
    EXPECT_EQ(on.results[i].logprobs, off.results[i].logprobs) << "request " << i;  // bits
  }
  EXPECT_EQ(off.prefix.hit_tokens, 0);
  EXPECT_EQ(off.prefix.queried_tokens, 0);
  EXPECT_EQ(on.prefix.hit_tokens, 5 * 20);  // every request after the first skips the prefix
  EXPECT_EQ(on.stats.prefill_tokens + on.prefix.hit_tokens, off.stats.prefill_tokens);
  EXPECT_EQ(on.stats.decode_tokens, off.stats.decode_tokens);
}

TEST(PrefixCacheEngine, GreedyOutputsAreBitwiseTheSameWithTheCacheOnAndOff) {
  expect_bitwise_on_equals_off(/*page_size=*/4, /*seeded=*/false);
}

TEST(PrefixCacheEngine, SeededOutputsAreBitwiseTheSameWithTheCacheOnAndOff) {
  expect_bitwise_on_equals_off(/*page_size=*/4, /*seeded=*/true);
}

TEST(PrefixCacheEngine, OddPageSizeOutputsAreBitwiseTheSame) {
  expect_bitwise_on_equals_off(/*page_size=*/5, /*seeded=*/true);
}

/// Waves of concurrent requests sharing prefixes (a system prompt, then per-user
/// histories); a wave is added after the previous one finished, so that later waves hit
/// what earlier ones cached, and a budget that admits a whole wave in one step keeps the
/// same sequences in every step with the cache or without (only prefill rows go). The
/// row counts differ, so the values are compared to a tolerance and the tokens exactly.
struct WaveOutcome {
  std::vector<Result> results;
  EngineStats stats;
  PrefixCacheStats prefix;
};

WaveOutcome run_waves(bool caching, bool seeded) {
  EngineSetup s;
  s.caching = caching;
  s.max_batched_tokens = 512;
  std::unique_ptr<Engine> engine = make_engine(s);
  const std::vector<int32_t> system = tokens(26, 1);
  WaveOutcome o;
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 5; ++i) {
      std::vector<int32_t> prompt = system;
      const std::vector<int32_t> user = tokens(3 + 4 * i, 10 + i);  // same per i across waves
      prompt.insert(prompt.end(), user.begin(), user.end());
      const std::vector<int32_t> turn = tokens(1 + wave * 5, 50 + wave);
      prompt.insert(prompt.end(), turn.begin(), turn.end());
      ids.push_back(engine->add_request(prompt, params(seeded, 6 + i, 100 + 10 * wave + i)));
    }
    step_until_done(*engine);
    for (int64_t id : ids) o.results.push_back(result_of(engine->request(id)));
  }
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  o.stats = engine->stats();
  o.prefix = engine->prefix_cache_stats();
  return o;
}

TEST(PrefixCacheEngine, ConcurrentWavesSharingPrefixesGiveTheSameOutputs) {
  for (bool seeded : {false, true}) {
    const WaveOutcome off = run_waves(false, seeded);
    const WaveOutcome on = run_waves(true, seeded);
    ASSERT_EQ(on.results.size(), off.results.size());
    for (size_t i = 0; i < on.results.size(); ++i) {
      expect_close(on.results[i], off.results[i], "request " + std::to_string(i));
    }
    // Waves 2 and 3 find the system prompt and each user's history of the wave before.
    EXPECT_GT(on.prefix.hit_tokens, 10 * 24);
    EXPECT_EQ(on.stats.prefill_tokens + on.prefix.hit_tokens, off.stats.prefill_tokens);
    EXPECT_EQ(on.stats.steps, off.stats.steps);
  }
}

TEST(PrefixCacheEngine, SecondRequestSharingALongPrefixComputesOnlyTheRest) {
  // The budget equals the hit (below), so that without the cache the second prompt's
  // first chunk is exactly the first prompt's: bits compare (see run_aligned).
  EngineSetup with;
  with.max_batched_tokens = 48;
  std::unique_ptr<Engine> engine = make_engine(with);
  const std::vector<int32_t> first = tokens(61, 3);
  run_one(*engine, first, params(false, 4));
  const int64_t prefill_before = engine->stats().prefill_tokens;
  EXPECT_EQ(prefill_before, 61);

  std::vector<int32_t> second(first.begin(), first.begin() + 50);  // 12 full pages + 2
  const std::vector<int32_t> rest = tokens(9, 40);
  second.insert(second.end(), rest.begin(), rest.end());
  Result with_cache;
  run_one(*engine, second, params(false, 4), &with_cache);
  EXPECT_EQ(engine->stats().prefill_tokens - prefill_before, 59 - 48);
  const PrefixCacheStats stats = engine->prefix_cache_stats();
  EXPECT_EQ(stats.hit_tokens, 48);
  EXPECT_EQ(stats.queried_tokens, 60 + 58);
  EXPECT_NEAR(stats.hit_rate(), 48.0 / 118.0, 1e-12);
  EXPECT_GT(stats.cached_pages, 0);
  EXPECT_EQ(stats.cached_free_pages, stats.cached_pages);  // idle: nobody holds them
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());

  EngineSetup without = with;
  without.caching = false;
  std::unique_ptr<Engine> plain = make_engine(without);
  Result without_cache;
  run_one(*plain, second, params(false, 4), &without_cache);
  EXPECT_EQ(with_cache, without_cache);
}

TEST(PrefixCacheEngine, EntirelyCachedPromptStillProducesItsFirstTokenCorrectly) {
  for (int32_t len : {40, 41}) {  // a multiple of the page size and one past it
    // Everything but the last token's page (40) or the last token (41) is found cached.
    const int32_t hit = len == 40 ? 36 : 40;
    EngineSetup s;
    s.max_batched_tokens = hit;  // the first run's first chunk is exactly the hit
    std::unique_ptr<Engine> engine = make_engine(s);
    const std::vector<int32_t> prompt = tokens(len, 5);
    Result first, again;
    run_one(*engine, prompt, params(false, 5), &first);
    const int64_t prefill_before = engine->stats().prefill_tokens;
    run_one(*engine, prompt, params(false, 5), &again);
    EXPECT_EQ(engine->stats().prefill_tokens - prefill_before, len - hit) << "prompt of " << len;
    EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, hit);
    EXPECT_EQ(again, first) << "prompt of " << len;
    EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  }
}

TEST(PrefixCacheEngine, TwoIdenticalPromptsInOneStepStayCorrect) {
  // Both compute the same pages in the same step; one copy is registered, the other freed.
  std::unique_ptr<Engine> engine = make_engine(EngineSetup{});
  const std::vector<int32_t> prompt = tokens(30, 8);
  const int64_t a = engine->add_request(prompt, params(false, 6));
  const int64_t b = engine->add_request(prompt, params(false, 6));
  step_until_done(*engine);
  expect_close(result_of(engine->request(a)), result_of(engine->request(b)), "a and b");
  EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, 0);
  EXPECT_EQ(engine->prefix_cache_stats().cached_pages, 8);  // 35 computed tokens, once
  Result third;
  run_one(*engine, prompt, params(false, 6), &third);
  EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, 28);
  expect_close(third, result_of(engine->request(a)), "a and a later copy");
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

struct PreemptionOutcome {
  std::vector<Result> results;
  EngineStats stats;
  PrefixCacheStats prefix;
};

PreemptionOutcome run_with_preemption(bool caching) {
  EngineSetup s;
  s.caching = caching;
  s.num_pages = 30;  // 29 usable pages of 4 tokens: 6 requests cannot all grow at once
  s.max_num_seqs = 6;
  // A budget that recomputes a resumed request in one step with the cache or without, so
  // that both runs schedule the same sequences in every step (page accounting is the
  // same: attached cached pages stand for the pages the recompute would allocate).
  s.max_batched_tokens = 512;
  std::unique_ptr<Engine> engine = make_engine(s);
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    // Distinct prompts: every hit comes from a preempted request resuming.
    ids.push_back(engine->add_request(tokens(10 + 3 * i, 60 + i), params(true, 24, 7 + i)));
  }
  step_until_done(*engine);
  PreemptionOutcome o;
  for (int64_t id : ids) o.results.push_back(result_of(engine->request(id)));
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  o.stats = engine->stats();
  o.prefix = engine->prefix_cache_stats();
  return o;
}

TEST(PrefixCacheEngine, PreemptedRequestsResumeFromTheirCachedPages) {
  const PreemptionOutcome off = run_with_preemption(false);
  const PreemptionOutcome on = run_with_preemption(true);
  EXPECT_GT(off.stats.preemptions, 0);
  EXPECT_GT(on.stats.preemptions, 0);
  EXPECT_GT(on.prefix.hit_tokens, 0);
  EXPECT_EQ(off.prefix.hit_tokens, 0);
  ASSERT_EQ(on.results.size(), off.results.size());
  // A resumed request computes fewer rows with the cache (another batch composition):
  // tokens exactly, values to a tolerance.
  for (size_t i = 0; i < on.results.size(); ++i) {
    expect_close(on.results[i], off.results[i], "request " + std::to_string(i));
  }
  EXPECT_EQ(on.stats.steps, off.stats.steps);  // the same steps, fewer prefill rows
}

TEST(PrefixCacheEngine, WeightsVersionBumpMakesOldPagesUnmatchable) {
  std::unique_ptr<Engine> engine = make_engine(EngineSetup{});
  const std::vector<int32_t> prompt = tokens(33, 9);
  run_one(*engine, prompt, params(false, 3));
  engine->bump_weights_version();
  const int64_t prefill_before = engine->stats().prefill_tokens;
  run_one(*engine, prompt, params(false, 3));
  EXPECT_EQ(engine->stats().prefill_tokens - prefill_before, 33);
  EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, 0);
  // Pages cached under the new version match again.
  run_one(*engine, prompt, params(false, 3));
  EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, 32);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

TEST(PrefixCacheEngine, ResetFreesEveryCachedPageAndForgetsThem) {
  std::unique_ptr<Engine> engine = make_engine(EngineSetup{});
  const std::vector<int32_t> prompt = tokens(33, 11);
  run_one(*engine, prompt, params(false, 3));
  EXPECT_GT(engine->prefix_cache_stats().cached_free_pages, 0);
  engine->reset_prefix_cache();
  engine->check_invariants();
  EXPECT_EQ(engine->prefix_cache_stats().cached_pages, 0);
  EXPECT_EQ(engine->allocator().num_cached_free(), 0);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  const int64_t prefill_before = engine->stats().prefill_tokens;
  run_one(*engine, prompt, params(false, 3));
  EXPECT_EQ(engine->stats().prefill_tokens - prefill_before, 33);
  EXPECT_EQ(engine->prefix_cache_stats().hit_tokens, 0);
}

TEST(PrefixCacheEngine, ResetWhileRequestsRunLeavesThemCorrect) {
  EngineSetup off;
  off.caching = false;
  std::unique_ptr<Engine> plain = make_engine(off);
  std::unique_ptr<Engine> engine = make_engine(EngineSetup{});
  const std::vector<int32_t> prompt = tokens(21, 13);
  Result expected;
  run_one(*plain, prompt, params(true, 12, 5), &expected);
  const int64_t id = engine->add_request(prompt, params(true, 12, 5));
  for (int i = 0; i < 4; ++i) {
    engine->step();
    engine->check_invariants();
  }
  engine->reset_prefix_cache();
  engine->check_invariants();
  step_until_done(*engine);
  EXPECT_EQ(result_of(engine->request(id)), expected);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

TEST(PrefixCacheEngine, CachedPagesAreEvictedForNewWorkInsteadOfRejectingIt) {
  EngineSetup s;
  s.num_pages = 20;  // 19 usable pages
  std::unique_ptr<Engine> engine = make_engine(s);
  // Fill the cache with unrelated prompts, then run requests that need most of the pool.
  for (int i = 0; i < 4; ++i) run_one(*engine, tokens(24, 20 + i), params(false, 2));
  EXPECT_GT(engine->prefix_cache_stats().cached_free_pages, 0);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  const int64_t evictions = engine->prefix_cache_stats().evictions;
  // 36 + 11 and 16 + 7 cached tokens at most: 12 + 6 of the 19 pages.
  const int64_t a = engine->add_request(tokens(36, 90), params(false, 12));
  const int64_t b = engine->add_request(tokens(16, 91), params(false, 8));
  step_until_done(*engine);
  EXPECT_EQ(engine->request(a).finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine->request(b).finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine->stats().preemptions, 0);  // cached pages are never a reason to preempt
  EXPECT_GT(engine->prefix_cache_stats().evictions, evictions);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

}  // namespace
}  // namespace pagellm
