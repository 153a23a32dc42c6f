// Table-driven tests of every admission rule of `--attention-backend auto` at its edges,
// and of the explicit choices. A case that fails a rule must fall back to native with that
// rule as the decider (auto) or throw an Error that names it (explicit cudnn).
#include <gtest/gtest.h>

#include <climits>
#include <functional>
#include <random>

#include "fixtures.h"
#include "pagellm/attention/explain.h"

namespace pagellm {
namespace {

using test::FakeRegistry;
using test::h200;
using test::make_batch;
using test::OwnedBatch;
using test::standard_domain;
using test::standard_tables;
using test::uniform_batch;

constexpr int kDomainRule = 0, kConsistencyRule = 1, kWorkRule = 2, kDeviceRule = 3,
              kPlanRule = 4;

// A prefill batch comfortably past the standard table's eager crossover (1e6): 4 x 512.
OwnedBatch admitted_prefill() { return uniform_batch(4, 512, 512); }

struct Scenario {
  AttentionDomain domain = standard_domain();
  DeviceProfile device = h200();
  CrossoverTables tables = standard_tables();
  AttentionBackendChoice choice = AttentionBackendChoice::kAuto;
  LaunchMode mode = LaunchMode::kEager;
};

const AttentionPlan& plan_with(AttentionPlanner& planner, const Scenario& s,
                               const AttentionBatchView& v) {
  return planner.plan(s.domain, v, s.mode);
}

AttentionPlanner make_planner(const Scenario& s, CudnnPlanRegistry* registry = nullptr) {
  AttentionPlannerConfig c;
  c.choice = s.choice;
  c.device = s.device;
  c.tables = &s.tables;
  c.registry = registry;
  return AttentionPlanner(c);
}

TEST(AdmissionRules, BaselineIsAdmittedByEveryRule) {
  Scenario s;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = admitted_prefill();
  const AttentionPlan& p = plan_with(planner, s, b.view());
  EXPECT_EQ(p.provider, AttentionProvider::kCudnn) << p.summary();
  EXPECT_EQ(p.decided_by, -1);
  EXPECT_EQ(p.reason, Reason::kPassed);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.rules[r].verdict, Verdict::kPass) << "rule " << r + 1;
  EXPECT_EQ(p.rules[kPlanRule].reason, Reason::kPlanNotChecked);
  EXPECT_EQ(p.work, 4 * int64_t{32} * causal_pairs(512, 512));
  EXPECT_EQ(p.phase, AttentionPhase::kPrefill);
}

// ---- rule 1: static domain ---------------------------------------------------------------

struct DomainCase {
  const char* name;
  std::function<void(Scenario&, OwnedBatch&, AttentionBatchView&)> mutate;
  Reason expected;  // kPassed: rule 1 must pass
  int64_t value = 0, limit = 0;
  bool check_numbers = false;
};

TEST(AdmissionRules, DomainEdges) {
  const std::vector<DomainCase> cases = {
      {"no cuDNN", [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 0; },
       Reason::kNoCudnn},
      {"prefill needs 9.8 (ragged + paged): 9.7.1",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 90701; },
       Reason::kCudnnTooOld, 90701, 90800, true},
      {"prefill on exactly 9.8.0",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 90800; },
       Reason::kPassed},
      {"decode needs 9.5 (paged): 9.4.0",
       [](Scenario& s, OwnedBatch& b, AttentionBatchView& v) {
         s.device.cudnn_version = 90400;
         b = uniform_batch(8, 1, 100);
         v = b.view();
       },
       Reason::kCudnnTooOld, 90400, 90500, true},
      {"decode on exactly 9.5.0",
       [](Scenario& s, OwnedBatch& b, AttentionBatchView& v) {
         s.device.cudnn_version = 90500;
         b = uniform_batch(8, 1, 100);
         v = b.view();
       },
       Reason::kPassed},
      {"9.10.0 excluded",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 91000; },
       Reason::kCudnnKnownBad},
      {"9.10.1 excluded",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 91001; },
       Reason::kCudnnKnownBad},
      {"9.10.2 accepted",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 91002; },
       Reason::kPassed},
      {"compute capability 7.5",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) {
         s.device.cc_major = 7;
         s.device.cc_minor = 5;
       },
       Reason::kComputeCapability, 75, 80, true},
      {"f32", [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.dtype = DType::F32; },
       Reason::kDtype},
      {"f16 accepted",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.dtype = DType::F16; },
       Reason::kPassed},
      {"head_dim 100 (not a multiple of 8)",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.head_dim = 100; },
       Reason::kHeadDim, 100, 256, true},
      {"head_dim 256 on 9.9 (paged limit 128)",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) {
         s.device.cudnn_version = 90900;
         s.domain.head_dim = 256;
       },
       Reason::kHeadDim, 256, 128, true},
      {"head_dim 128 on 9.9",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.device.cudnn_version = 90900; },
       Reason::kPassed},
      {"head_dim 256 on 9.14",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.head_dim = 256; },
       Reason::kPassed},
      {"head_dim 264 on 9.14",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.head_dim = 264; },
       Reason::kHeadDim},
      {"GQA 30/8", [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.num_q_heads = 30; },
       Reason::kGqaRatio, 30, 8, true},
      {"MQA 32/1 accepted",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.num_kv_heads = 1; },
       Reason::kPassed},
      {"zero KV heads",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.num_kv_heads = 0; },
       Reason::kHeadCounts},
      {"page size 0",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.domain.page_size = 0; },
       Reason::kPageSize},
      {"page size 1025",
       [](Scenario& s, OwnedBatch& b, AttentionBatchView& v) {
         s.domain.page_size = 1025;
         b = make_batch({512, 512}, {512, 512}, 1025);
         v = b.view();
       },
       Reason::kPageSize, 1025, 1024, true},
      {"page size 1024 accepted",
       [](Scenario& s, OwnedBatch& b, AttentionBatchView& v) {
         s.domain.page_size = 1024;
         b = make_batch({512, 512}, {512, 512}, 1024);
         v = b.view();
       },
       Reason::kPassed},
      {"empty batch",
       [](Scenario&, OwnedBatch& b, AttentionBatchView& v) {
         b = OwnedBatch{};
         v = b.view();
       },
       Reason::kBatchRange},
      {"declared KV beyond the page-table row",
       [](Scenario&, OwnedBatch& b, AttentionBatchView& v) {
         v.max_kv_len = b.max_pages_per_seq * 16 + 1;
       },
       Reason::kKvRange},
      {"page-table row beyond cuDNN's int KV dimension",
       [](Scenario&, OwnedBatch& b, AttentionBatchView& v) {
         // 2^27 pages x 16 = 2^31 tokens per row: the graph's s_kv would not fit an int.
         v.max_pages_per_seq = 1 << 27;
         v.page_table_size = static_cast<size_t>(v.num_seqs) * v.max_pages_per_seq;
         (void)b;
       },
       Reason::kKvRange, int64_t{1} << 31, INT32_MAX, true},
      {"graph: ragged prefill is never captured on cuDNN",
       [](Scenario& s, OwnedBatch&, AttentionBatchView&) { s.mode = LaunchMode::kGraph; },
       Reason::kGraphRagged},
  };
  for (const DomainCase& c : cases) {
    SCOPED_TRACE(c.name);
    Scenario s;
    OwnedBatch b = admitted_prefill();
    AttentionBatchView v = b.view();
    c.mutate(s, b, v);
    AttentionPlanner planner = make_planner(s);
    const AttentionPlan& p = planner.plan(s.domain, v, s.mode);
    EXPECT_EQ(p.rules[kDomainRule].reason, c.expected) << describe(AdmissionRule::kDomain, p.rules[0]);
    if (c.expected == Reason::kPassed) {
      EXPECT_EQ(p.rules[kDomainRule].verdict, Verdict::kPass);
      continue;
    }
    EXPECT_EQ(p.rules[kDomainRule].verdict, Verdict::kFail);
    EXPECT_EQ(p.provider, AttentionProvider::kNative);
    EXPECT_EQ(p.decided_by, kDomainRule);
    if (c.check_numbers) {
      EXPECT_EQ(p.rules[kDomainRule].value, c.value);
      EXPECT_EQ(p.rules[kDomainRule].limit, c.limit);
    }
    // The same call under explicit cudnn is an error naming rule 1.
    Scenario forced = s;
    forced.choice = AttentionBackendChoice::kCudnn;
    AttentionPlanner strict = make_planner(forced);
    try {
      strict.plan(forced.domain, v, forced.mode);
      ADD_FAILURE() << "explicit cudnn accepted a call outside its domain";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rule 1 (domain)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
    }
  }
}

TEST(AdmissionRules, Int32OffsetEdge) {
  // tokens x Hq x D must fit cuDNN's int32 ragged offsets: 524287 x 32 x 128 fits, one more
  // token does not (2^31).
  Scenario s;
  for (int32_t tokens : {524287, 524288}) {
    OwnedBatch b = make_batch({tokens}, {tokens});
    AttentionPlanner planner = make_planner(s);
    const AttentionPlan& p = planner.plan(s.domain, b.view());
    if (tokens == 524287) {
      EXPECT_NE(p.rules[kDomainRule].reason, Reason::kOffsetOverflow);
    } else {
      EXPECT_EQ(p.rules[kDomainRule].reason, Reason::kOffsetOverflow);
      EXPECT_EQ(p.rules[kDomainRule].value, int64_t{1} << 31);
      EXPECT_EQ(p.provider, AttentionProvider::kNative);
    }
  }
}

// ---- rule 2: consistency -----------------------------------------------------------------

struct ConsistencyCase {
  const char* name;
  std::function<void(OwnedBatch&, AttentionBatchView&)> mutate;
  Reason expected;
  int32_t index = -1;
};

TEST(AdmissionRules, EveryConsistencyFailureStaysNative) {
  const std::vector<ConsistencyCase> cases = {
      {"offsets one entry short",
       [](OwnedBatch& b, AttentionBatchView& v) { v.query_start_size = b.query_start.size() - 1; },
       Reason::kOffsetsSize},
      {"offsets do not start at 0",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b.query_start[0] = 1;
         v = b.view();
         v.num_tokens = b.query_start.back();
       },
       Reason::kOffsetsStart},
      {"offsets end before the declared total",
       [](OwnedBatch&, AttentionBatchView& v) { v.num_tokens += 1; }, Reason::kOffsetsEnd},
      {"offsets end after the declared total",
       [](OwnedBatch&, AttentionBatchView& v) { v.num_tokens -= 1; }, Reason::kOffsetsEnd},
      {"an empty request (q = 0)",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b = make_batch({512, 0, 512}, {512, 10, 512});
         v = b.view();
       },
       Reason::kQueryNotPositive, 1},
      {"decreasing offsets (q < 0)",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b.query_start = {0, 500, 400, 1536, 2048};
         v = b.view();
         v.max_query_len = 512;
       },
       Reason::kQueryNotPositive, 1},
      {"q > kv",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b = make_batch({512, 513}, {512, 512});
         v = b.view();
       },
       Reason::kQueryExceedsKv, 1},
      {"declared max query above the real one",
       [](OwnedBatch&, AttentionBatchView& v) { v.max_query_len += 1; }, Reason::kMaxQueryMismatch},
      {"declared max query below the real one",
       [](OwnedBatch&, AttentionBatchView& v) { v.max_query_len -= 1; }, Reason::kMaxQueryMismatch},
      {"declared max KV above the real one",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b = make_batch({512, 512}, {512, 512}, 16, 1024);
         v = b.view();
         v.max_kv_len += 1;
       },
       Reason::kMaxKvMismatch},
      {"declared max KV below the real one",
       [](OwnedBatch&, AttentionBatchView& v) { v.max_kv_len -= 1; }, Reason::kMaxKvMismatch},
      {"KV lengths one short",
       [](OwnedBatch&, AttentionBatchView& v) { v.kv_lens_size -= 1; }, Reason::kKvLensSize},
      {"page table one row short",
       [](OwnedBatch& b, AttentionBatchView& v) { v.page_table_size -= b.max_pages_per_seq; },
       Reason::kPageTableSize},
      {"a KV length beyond its page-table row",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b = make_batch({512, 512}, {512, 512}, 16, 512);
         b.kv_lens[0] = 513;
         v = b.view();
         v.max_kv_len = 512;  // declared within the table: rule 1 passes, rule 2 must catch it
       },
       Reason::kKvExceedsTable, 0},
      {"declared KV capacity below the real maximum",
       [](OwnedBatch& b, AttentionBatchView& v) {
         b = make_batch({512, 512}, {512, 512}, 16, 1024);
         v = b.view();
         v.kv_len_capacity = 511;
       },
       Reason::kCapacityBelowKv},
  };
  for (const ConsistencyCase& c : cases) {
    SCOPED_TRACE(c.name);
    Scenario s;
    OwnedBatch b = admitted_prefill();
    AttentionBatchView v = b.view();
    c.mutate(b, v);
    AttentionPlanner planner = make_planner(s);
    const AttentionPlan& p = planner.plan(s.domain, v);
    EXPECT_EQ(p.provider, AttentionProvider::kNative);
    EXPECT_EQ(p.rules[kConsistencyRule].verdict, Verdict::kFail);
    EXPECT_EQ(p.rules[kConsistencyRule].reason, c.expected)
        << describe(AdmissionRule::kConsistency, p.rules[kConsistencyRule]);
    if (c.index >= 0) {
      EXPECT_EQ(p.rules[kConsistencyRule].index, c.index);
    }
    if (p.rules[kDomainRule].verdict == Verdict::kPass) {
      EXPECT_EQ(p.decided_by, kConsistencyRule);
    }
    EXPECT_EQ(p.work, -1) << "no work is computed from inconsistent lengths";
    EXPECT_EQ(p.rules[kWorkRule].verdict, Verdict::kNotEvaluated);

    Scenario forced = s;
    forced.choice = AttentionBackendChoice::kCudnn;
    AttentionPlanner strict = make_planner(forced);
    EXPECT_THROW(strict.plan(forced.domain, v), Error);
  }
}

// ---- rule 3: work ------------------------------------------------------------------------

TEST(AdmissionRules, CausalPairsCountBottomRightAlignedKeys) {
  // q = 3, kv = 5: queries at positions 2, 3, 4 see 3, 4 and 5 keys.
  EXPECT_EQ(causal_pairs(3, 5), 12);
  EXPECT_EQ(causal_pairs(1, 4096), 4096);  // decode sees every key
  EXPECT_EQ(causal_pairs(128, 128), 128 * 129 / 2);
  for (int64_t q = 1; q <= 40; ++q) {
    for (int64_t kv = q; kv <= 45; ++kv) {
      int64_t brute = 0;
      for (int64_t i = 0; i < q; ++i) brute += kv - q + i + 1;
      ASSERT_EQ(causal_pairs(q, kv), brute) << q << " " << kv;
    }
  }
}

TEST(AdmissionRules, RaggedBatchIsJudgedByRealWorkNotByMaxima) {
  // One long request and 63 near-empty ones. The product of declared maxima
  // (64 x 2048 x 2048 x heads) is far past the crossover; the causal work actually computed
  // is not.
  std::vector<int32_t> q(64, 1), kv(64, 1);
  q[17] = kv[17] = 2048;
  const int64_t real = test::work_of(q, kv, 32);
  const int64_t maxima = int64_t{64} * 32 * causal_pairs(2048, 2048);
  Scenario s;
  s.tables = CrossoverTables{};
  CrossoverTable t = test::standard_table();
  t.entries[0].min_work = real + 1000;  // between the real work and the product of maxima
  ASSERT_LT(t.entries[0].min_work, maxima);
  s.tables.add(test::every_prefill_class(t));
  OwnedBatch b = make_batch(q, kv);
  AttentionPlanner planner = make_planner(s);
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  EXPECT_EQ(p.provider, AttentionProvider::kNative);
  EXPECT_EQ(p.decided_by, kWorkRule);
  EXPECT_EQ(p.rules[kWorkRule].reason, Reason::kBelowThreshold);
  EXPECT_EQ(p.rules[kWorkRule].value, real);
  EXPECT_EQ(p.work, real);
  // The same number of tokens spread evenly is past the crossover and admitted.
  OwnedBatch even = uniform_batch(64, 33, 33 + 2048);
  EXPECT_EQ(planner.plan(s.domain, even.view()).provider, AttentionProvider::kCudnn);
}

TEST(AdmissionRules, WorkThresholdExactlyAtAndAroundTheEdge) {
  const std::vector<int32_t> q = {100, 7, 300}, kv = {250, 7, 900};
  const int64_t W = test::work_of(q, kv, 32);
  OwnedBatch b = make_batch(q, kv);
  struct Case {
    int64_t min_work, max_work;
    AttentionProvider expected;
    Reason reason;
  };
  const std::vector<Case> cases = {
      {W - 1, W * 10, AttentionProvider::kCudnn, Reason::kPassed},
      {W, W * 10, AttentionProvider::kCudnn, Reason::kPassed},  // at the edge: admitted
      {W + 1, W * 10, AttentionProvider::kNative, Reason::kBelowThreshold},
      {0, W, AttentionProvider::kCudnn, Reason::kPassed},  // at the top edge: admitted
      {0, W - 1, AttentionProvider::kNative, Reason::kAboveMeasured},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "min " << c.min_work << " max " << c.max_work << " W " << W);
    Scenario s;
    s.tables = CrossoverTables{};
    CrossoverTable t = test::standard_table();
    t.entries[0].min_work = c.min_work;
    t.entries[0].max_work = c.max_work;
    s.tables.add(test::every_prefill_class(t));
    AttentionPlanner planner = make_planner(s);
    const AttentionPlan& p = planner.plan(s.domain, b.view());
    EXPECT_EQ(p.provider, c.expected) << p.summary();
    EXPECT_EQ(p.rules[kWorkRule].reason, c.reason);
    EXPECT_EQ(p.work, W);
    if (c.expected == AttentionProvider::kNative) {
      EXPECT_EQ(p.decided_by, kWorkRule);
    }
  }
}

// ---- rules 3 and 4 per shape class ------------------------------------------------------

// A table that admits cuDNN only for chunks of 257-1024 tokens over 4097-16384 keys (what an
// H200 measured: chunk 512 after 8192, 296 against 389 us), from work `min_work`.
CrossoverTables chunk_only_tables(int64_t min_work = 0) {
  CrossoverTable t = test::standard_table();
  t.entries = {test::entry(LaunchMode::kEager, AttentionPhase::kPrefill, 128, min_work,
                           int64_t{1} << 40)};
  t.entries[0].shape_class = classify_shape(512, 512, 8704, false);
  CrossoverTables tables;
  tables.add(t);
  return tables;
}

TEST(AdmissionRules, TheCallsClassEntryDecidesAndNoOtherClassIsAdmitted) {
  Scenario s;
  s.tables = chunk_only_tables();
  AttentionPlanner planner = make_planner(s);
  // Chunk 512 after 8192 cached tokens: its class has an entry.
  OwnedBatch chunk = make_batch({512}, {8704});
  const AttentionPlan& p = planner.plan(s.domain, chunk.view());
  EXPECT_EQ(p.provider, AttentionProvider::kCudnn) << p.summary();
  ASSERT_NE(p.entry, nullptr);
  EXPECT_EQ(p.entry->shape_class, p.shape_class);
  // Fresh 2048 (more work, another class) and the chunk with 63 decode rows (ragged) are
  // native by rule 4, which names the class that has no entry.
  OwnedBatch fresh = make_batch({2048}, {2048});
  std::vector<int32_t> q(64, 1), kv(64, 100);
  q[0] = 512;
  kv[0] = 8704;
  OwnedBatch mixed = make_batch(q, kv);
  OwnedBatch wider = make_batch({512}, {20000});  // the next KV bucket up
  struct Case {
    const OwnedBatch* batch;
    const char* cls;
  };
  for (const Case& c : {Case{&fresh, "q1025-4096 kv1025-4096 uniform"},
                        Case{&mixed, "q257-1024 kv4097-16384 ragged"},
                        Case{&wider, "q257-1024 kv16385-65536 uniform"}}) {
    SCOPED_TRACE(c.cls);
    const AttentionPlan& n = planner.plan(s.domain, c.batch->view());
    EXPECT_EQ(n.provider, AttentionProvider::kNative);
    EXPECT_EQ(n.decided_by, kDeviceRule);
    EXPECT_EQ(n.rules[kDeviceRule].reason, Reason::kNoEntry);
    EXPECT_EQ(n.rules[kWorkRule].reason, Reason::kNoThreshold);  // no entry, no threshold
    EXPECT_EQ(shape_class_name(n.shape_class), c.cls);
    EXPECT_EQ(n.entry, nullptr);
    EXPECT_NE(describe(AdmissionRule::kDevice, n.rules[kDeviceRule]).find(c.cls),
              std::string::npos)
        << describe(AdmissionRule::kDevice, n.rules[kDeviceRule]);
  }
}

TEST(AdmissionRules, RuleThreeUsesTheRangeOfTheCallsClassEntry) {
  OwnedBatch chunk = make_batch({512}, {8704});
  const int64_t W = test::work_of({512}, {8704}, 32);
  Scenario s;
  CrossoverTable t = test::every_prefill_class(test::standard_table());
  // Every other class admits from 0; the chunk's own class only from W + 1.
  for (CrossoverEntry& e : t.entries) {
    e.min_work = e.shape_class == classify_shape(512, 512, 8704, false) ? W + 1 : 0;
  }
  s.tables = CrossoverTables{};
  s.tables.add(t);
  AttentionPlanner planner = make_planner(s);
  const AttentionPlan& p = planner.plan(s.domain, chunk.view());
  EXPECT_EQ(p.provider, AttentionProvider::kNative);
  EXPECT_EQ(p.decided_by, kWorkRule);
  EXPECT_EQ(p.rules[kWorkRule].reason, Reason::kBelowThreshold);
  EXPECT_EQ(p.rules[kWorkRule].limit, W + 1);
  EXPECT_EQ(p.min_work, W + 1);
  s.tables = chunk_only_tables(W);
  AttentionPlanner at_edge = make_planner(s);
  EXPECT_EQ(at_edge.plan(s.domain, chunk.view()).provider, AttentionProvider::kCudnn);
}

// ---- rule 4: device ----------------------------------------------------------------------

struct DeviceCase {
  const char* name;
  std::function<void(Scenario&, OwnedBatch&)> mutate;
  Reason expected;
};

TEST(AdmissionRules, DeviceTableEdges) {
  const std::vector<DeviceCase> cases = {
      {"no tables at all", [](Scenario& s, OwnedBatch&) { s.tables = CrossoverTables{}; },
       Reason::kUnknownDevice},
      {"an unknown device name", [](Scenario& s, OwnedBatch&) { s.device.name = "NVIDIA H100 80GB HBM3"; },
       Reason::kUnknownDevice},
      {"same name, other SM count (a cut-down part)",
       [](Scenario& s, OwnedBatch&) { s.device.sm_count = 114; }, Reason::kUnknownDevice},
      {"same name, other compute capability",
       [](Scenario& s, OwnedBatch&) { s.device.cc_minor = 1; }, Reason::kUnknownDevice},
      {"measured with another cuDNN",
       [](Scenario& s, OwnedBatch&) { s.device.cudnn_version = 91900; }, Reason::kOtherCudnnVersion},
      {"no entry for this head_dim",
       [](Scenario& s, OwnedBatch&) { s.domain.head_dim = 64; }, Reason::kNoEntry},
      {"no eager decode entry",
       [](Scenario&, OwnedBatch& b) { b = uniform_batch(256, 1, 32768); }, Reason::kNoEntry},
      {"page size not measured",
       [](Scenario& s, OwnedBatch& b) {
         s.domain.page_size = 64;
         b = make_batch({512, 512, 512, 512}, {512, 512, 512, 512}, 64);
       },
       Reason::kPageSizeNotMeasured},
      {"GQA ratio not measured",
       [](Scenario& s, OwnedBatch&) { s.domain.num_kv_heads = 16; }, Reason::kGqaNotMeasured},
      {"batch larger than measured",
       [](Scenario&, OwnedBatch& b) { b = uniform_batch(257, 16, 16); }, Reason::kBatchNotMeasured},
      {"query longer than measured",
       [](Scenario&, OwnedBatch& b) { b = make_batch({8193}, {8193}); }, Reason::kQueryNotMeasured},
      {"KV longer than measured",
       [](Scenario&, OwnedBatch& b) { b = make_batch({512}, {32769}); }, Reason::kKvNotMeasured},
  };
  for (const DeviceCase& c : cases) {
    SCOPED_TRACE(c.name);
    Scenario s;
    OwnedBatch b = admitted_prefill();
    c.mutate(s, b);
    AttentionPlanner planner = make_planner(s);
    const AttentionPlan& p = planner.plan(s.domain, b.view());
    ASSERT_EQ(p.rules[kDomainRule].verdict, Verdict::kPass)
        << describe(AdmissionRule::kDomain, p.rules[0]);
    ASSERT_EQ(p.rules[kConsistencyRule].verdict, Verdict::kPass);
    EXPECT_EQ(p.provider, AttentionProvider::kNative);
    EXPECT_EQ(p.rules[kDeviceRule].reason, c.expected)
        << describe(AdmissionRule::kDevice, p.rules[kDeviceRule]);
    if (p.rules[kWorkRule].verdict != Verdict::kFail) {
      EXPECT_EQ(p.decided_by, kDeviceRule);
    }
  }
}

TEST(AdmissionRules, OtherCudnnVersionNamesTheMeasuredOne) {
  Scenario s;
  s.device.cudnn_version = 91900;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = admitted_prefill();
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  EXPECT_EQ(p.rules[kDeviceRule].value, 91900);
  EXPECT_EQ(p.rules[kDeviceRule].limit, 91400);
  const std::string text = describe(AdmissionRule::kDevice, p.rules[kDeviceRule]);
  EXPECT_NE(text.find("9.14.0"), std::string::npos) << text;
  EXPECT_NE(text.find("9.19.0"), std::string::npos) << text;
}

TEST(AdmissionRules, WorkRuleDecidesBeforeDeviceRuleWhenBothFail) {
  // A tiny batch on a device whose table has the entry but not the page size: rule 3 fails
  // first, and decides.
  Scenario s;
  s.domain.page_size = 64;
  OwnedBatch b = make_batch({4}, {4}, 64);
  AttentionPlanner planner = make_planner(s);
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  EXPECT_EQ(p.rules[kWorkRule].reason, Reason::kBelowThreshold);
  EXPECT_EQ(p.rules[kDeviceRule].reason, Reason::kPageSizeNotMeasured);
  EXPECT_EQ(p.decided_by, kWorkRule);
}

// ---- rule 5: plan ready ------------------------------------------------------------------

TEST(AdmissionRules, AutoNeverBuildsAPlanOnTheHotPath) {
  Scenario s;
  FakeRegistry registry;
  AttentionPlanner planner = make_planner(s, &registry);
  OwnedBatch b = admitted_prefill();
  const AttentionPlan& first = planner.plan(s.domain, b.view());
  EXPECT_EQ(first.provider, AttentionProvider::kNative);
  EXPECT_EQ(first.decided_by, kPlanRule);
  EXPECT_EQ(first.rules[kPlanRule].reason, Reason::kPlanNotBuilt);
  ASSERT_EQ(registry.requested.size(), 1u);
  const CudnnPlanKey key = registry.requested[0];
  // Built off the hot path, the next forward of the same shape goes to cuDNN.
  registry.built.insert(key);
  const AttentionPlan& second = planner.plan(s.domain, b.view());
  EXPECT_EQ(second.provider, AttentionProvider::kCudnn);
  EXPECT_EQ(second.cudnn_key, key);
  EXPECT_EQ(second.rules[kPlanRule].verdict, Verdict::kPass);
  EXPECT_EQ(registry.requested.size(), 1u);
}

TEST(AdmissionRules, ExplicitCudnnMarksAMissingPlanInsteadOfFallingBack) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  FakeRegistry registry;
  AttentionPlanner planner = make_planner(s, &registry);
  OwnedBatch b = admitted_prefill();
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  EXPECT_EQ(p.provider, AttentionProvider::kCudnn);
  EXPECT_TRUE(p.cudnn_plan_missing);
  EXPECT_TRUE(registry.requested.empty());
}

// ---- explicit choices --------------------------------------------------------------------

TEST(AdmissionRules, NativeChoiceSkipsEveryRule) {
  Scenario s;
  s.choice = AttentionBackendChoice::kNative;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = admitted_prefill();
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  EXPECT_EQ(p.provider, AttentionProvider::kNative);
  EXPECT_EQ(p.reason, Reason::kExplicitChoice);
  for (const RuleResult& r : p.rules) EXPECT_EQ(r.verdict, Verdict::kSkipped);
}

TEST(AdmissionRules, ExplicitCudnnIgnoresTablesAndWork) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  s.tables = CrossoverTables{};  // nothing measured
  AttentionPlanner planner = make_planner(s);
  OwnedBatch tiny = make_batch({1, 2}, {5, 2});
  const AttentionPlan& p = planner.plan(s.domain, tiny.view());
  EXPECT_EQ(p.provider, AttentionProvider::kCudnn);
  EXPECT_EQ(p.rules[kWorkRule].verdict, Verdict::kSkipped);
  EXPECT_EQ(p.rules[kDeviceRule].verdict, Verdict::kSkipped);
}

TEST(AdmissionRules, ExplicitCudnnWithoutCudnnIsAClearError) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  s.device.cudnn_version = 0;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = admitted_prefill();
  try {
    planner.plan(s.domain, b.view());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--attention-backend cudnn cannot serve"), std::string::npos) << m;
    EXPECT_NE(m.find("no cuDNN library is loaded"), std::string::npos) << m;
  }
}

TEST(AdmissionRules, AutoNeverThrowsWhateverTheMetadata) {
  // Random, mostly malformed batches and shapes: auto must always answer (native when in
  // doubt), never throw.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-3, 40), pick(0, 9);
  Scenario s;
  AttentionPlanner planner = make_planner(s);
  int cudnn = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int n = std::max(0, small(rng) / 4);
    std::vector<int32_t> q(n), kv(n);
    for (int i = 0; i < n; ++i) {
      q[i] = small(rng) * (pick(rng) == 0 ? 64 : 16);
      kv[i] = q[i] + small(rng) * 16;
    }
    OwnedBatch b = make_batch(q, kv);
    AttentionBatchView v = b.view();
    if (pick(rng) == 0) v.max_query_len += small(rng);
    if (pick(rng) == 0) v.num_tokens += small(rng);
    if (pick(rng) == 0) v.kv_len_capacity = small(rng) * 64;
    AttentionDomain d = s.domain;
    if (pick(rng) == 0) d.head_dim = small(rng) * 8;
    if (pick(rng) == 0) d.num_kv_heads = small(rng);
    if (pick(rng) == 0) d.page_size = small(rng);
    const LaunchMode mode = pick(rng) < 2 ? LaunchMode::kGraph : LaunchMode::kEager;
    const AttentionPlan* p = nullptr;
    ASSERT_NO_THROW(p = &planner.plan(d, v, mode)) << "iteration " << iter;
    if (p->provider == AttentionProvider::kCudnn) {
      ++cudnn;
      // Whatever was admitted really is consistent.
      for (int r = 0; r < 4; ++r) ASSERT_EQ(p->rules[r].verdict, Verdict::kPass);
    }
  }
  EXPECT_GT(cudnn, 0) << "the random batches never reached cuDNN; the test is too weak";
}

// ---- what a cuDNN plan carries ------------------------------------------------------------

TEST(AdmissionRules, CudnnPrefillArraysAndKey) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = make_batch({3, 70, 1}, {3, 300, 1000}, 16, 2048);
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  ASSERT_EQ(p.provider, AttentionProvider::kCudnn);
  EXPECT_EQ(p.cudnn_seq_len_q, (std::vector<int32_t>{3, 70, 1}));
  const int32_t row = 32 * 128;
  EXPECT_EQ(p.cudnn_ragged_offsets, (std::vector<int32_t>{0, 3 * row, 73 * row, 74 * row}));
  EXPECT_TRUE(p.cudnn_key.ragged);
  EXPECT_EQ(p.cudnn_key.num_seqs, 3);
  EXPECT_EQ(p.cudnn_key.max_query_len, 128);  // 70 -> next power of two
  EXPECT_EQ(p.cudnn_key.max_kv_len, 2048);    // the row's capacity (128 pages x 16), not KV 1000
  EXPECT_EQ(p.cudnn_key.max_pages_per_seq, 128);
  EXPECT_EQ(p.cudnn_key.num_q_heads, 32);
  EXPECT_EQ(p.cudnn_key.num_kv_heads, 8);
}

TEST(AdmissionRules, CudnnDecodeIsDenseAndCarriesNoArrays) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = make_batch({1, 1, 1}, {5, 900, 17}, 16, 960);
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  ASSERT_EQ(p.provider, AttentionProvider::kCudnn);
  EXPECT_EQ(p.phase, AttentionPhase::kDecode);
  EXPECT_FALSE(p.cudnn_key.ragged);
  EXPECT_EQ(p.cudnn_key.max_query_len, 1);
  EXPECT_EQ(p.cudnn_key.max_kv_len, 960);  // the row's capacity (60 pages x 16)
  EXPECT_TRUE(p.cudnn_seq_len_q.empty());
  EXPECT_TRUE(p.cudnn_ragged_offsets.empty());
}

TEST(AdmissionRules, PlanKeyBuckets) {
  EXPECT_EQ(bucket_pow2(1, 64), 64);
  EXPECT_EQ(bucket_pow2(64, 64), 64);
  EXPECT_EQ(bucket_pow2(65, 64), 128);
  EXPECT_EQ(bucket_pow2(5000, 256), 8192);
  EXPECT_EQ(bucket_pow2(INT32_MAX, 1), 1 << 30);
  // Two batches in the same buckets share a plan; crossing a bucket changes it.
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch a = make_batch({100, 60}, {300, 60}, 16, 4096);
  OwnedBatch b = make_batch({128, 2}, {512, 200}, 16, 4096);
  OwnedBatch c = make_batch({129, 2}, {512, 200}, 16, 4096);
  const CudnnPlanKey ka = planner.plan(s.domain, a.view()).cudnn_key;
  const CudnnPlanKey kb = planner.plan(s.domain, b.view()).cudnn_key;
  const CudnnPlanKey kc = planner.plan(s.domain, c.view()).cudnn_key;
  EXPECT_EQ(ka, kb);
  EXPECT_NE(kb, kc);
  EXPECT_EQ(CudnnPlanKeyHash{}(ka), CudnnPlanKeyHash{}(kb));
}

// cuDNN's paged loads need ceil(s_kv / page_size) == the page-table row length, so the
// key's KV dimension is the row's capacity whatever the lengths: the engine's rows
// (max_model_len / page_size pages) with short KV, page sizes that do not divide a
// power of two bucket, and a decode graph's capacity below the row all get s_kv = row.
TEST(AdmissionRules, PlanKeyKvIsThePageTableRowCapacity) {
  Scenario s;
  s.choice = AttentionBackendChoice::kCudnn;
  struct Case {
    std::vector<int32_t> q, kv;
    int32_t page, table_tokens, capacity;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1, 1}, {1000, 3, 17, 999}, 16, 40960, 0},  // engine row: 2560 pages of 16
      {{1, 1}, {1000, 1}, 16, 40960, 40960},             // engine decode graph
      {{1, 1}, {1000, 1}, 16, 1024, 1000},               // capacity 1000 in a 64-page row
      {{50, 3}, {200, 60}, 64, 320, 0},                  // 5 pages of 64
      {{50, 3}, {200, 60}, 128, 384, 0},                 // 3 pages of 128
      {{5, 2}, {7, 2}, 1, 9, 0},                         // pages of one token
  };
  for (const Case& c : cases) {
    s.domain.page_size = c.page;
    AttentionPlanner planner = make_planner(s);
    OwnedBatch b = make_batch(c.q, c.kv, c.page, c.table_tokens);
    b.kv_len_capacity = c.capacity;
    const LaunchMode mode = c.capacity > 0 ? LaunchMode::kGraph : LaunchMode::kEager;
    const AttentionPlan& p = planner.plan(s.domain, b.view(), mode);
    ASSERT_EQ(p.provider, AttentionProvider::kCudnn) << p.summary();
    SCOPED_TRACE(p.cudnn_key.describe());
    EXPECT_EQ(p.cudnn_key.max_pages_per_seq, b.max_pages_per_seq);
    EXPECT_EQ(p.cudnn_key.max_kv_len, b.max_pages_per_seq * c.page);
    EXPECT_EQ((p.cudnn_key.max_kv_len + c.page - 1) / c.page, p.cudnn_key.max_pages_per_seq);
  }
}

// ---- explain ------------------------------------------------------------------------------

TEST(AdmissionRules, ExplainNamesTheDecidingRule) {
  Scenario s;
  AttentionPlanner planner = make_planner(s);
  OwnedBatch b = make_batch({4}, {4});
  const AttentionPlan& p = planner.plan(s.domain, b.view());
  const std::string text = explain_text(p, s.domain, s.device);
  EXPECT_NE(text.find("provider:    native"), std::string::npos) << text;
  EXPECT_NE(text.find("rule 3 (work)"), std::string::npos) << text;
  EXPECT_NE(text.find("below the measured crossover 1000000"), std::string::npos) << text;
  const std::string json = explain_json(p, s.domain, s.device);
  EXPECT_NE(json.find("\"decided_by\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"provider\": \"native\""), std::string::npos) << json;
}

TEST(AdmissionRules, ExplainShowsTheClassAndItsEntryOrItsAbsence) {
  Scenario s;
  s.tables = chunk_only_tables(1000);
  AttentionPlanner planner = make_planner(s);
  OwnedBatch chunk = make_batch({512}, {8704});
  const AttentionPlan& p = planner.plan(s.domain, chunk.view());
  std::string text = explain_text(p, s.domain, s.device);
  EXPECT_NE(text.find("class:       q257-1024 kv4097-16384 uniform (512 query tokens, largest "
                      "query 512, largest KV 8704, query lengths equal)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("entry:       cuDNN measured faster in this class for work in [1000, "),
            std::string::npos)
      << text;
  std::string json = explain_json(p, s.domain, s.device);
  EXPECT_NE(json.find("\"class\": \"q257-1024 kv4097-16384 uniform\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"min_work\": 1000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"table_consulted\": true"), std::string::npos) << json;

  OwnedBatch fresh = make_batch({2048}, {2048});
  const AttentionPlan& q = planner.plan(s.domain, fresh.view());
  text = explain_text(q, s.domain, s.device);
  EXPECT_NE(text.find("entry:       none: the device's table has no entry for shape class "
                      "q1025-4096 kv1025-4096 uniform"),
            std::string::npos)
      << text;
  json = explain_json(q, s.domain, s.device);
  EXPECT_NE(json.find("\"entry\": null"), std::string::npos) << json;

  // A decode call names its one class; with no table at all, no entry line is claimed
  // beyond rule 4's reason.
  s.tables = CrossoverTables{};
  AttentionPlanner bare = make_planner(s);
  OwnedBatch decode = uniform_batch(8, 1, 3000);
  text = explain_text(bare.plan(s.domain, decode.view()), s.domain, s.device);
  EXPECT_NE(text.find("class:       decode (every query one token"), std::string::npos) << text;
  EXPECT_NE(text.find("entry:       none: no crossover table was measured on this device"),
            std::string::npos)
      << text;
  // Explicit native consults nothing: no class entry line.
  s.choice = AttentionBackendChoice::kNative;
  AttentionPlanner native = make_planner(s);
  text = explain_text(native.plan(s.domain, decode.view()), s.domain, s.device);
  EXPECT_EQ(text.find("entry:"), std::string::npos) << text;
}

}  // namespace
}  // namespace pagellm
