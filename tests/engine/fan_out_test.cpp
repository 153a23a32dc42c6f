// n-sample fan-out in the engine (CPU backend, a small random model): a group prefills its
// prompt once, its samples share the prompt's pages (copy-on-write of the partly filled last
// page), and sample j equals a single request with seed s + j. Also: the memory a group
// holds, admission by rows, aborts and preemption of group members, n above max_num_seqs.
// check_invariants runs after every step and every page is free at the end.
//
// Tolerance: tokens must be equal; log-probabilities equal to within float noise (1e-4),
// because the group's prefill and decode batches have other row counts than the single
// requests' and the CPU backend's matmul may round differently for different row counts.
#include <gtest/gtest.h>

#include <algorithm>
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
  int32_t page_size = 4;
  int64_t num_pages = 256;
  int32_t max_num_seqs = 8;
  int32_t max_batched_tokens = 64;
  int32_t max_model_len = 128;
};

std::unique_ptr<Engine> make_engine(const EngineSetup& s) {
  Qwen3Config c = testing::small_config(false);
  c.max_position_embeddings = 4096;
  testing::HostWeights w = testing::random_weights(c, 777);
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = s.page_size;
  ec.num_pages = s.num_pages;
  ec.max_num_seqs = s.max_num_seqs;
  ec.max_num_batched_tokens = s.max_batched_tokens;
  ec.max_model_len = s.max_model_len;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

std::vector<int32_t> prompt_of(int32_t length, int salt = 0) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 17 + salt * 31) % 95 + 1);
  return p;
}

SamplingParams seeded(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 30;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

/// Steps until nothing is unfinished, checking the bookkeeping after every step; returns
/// the peak of referenced pages. `each_step(step)` may abort requests.
template <class Fn>
int32_t run_all(Engine& engine, Fn each_step) {
  int32_t peak = 0;
  for (int step = 1; engine.has_unfinished(); ++step) {
    engine.step();
    engine.check_invariants();
    peak = std::max(peak, engine.allocator().num_referenced());
    each_step(step);
    if (step > 20000) {
      ADD_FAILURE() << "no end after 20000 steps";
      break;
    }
  }
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable()) << "pages leaked";
  return peak;
}

int32_t run_all(Engine& engine) {
  return run_all(engine, [](int) {});
}

void expect_same_sample(const Sequence& got, const Sequence& want, const std::string& what) {
  EXPECT_EQ(got.output, want.output) << what;
  ASSERT_EQ(got.sampled.size(), want.sampled.size()) << what;
  for (size_t k = 0; k < got.sampled.size(); ++k) {
    EXPECT_NEAR(got.sampled[k].logprob, want.sampled[k].logprob, 1e-4) << what << " token " << k;
  }
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
}

/// Sample j of the group against a single request with seed s + j (or the same greedy
/// params), all singles run together in a second engine.
void expect_group_equals_singles(const SamplingParams& params, int n, int32_t prompt_len) {
  const std::vector<int32_t> prompt = prompt_of(prompt_len);
  auto group_engine = make_engine(EngineSetup{});
  SamplingParams p = params;
  p.n = n;
  const std::vector<int64_t> ids = group_engine->add_request_group(prompt, p);
  ASSERT_EQ(ids.size(), static_cast<size_t>(n));
  for (int j = 1; j < n; ++j) EXPECT_EQ(ids[j], ids[0] + j);  // consecutive, sample 0 first
  run_all(*group_engine);

  auto single_engine = make_engine(EngineSetup{});
  std::vector<int64_t> singles;
  for (int j = 0; j < n; ++j) {
    SamplingParams one = params;
    if (params.seed) one.seed = *params.seed + j;
    singles.push_back(single_engine->add_request(prompt, one));
  }
  run_all(*single_engine);

  for (int j = 0; j < n; ++j) {
    expect_same_sample(group_engine->request(ids[j]), single_engine->request(singles[j]),
                       "sample " + std::to_string(j));
  }
  // The prompt was prefilled once; every other sample forked from sample 0, and each but
  // the last holder of the partly filled last page copied it once.
  const EngineStats& gs = group_engine->stats();
  EXPECT_EQ(gs.prefill_tokens, prompt_len);
  EXPECT_EQ(single_engine->stats().prefill_tokens, int64_t{prompt_len} * n);
  EXPECT_EQ(gs.forked_samples, n - 1);
  EXPECT_EQ(gs.cow_page_copies, prompt_len % 4 == 0 ? 0 : n - 1);
  EXPECT_EQ(single_engine->stats().forked_samples, 0);
}

TEST(FanOut, CpuCopyKvPagesCopiesEveryLayersKAndVInOrder) {
  CpuBackend cpu;
  const int64_t pages = 6, elems = 2 * 4 * 3;  // [6, 2 heads, page 4, dim 3]
  std::vector<DeviceBuffer> buffers;
  std::vector<LayerKv> kv(2);
  std::vector<std::vector<float>> want;
  float next = 0.0f;
  for (LayerKv& layer : kv) {
    for (Tensor* pool : {&layer.k, &layer.v}) {
      buffers.emplace_back(&cpu, static_cast<size_t>(pages * elems) * sizeof(float));
      *pool = buffers.back().tensor(DType::F32, {pages, 2, 4, 3});
      std::vector<float> values(static_cast<size_t>(pages * elems));
      for (float& v : values) v = next++;
      cpu.upload(*pool, 0, values.data(), DType::F32, pool->numel());
      want.push_back(values);
    }
  }
  // 1 -> 4, then 4 -> 5 reads the page just written; 2 -> 3.
  const std::vector<std::pair<int32_t, int32_t>> pairs = {{1, 4}, {4, 5}, {2, 3}};
  for (std::vector<float>& pool : want) {
    for (const auto& [src, dst] : pairs) {
      std::copy(pool.begin() + src * elems, pool.begin() + (src + 1) * elems,
                pool.begin() + dst * elems);
    }
  }
  cpu.copy_kv_pages(kv, pairs);
  size_t i = 0;
  for (LayerKv& layer : kv) {
    EXPECT_EQ(cpu.download_f32(layer.k), want[i++]);
    EXPECT_EQ(cpu.download_f32(layer.v), want[i++]);
  }
  try {
    cpu.copy_kv_pages(kv, {{1, 6}});
    ADD_FAILURE() << "page 6 of 6 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lie in 1..5"), std::string::npos) << e.what();
  }
}

TEST(FanOut, SeededSamplesEqualSingleRequestsWithSeedPlusJ) {
  expect_group_equals_singles(seeded(12, 100), 4, 10);  // 10 tokens: page 3 half full
  expect_group_equals_singles(seeded(9, 7), 3, 8);      // a full last page: no copy
}

TEST(FanOut, GreedySamplesEqualTheGreedySingleRequest) {
  expect_group_equals_singles(greedy(10), 3, 13);
}

TEST(FanOut, SamplesDifferAndUnseededOnesDeriveTheirSeedFromTheirOwnId) {
  auto engine = make_engine(EngineSetup{});
  SamplingParams p = seeded(10, 0);
  p.seed.reset();
  p.n = 3;
  const std::vector<int64_t> ids = engine->add_request_group(prompt_of(9), p);
  run_all(*engine);
  EXPECT_NE(engine->request(ids[0]).output, engine->request(ids[1]).output);
  EXPECT_NE(engine->request(ids[1]).output, engine->request(ids[2]).output);
  // Sample 2 equals a single unseeded request that gets sample 2's id in a fresh engine.
  auto other = make_engine(EngineSetup{});
  SamplingParams one = p;
  one.n = 1;
  for (int j = 0; j < 2; ++j) other->add_request({1}, greedy(1));  // use up ids 1, 2
  const int64_t id = other->add_request(prompt_of(9), one);
  ASSERT_EQ(id, ids[2]);
  run_all(*other);
  expect_same_sample(engine->request(ids[2]), other->request(id), "sample 2");
}

/// Steps until done; the peak of referenced pages inside a step: the logits hook runs after
/// the forward, when the step's pages are all allocated and before finished requests free
/// theirs.
int32_t peak_pages_in_steps(Engine& engine) {
  int32_t peak = 0;
  engine.set_logits_hook([&](int64_t, int64_t, const float*, int64_t) {
    peak = std::max(peak, engine.allocator().num_referenced());
  });
  return std::max(peak, run_all(engine));
}

TEST(FanOut, EightSamplesOfA1024TokenPromptHoldItsPagesOnce) {
  EngineSetup s;
  s.page_size = 16;
  s.num_pages = 700;
  s.max_num_seqs = 8;
  s.max_batched_tokens = 8 * 1030;  // the separate requests all prefill in one step
  s.max_model_len = 1200;
  // 10 tokens: 9 are fed back, at positions 1024..1032 or 1030..1038, all in block 64.
  const int n = 8, max_tokens = 10;
  for (int32_t prompt_len : {1024, 1030}) {
    const int32_t prompt_pages = (prompt_len + 15) / 16;
    auto group_engine = make_engine(s);
    SamplingParams p = seeded(max_tokens, 5);
    p.n = n;
    group_engine->add_request_group(prompt_of(prompt_len), p);
    const int32_t group_peak = peak_pages_in_steps(*group_engine);

    auto separate_engine = make_engine(s);
    for (int j = 0; j < n; ++j) separate_engine->add_request(prompt_of(prompt_len), seeded(max_tokens, 5 + j));
    const int32_t separate_peak = peak_pages_in_steps(*separate_engine);

    // The prompt's pages once, plus one page per sample: its own copy of the partly filled
    // last page (1030), or the page its decodes open (1024).
    EXPECT_LE(group_peak, prompt_pages + n) << prompt_len;
    EXPECT_GE(separate_peak, n * prompt_pages) << prompt_len;
    EXPECT_LE(static_cast<double>(group_peak) / separate_peak, 1.0 / n + 0.02)
        << prompt_len << ": group " << group_peak << " pages, separate " << separate_peak;
    EXPECT_EQ(group_engine->stats().forked_samples, n - 1);
    EXPECT_EQ(group_engine->stats().cow_page_copies, prompt_len % 16 == 0 ? 0 : n - 1);
  }
}

TEST(FanOut, AGroupWaitsForRowsForAllItsSamplesAndKeepsThemReserved) {
  EngineSetup s;
  s.max_num_seqs = 3;
  s.max_batched_tokens = 8;  // a 20-token prompt prefills over 3 steps
  auto engine = make_engine(s);
  const int64_t single = engine->add_request(prompt_of(5, 1), greedy(6));
  SamplingParams p = seeded(4, 11);
  p.n = 3;
  const std::vector<int64_t> group = engine->add_request_group(prompt_of(20), p);
  engine->step();
  engine->check_invariants();
  // One row in use by the single request: the group needs 3.
  EXPECT_EQ(engine->request(single).status, SequenceStatus::kRunning);
  EXPECT_EQ(engine->request(group[0]).status, SequenceStatus::kWaiting);
  while (!engine->request(single).finished()) {
    engine->step();
    engine->check_invariants();
  }
  engine->step();  // the group's sample 0 starts its prefill
  engine->check_invariants();
  ASSERT_EQ(engine->request(group[0]).status, SequenceStatus::kRunning);
  ASSERT_TRUE(engine->request(group[0]).output.empty());
  // A request arriving mid-prefill may not take the rows reserved for the fan-out.
  const int64_t late = engine->add_request(prompt_of(3, 2), greedy(2));
  engine->step();
  engine->check_invariants();
  EXPECT_EQ(engine->request(late).status, SequenceStatus::kWaiting);
  run_all(*engine);
  for (int64_t id : group) EXPECT_EQ(engine->request(id).output.size(), 4u);
  EXPECT_EQ(engine->request(late).finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine->stats().forked_samples, 2);
}

TEST(FanOut, NAboveMaxNumSeqsIsRejectedAndTheEngineKeepsServing) {
  EngineSetup s;
  s.max_num_seqs = 6;
  auto engine = make_engine(s);
  SamplingParams p = seeded(4, 1);
  p.n = 7;
  const std::vector<int64_t> ids = engine->add_request_group(prompt_of(5), p);
  ASSERT_EQ(ids.size(), 1u);
  const Sequence& rejected = engine->request(ids[0]);
  EXPECT_EQ(rejected.finish_reason, FinishReason::kError);
  EXPECT_NE(rejected.error.find("n = 7"), std::string::npos) << rejected.error;
  EXPECT_NE(rejected.error.find("max_num_seqs is 6"), std::string::npos) << rejected.error;
  EXPECT_FALSE(engine->has_unfinished());
  // Bad sampling parameters are rejected the same way, with one id.
  p.n = 3;
  p.top_p = 2.0f;
  const std::vector<int64_t> bad = engine->add_request_group(prompt_of(5), p);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(engine->request(bad[0]).error.find("top_p"), std::string::npos);
  // A prompt the scheduler rejects finishes every sample with the reason.
  p = seeded(4, 1);
  p.n = 2;
  const std::vector<int64_t> too_long = engine->add_request_group(prompt_of(200), p);
  ASSERT_EQ(too_long.size(), 2u);
  for (int64_t id : too_long) {
    EXPECT_NE(engine->request(id).error.find("max_model_len"), std::string::npos);
  }
  p.n = 6;  // exactly the limit runs
  const std::vector<int64_t> ok = engine->add_request_group(prompt_of(5), p);
  run_all(*engine);
  for (int64_t id : ok) EXPECT_EQ(engine->request(id).finish_reason, FinishReason::kLength);
}

/// A group of 4 with seed 50 whose sample `abort_index` is aborted after `abort_after`
/// steps; the other samples must equal the run without the abort.
void expect_abort_keeps_the_others(int abort_index, int abort_after, const EngineSetup& s) {
  const std::vector<int32_t> prompt = prompt_of(14);
  SamplingParams p = seeded(10, 50);
  p.n = 4;
  auto reference = make_engine(s);
  const std::vector<int64_t> want = reference->add_request_group(prompt, p);
  run_all(*reference);

  auto engine = make_engine(s);
  const std::vector<int64_t> ids = engine->add_request_group(prompt, p);
  if (abort_after == 0) engine->abort(ids[abort_index]);
  run_all(*engine, [&](int step) {
    if (step == abort_after) engine->abort(ids[abort_index]);
  });
  EXPECT_EQ(engine->request(ids[abort_index]).finish_reason, FinishReason::kAborted);
  for (int j = 0; j < 4; ++j) {
    if (j == abort_index) continue;
    expect_same_sample(engine->request(ids[j]), reference->request(want[j]),
                       "sample " + std::to_string(j) + " with sample " +
                           std::to_string(abort_index) + " aborted after step " +
                           std::to_string(abort_after));
  }
}

TEST(FanOut, AbortingSampleZeroBeforeTheFanOutPromotesTheNextSample) {
  EngineSetup s;
  s.max_num_seqs = 4;
  s.max_batched_tokens = 6;  // 14 prompt tokens: prefill over 3 steps
  expect_abort_keeps_the_others(0, 0, s);  // still waiting
  expect_abort_keeps_the_others(0, 1, s);  // mid-prefill
  expect_abort_keeps_the_others(0, 2, s);
  expect_abort_keeps_the_others(0, 5, s);  // after the fan-out: an ordinary sample
}

TEST(FanOut, AbortingAWaitingOrForkedSampleLeavesTheOthers) {
  EngineSetup s;
  s.max_num_seqs = 4;
  s.max_batched_tokens = 6;
  expect_abort_keeps_the_others(2, 0, s);  // waiting for the fan-out
  expect_abort_keeps_the_others(3, 1, s);
  expect_abort_keeps_the_others(1, 4, s);  // forked, decoding
  expect_abort_keeps_the_others(3, 6, s);
}

TEST(FanOut, PreemptedSamplesRecomputeAndMatchTheUnpreemptedRun) {
  const std::vector<int32_t> prompt = prompt_of(22);
  SamplingParams p = seeded(30, 900);
  p.n = 4;
  auto roomy = make_engine(EngineSetup{});
  const std::vector<int64_t> want = roomy->add_request_group(prompt, p);
  run_all(*roomy);
  EXPECT_EQ(roomy->stats().preemptions, 0);

  EngineSetup tight;
  tight.num_pages = 20;  // 19 usable: prompt 6 pages, each sample grows to 13 pages alone
  auto engine = make_engine(tight);
  const std::vector<int64_t> ids = engine->add_request_group(prompt, p);
  run_all(*engine);
  EXPECT_GT(engine->stats().preemptions, 0);
  for (int j = 0; j < 4; ++j) {
    expect_same_sample(engine->request(ids[j]), roomy->request(want[j]),
                       "sample " + std::to_string(j));
  }
}

TEST(FanOut, CopiedPagesHoldTheSharedTokensForEveryLayer) {
  // The first decode of each sample attends over the copied page: if copy_kv_pages missed
  // a layer, K or V, the samples' logits would differ from the single requests'. Checked
  // directly here through the logits hook: sample j's second-token logits equal those of a
  // single request with the same first token history.
  const std::vector<int32_t> prompt = prompt_of(11);
  SamplingParams p = seeded(3, 40);
  p.n = 3;
  std::vector<std::vector<float>> group_logits, single_logits;
  auto group_engine = make_engine(EngineSetup{});
  group_engine->set_logits_hook([&](int64_t, int64_t index, const float* l, int64_t v) {
    if (index == 1) group_logits.emplace_back(l, l + v);
  });
  group_engine->add_request_group(prompt, p);
  run_all(*group_engine);
  auto single_engine = make_engine(EngineSetup{});
  single_engine->set_logits_hook([&](int64_t, int64_t index, const float* l, int64_t v) {
    if (index == 1) single_logits.emplace_back(l, l + v);
  });
  for (int j = 0; j < 3; ++j) single_engine->add_request(prompt, seeded(3, 40 + j));
  run_all(*single_engine);
  ASSERT_EQ(group_logits.size(), 3u);
  ASSERT_EQ(single_logits.size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    for (size_t t = 0; t < group_logits[j].size(); ++t) {
      ASSERT_NEAR(group_logits[j][t], single_logits[j][t], 1e-4) << "sample " << j << " logit " << t;
    }
  }
  EXPECT_EQ(group_engine->stats().cow_page_copies, 2);
}

}  // namespace
}  // namespace pagellm
