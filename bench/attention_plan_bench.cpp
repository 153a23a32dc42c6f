// plan() time and the graph reservation of the attention planner at batch 16 and 256 (the
// cost the dispatcher adds to every forward, on the host).
//
//   BM_PlanEagerPrefill/B   auto, eager prefill of B sequences with cached prefixes
//                           (rules 1-4 evaluated, arrays filled when admitted)
//   BM_PlanCudnnPrefill/B   explicit cudnn: also fills seq_len_q and the ragged offsets
//   BM_PlanBoundDecode/B    a planner bound to a decode graph of B sequences, KV capacity
//                           32768: the re-plan a replay would do
// Counters: reserved_bytes (host bytes the planner holds for its arrays; linear in B) and
// ns_per_seq.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/planner.h"
#include "pagellm/kv/forward_batch.h"

namespace pagellm {
namespace {

/// n sequences of about q new tokens after about kv cached ones, in page-table rows of
/// table_tokens (pages of 16).
ForwardBatch make(int n, int32_t q, int32_t kv, int32_t table_tokens) {
  ForwardBatch b;
  b.page_size = 16;
  b.query_start = {0};
  for (int i = 0; i < n; ++i) {
    b.query_start.push_back(b.query_start.back() + q + (i % 3));
    b.kv_lens.push_back(kv + (i % 7) * 16 + q + (i % 3));
  }
  b.token_ids.assign(static_cast<size_t>(b.query_start.back()), 0);
  b.max_pages_per_seq = (table_tokens + 15) / 16;
  b.page_table.assign(static_cast<size_t>(n) * b.max_pages_per_seq, 1);
  return b;
}

AttentionDomain domain() {
  AttentionDomain d;
  d.num_q_heads = 32;
  d.num_kv_heads = 8;
  d.head_dim = 128;
  d.page_size = 16;
  d.scale = 1.0f / std::sqrt(128.0f);
  return d;
}

DeviceProfile device() {
  DeviceProfile p;
  p.name = "NVIDIA H200";
  p.sm_count = 132;
  p.cc_major = 9;
  p.cudnn_version = 91400;
  return p;
}

CrossoverTables tables() {
  CrossoverTable t;
  t.device = device();
  for (auto [mode, phase] : {std::pair{LaunchMode::kEager, AttentionPhase::kPrefill},
                             std::pair{LaunchMode::kGraph, AttentionPhase::kDecode}}) {
    CrossoverEntry e;
    e.mode = mode;
    e.phase = phase;
    e.head_dim = 128;
    e.min_work = 1;
    e.max_work = int64_t{1} << 60;
    e.page_sizes = {16};
    e.gqa_ratios = {4};
    e.max_num_seqs = 1024;
    e.max_query_len = 1 << 20;
    e.max_kv_len = 1 << 20;
    t.entries.push_back(e);
  }
  CrossoverTables ts;
  ts.add(t);
  return ts;
}

void run_plan(benchmark::State& state, AttentionBackendChoice choice) {
  const int n = static_cast<int>(state.range(0));
  const CrossoverTables ts = tables();
  AttentionPlannerConfig c;
  c.choice = choice;
  c.device = device();
  c.tables = &ts;
  AttentionPlanner planner(c);
  const ForwardBatch b = make(n, 64, 2048, 4096);
  const AttentionBatchView v = batch_view(b);
  const AttentionDomain d = domain();
  for (auto _ : state) {
    const AttentionPlan& p = planner.plan(d, v);
    benchmark::DoNotOptimize(p.provider);
  }
  state.counters["reserved_bytes"] = static_cast<double>(planner.reserved_bytes());
  state.counters["ns_per_seq"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_PlanEagerPrefill(benchmark::State& s) { run_plan(s, AttentionBackendChoice::kAuto); }
void BM_PlanCudnnPrefill(benchmark::State& s) { run_plan(s, AttentionBackendChoice::kCudnn); }

void BM_PlanBoundDecode(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const CrossoverTables ts = tables();
  AttentionPlannerConfig c;
  c.device = device();
  c.tables = &ts;
  AttentionPlanner planner(c);
  const int32_t capacity = 32768;
  ForwardBatch rep;  // the representative batch: one token, one key per sequence
  rep.page_size = 16;
  rep.query_start = {0};
  for (int i = 0; i < n; ++i) {
    rep.query_start.push_back(i + 1);
    rep.kv_lens.push_back(1);
  }
  rep.token_ids.assign(static_cast<size_t>(n), 0);
  rep.max_pages_per_seq = capacity / 16;
  rep.page_table.assign(static_cast<size_t>(n) * rep.max_pages_per_seq, 0);
  rep.kv_len_capacity = capacity;
  GraphCapacity cap;
  cap.num_seqs = n;
  cap.max_num_tokens = n;
  cap.max_query_len = 1;
  cap.max_pages_per_seq = rep.max_pages_per_seq;
  cap.kv_len_capacity = capacity;
  planner.bind_to_graph(domain(), cap, batch_view(rep));
  ForwardBatch live = rep;
  for (int i = 0; i < n; ++i) live.kv_lens[i] = 1 + (i * 977) % capacity;
  const AttentionBatchView v = batch_view(live);
  const AttentionDomain d = domain();
  for (auto _ : state) {
    const AttentionPlan& p = planner.plan(d, v);
    benchmark::DoNotOptimize(p.provider);
  }
  state.counters["reserved_bytes"] = static_cast<double>(planner.reserved_bytes());
  state.counters["ns_per_seq"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_PlanEagerPrefill)->Arg(16)->Arg(256);
BENCHMARK(BM_PlanCudnnPrefill)->Arg(16)->Arg(256);
BENCHMARK(BM_PlanBoundDecode)->Arg(16)->Arg(256);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
