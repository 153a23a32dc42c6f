// Scheduler::schedule_ahead (pipelined decode): the plan of the step after one still in
// flight. Who continues (not the sequences that the in-flight token ends by length, not
// the aborted), the pages for the extra token (a new page at a page boundary), the input
// rows it is fed from, when it refuses (a prefill in flight, requests waiting, too few
// pages) without changing anything, and that steps are reported in order.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "pagellm/engine/scheduler.h"

namespace pagellm {
namespace {

using testing::expect_error;

struct Fixture {
  explicit Fixture(int32_t num_pages)
      : kv(num_pages, /*page_size=*/4, /*max_slots=*/9, /*max_pages_per_seq=*/16),
        scheduler(config(), kv) {}
  static SchedulerConfig config() {
    SchedulerConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.page_size = 4;
    c.max_model_len = 64;
    c.eos_token_ids = {2};
    return c;
  }
  Sequence* add(int64_t id, int32_t prompt_len, int max_tokens) {
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    for (int32_t i = 0; i < prompt_len; ++i) seq->prompt.push_back(10 + i);
    seq->params.max_tokens = max_tokens;
    seqs.push_back(std::move(seq));
    EXPECT_TRUE(scheduler.add(seqs.back().get()));
    return seqs.back().get();
  }
  /// Tokens 50, 51, ... one per sampling entry (never EOS).
  std::vector<SampledToken> tokens_for(const SchedulerOutput& out) {
    std::vector<SampledToken> t(static_cast<size_t>(out.num_sampling()));
    for (SampledToken& s : t) s.token = next_token++;
    return t;
  }
  KvCacheManager kv;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;
  int32_t next_token = 50;
};

TEST(ScheduleAhead, ContinuesADecodeStepWithTheRowsItSamples) {
  Fixture f(64);
  Sequence* a = f.add(1, 3, 10);  // after prefill: 3 computed, 4 tokens
  Sequence* b = f.add(2, 6, 2);   // ends by length with its second token
  f.add(3, 5, 10);                // c, aborted below
  SchedulerOutput prefill = f.scheduler.schedule();
  // A prefill in flight: nothing is planned ahead, and nothing changes.
  const int32_t free_before = f.kv.num_free_pages();
  EXPECT_TRUE(f.scheduler.schedule_ahead(prefill).scheduled.empty());
  EXPECT_EQ(f.kv.num_free_pages(), free_before);
  f.scheduler.on_step_done(prefill, f.tokens_for(prefill));

  SchedulerOutput decode = f.scheduler.schedule();  // a: token 3, b: token 6, c: token 5
  ASSERT_EQ(decode.scheduled.size(), 3u);
  const size_t a_pages = a->pages.size();
  f.scheduler.abort(3);  // c: aborted while the step is in flight
  SchedulerOutput ahead = f.scheduler.schedule_ahead(decode);
  // b's in-flight token is its second and last (max_tokens 2): it does not continue.
  ASSERT_EQ(ahead.scheduled.size(), 1u);
  const ScheduledSeq& s = ahead.scheduled[0];
  EXPECT_EQ(s.seq, a);
  EXPECT_EQ(s.num_new_tokens, 1);
  EXPECT_TRUE(s.samples);
  EXPECT_EQ(s.ahead, 1);
  EXPECT_EQ(s.fed_from, 0);
  EXPECT_EQ(ahead.step, decode.step + 1);
  // a computes index 4 (3 + the in-flight token): a second page.
  EXPECT_EQ(a->pages.size(), a_pages + 1);
  EXPECT_EQ(static_cast<int32_t>(a->pages.size()) * 4, 8);

  // Steps are reported in order; a second step ahead waits for the first report.
  expect_error([&] { f.scheduler.on_step_done(ahead, f.tokens_for(ahead)); },
               "on_step_done() for step");
  expect_error([&] { f.scheduler.schedule_ahead(ahead); }, "the only step in flight");
  expect_error([&] { f.scheduler.schedule(); }, "before on_step_done()");
  const std::vector<Sequence*> done = f.scheduler.on_step_done(decode, f.tokens_for(decode));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0], b);
  EXPECT_EQ(b->finish_reason, FinishReason::kLength);
  EXPECT_EQ(a->num_computed, 4);
  EXPECT_EQ(a->output.size(), 2u);
  f.scheduler.check_invariants();
  f.scheduler.on_step_done(ahead, f.tokens_for(ahead));
  EXPECT_EQ(a->num_computed, 5);
  EXPECT_EQ(a->output.size(), 3u);
  f.scheduler.check_invariants();
}

TEST(ScheduleAhead, RefusesWithRequestsWaitingOrTooFewPages) {
  {
    Fixture f(64);
    f.add(1, 3, 10);
    SchedulerOutput prefill = f.scheduler.schedule();
    f.scheduler.on_step_done(prefill, f.tokens_for(prefill));
    SchedulerOutput decode = f.scheduler.schedule();
    f.add(2, 4, 10);  // arrives while the decode runs
    EXPECT_TRUE(f.scheduler.schedule_ahead(decode).scheduled.empty());
    f.scheduler.on_step_done(decode, f.tokens_for(decode));
    EXPECT_EQ(f.scheduler.schedule().scheduled.size(), 2u);
  }
  {
    // 4 usable pages: a holds 1 (3 tokens) and b 3 (12 tokens) after prefill; the decode
    // step fills a's, and the step ahead needs a new page for a (none left; b ends by
    // length with the token in flight).
    Fixture f(5);
    Sequence* a = f.add(1, 3, 10);
    Sequence* b = f.add(2, 11, 2);
    SchedulerOutput prefill = f.scheduler.schedule();
    f.scheduler.on_step_done(prefill, f.tokens_for(prefill));
    SchedulerOutput decode = f.scheduler.schedule();
    ASSERT_EQ(decode.scheduled.size(), 2u);
    EXPECT_EQ(f.kv.num_free_pages(), 0);
    const size_t a_pages = a->pages.size(), b_pages = b->pages.size();
    EXPECT_TRUE(f.scheduler.schedule_ahead(decode).scheduled.empty());
    EXPECT_EQ(a->pages.size(), a_pages);  // nothing allocated for either
    EXPECT_EQ(b->pages.size(), b_pages);
    f.scheduler.on_step_done(decode, f.tokens_for(decode));
    f.scheduler.check_invariants();
  }
}

TEST(ScheduleAhead, StopsBeforeTheContextLimit) {
  Fixture f(64);
  Sequence* a = f.add(1, 62, 10);  // max_model_len 64
  SchedulerOutput prefill = f.scheduler.schedule();
  f.scheduler.on_step_done(prefill, f.tokens_for(prefill));  // 63 tokens
  SchedulerOutput decode = f.scheduler.schedule();
  SchedulerOutput ahead = f.scheduler.schedule_ahead(decode);  // the 64th in flight
  EXPECT_TRUE(ahead.scheduled.empty()) << "its in-flight token reaches max_model_len";
  f.scheduler.on_step_done(decode, f.tokens_for(decode));
  EXPECT_EQ(a->finish_reason, FinishReason::kContextLimit);
  f.scheduler.check_invariants();
}

}  // namespace
}  // namespace pagellm
