// The graph lifecycle of the attention planner: a planner bound to a captured graph keeps
// its provider whatever later batches bring, a longer KV within the capacity maps to the
// same cuDNN plan, batches outside the capacity are errors rather than silent switches,
// and the reservation made at binding is linear in the batch.
#include <gtest/gtest.h>

#include <chrono>

#include "fixtures.h"

namespace pagellm {
namespace {

using test::h200;
using test::make_batch;
using test::OwnedBatch;
using test::standard_domain;
using test::uniform_batch;

AttentionPlannerConfig config(const CrossoverTables* tables,
                              AttentionBackendChoice choice = AttentionBackendChoice::kAuto) {
  AttentionPlannerConfig c;
  c.choice = choice;
  c.device = h200();
  c.tables = tables;
  return c;
}

// A decode graph for `seqs` sequences, KV up to kv_capacity, as the engine captures it: the
// representative batch is all padding rows (q = 1, kv = 1).
GraphCapacity decode_capacity(int32_t seqs, int32_t kv_capacity, int32_t page_size = 16) {
  GraphCapacity c;
  c.num_seqs = seqs;
  c.max_num_tokens = seqs;
  c.max_query_len = 1;
  c.max_pages_per_seq = (kv_capacity + page_size - 1) / page_size;
  c.kv_len_capacity = kv_capacity;
  return c;
}

OwnedBatch decode_batch(int32_t seqs, int32_t kv, const GraphCapacity& cap) {
  return uniform_batch(seqs, 1, kv, 16, cap.max_pages_per_seq * 16);
}

TEST(GraphLifecycle, GraphDecisionMustHoldForEveryReplayUpToTheCapacity) {
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(64, 4096);
  // Graph decode crosses at 1024 (standard table): the smallest replay (KV 1 everywhere)
  // does 64 x 32 = 2048 pairs, the largest 64 x 32 x 4096.
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(64, 1, cap);
  const AttentionPlan& p = planner.bind_to_graph(d, cap, rep.view());
  EXPECT_EQ(p.provider, AttentionProvider::kCudnn) << p.summary();
  EXPECT_EQ(p.work_lo, 64 * 32);
  EXPECT_EQ(p.work_hi, int64_t{64} * 32 * 4096);
  EXPECT_EQ(p.cudnn_key.max_kv_len, 4096);

  // With the crossover above the smallest replay's work, the graph stays native even though
  // its largest replays would be past it.
  CrossoverTables strict;
  CrossoverTable t = test::standard_table();
  t.entries[1].min_work = 64 * 32 + 1;
  strict.add(t);
  AttentionPlanner cautious(config(&strict));
  const AttentionPlan& q = cautious.bind_to_graph(d, cap, rep.view());
  EXPECT_EQ(q.provider, AttentionProvider::kNative);
  EXPECT_EQ(q.decided_by, static_cast<int>(AdmissionRule::kWork));
  EXPECT_EQ(q.rules[2].value, 64 * 32);
}

// Decode is one shape class for every KV length, so a graph's replays (KV 1 .. capacity)
// never leave it; rule 3 judges the whole capacity's work range against that entry.
TEST(GraphLifecycle, DecodeGraphIsJudgedOverTheCapacityInItsOneClass) {
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(16, 40960);
  OwnedBatch rep = decode_batch(16, 1, cap);
  const int64_t hi = int64_t{16} * 32 * 40960;
  for (int64_t max_work : {hi - 1, hi}) {
    SCOPED_TRACE(max_work);
    CrossoverTables tables;
    CrossoverTable t = test::standard_table();
    t.entries[1].min_work = 16 * 32;  // the smallest replay: every KV one token
    t.entries[1].max_work = max_work;
    t.entries[1].max_kv_len = 40960;
    tables.add(t);
    AttentionPlanner planner(config(&tables));
    const AttentionPlan& p = planner.bind_to_graph(d, cap, rep.view());
    EXPECT_TRUE(p.shape_class.decode());
    EXPECT_EQ(p.work_lo, 16 * 32);
    EXPECT_EQ(p.work_hi, hi);
    if (max_work < hi) {
      EXPECT_EQ(p.provider, AttentionProvider::kNative);
      EXPECT_EQ(p.rules[2].reason, Reason::kAboveMeasured);
    } else {
      EXPECT_EQ(p.provider, AttentionProvider::kCudnn) << p.summary();
    }
  }
  // The graph's replays keep the decode class whatever their KV lengths (one to the
  // capacity), so the binding holds in every class a replay can meet.
  CrossoverTables tables;
  CrossoverTable t = test::standard_table();
  t.entries[1].max_kv_len = 40960;
  tables.add(t);
  AttentionPlanner planner(config(&tables));
  planner.bind_to_graph(d, cap, rep.view());
  for (int32_t kv : {1, 256, 257, 4097, 16385, 40960}) {
    OwnedBatch b = decode_batch(16, kv, cap);
    EXPECT_TRUE(planner.plan(d, b.view()).shape_class.decode()) << kv;
  }
}

TEST(GraphLifecycle, BoundCudnnPlannerKeepsItsProviderAndPlanAcrossReplans) {
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(32, 8192);
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(32, 1, cap);
  const CudnnPlanKey key = planner.bind_to_graph(d, cap, rep.view()).cudnn_key;
  ASSERT_EQ(planner.last_plan().provider, AttentionProvider::kCudnn);
  for (int32_t kv : {1, 7, 100, 4096, 8000, 8192}) {
    SCOPED_TRACE(kv);
    OwnedBatch b = decode_batch(32, kv, cap);
    const AttentionPlan& p = planner.plan(d, b.view());
    EXPECT_EQ(p.provider, AttentionProvider::kCudnn);
    EXPECT_TRUE(p.graph_bound);
    EXPECT_EQ(p.cudnn_key, key) << "a longer KV within the capacity needs no other plan";
    EXPECT_EQ(p.work, int64_t{32} * 32 * kv);
  }
  // Ragged KV lengths within the capacity: same plan.
  std::vector<int32_t> kv(32, 3);
  kv[5] = 8192;
  OwnedBatch ragged = make_batch(std::vector<int32_t>(32, 1), kv, 16, 8192);
  EXPECT_EQ(planner.plan(d, ragged.view()).cudnn_key, key);
}

TEST(GraphLifecycle, BoundNativePlannerNeverSwitchesToCudnn) {
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(64, 2048);
  // No graph entry in this table: the graph is captured native ...
  CrossoverTables tables;
  CrossoverTable t = test::standard_table();
  t.entries.pop_back();
  tables.add(t);
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(64, 1, cap);
  ASSERT_EQ(planner.bind_to_graph(d, cap, rep.view()).provider, AttentionProvider::kNative);
  // ... and stays native even when the tables change under it to admit everything, and for
  // a batch whose metadata is inconsistent.
  tables.add(test::standard_table());
  OwnedBatch big = decode_batch(64, 2048, cap);
  const AttentionPlan& p = planner.plan(d, big.view());
  EXPECT_EQ(p.provider, AttentionProvider::kNative);
  EXPECT_EQ(p.reason, Reason::kGraphBound);
  AttentionBatchView bad = big.view();
  bad.max_kv_len = 5;
  EXPECT_EQ(planner.plan(d, bad).provider, AttentionProvider::kNative);
  // An unbound planner with the same tables would admit it: the binding is what holds.
  AttentionPlanner eager(config(&tables));
  EXPECT_EQ(eager.plan(d, big.view(), LaunchMode::kGraph).provider, AttentionProvider::kCudnn);
}

TEST(GraphLifecycle, BoundCudnnPlannerRefusesWhatItCannotServeInsteadOfSwitching) {
  const AttentionDomain d = standard_domain();
  // 32 sequences x 32 heads: the smallest replay's work is exactly the crossover (1024).
  const GraphCapacity cap = decode_capacity(32, 1024);
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(32, 1, cap);
  ASSERT_EQ(planner.bind_to_graph(d, cap, rep.view()).provider, AttentionProvider::kCudnn);

  OwnedBatch ok = decode_batch(32, 1024, cap);
  EXPECT_NO_THROW(planner.plan(d, ok.view()));
  // Inconsistent metadata: cannot be served, and the graph must not silently change.
  AttentionBatchView lying = ok.view();
  lying.max_kv_len = 512;
  EXPECT_THROW(planner.plan(d, lying), Error);
  // KV beyond the capacity.
  OwnedBatch longer = uniform_batch(32, 1, 1025, 16, cap.max_pages_per_seq * 16 + 16);
  EXPECT_THROW(planner.plan(d, longer.view()), Error);
  // Another batch size (replays are padded to the capacity).
  OwnedBatch fewer = decode_batch(31, 10, cap);
  EXPECT_THROW(planner.plan(d, fewer.view()), Error);
  // A prefill batch in a decode graph.
  std::vector<int32_t> q(32, 1);
  q[0] = 2;
  OwnedBatch prefill = make_batch(q, std::vector<int32_t>(32, 10), 16, cap.max_pages_per_seq * 16);
  EXPECT_THROW(planner.plan(d, prefill.view()), Error);
  // Another attention shape.
  AttentionDomain other = d;
  other.num_kv_heads = 4;
  EXPECT_THROW(planner.plan(other, ok.view()), Error);
  // After every refusal the planner is still bound to cuDNN and serves valid batches.
  EXPECT_EQ(planner.plan(d, ok.view()).provider, AttentionProvider::kCudnn);
  try {
    planner.plan(d, longer.view());
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not fit the graph's capacity"), std::string::npos) << m;
    EXPECT_NE(m.find("KV up to 1024"), std::string::npos) << m;
  }
}

TEST(GraphLifecycle, KvBeyondTheCapacityButWithinTheTableIsRefused) {
  // Capacity 1000 in a 63-page (1008-token) row: KV 1000 replays, KV 1005 fits the table but
  // not the capacity the cuDNN plan was built for.
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(32, 1000);
  ASSERT_EQ(cap.max_pages_per_seq * 16, 1008);
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(32, 1, cap);
  ASSERT_EQ(planner.bind_to_graph(d, cap, rep.view()).provider, AttentionProvider::kCudnn);
  OwnedBatch at = decode_batch(32, 1000, cap);
  EXPECT_EQ(planner.plan(d, at.view()).cudnn_key.max_kv_len, 1008);  // s_kv: the whole row
  OwnedBatch beyond = decode_batch(32, 1005, cap);
  EXPECT_THROW(planner.plan(d, beyond.view()), Error);
}

TEST(GraphLifecycle, BindingIsExclusiveAndReleasable) {
  const AttentionDomain d = standard_domain();
  const GraphCapacity cap = decode_capacity(4, 256);
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  OwnedBatch rep = decode_batch(4, 1, cap);
  planner.bind_to_graph(d, cap, rep.view());
  EXPECT_TRUE(planner.graph_bound());
  EXPECT_THROW(planner.bind_to_graph(d, cap, rep.view()), Error);
  planner.release_graph();
  EXPECT_FALSE(planner.graph_bound());
  // Unbound again: eager semantics (no eager decode entry in the table -> native).
  OwnedBatch b = decode_batch(4, 200, cap);
  const AttentionPlan& p = planner.plan(d, b.view());
  EXPECT_FALSE(p.graph_bound);
  EXPECT_EQ(p.provider, AttentionProvider::kNative);
  EXPECT_EQ(p.rules[3].reason, Reason::kNoEntry);
}

TEST(GraphLifecycle, MalformedCapacityAndMisfitRepresentativeAreErrors) {
  const AttentionDomain d = standard_domain();
  const CrossoverTables tables = test::standard_tables();
  AttentionPlanner planner(config(&tables));
  GraphCapacity cap = decode_capacity(4, 256);
  OwnedBatch rep = decode_batch(4, 1, cap);
  GraphCapacity zero = cap;
  zero.num_seqs = 0;
  EXPECT_THROW(planner.bind_to_graph(d, zero, rep.view()), Error);
  GraphCapacity beyond_table = cap;
  beyond_table.kv_len_capacity = cap.max_pages_per_seq * 16 + 1;
  EXPECT_THROW(planner.bind_to_graph(d, beyond_table, rep.view()), Error);
  OwnedBatch wrong = decode_batch(5, 1, cap);
  EXPECT_THROW(planner.bind_to_graph(d, cap, wrong.view()), Error);
  EXPECT_FALSE(planner.graph_bound());
}

TEST(GraphLifecycle, ExplicitCudnnCannotCaptureRaggedPrefill) {
  const AttentionDomain d = standard_domain();
  AttentionPlanner planner(config(nullptr, AttentionBackendChoice::kCudnn));
  GraphCapacity cap;
  cap.num_seqs = 2;
  cap.max_num_tokens = 256;
  cap.max_query_len = 128;
  cap.max_pages_per_seq = 64;
  cap.kv_len_capacity = 1024;
  OwnedBatch rep = make_batch({128, 100}, {300, 100}, 16, 1024);
  try {
    planner.bind_to_graph(d, cap, rep.view());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph capture"), std::string::npos) << e.what();
  }
}

// The reservation: host arrays for capacity.num_seqs, made once at binding, linear in the
// batch, and never reallocated by re-plans within the capacity.
TEST(GraphLifecycle, ReservationIsLinearInTheBatch) {
  const AttentionDomain d = standard_domain();
  const CrossoverTables tables = test::standard_tables();
  size_t bytes[2];
  const int32_t sizes[2] = {16, 256};
  for (int i = 0; i < 2; ++i) {
    AttentionPlanner planner(config(&tables));
    const GraphCapacity cap = decode_capacity(sizes[i], 32768);
    OwnedBatch rep = decode_batch(sizes[i], 1, cap);
    planner.bind_to_graph(d, cap, rep.view());
    bytes[i] = planner.reserved_bytes();
    // One int32 per sequence (query lengths) and one per offset (num_seqs + 1): no term in
    // the KV capacity, none quadratic in the batch.
    EXPECT_EQ(bytes[i], (2 * static_cast<size_t>(sizes[i]) + 1) * sizeof(int32_t));
  }
  EXPECT_EQ(bytes[1] - bytes[0], (256 - 16) * 2 * sizeof(int32_t));
}

TEST(GraphLifecycle, ReplansWithinTheCapacityNeverReallocate) {
  // Explicit cudnn on an eager prefill planner that has seen its largest batch: arrays are
  // filled in place for every smaller or equal batch (their addresses are what an upload
  // reads from).
  const AttentionDomain d = standard_domain();
  AttentionPlanner planner(config(nullptr, AttentionBackendChoice::kCudnn));
  OwnedBatch largest = uniform_batch(256, 4, 64, 16, 4096);
  const AttentionPlan& first = planner.plan(d, largest.view());
  const int32_t* q_data = first.cudnn_seq_len_q.data();
  const int32_t* off_data = first.cudnn_ragged_offsets.data();
  const size_t reserved = planner.reserved_bytes();
  for (int n : {1, 17, 255, 256}) {
    OwnedBatch b = uniform_batch(n, 3, 4000, 16, 4096);
    const AttentionPlan& p = planner.plan(d, b.view());
    ASSERT_EQ(p.provider, AttentionProvider::kCudnn);
    EXPECT_EQ(p.cudnn_seq_len_q.size(), static_cast<size_t>(n));
    EXPECT_EQ(p.cudnn_seq_len_q.data(), q_data);
    EXPECT_EQ(p.cudnn_ragged_offsets.data(), off_data);
    EXPECT_EQ(planner.reserved_bytes(), reserved);
  }
}

TEST(GraphLifecycle, PlanTimeStaysLinearInTheBatch) {
  // plan() walks the batch once. A generous bound (a quadratic walk over 256 sequences
  // would be ~16x slower per sequence than over 16) that still holds on a loaded machine:
  // per-sequence cost at 256 within 4x of that at 16, best of several runs.
  const AttentionDomain d = standard_domain();
  const CrossoverTables tables = test::standard_tables();
  double per_seq[2];
  const int32_t sizes[2] = {16, 256};
  for (int i = 0; i < 2; ++i) {
    AttentionPlanner planner(config(&tables));
    OwnedBatch b = uniform_batch(sizes[i], 64, 2048, 16, 2048);
    double best = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      const int iters = 2000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < iters; ++k) planner.plan(d, b.view());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s / iters);
    }
    per_seq[i] = best / sizes[i];
  }
  EXPECT_LT(per_seq[1], per_seq[0] * 4) << "per-sequence plan() time grew with the batch: "
                                        << per_seq[0] * 1e9 << " ns at 16, "
                                        << per_seq[1] * 1e9 << " ns at 256";
}

}  // namespace
}  // namespace pagellm
