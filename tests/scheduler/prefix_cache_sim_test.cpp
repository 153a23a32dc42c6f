// The scheduler with prefix caching, in the simulation harness (sim.h): seeded random
// workloads whose prompts share prefixes, with pools small enough to preempt and evict
// often, and aborts. Sim checks every step that each sequence reads, through its page-table
// row, cells written for exactly its own tokens up to each position (whoever wrote them),
// that no token is written into a shared or cached page, and the KV cache manager's
// invariants (the prefix cache's included).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/sim.h"

namespace pagellm {
namespace {

using testing::Draws;
using testing::Request;
using testing::Sim;
using testing::small_config;

TEST(SchedulerPrefixCache, RandomSharedPrefixWorkloadsStayConsistent) {
  int64_t total_hits = 0, total_queried = 0, total_evictions = 0;
  int total_preemptions = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Draws next(seed * 0xD1B54A32D192ED03ull);  // splitmix64: identical on every platform
    SchedulerConfig c = small_config(1 + next(4), 0);
    c.max_num_batched_tokens = c.max_num_seqs + next(24);
    c.max_model_len = 24 + next(24);
    c.page_size = 1 + next(6);
    const int32_t row_pages = (c.max_model_len + c.page_size - 1) / c.page_size;
    const int32_t num_pages = 2 + row_pages + next(row_pages + 6);
    Sim sim(c, num_pages, /*max_slots=*/0, /*prefix_caching=*/true);

    const int num_requests = 16;
    int added = 0;
    int64_t steps = 0;
    std::vector<int64_t> accepted;
    while (added < num_requests || sim.scheduler().has_unfinished()) {
      ASSERT_LT(++steps, 5000) << "no termination";
      while (added < num_requests && next(3) == 0) {
        Request r;
        r.id = ++added;
        r.prompt_len = 1 + next(c.max_model_len / 2 + 4);
        r.shared_prefix = next(3) == 0 ? 0 : next(r.prompt_len + 1);
        r.max_tokens = 1 + next(16);
        r.ignore_eos = next(4) == 0;
        for (int k = 0; k < 20; ++k) r.script.push_back(next(10) == 0 ? 2 : 100 + k);
        if (sim.add(r)) accepted.push_back(r.id);
      }
      if (!sim.scheduler().has_unfinished()) continue;
      if (next(20) == 0) sim.scheduler().abort(1 + next(added));
      if (!sim.scheduler().has_unfinished()) continue;
      sim.step();
      const SchedulerOutput& out = sim.last_output();
      EXPECT_TRUE(!out.scheduled.empty() || !out.finished.empty()) << "an idle step";
      // The cache never starves anyone: with caching, a request fails only as without it.
      EXPECT_TRUE(out.finished.empty()) << "a request failed for pages";
    }
    // Idle: every page is free (cached-free ones included) and no row is in use.
    EXPECT_EQ(sim.allocator().num_free(), sim.allocator().num_usable());
    EXPECT_EQ(sim.table().num_used_rows(), 0);
    EXPECT_NO_THROW(sim.kv().check_invariants({}));
    for (int64_t id : accepted) {
      const Sequence& s = *sim.seq(id);
      ASSERT_TRUE(s.finished());
      total_preemptions += s.num_preemptions;
      EXPECT_EQ(s.sampled.size(), s.output.size());
      if (s.finish_reason == FinishReason::kLength) {
        EXPECT_EQ(static_cast<int64_t>(s.output.size()), s.params.max_tokens);
      }
    }
    const PrefixCacheStats stats = sim.kv().prefix_cache_stats();
    total_hits += stats.hit_tokens;
    total_queried += stats.queried_tokens;
    total_evictions += stats.evictions;
    sim.kv().reset_prefix_cache();
    EXPECT_EQ(sim.kv().prefix_cache().size(), 0);
    EXPECT_EQ(sim.allocator().num_cached_free(), 0);
    EXPECT_NO_THROW(sim.kv().check_invariants({}));
  }
  // The workloads exercise what they are meant to.
  EXPECT_GT(total_hits, 0);
  EXPECT_LT(total_hits, total_queried);
  EXPECT_GT(total_evictions, 0);
  EXPECT_GT(total_preemptions, 0);
}

}  // namespace
}  // namespace pagellm
