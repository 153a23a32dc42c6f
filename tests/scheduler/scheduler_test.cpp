// Deterministic simulations of the continuous-batching scheduler. Each table row is the
// state after one step: scheduled ("id:n", '*' when the sequence samples), preempted,
// finished, running and waiting ids, and free pages. Invariants (page ownership, page
// table rows, budget) and the mocked model's KV read-back are checked after every step.
#include "pagellm/engine/scheduler.h"

#include <gtest/gtest.h>

#include <string>

#include "pagellm/common/check.h"
#include "scheduler/sim.h"
#include "common/expect_error.h"

namespace pagellm {
namespace {

using testing::Draws;
using testing::Expect;
using testing::Request;
using testing::Sim;
using testing::small_config;

using testing::expect_error;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Admission while the budget allows, a prompt split at the budget, a late arrival that
// waits for budget, and retirement by max_tokens.
TEST(Scheduler, AdmissionTokenBudgetAndChunkedPrefill) {
  Sim sim(small_config(4, 8), 33);  // 32 usable pages of 4 tokens
  sim.run_table(
      {{1, {{1, 5, 3}, {2, 10, 2}}}, {2, {{3, 3, 2}}}},
      {
          // 1 takes 5 of 8 tokens (2 pages), 2 gets the other 3 (1 page): a chunk.
          {"1:5* 2:3", "", "", "1 2", "", 29},
          // 1 decodes; 2 gets the remaining 7 = the rest of its prompt; no budget for 3.
          {"1:1* 2:7*", "", "", "1 2", "3", 27},
          // Both decode and reach max_tokens; 3 is admitted in the same step.
          {"1:1* 2:1* 3:3*", "", "1 2", "3", "", 31},
          {"3:1*", "", "3", "", "", 32},
      });
  EXPECT_EQ(sim.seq(1)->output, (std::vector<int32_t>{100, 101, 102}));
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{100, 101}));
  for (int64_t id : {1, 2, 3}) {
    EXPECT_EQ(sim.seq(id)->finish_reason, FinishReason::kLength);
    EXPECT_EQ(sim.seq(id)->sampled.size(), sim.seq(id)->output.size());
  }
  EXPECT_FLOAT_EQ(sim.seq(1)->sampled[2].logprob, -0.75f);
  EXPECT_FALSE(sim.scheduler().has_unfinished());
}

// A prompt longer than the budget runs in three chunks; a request arriving meanwhile is
// admitted in the step of the last chunk, with what is left of the budget.
TEST(Scheduler, LongPromptPrefillsAcrossSteps) {
  Sim sim(small_config(4, 8), 33);
  sim.run_table({{1, {{1, 20, 2}}}, {2, {{2, 2, 1}}}},
                {
                    {"1:8", "", "", "1", "", 30},
                    {"1:8", "", "", "1", "2", 28},
                    {"1:4* 2:2*", "", "2", "1", "", 27},
                    {"1:1*", "", "1", "", "", 32},
                });
  EXPECT_EQ(sim.seq(1)->num_computed, 21);
}

// busy_batched_tokens: a step that begins with more than busy_decode_rows sequences
// decoding gets the smaller budget (an offline engine's long chunk pays only where few
// decodes share the step); with fewer, or none, the whole max_num_batched_tokens.
TEST(Scheduler, BusyStepsTakeTheSmallerBudget) {
  SchedulerConfig c = small_config(4, 16);
  c.busy_batched_tokens = 6;
  c.busy_decode_rows = 1;
  Sim sim(c, 33);
  ASSERT_TRUE(sim.add({1, 3, 3}));
  ASSERT_TRUE(sim.add({2, 3, 3}));
  EXPECT_EQ(sim.step().scheduled, "1:3* 2:3*");  // nothing decodes: 16
  ASSERT_TRUE(sim.add({3, 20, 2}));
  EXPECT_EQ(sim.step().scheduled, "1:1* 2:1* 3:4");  // two decode: 6
  EXPECT_EQ(sim.step().scheduled, "1:1* 2:1* 3:4");  // 1 and 2 reach max_tokens
  EXPECT_EQ(sim.step().scheduled, "3:12*");          // 3 alone, prefilling: 16
  ASSERT_TRUE(sim.add({4, 30, 1}));
  EXPECT_EQ(sim.step().scheduled, "3:1* 4:15");  // one decodes (not more than 1): 16
  EXPECT_FALSE(sim.step().scheduled.empty());
  c.busy_batched_tokens = 17;
  KvCacheManager kv(33, 4, 5, 16);
  expect_error([&] { Scheduler s(c, kv); }, "busy_batched_tokens (17) must be 0 or in [4, 16]");
  c.busy_batched_tokens = 3;
  expect_error([&] { Scheduler s(c, kv); }, "busy_batched_tokens (3) must be 0 or in [4, 16]");
}

// max_num_seqs caps admission even when budget and pages are plentiful.
TEST(Scheduler, MaxNumSeqsLimitsAdmission) {
  Sim sim(small_config(2, 8), 33);
  sim.run_table({{1, {{1, 2, 2}, {2, 2, 2}, {3, 2, 2}}}},
                {
                    {"1:2* 2:2*", "", "", "1 2", "3", 30},
                    {"1:1* 2:1*", "", "1 2", "", "3", 32},
                    {"3:2*", "", "", "3", "", 31},
                    {"3:1*", "", "3", "", "", 32},
                });
}

// Free page-table rows cap admission too: one usable row means one sequence at a time.
TEST(Scheduler, PageTableRowsLimitAdmission) {
  Sim sim(small_config(4, 8), 33, /*max_slots=*/2);
  sim.run_table({{1, {{1, 2, 2}, {2, 2, 1}}}},
                {
                    {"1:2*", "", "", "1", "2", 31},
                    {"1:1*", "", "1", "", "2", 32},
                    {"2:2*", "", "2", "", "", 32},
                });
  EXPECT_EQ(sim.seq(2)->slot, 0);
}

// Two requests that each fit the 4-page pool but not together: when 1 needs its third
// page, the newest (2) is preempted, goes back ahead of the waiting 3, and later
// recomputes prompt + 5 outputs in one go.
TEST(Scheduler, PreemptsNewestAndRecomputes) {
  Sim sim(small_config(4, 16), 5);
  sim.run_table({{1, {{1, 4, 6}, {2, 4, 6}}}, {2, {{3, 2, 1}}}},
                {
                    {"1:4* 2:4*", "", "", "1 2", "", 2},
                    {"1:1* 2:1*", "", "", "1 2", "3", 0},
                    {"1:1* 2:1*", "", "", "1 2", "3", 0},
                    {"1:1* 2:1*", "", "", "1 2", "3", 0},
                    {"1:1* 2:1*", "", "", "1 2", "3", 0},
                    // 2's two pages go back; 1 takes one; no admission after a preemption.
                    {"1:1*", "2", "1", "", "2 3", 4},
                    {"2:9* 3:2*", "", "2 3", "", "", 4},
                });
  const std::vector<int32_t> expected = {100, 101, 102, 103, 104, 105};
  EXPECT_EQ(sim.seq(1)->output, expected);
  EXPECT_EQ(sim.seq(2)->output, expected);  // recompute reproduces the same tokens
  EXPECT_EQ(sim.seq(1)->num_preemptions, 0);
  EXPECT_EQ(sim.seq(2)->num_preemptions, 1);
  EXPECT_EQ(sim.seq(2)->sampled.size(), 6u);
}

// When the sequence that needs a page is itself the newest running one, it preempts itself
// and the older one keeps going.
TEST(Scheduler, NewestRunningPreemptsItself) {
  Sim sim(small_config(4, 16), 4);  // 3 usable pages
  sim.run_table({{1, {{1, 4, 4}, {2, 2, 8}}}},
                {
                    {"1:4* 2:2*", "", "", "1 2", "", 1},
                    {"1:1* 2:1*", "", "", "1 2", "", 0},
                    {"1:1* 2:1*", "", "", "1 2", "", 0},
                    {"1:1*", "2", "1", "", "2", 3},
                    {"2:5*", "", "", "2", "", 1},
                    {"2:1*", "", "", "2", "", 1},
                    {"2:1*", "", "", "2", "", 1},
                    {"2:1*", "", "", "2", "", 1},
                    {"2:1*", "", "2", "", "", 3},
                });
  EXPECT_EQ(sim.seq(2)->output.size(), 8u);
  EXPECT_EQ(sim.seq(2)->finish_reason, FinishReason::kLength);
}

// Every finish reason: EOS, EOS ignored, stop token, max_tokens, and max_model_len.
TEST(Scheduler, FinishesByEachReason) {
  SchedulerConfig c = small_config(8, 32);
  c.max_model_len = 12;  // 3 pages per sequence
  Sim sim(c, 33);
  Request eos{1, 3, 10, {7, 2}};
  Request ignore_eos{2, 3, 3, {2, 2, 2}};
  ignore_eos.ignore_eos = true;
  Request stop{3, 3, 10, {5, 9}, {9}};
  Request length{4, 3, 2};
  Request context{5, 10, 100};
  sim.run_table({{1, {eos, ignore_eos, stop, length, context}}},
                {
                    {"1:3* 2:3* 3:3* 4:3* 5:10*", "", "", "1 2 3 4 5", "", 25},
                    {"1:1* 2:1* 3:1* 4:1* 5:1*", "", "1 3 4 5", "2", "", 31},
                    {"2:1*", "", "2", "", "", 32},
                });
  EXPECT_EQ(sim.seq(1)->finish_reason, FinishReason::kEos);
  EXPECT_EQ(sim.seq(1)->output, (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(sim.seq(2)->finish_reason, FinishReason::kLength);
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(sim.seq(3)->finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(sim.seq(3)->output, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(sim.seq(4)->finish_reason, FinishReason::kLength);
  EXPECT_EQ(sim.seq(5)->finish_reason, FinishReason::kContextLimit);
  EXPECT_EQ(sim.seq(5)->num_tokens(), 12);
  for (int64_t id = 1; id <= 5; ++id) {
    EXPECT_TRUE(sim.seq(id)->finished());
    EXPECT_TRUE(sim.seq(id)->pages.empty());
    EXPECT_EQ(sim.seq(id)->slot, 0);
  }
}

// Requests that can never run are finished with kError at add() and never queued.
TEST(Scheduler, RejectsImpossibleRequestsAtAdd) {
  SchedulerConfig c = small_config(4, 16);
  c.max_model_len = 16;  // 4 pages per row
  Sim sim(c, 4);         // 3 usable pages
  struct Case {
    Request request;
    std::vector<std::string> message;
  };
  std::vector<Case> cases = {
      {{1, 0, 4}, {"request 1 has an empty prompt"}},
      {{2, 16, 4}, {"prompt of 16 tokens", "max_model_len is 16", "at most 15"}},
      {{3, 20, 4}, {"prompt of 20 tokens"}},
      {{4, 3, 0}, {"max_tokens = 0", "at least 1"}},
      // 15 + 1 tokens, 15 cached: 4 pages of 4 > 3 in the pool.
      {{5, 15, 1}, {"needs up to 4 KV-cache pages", "15 of them cached", "only 3 pages"}},
      // max_tokens is capped by max_model_len: 2 + 14 tokens, 15 cached: 4 pages.
      {{6, 2, 1000}, {"up to 14 generated tokens", "only 3 pages"}},
  };
  for (const Case& k : cases) {
    Sequence* s = sim.make(k.request);
    EXPECT_FALSE(sim.scheduler().add(s));
    EXPECT_EQ(s->status, SequenceStatus::kFinished);
    EXPECT_EQ(s->finish_reason, FinishReason::kError);
    for (const std::string& m : k.message) EXPECT_TRUE(contains(s->error, m)) << s->error;
  }
  EXPECT_EQ(sim.scheduler().num_waiting(), 0u);
  // 4 + 8 tokens, 11 cached: 3 pages, fits the pool exactly.
  EXPECT_TRUE(sim.add({7, 4, 8}));
  EXPECT_EQ(sim.scheduler().num_waiting(), 1u);
  sim.scheduler().check_invariants();
  while (sim.scheduler().has_unfinished()) sim.step();
  EXPECT_EQ(sim.seq(7)->finish_reason, FinishReason::kLength);
}

TEST(Scheduler, RejectsRequestsBeyondThePageTableRow) {
  SchedulerConfig c = small_config(4, 16);
  c.max_pages_per_seq = 2;
  Sim sim(c, 33);
  Sequence* s = sim.make({1, 5, 5});  // 9 cached tokens: 3 pages
  EXPECT_FALSE(sim.scheduler().add(s));
  EXPECT_TRUE(contains(s->error, "a page-table row holds only 2 pages")) << s->error;
  EXPECT_TRUE(sim.add({2, 5, 4}));  // 8 cached: 2 pages
}

TEST(Scheduler, EngineBugsThrow) {
  Sim sim(small_config(4, 16), 33);
  expect_error([&] { sim.scheduler().add(nullptr); }, "null sequence");
  ASSERT_TRUE(sim.add({1, 3, 2}));
  Sequence* dup = sim.make({1, 3, 2});
  expect_error([&] { sim.scheduler().add(dup); }, "request id 1 is already waiting");
  Sequence* used = sim.make({2, 3, 2});
  used->num_computed = 1;
  expect_error([&] { sim.scheduler().add(used); }, "not a fresh sequence");

  SchedulerOutput out = sim.scheduler().schedule();
  expect_error([&] { sim.scheduler().schedule(); }, "before on_step_done() reported step 1");
  expect_error([&] { sim.scheduler().on_step_done(out, {}); }, "1 sampling sequences but got 0");
  SchedulerOutput stale = out;
  stale.step = 7;
  expect_error([&] { sim.scheduler().on_step_done(stale, {SampledToken{}}); }, "for step 7");
  SampledToken t;
  t.token = 50;
  sim.scheduler().on_step_done(out, {t});
  expect_error([&] { sim.scheduler().on_step_done(out, {t}); }, "awaiting it is none");
  sim.scheduler().check_invariants();
  EXPECT_EQ(sim.seq(1)->output, (std::vector<int32_t>{50}));
}

TEST(Scheduler, InvalidConfigsThrow) {
  KvCacheManager kv(8, 4, 3, 4);  // 8 pages of 4 tokens, 3 rows of 4 pages
  SchedulerConfig c = small_config(4, 16);  // derives 16 pages per row, table has 4
  expect_error([&] { Scheduler s(c, kv); }, "holds 4 pages per sequence");
  c.max_pages_per_seq = 4;
  Scheduler ok(c, kv);
  c.max_num_batched_tokens = 3;
  expect_error([&] { Scheduler s(c, kv); }, "must be at least max_num_seqs (4)");
  c = small_config(4, 16);
  c.max_pages_per_seq = 4;
  c.page_size = 0;
  expect_error([&] { Scheduler s(c, kv); }, "page_size must be at least 1");
  c.page_size = 4;
  c.max_model_len = 1;
  expect_error([&] { Scheduler s(c, kv); }, "max_model_len must be at least 2");
  c.max_model_len = 16;
  c.page_size = 2;
  c.max_pages_per_seq = 4;
  expect_error([&] { Scheduler s(c, kv); },
               "pages of 4 tokens but the scheduler is configured for 2");
}

// Abort of a waiting request, of a running one (pages and row come back), of one that is
// in the step being run (its token is dropped), and of unknown or finished ids.
TEST(Scheduler, Abort) {
  Sim sim(small_config(2, 16), 33);
  ASSERT_TRUE(sim.add({1, 5, 10}));
  ASSERT_TRUE(sim.add({2, 3, 10}));
  ASSERT_TRUE(sim.add({3, 2, 10}));
  EXPECT_TRUE(sim.scheduler().abort(3));  // waiting
  EXPECT_EQ(sim.seq(3)->finish_reason, FinishReason::kAborted);
  EXPECT_EQ(sim.scheduler().num_waiting(), 2u);
  sim.scheduler().check_invariants();

  testing::StepRecord r = sim.step();
  EXPECT_EQ(r.scheduled, "1:5* 2:3*");
  EXPECT_EQ(r.free_pages, 29);
  EXPECT_TRUE(sim.scheduler().abort(1));  // running: its 2 pages and row 1 come back
  EXPECT_EQ(sim.allocator().num_free(), 31);
  EXPECT_FALSE(sim.table().in_use(1));
  EXPECT_TRUE(sim.seq(1)->pages.empty());
  sim.scheduler().check_invariants();

  // Abort 2 after schedule() and before on_step_done(): its sampled token is dropped.
  ASSERT_TRUE(sim.add({4, 3, 10}));
  SchedulerOutput out = sim.scheduler().schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq->id, 2);
  EXPECT_TRUE(sim.scheduler().abort(2));
  SampledToken a, b;
  a.token = 61;
  b.token = 62;
  std::vector<Sequence*> done = sim.scheduler().on_step_done(out, {a, b});
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{100}));
  EXPECT_EQ(sim.seq(4)->output, (std::vector<int32_t>{62}));
  sim.scheduler().check_invariants();

  EXPECT_FALSE(sim.scheduler().abort(2));   // already finished
  EXPECT_FALSE(sim.scheduler().abort(99));  // unknown
  EXPECT_TRUE(sim.scheduler().abort(4));
  EXPECT_FALSE(sim.scheduler().has_unfinished());
  EXPECT_EQ(sim.allocator().num_free(), 32);
  sim.scheduler().check_invariants();
}

// Pages held outside the scheduler can starve a request that fits the pool; it is
// finished with kError instead of the engine spinning on empty steps.
TEST(Scheduler, StarvedRequestsAreFinishedNotSpun) {
  Sim sim(small_config(4, 16), 5);  // 4 usable pages
  std::vector<int32_t> held;
  ASSERT_TRUE(sim.allocator().allocate(2, &held));
  sim.extra_owners().push_back(&held);
  // Running alone, request 1 cannot get its third page.
  sim.run_table({{1, {{1, 8, 4}}}}, {
                                        {"1:8*", "", "", "1", "", 0},
                                        {"", "", "1", "", "", 2},
                                    });
  EXPECT_EQ(sim.seq(1)->finish_reason, FinishReason::kError);
  EXPECT_TRUE(contains(sim.seq(1)->error, "needs 1 more KV-cache pages but only 0 of 4 are free"))
      << sim.seq(1)->error;
  // With nothing running, request 2 cannot even start.
  sim.run_table({{1, {{2, 12, 1}}}}, {{"", "", "2", "", "", 2}});
  EXPECT_TRUE(contains(sim.seq(2)->error, "needs 3 KV-cache pages to start but only 2"))
      << sim.seq(2)->error;
  sim.allocator().release(held);
  sim.extra_owners().clear();
  sim.scheduler().check_invariants();
  EXPECT_EQ(sim.allocator().num_free(), 4);
}

// No admission in a step that preempted: 2 preempts itself for want of a page, and would
// otherwise be readmitted at once with a one-token chunk into the page it just freed.
TEST(Scheduler, NoAdmissionInAStepThatPreempted) {
  Sim sim(small_config(2, 2), 5);  // budget 2 tokens, 4 usable pages
  sim.run_table({{1, {{1, 4, 6}, {2, 4, 6}}}},
                {
                    {"1:2", "", "", "1", "2", 3},
                    {"1:2*", "", "", "1", "2", 3},
                    {"1:1* 2:1", "", "", "1 2", "", 1},
                    {"1:1* 2:1", "", "", "1 2", "", 1},
                    {"1:1* 2:1", "", "", "1 2", "", 1},
                    {"1:1* 2:1*", "", "", "1 2", "", 1},
                    {"1:1*", "2", "1", "", "2", 4},
                    // 2 recomputes its prompt and first output in chunks of 2, then decodes.
                    {"2:2", "", "", "2", "", 3},
                    {"2:2", "", "", "2", "", 3},
                    {"2:1*", "", "", "2", "", 2},
                    {"2:1*", "", "", "2", "", 2},
                    {"2:1*", "", "", "2", "", 2},
                    {"2:1*", "", "", "2", "", 2},
                    {"2:1*", "", "2", "", "", 4},
                });
  EXPECT_EQ(sim.seq(2)->num_preemptions, 1);
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{100, 101, 102, 103, 104, 105}));
}

// A waiting request blocks the queue (FIFO) rather than letting a smaller one overtake.
TEST(Scheduler, AdmissionIsStrictlyFifo) {
  Sim sim(small_config(4, 32), 5);  // 4 usable pages
  sim.run_table({{1, {{1, 8, 3}, {2, 12, 1}, {3, 2, 1}}}},
                {
                    // 1 takes 2 pages; 2 needs 3, only 2 free: 3 would fit but waits.
                    {"1:8*", "", "", "1", "2 3", 2},
                    {"1:1*", "", "", "1", "2 3", 1},
                    {"1:1*", "", "1", "", "2 3", 4},
                    {"2:12* 3:2*", "", "2 3", "", "", 4},
                });
}

// Seeded random workloads: arrivals, prompt lengths, EOS, aborts, a pool small enough to
// preempt often. Checks invariants and KV read-back every step (in Sim), that every step
// makes progress, that every running sequence is scheduled every step, and that each
// request ends consistently with its finish reason.
TEST(Scheduler, RandomWorkloadsTerminateConsistently) {
  int total_preemptions = 0, total_rejected = 0, total_aborted = 0, total_chunked = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Draws next(seed * 0x9E3779B97F4A7C15ull);  // splitmix64: identical on every platform
    SchedulerConfig c = small_config(1 + next(4), 0);
    c.max_num_batched_tokens = c.max_num_seqs + next(24);
    c.max_model_len = 24 + next(24);
    c.page_size = 1 + next(6);
    // Sometimes smaller than one row, so that some requests are rejected for the pool.
    const int32_t row_pages = (c.max_model_len + c.page_size - 1) / c.page_size;
    const int32_t num_pages = 2 + row_pages / 2 + next(row_pages + 6);
    Sim sim(c, num_pages);

    const int num_requests = 12;
    int added = 0;
    int64_t steps = 0;
    std::vector<int64_t> accepted;
    while (added < num_requests || sim.scheduler().has_unfinished()) {
      ASSERT_LT(++steps, 5000) << "no termination";
      while (added < num_requests && next(3) == 0) {
        Request r;
        r.id = ++added;
        r.prompt_len = next(5) == 0 ? c.max_model_len + next(3) - 1 : 1 + next(c.max_model_len / 2);
        r.max_tokens = 1 + next(20);
        r.ignore_eos = next(4) == 0;
        for (int k = 0; k < 20; ++k) r.script.push_back(next(10) == 0 ? 2 : 100 + k);
        if (sim.add(r)) {
          accepted.push_back(r.id);
        } else {
          ++total_rejected;
          EXPECT_EQ(sim.seq(r.id)->finish_reason, FinishReason::kError);
        }
      }
      if (!sim.scheduler().has_unfinished()) continue;
      if (next(15) == 0) sim.scheduler().abort(1 + next(added));
      if (!sim.scheduler().has_unfinished()) continue;
      std::vector<Sequence*> before = sim.scheduler().running();
      testing::StepRecord rec = sim.step();
      const SchedulerOutput& out = sim.last_output();
      for (const ScheduledSeq& x : out.scheduled) total_chunked += x.samples ? 0 : 1;
      EXPECT_TRUE(!out.scheduled.empty() || !out.finished.empty()) << "an idle step";
      // Every sequence that was running and not preempted computed this step.
      for (Sequence* s : before) {
        bool preempted = false, scheduled = false;
        for (Sequence* p : out.preempted) preempted |= p == s;
        for (const ScheduledSeq& x : out.scheduled) scheduled |= x.seq == s;
        EXPECT_TRUE(preempted || scheduled) << "request " << s->id << " was skipped";
      }
    }
    EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
    EXPECT_EQ(sim.table().num_used_rows(), 0);
    for (int64_t id : accepted) {
      const Sequence& s = *sim.seq(id);
      ASSERT_TRUE(s.finished());
      total_preemptions += s.num_preemptions;
      total_aborted += s.finish_reason == FinishReason::kAborted ? 1 : 0;
      EXPECT_LT(static_cast<int32_t>(s.prompt.size()), c.max_model_len);
      EXPECT_LE(s.num_tokens(), c.max_model_len);
      EXPECT_EQ(s.sampled.size(), s.output.size());
      for (size_t k = 0; k < s.output.size(); ++k) {
        EXPECT_EQ(s.output[k], s.sampled[k].token);
        // Outputs follow the script whatever the preemptions.
        EXPECT_TRUE(s.output[k] == 2 || s.output[k] == 100 + static_cast<int32_t>(k));
      }
      switch (s.finish_reason) {
        case FinishReason::kEos:
          EXPECT_FALSE(s.params.ignore_eos);
          EXPECT_EQ(s.output.back(), 2);
          break;
        case FinishReason::kLength:
          EXPECT_EQ(static_cast<int>(s.output.size()), s.params.max_tokens);
          break;
        case FinishReason::kContextLimit:
          EXPECT_EQ(s.num_tokens(), c.max_model_len);
          break;
        case FinishReason::kAborted:
          break;
        default:
          ADD_FAILURE() << "request " << id << " finished with reason "
                        << static_cast<int>(s.finish_reason) << ": " << s.error;
      }
    }
  }
  // The workloads exercise what they claim to.
  EXPECT_GT(total_preemptions, 20);
  EXPECT_GT(total_rejected, 20);
  EXPECT_GT(total_aborted, 5);
  EXPECT_GT(total_chunked, 20);
}

}  // namespace
}  // namespace pagellm
