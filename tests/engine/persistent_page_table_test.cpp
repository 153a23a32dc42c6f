// The persistent page table in the engine: the CPU backend keeps its own table and receives
// only the entries that changed; a CPU backend that says it has no persistent table gets
// dense rows. Both must give identical tokens and log-probabilities (greedy and seeded
// sampling, preemption, chunked prefill, aborts), and the persistent path must upload about
// one entry per sequence every page_size decode steps.
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

/// The CPU backend as a backend without a persistent page table would be driven.
class DenseCpuBackend : public CpuBackend {
 public:
  bool supports_persistent_page_table() const override { return false; }
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  std::vector<FinishReason> reasons;
  EngineStats stats;
};

struct Workload {
  int32_t page_size = 4;
  int64_t num_pages = 0;
  int32_t max_batched_tokens = 32;
  bool seeded = false;
  /// Request index to abort after that many steps (-1: none).
  int abort_index = -1;
  int abort_after_steps = 0;
};

/// The dense path either by the engine's switch (EngineConfig::persistent_page_table) or
/// because the backend keeps no table of its own.
enum class Path { kPersistent, kDenseBySwitch, kDenseByBackend };

Outcome run(Path path, const Workload& wl) {
  Qwen3Config c = testing::small_config(false);
  testing::HostWeights w = testing::random_weights(c, 4242);
  std::unique_ptr<Backend> backend;
  if (path == Path::kDenseByBackend) {
    backend = std::make_unique<DenseCpuBackend>();
  } else {
    backend = std::make_unique<CpuBackend>();
  }
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.persistent_page_table = path == Path::kPersistent;
  ec.page_size = wl.page_size;
  ec.num_pages = wl.num_pages;
  ec.max_num_seqs = 6;
  ec.max_num_batched_tokens = wl.max_batched_tokens;
  ec.max_model_len = 96;
  Engine engine(std::move(backend), std::move(model), ec);

  std::vector<int64_t> ids;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 2 + 9 * i; ++j) prompt.push_back((j * 13 + i * 29) % 96 + 1);
    SamplingParams sp;
    sp.max_tokens = 10 + 2 * i;
    sp.ignore_eos = true;
    if (wl.seeded) {
      sp.temperature = 0.9f;
      sp.top_k = 20;
      sp.seed = 100 + i;
    } else {
      sp.temperature = 0.0f;
    }
    sp.processed_logprobs = true;
    ids.push_back(engine.add_request(prompt, sp));
  }
  int steps = 0;
  while (engine.has_unfinished()) {
    engine.step();
    engine.check_invariants();
    if (++steps == wl.abort_after_steps && wl.abort_index >= 0) engine.abort(ids[wl.abort_index]);
    EXPECT_LT(steps, 5000);
  }
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable());
  Outcome o;
  for (int64_t id : ids) {
    const Sequence& s = engine.request(id);
    o.tokens.push_back(s.output);
    o.reasons.push_back(s.finish_reason);
    std::vector<float> lp;
    for (const SampledToken& t : s.sampled) {
      lp.push_back(t.logprob);
      lp.push_back(t.processed_logprob);
    }
    o.logprobs.push_back(lp);
  }
  o.stats = engine.stats();
  return o;
}

void expect_same(const Workload& wl, bool expect_preemption) {
  const Outcome dense = run(Path::kDenseByBackend, wl);
  const Outcome persistent = run(Path::kPersistent, wl);
  EXPECT_EQ(dense.tokens, persistent.tokens);
  EXPECT_EQ(dense.logprobs, persistent.logprobs);  // bit for bit: same pages, same sums
  EXPECT_EQ(dense.reasons, persistent.reasons);
  EXPECT_EQ(dense.stats.steps, persistent.stats.steps);
  EXPECT_EQ(dense.stats.preemptions, persistent.stats.preemptions);
  EXPECT_EQ(dense.stats.prefill_tokens, persistent.stats.prefill_tokens);
  if (expect_preemption) {
    EXPECT_GT(persistent.stats.preemptions, 0);
  } else {
    EXPECT_EQ(persistent.stats.preemptions, 0);
  }
  EXPECT_LT(persistent.stats.page_table_entries_uploaded,
            dense.stats.page_table_entries_uploaded / 4);
}

TEST(PersistentPageTable, EngineSwitchSendsDenseRowsLikeABackendWithoutATable) {
  Workload wl;
  wl.num_pages = 200;
  const Outcome by_switch = run(Path::kDenseBySwitch, wl);
  const Outcome by_backend = run(Path::kDenseByBackend, wl);
  const Outcome persistent = run(Path::kPersistent, wl);
  EXPECT_EQ(by_switch.tokens, persistent.tokens);
  EXPECT_EQ(by_switch.logprobs, persistent.logprobs);
  EXPECT_EQ(by_switch.stats.page_table_entries_uploaded,
            by_backend.stats.page_table_entries_uploaded);
  EXPECT_LT(persistent.stats.page_table_entries_uploaded,
            by_switch.stats.page_table_entries_uploaded / 4);
}

TEST(PersistentPageTable, GreedyWithChunkedPrefillMatchesDense) {
  Workload wl;
  wl.num_pages = 200;
  wl.max_batched_tokens = 16;  // prompts up to 65 tokens: chunked over several steps
  expect_same(wl, false);
}

TEST(PersistentPageTable, SeededWithPreemptionMatchesDense) {
  Workload wl;
  wl.num_pages = 30;  // 29 pages of 4 tokens for up to 6 sequences of up to 90: preemption
  wl.seeded = true;
  expect_same(wl, true);
}

TEST(PersistentPageTable, AbortsMatchDense) {
  Workload wl;
  wl.num_pages = 30;
  wl.page_size = 8;
  wl.abort_index = 2;
  wl.abort_after_steps = 4;
  const Outcome dense = run(Path::kDenseByBackend, wl);
  const Outcome persistent = run(Path::kPersistent, wl);
  EXPECT_EQ(persistent.reasons[2], FinishReason::kAborted);
  EXPECT_EQ(dense.tokens, persistent.tokens);
  EXPECT_EQ(dense.logprobs, persistent.logprobs);
  EXPECT_EQ(dense.reasons, persistent.reasons);
}

// Decode steps upload only the entries of sequences that crossed into a new page: with S
// sequences decoding D steps, at most S * ceil(D / page_size) + S entries (the + S for a
// page boundary at the first step), where the dense path uploads S rows each step.
TEST(PersistentPageTable, DecodeUploadsOnlyNewPages) {
  for (int32_t page_size : {1, 4, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    Qwen3Config c = testing::small_config(false);
    testing::HostWeights w = testing::random_weights(c, 7);
    auto backend = std::make_unique<CpuBackend>();
    auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
    EngineConfig ec;
    ec.page_size = page_size;
    ec.num_pages = 400;
    ec.max_num_seqs = 4;
    ec.max_num_batched_tokens = 256;
    ec.max_model_len = 128;
    Engine engine(std::move(backend), std::move(model), ec);
    const int32_t S = 4, decode_steps = 40;
    SamplingParams sp;
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = decode_steps + 1;
    for (int i = 0; i < S; ++i) {
      engine.add_request(std::vector<int32_t>(static_cast<size_t>(5 + 3 * i), 7 + i), sp);
    }
    engine.step();  // every prompt in one step, each samples its first token
    const int64_t after_prefill = engine.stats().page_table_entries_uploaded;
    // The prefill step sends each sequence's pages once.
    int64_t prompt_pages = 0;
    for (int i = 0; i < S; ++i) prompt_pages += (5 + 3 * i + page_size - 1) / page_size;
    EXPECT_EQ(after_prefill, prompt_pages);

    int64_t most_in_a_step = 0;
    for (int32_t d = 0; d < decode_steps; ++d) {
      const int64_t before = engine.stats().page_table_entries_uploaded;
      engine.step();
      const int64_t sent = engine.stats().page_table_entries_uploaded - before;
      most_in_a_step = std::max(most_in_a_step, sent);
      EXPECT_LE(sent, S);  // at most one new page per sequence per step
    }
    EXPECT_FALSE(engine.has_unfinished());  // the last step finished and zeroed every row
    const int64_t decoded = engine.stats().page_table_entries_uploaded - after_prefill;
    // New pages while decoding: positions 5+3i .. 5+3i+39 of sequence i; the last step's
    // zeroing happens after its upload and is sent with the next batch (none here).
    int64_t new_pages = 0;
    for (int i = 0; i < S; ++i) {
      const int32_t first = 5 + 3 * i, last = first + decode_steps - 1;
      new_pages += (last / page_size) - ((first - 1) / page_size);
    }
    EXPECT_EQ(decoded, new_pages);
    EXPECT_LE(decoded, int64_t{S} * ((decode_steps + page_size - 1) / page_size + 1));
    if (page_size > 1) {
      EXPECT_LT(decoded, int64_t{S} * decode_steps / 2);
    }
  }
}

}  // namespace
}  // namespace pagellm
