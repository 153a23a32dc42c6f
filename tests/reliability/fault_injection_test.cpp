// Fault injection into the engine (issue 21): KV pages that cannot be had at a chosen step,
// device allocations that fail while the engine starts, and requests aborted at every point
// of their life; the page shortages and the aborts also with pipelined decode. In each, the
// scheduler's invariants are checked after every step, every page comes back, nothing
// hangs, and the requests the fault did not touch produce the tokens they produce without
// it (greedy and seeded sampling, so any difference is real).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

constexpr int kRequests = 6;
constexpr int kMaxSteps = 2000;  // a run that needs more is a livelock

struct Pool {
  int64_t num_pages = 200;     // 4-token pages; small values force preemption
  int32_t max_batched_tokens = 16;  // prompts up to 47 tokens: chunked prefill
  int32_t max_num_seqs = 4;    // fewer than the requests: some wait in the queue
  int32_t pipelined_decode_steps = 1;  // > 1: decode steps launched ahead (docs/design.md)
};

const Qwen3Config& config() {
  static const Qwen3Config c = testing::small_config(false);
  return c;
}
const testing::HostWeights& weights() {
  static const testing::HostWeights w = testing::random_weights(config(), 2121);
  return w;
}

EngineConfig engine_config(const Pool& s) {
  EngineConfig ec;
  ec.page_size = 4;
  ec.num_pages = s.num_pages;
  ec.max_num_seqs = s.max_num_seqs;
  ec.max_num_batched_tokens = s.max_batched_tokens;
  ec.max_model_len = 96;
  ec.pipelined_decode_steps = s.pipelined_decode_steps;
  return ec;
}

std::unique_ptr<Engine> make_engine(const Pool& s) {
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, config(), weights().lookup());
  return std::make_unique<Engine>(std::move(backend), std::move(model), engine_config(s));
}

/// Adds the workload: prompts of 3..47 tokens; even requests greedy, odd ones seeded.
std::vector<int64_t> add_requests(Engine& engine) {
  std::vector<int64_t> ids;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 9 * i; ++j) prompt.push_back((j * 17 + i * 31) % 90 + 1);
    SamplingParams sp;
    sp.max_tokens = 8 + 3 * i;
    sp.ignore_eos = true;
    if (i % 2 == 0) {
      sp.temperature = 0.0f;
    } else {
      sp.temperature = 0.8f;
      sp.top_k = 30;
      sp.seed = 700 + i;
    }
    ids.push_back(engine.add_request(prompt, sp));
  }
  return ids;
}

/// One step, then the scheduler's and the KV cache's invariants.
void step_checked(Engine& engine, int* steps) {
  engine.step();
  engine.check_invariants();
  ++*steps;
  ASSERT_LT(*steps, kMaxSteps) << "the engine does not finish (livelock?)";
}

void expect_all_pages_back(const Engine& engine) {
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable())
      << "KV pages leaked";
  EXPECT_EQ(engine.allocator().num_referenced(), 0);
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> reasons;
  int steps = 0;
  int64_t preemptions = 0;
};

Outcome collect(const Engine& engine, const std::vector<int64_t>& ids, int steps) {
  Outcome o;
  for (int64_t id : ids) {
    o.tokens.push_back(engine.request(id).output);
    o.reasons.push_back(engine.request(id).finish_reason);
  }
  o.steps = steps;
  o.preemptions = engine.stats().preemptions;
  return o;
}

const Outcome& baseline() {
  static const Outcome o = [] {
    auto engine = make_engine(Pool{});
    const std::vector<int64_t> ids = add_requests(*engine);
    int steps = 0;
    while (engine->has_unfinished()) step_checked(*engine, &steps);
    return collect(*engine, ids, steps);
  }();
  return o;
}

int count_running(const Engine& engine, const std::vector<int64_t>& ids) {
  int n = 0;
  for (int64_t id : ids) n += engine.request(id).status == SequenceStatus::kRunning;
  return n;
}

TEST(FaultInjection, BaselineRunsEveryRequestToItsLength) {
  const Outcome& b = baseline();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(b.reasons[i], FinishReason::kLength);
    EXPECT_EQ(b.tokens[i].size(), static_cast<size_t>(8 + 3 * i));
  }
  EXPECT_EQ(b.preemptions, 0) << "the baseline has pages for everyone";
}

// At each step in turn, every free page is withheld for that one step: whoever needs a new
// page then finds none, and the scheduler must preempt (the newest first), recompute it
// later, and end with the same tokens. Steps with fewer than two requests running are
// skipped here (a lone request has nobody to preempt; the next test covers it).
void pages_withheld_at_any_step(const Pool& pool) {
  const Outcome& b = baseline();
  int64_t preemptions = 0, pipelined = 0;
  int faulted_steps = 0;
  for (int k = 1; k < b.steps; ++k) {
    SCOPED_TRACE("pages withheld during step " + std::to_string(k));
    auto engine = make_engine(pool);
    const std::vector<int64_t> ids = add_requests(*engine);
    int steps = 0;
    while (engine->has_unfinished()) {
      const bool fault = steps + 1 == k && count_running(*engine, ids) >= 2;
      if (fault) {
        engine->withhold_pages_for_testing(engine->allocator().num_free());
        ++faulted_steps;
      }
      step_checked(*engine, &steps);
      if (fault) engine->withhold_pages_for_testing(0);
    }
    const Outcome o = collect(*engine, ids, steps);
    EXPECT_EQ(o.tokens, b.tokens);
    EXPECT_EQ(o.reasons, b.reasons);
    expect_all_pages_back(*engine);
    preemptions += o.preemptions;
    pipelined += engine->stats().pipelined_steps;
  }
  EXPECT_EQ(pipelined > 0, pool.pipelined_decode_steps > 1);
  EXPECT_GT(faulted_steps, 10);
  EXPECT_GT(preemptions, 5) << "withholding pages should have forced preemptions";
}

TEST(FaultInjection, PagesWithheldAtAnyStepPreemptAndRecomputeToTheSameTokens) {
  pages_withheld_at_any_step(Pool{});
}

// The same with pipelined decode: a step planned ahead finds no page and the run ends;
// the next full schedule preempts as without it.
TEST(FaultInjection, PagesWithheldAtAnyPipelinedStepGiveTheSameTokens) {
  Pool pool;
  pool.pipelined_decode_steps = 4;
  pages_withheld_at_any_step(pool);
}

// A long fault: pages withheld for several steps while the pool is already small, so that
// requests are preempted repeatedly (and preempted again while recomputing).
TEST(FaultInjection, RepeatedShortagesInASmallPoolStillGiveTheSameTokens) {
  const Outcome& b = baseline();
  Pool small;
  small.num_pages = 40;  // 39 usable pages for requests of up to 72 tokens (18 pages)
  for (int start : {2, 5, 9, 14}) {
    SCOPED_TRACE("pages withheld from step " + std::to_string(start));
    auto engine = make_engine(small);
    const std::vector<int64_t> ids = add_requests(*engine);
    int steps = 0;
    while (engine->has_unfinished()) {
      // Half of the free pages for 6 steps, only while at least two requests run.
      const bool fault = steps + 1 >= start && steps + 1 < start + 6 &&
                         count_running(*engine, ids) >= 2;
      engine->withhold_pages_for_testing(fault ? engine->allocator().num_free() / 2 + 1 : 0);
      step_checked(*engine, &steps);
    }
    engine->withhold_pages_for_testing(0);
    const Outcome o = collect(*engine, ids, steps);
    EXPECT_EQ(o.tokens, b.tokens);
    EXPECT_EQ(o.reasons, b.reasons);
    EXPECT_GT(o.preemptions, 0);
    expect_all_pages_back(*engine);
  }
}

// A lone request that needs a page when none can be had has nobody to preempt: it ends at
// once with a clear error instead of spinning, and gives its pages back; the engine then
// serves the next request normally.
TEST(FaultInjection, ALoneRequestShortOfPagesFailsClearlyAndTheEngineGoesOn) {
  auto engine = make_engine(Pool{});
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  const int64_t id = engine->add_request({5, 6, 7}, greedy);  // 3 tokens: page 1 fills at 4
  int steps = 0;
  step_checked(*engine, &steps);  // prefill, one page
  engine->withhold_pages_for_testing(engine->allocator().num_free());
  while (engine->has_unfinished()) step_checked(*engine, &steps);
  engine->withhold_pages_for_testing(0);
  const Sequence& seq = engine->request(id);
  EXPECT_EQ(seq.finish_reason, FinishReason::kError);
  EXPECT_NE(seq.error.find("KV-cache pages"), std::string::npos) << seq.error;
  EXPECT_EQ(seq.error.find('\n'), std::string::npos) << "one line: " << seq.error;
  EXPECT_LT(seq.output.size(), 12u);
  expect_all_pages_back(*engine);

  const int64_t next = engine->add_request({5, 6, 7}, greedy);
  while (engine->has_unfinished()) step_checked(*engine, &steps);
  EXPECT_EQ(engine->request(next).finish_reason, FinishReason::kLength);
  expect_all_pages_back(*engine);
}

// The points of a request's life at which it can be aborted.
enum class Point { kQueued, kMidPrefill, kDecoding, kPreempted };
const char* point_name(Point p) {
  switch (p) {
    case Point::kQueued: return "queued";
    case Point::kMidPrefill: return "mid-prefill-chunk";
    case Point::kDecoding: return "mid-decode";
    case Point::kPreempted: return "preempted";
  }
  return "?";
}

Point point_of(const Sequence& seq) {
  if (seq.status == SequenceStatus::kWaiting)
    return seq.num_preemptions > 0 ? Point::kPreempted : Point::kQueued;
  return seq.num_computed < static_cast<int32_t>(seq.prompt.size()) ? Point::kMidPrefill
                                                                     : Point::kDecoding;
}

// Every request is aborted after every number of steps (0: before the first), in a pool
// small enough that requests are also preempted. The aborted request gives its pages back
// at once; the others end with the tokens they have without the abort.
void abort_at_every_point(int32_t pipelined_decode_steps) {
  const Outcome& b = baseline();
  Pool small;
  small.num_pages = 30;  // preemption happens in this pool
  small.pipelined_decode_steps = pipelined_decode_steps;
  std::set<Point> seen;
  int64_t pipelined = 0;
  for (int victim = 0; victim < kRequests; ++victim) {
    for (int at = 0;; ++at) {
      SCOPED_TRACE("request " + std::to_string(victim) + " aborted after " +
                   std::to_string(at) + " steps");
      auto engine = make_engine(small);
      const std::vector<int64_t> ids = add_requests(*engine);
      int steps = 0;
      bool aborted = false;
      while (engine->has_unfinished()) {
        if (steps == at) {
          const Sequence& seq = engine->request(ids[victim]);
          if (!seq.finished()) {
            const Point p = point_of(seq);
            seen.insert(p);
            SCOPED_TRACE(point_name(p));
            const int32_t free_before = engine->allocator().num_free();
            const size_t held = seq.pages.size();
            engine->abort(ids[victim]);
            aborted = true;
            EXPECT_EQ(seq.finish_reason, FinishReason::kAborted);
            EXPECT_TRUE(seq.pages.empty());
            EXPECT_EQ(seq.slot, 0);
            EXPECT_EQ(engine->allocator().num_free(), free_before + static_cast<int32_t>(held))
                << "the aborted request's pages did not all come back";
            engine->check_invariants();
          }
        }
        step_checked(*engine, &steps);
      }
      const Outcome o = collect(*engine, ids, steps);
      pipelined += engine->stats().pipelined_steps;
      for (int i = 0; i < kRequests; ++i) {
        if (i == victim && aborted) continue;
        EXPECT_EQ(o.tokens[i], b.tokens[i]) << "request " << i;
        EXPECT_EQ(o.reasons[i], b.reasons[i]) << "request " << i;
      }
      if (aborted) {
        // Tokens already produced stay a prefix of the unaborted run's.
        const std::vector<int32_t>& got = o.tokens[victim];
        ASSERT_LE(got.size(), b.tokens[victim].size());
        EXPECT_TRUE(std::equal(got.begin(), got.end(), b.tokens[victim].begin()));
      }
      expect_all_pages_back(*engine);
      if (!aborted) break;  // the victim had finished before `at` steps
    }
  }
  for (Point p : {Point::kQueued, Point::kMidPrefill, Point::kDecoding, Point::kPreempted})
    EXPECT_TRUE(seen.count(p)) << "no abort happened while " << point_name(p);
  EXPECT_EQ(pipelined > 0, pipelined_decode_steps > 1);
}

TEST(FaultInjection, AbortAtEveryPointOfARequestsLifeReturnsItsPagesAndSparesTheOthers) {
  abort_at_every_point(1);
}

// With pipelined decode an engine step runs several decode steps, so the points between
// steps are fewer, but each abort still frees the request at once and spares the others.
TEST(FaultInjection, AbortBetweenPipelinedStepsReturnsItsPagesAndSparesTheOthers) {
  abort_at_every_point(4);
}

/// A CPU backend that counts the allocations alive, to prove that a failed start frees
/// everything it had allocated.
class CountingCpuBackend : public CpuBackend {
 public:
  explicit CountingCpuBackend(int64_t* live, int64_t* calls) : live_(live), calls_(calls) {}
  void* allocate(size_t bytes) override {
    ++*calls_;
    void* p = CpuBackend::allocate(bytes);
    ++*live_;
    return p;
  }
  // The KV pools come through allocate_as (mappings of their own, for sleep).
  void* allocate_as(MemoryRole role, size_t bytes) override {
    if (role != MemoryRole::kKvCache) return allocate(bytes);
    ++*calls_;
    void* p = CpuBackend::allocate_as(role, bytes);
    ++*live_;
    return p;
  }
  void deallocate(void* ptr) override {
    if (ptr != nullptr) --*live_;
    CpuBackend::deallocate(ptr);
  }

 private:
  int64_t* live_;
  int64_t* calls_;
};

// The device (here host) memory runs out at each allocation of the start in turn: loading
// the weights, the KV pools, the workspaces. Each gives one Error naming the failure, and
// everything allocated before it is freed.
TEST(FaultInjection, AnAllocationFailingAtStartGivesOneClearErrorAndFreesEverything) {
  int64_t live = 0, calls = 0;
  {
    auto backend = std::make_unique<CountingCpuBackend>(&live, &calls);
    auto model = std::make_unique<Qwen3Model>(*backend, config(), weights().lookup());
    Engine engine(std::move(backend), std::move(model), engine_config(Pool{}));
    EXPECT_GT(live, 0);
  }
  EXPECT_EQ(live, 0);
  const int64_t total = calls;
  ASSERT_GT(total, 10) << "the start should allocate weights, KV pools and workspaces";
  for (int64_t n = 0; n < total; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of " + std::to_string(total) + " fails");
    live = 0;
    calls = 0;
    int errors = 0;
    try {
      auto backend = std::make_unique<CountingCpuBackend>(&live, &calls);
      backend->fail_allocations_after_for_testing(n);
      auto model = std::make_unique<Qwen3Model>(*backend, config(), weights().lookup());
      Engine engine(std::move(backend), std::move(model), engine_config(Pool{}));
      ADD_FAILURE() << "the engine started although allocation " << n << " failed";
    } catch (const Error& e) {
      ++errors;
      const std::string what = e.what();
      EXPECT_NE(what.find("out of host memory"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
    EXPECT_EQ(errors, 1);
    EXPECT_EQ(calls, n + 1) << "the start went on allocating after a failure";
    EXPECT_EQ(live, 0) << "allocations leaked by the failed start";
  }
}

}  // namespace
}  // namespace pagellm
