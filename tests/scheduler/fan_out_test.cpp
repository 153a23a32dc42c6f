// n-sample groups in the scheduler (deterministic simulations, sim.h): one prefill, the
// fan-out step ("id:n*+k": k more samples take their first token from that row), shared
// pages with copy-on-write (the mocked pool applies the step's copies, then checks that
// every sequence reads its own tokens), row reservation, aborts, preemption, rejection.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagellm/engine/scheduler.h"
#include "scheduler/sim.h"

namespace pagellm {
namespace {

using testing::Draws;
using testing::Request;
using testing::Sim;
using testing::StepRecord;
using testing::small_config;

std::vector<Request> group(int64_t first_id, int n, int32_t prompt_len, int32_t max_tokens) {
  std::vector<Request> g;
  for (int j = 0; j < n; ++j) {
    std::vector<int32_t> script;
    for (int k = 0; k < 40; ++k) script.push_back(200 + 50 * j + k);  // distinct per sample
    g.emplace_back(first_id + j, prompt_len, max_tokens, script);
  }
  return g;
}

void expect_step(const StepRecord& got, const char* scheduled, const char* finished,
                 const char* running, const char* waiting) {
  EXPECT_EQ(got.scheduled, scheduled);
  EXPECT_EQ(got.finished, finished);
  EXPECT_EQ(got.running, running);
  EXPECT_EQ(got.waiting, waiting);
}

TEST(SchedulerFanOut, OnePrefillSharedPagesAndOneCopyPerWriterButTheLast) {
  Sim sim(small_config(4, 16), 33);  // 32 usable pages of 4 tokens
  ASSERT_TRUE(sim.add_group(group(1, 3, 10, 3)));
  // 10 prompt tokens once: 3 pages, the last half full; samples 2 and 3 fork from 1.
  StepRecord r = sim.step();
  expect_step(r, "1:10*+2", "", "1 2 3", "");
  EXPECT_EQ(r.free_pages, 29);
  EXPECT_EQ(sim.allocator().refcount(sim.seq(1)->pages[2]), 3);
  EXPECT_EQ(sim.seq(3)->pages, sim.seq(1)->pages);
  EXPECT_EQ(sim.scheduler().forked_samples(), 2);
  // Each writes position 10 into the shared half page: 1 and 2 copy it, 3 (its last
  // holder by then) writes it in place.
  r = sim.step();
  expect_step(r, "1:1* 2:1* 3:1*", "", "1 2 3", "");
  EXPECT_EQ(r.free_pages, 27);
  EXPECT_EQ(sim.last_output().page_copies.size(), 2u);
  EXPECT_EQ(sim.copies(), 2);
  // Position 11 goes into each one's own page: no copy.
  r = sim.step();
  expect_step(r, "1:1* 2:1* 3:1*", "1 2 3", "", "");
  EXPECT_TRUE(sim.last_output().page_copies.empty());
  EXPECT_EQ(r.free_pages, 32);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(sim.seq(1 + j)->output,
              (std::vector<int32_t>{200 + 50 * j, 201 + 50 * j, 202 + 50 * j}));
  }
}

TEST(SchedulerFanOut, AGroupNeedsRowsForAllSamplesAndKeepsThemReserved) {
  Sim sim(small_config(3, 8), 33);
  ASSERT_TRUE(sim.add(Request(1, 3, 4)));
  ASSERT_TRUE(sim.add_group(group(2, 3, 12, 2)));
  expect_step(sim.step(), "1:3*", "", "1", "2");  // 3 rows needed, 2 free
  expect_step(sim.step(), "1:1*", "", "1", "2");
  expect_step(sim.step(), "1:1*", "", "1", "2");
  expect_step(sim.step(), "1:1*", "1", "", "2");
  expect_step(sim.step(), "2:8", "", "2", "");  // a chunk; rows for 3 and 4 held back
  ASSERT_TRUE(sim.add(Request(5, 2, 1)));
  expect_step(sim.step(), "2:4*+2", "", "2 3 4", "5");  // 5 may not take a reserved row
  expect_step(sim.step(), "2:1* 3:1* 4:1*", "2 3 4", "", "5");
  expect_step(sim.step(), "5:2*", "5", "", "");
  EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
}

TEST(SchedulerFanOut, AbortingSampleZeroHandsThePrefillToTheNext) {
  Sim sim(small_config(3, 8), 33);
  ASSERT_TRUE(sim.add_group(group(1, 3, 12, 2)));
  expect_step(sim.step(), "1:8", "", "1", "");
  ASSERT_TRUE(sim.scheduler().abort(1));  // mid-prefill: 2 restarts it, 3 stays with 2
  EXPECT_EQ(sim.seq(1)->finish_reason, FinishReason::kAborted);
  sim.scheduler().check_invariants();
  EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
  expect_step(sim.step(), "2:8", "", "2", "");
  expect_step(sim.step(), "2:4*+1", "", "2 3", "");
  expect_step(sim.step(), "2:1* 3:1*", "2 3", "", "");
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{250, 251}));
  EXPECT_EQ(sim.seq(3)->output, (std::vector<int32_t>{300, 301}));

  // Still waiting: the next sample takes its place in the queue.
  Sim waiting(small_config(3, 8), 33);
  ASSERT_TRUE(waiting.add(Request(10, 2, 1)));
  ASSERT_TRUE(waiting.add_group(group(11, 2, 5, 1)));
  ASSERT_TRUE(waiting.add(Request(13, 2, 1)));
  ASSERT_TRUE(waiting.scheduler().abort(11));
  EXPECT_EQ(testing::join_ids(std::vector<Sequence*>(waiting.scheduler().waiting().begin(),
                                                     waiting.scheduler().waiting().end())),
            "10 12 13");
  expect_step(waiting.step(), "10:2* 12:5* 13:1", "10 12", "13", "");
}

TEST(SchedulerFanOut, AbortingAWaitingSampleOrOneMidStepLeavesTheOthers) {
  Sim sim(small_config(4, 8), 33);
  ASSERT_TRUE(sim.add_group(group(1, 4, 6, 2)));
  ASSERT_TRUE(sim.scheduler().abort(3));  // waiting for the fan-out
  sim.scheduler().check_invariants();
  // Sample 4 is aborted between schedule() and on_step_done() of the fan-out step: it is
  // not forked and its token is dropped.
  SchedulerOutput out = sim.scheduler().schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  ASSERT_EQ(out.scheduled[0].fan_out.size(), 2u);
  ASSERT_TRUE(sim.scheduler().abort(4));
  std::vector<SampledToken> sampled(3);
  for (size_t k = 0; k < 3; ++k) sampled[k].token = 500 + static_cast<int32_t>(k);
  sim.scheduler().on_step_done(out, sampled);
  sim.scheduler().check_invariants();
  EXPECT_EQ(sim.seq(1)->output, (std::vector<int32_t>{500}));
  EXPECT_EQ(sim.seq(2)->output, (std::vector<int32_t>{501}));
  EXPECT_TRUE(sim.seq(4)->output.empty());
  EXPECT_EQ(sim.seq(4)->finish_reason, FinishReason::kAborted);
  EXPECT_EQ(sim.scheduler().forked_samples(), 1);
  EXPECT_EQ(testing::join_ids(sim.scheduler().running()), "1 2");

  // Sample 0 aborted in the fan-out step itself: its samples' tokens are dropped too, and
  // sample 1 takes over the prefill.
  Sim mid(small_config(4, 8), 33);
  ASSERT_TRUE(mid.add_group(group(1, 3, 6, 2)));
  out = mid.scheduler().schedule();
  ASSERT_TRUE(mid.scheduler().abort(1));
  mid.scheduler().on_step_done(out, sampled);
  mid.scheduler().check_invariants();
  EXPECT_TRUE(mid.seq(2)->output.empty());
  expect_step(mid.step(), "2:6*+1", "", "2 3", "");
}

TEST(SchedulerFanOut, ForkedSamplesArePreemptedAndRecomputeTheirOwnPrompt) {
  // 10 usable pages: the 9-token prompt takes 3 (one of them half full); 3 samples of 8
  // more tokens need 1 copy each and a page more: the newest is preempted, recomputes its
  // own prompt and output, and every sequence still reads only its own tokens.
  Sim sim(small_config(3, 16), 11);
  ASSERT_TRUE(sim.add_group(group(1, 3, 9, 9)));
  int preemptions = 0;
  for (int step = 0; sim.scheduler().has_unfinished(); ++step) {
    ASSERT_LT(step, 200);
    sim.step();
    preemptions += static_cast<int>(sim.last_output().preempted.size());
  }
  EXPECT_GT(preemptions, 0);
  for (int j = 0; j < 3; ++j) {
    const Sequence& s = *sim.seq(1 + j);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
    for (int k = 0; k < 9; ++k) EXPECT_EQ(s.output[k], 200 + 50 * j + k) << j << " " << k;
  }
  EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
}

TEST(SchedulerFanOut, GroupsThatCanNeverRunAreRejectedAtAdd) {
  Sim sim(small_config(3, 8), 33);
  EXPECT_FALSE(sim.add_group(group(1, 4, 5, 2)));
  for (int64_t id = 1; id <= 4; ++id) {
    EXPECT_EQ(sim.seq(id)->finish_reason, FinishReason::kError);
    EXPECT_NE(sim.seq(id)->error.find("n = 4 samples but at most 3"), std::string::npos)
        << sim.seq(id)->error;
  }
  // Fewer page-table rows than max_num_seqs: the rows are the limit.
  Sim rows(small_config(4, 8), 33, /*max_slots=*/3);
  EXPECT_FALSE(rows.add_group(group(1, 3, 5, 2)));
  EXPECT_NE(rows.seq(1)->error.find("at most 2"), std::string::npos) << rows.seq(1)->error;
  // A prompt no sequence could hold: every sample gets the reason.
  EXPECT_FALSE(sim.add_group(group(10, 2, 64, 2)));
  EXPECT_NE(sim.seq(11)->error.find("max_model_len"), std::string::npos);
  EXPECT_FALSE(sim.scheduler().has_unfinished());
  // Samples with different prompts are an engine bug.
  std::vector<Sequence*> mixed = {sim.make(Request(20, 3, 1)), sim.make(Request(21, 4, 1))};
  EXPECT_THROW(sim.scheduler().add_group(mixed), Error);
}

TEST(SchedulerFanOut, RandomWorkloadsWithGroupsTerminateConsistently) {
  int total_forked = 0, total_copies = 0, total_preempted = 0, total_aborted = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Draws next(seed * 0x9E3779B97F4A7C15ull);  // splitmix64: identical on every platform
    SchedulerConfig c = small_config(2 + next(4), 0);
    c.max_num_batched_tokens = c.max_num_seqs + next(24);
    c.max_model_len = 24 + next(24);
    c.page_size = 1 + next(6);
    const int32_t row_pages = (c.max_model_len + c.page_size - 1) / c.page_size;
    Sim sim(c, 2 + row_pages + next(2 * row_pages));

    int64_t next_id = 1;
    int arrivals = 0;
    std::vector<std::vector<int64_t>> groups;
    for (int64_t steps = 0; arrivals < 8 || sim.scheduler().has_unfinished();) {
      ASSERT_LT(++steps, 5000) << "no termination";
      while (arrivals < 8 && next(3) == 0) {
        ++arrivals;
        const int n = 1 + next(c.max_num_seqs);
        std::vector<Request> g = group(next_id, n, 1 + next(c.max_model_len / 2), 1 + next(16));
        next_id += n;
        ASSERT_TRUE(sim.add_group(g));
        groups.emplace_back();
        for (const Request& r : g) groups.back().push_back(r.id);
      }
      if (next(12) == 0 && next_id > 1) {
        total_aborted += sim.scheduler().abort(1 + next(static_cast<uint64_t>(next_id - 1)));
      }
      if (!sim.scheduler().has_unfinished()) continue;
      sim.step();
      total_preempted += static_cast<int>(sim.last_output().preempted.size());
    }
    EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
    EXPECT_EQ(sim.table().num_used_rows(), 0);
    total_forked += static_cast<int>(sim.scheduler().forked_samples());
    total_copies += static_cast<int>(sim.copies());
    for (const std::vector<int64_t>& g : groups) {
      for (size_t j = 0; j < g.size(); ++j) {
        const Sequence& s = *sim.seq(g[j]);
        ASSERT_TRUE(s.finished());
        ASSERT_TRUE(s.finish_reason == FinishReason::kLength ||
                    s.finish_reason == FinishReason::kContextLimit ||
                    s.finish_reason == FinishReason::kAborted)
            << "request " << s.id << ": " << s.error;
        // Each sample follows its own script, whatever the fan-out, copies and preemptions.
        for (size_t k = 0; k < s.output.size(); ++k) {
          EXPECT_EQ(s.output[k], 200 + 50 * static_cast<int32_t>(j) + static_cast<int32_t>(k));
        }
      }
    }
  }
  // The workloads exercised what they are meant to.
  EXPECT_GT(total_forked, 20);
  EXPECT_GT(total_copies, 10);
  EXPECT_GT(total_preempted, 0);
  EXPECT_GT(total_aborted, 0);
}

}  // namespace
}  // namespace pagellm
