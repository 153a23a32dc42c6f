// Shared fixtures for the attention planner tests: a batch that owns its arrays, the
// standard shape and device, and a crossover table with known thresholds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "pagellm/attention/planner.h"

namespace pagellm::test {

/// A batch that owns its host arrays; view() declares the real totals and maxima.
struct OwnedBatch {
  std::vector<int32_t> query_start{0};
  std::vector<int32_t> kv_lens;
  std::vector<int32_t> page_table;
  int32_t max_pages_per_seq = 0;
  int32_t kv_len_capacity = 0;

  AttentionBatchView view() const {
    AttentionBatchView v;
    v.query_start = query_start.data();
    v.query_start_size = query_start.size();
    v.kv_lens = kv_lens.data();
    v.kv_lens_size = kv_lens.size();
    v.page_table_size = page_table.size();
    v.max_pages_per_seq = max_pages_per_seq;
    v.num_seqs = static_cast<int32_t>(kv_lens.size());
    v.num_tokens = query_start.back();
    int32_t mq = 0, mk = 0;
    for (size_t b = 0; b + 1 < query_start.size(); ++b) {
      mq = std::max(mq, query_start[b + 1] - query_start[b]);
    }
    for (int32_t k : kv_lens) mk = std::max(mk, k);
    v.max_query_len = mq;
    v.max_kv_len = mk;
    v.kv_len_capacity = kv_len_capacity;
    return v;
  }
};

/// Sequences with query lengths q[b] and KV lengths kv[b]; the page table has room for
/// `table_tokens` tokens per row (default: the longest KV rounded up to whole pages).
inline OwnedBatch make_batch(const std::vector<int32_t>& q, const std::vector<int32_t>& kv,
                             int32_t page_size = 16, int32_t table_tokens = 0) {
  OwnedBatch b;
  int32_t longest = 1;
  for (size_t i = 0; i < q.size(); ++i) {
    b.query_start.push_back(b.query_start.back() + q[i]);
    b.kv_lens.push_back(kv[i]);
    longest = std::max(longest, kv[i]);
  }
  if (table_tokens <= 0) table_tokens = longest;
  b.max_pages_per_seq = (table_tokens + page_size - 1) / page_size;
  b.page_table.assign(q.size() * static_cast<size_t>(b.max_pages_per_seq), 1);
  return b;
}

/// `n` sequences of query length q and KV length kv.
inline OwnedBatch uniform_batch(int n, int32_t q, int32_t kv, int32_t page_size = 16,
                                int32_t table_tokens = 0) {
  return make_batch(std::vector<int32_t>(n, q), std::vector<int32_t>(n, kv), page_size,
                    table_tokens);
}

/// Qwen3-8B-like: 32 query heads, 8 KV heads, head_dim 128, pages of 16, bf16.
inline AttentionDomain standard_domain() {
  AttentionDomain d;
  d.dtype = DType::BF16;
  d.num_q_heads = 32;
  d.num_kv_heads = 8;
  d.head_dim = 128;
  d.page_size = 16;
  d.scale = 1.0f / std::sqrt(128.0f);
  return d;
}

inline DeviceProfile h200(CudnnVersion cudnn = 91400) {
  DeviceProfile p;
  p.name = "NVIDIA H200";
  p.sm_count = 132;
  p.cc_major = 9;
  p.cc_minor = 0;
  p.cudnn_version = cudnn;
  return p;
}

/// The class of a chunk of 512 after 4096 cached tokens (what fixture prefill entries use
/// unless told otherwise).
inline ShapeClass chunk_class() { return classify_shape(512, 512, 4608, false); }

inline CrossoverEntry entry(LaunchMode mode, AttentionPhase phase, int32_t head_dim,
                            int64_t min_work, int64_t max_work) {
  CrossoverEntry e;
  e.mode = mode;
  e.phase = phase;
  e.head_dim = head_dim;
  e.shape_class = phase == AttentionPhase::kDecode ? ShapeClass{} : chunk_class();
  e.min_work = min_work;
  e.max_work = max_work;
  e.page_sizes = {16, 32};
  e.gqa_ratios = {1, 4, 8};
  e.max_num_seqs = 256;
  e.max_query_len = 8192;
  e.max_kv_len = 32768;
  e.points = 10;
  e.admitted_points = 5;
  return e;
}

/// A table for h200(): eager prefill crosses at 1e6 work, graph decode at 1024; no eager
/// decode entry (as if cuDNN never won eager decode).
inline CrossoverTable standard_table(CudnnVersion cudnn = 91400) {
  CrossoverTable t;
  t.device = h200(cudnn);
  t.measured_on = "2026-11-29";
  t.source = "test";
  t.margin = 0.05;
  t.entries.push_back(entry(LaunchMode::kEager, AttentionPhase::kPrefill, 128, 1000000,
                            int64_t{1} << 40));
  t.entries.push_back(entry(LaunchMode::kGraph, AttentionPhase::kDecode, 128, 1024,
                            int64_t{1} << 40));
  return t;
}

/// Every prefill class there is (5 query buckets x 6 KV buckets x uniform/ragged).
inline std::vector<ShapeClass> all_prefill_classes() {
  std::vector<ShapeClass> out;
  for (int q = 1; q < kNumQueryBuckets; ++q) {
    for (int kv = 0; kv < kNumKvBuckets; ++kv) {
      for (bool ragged : {false, true}) {
        ShapeClass c;
        c.query_bucket = static_cast<int8_t>(q);
        c.kv_bucket = static_cast<int8_t>(kv);
        c.ragged = ragged;
        out.push_back(c);
      }
    }
  }
  return out;
}

/// `t` with each prefill entry repeated for every prefill class, so that the tests of the
/// other rules can judge batches of any shape against one threshold. Decode entries and
/// their order are kept (entries[0] stays a prefill entry, of its own class).
inline CrossoverTable every_prefill_class(CrossoverTable t) {
  const size_t n = t.entries.size();
  for (size_t i = 0; i < n; ++i) {
    if (t.entries[i].phase != AttentionPhase::kPrefill) continue;
    for (const ShapeClass& c : all_prefill_classes()) {
      if (c == t.entries[i].shape_class) continue;
      CrossoverEntry copy = t.entries[i];
      copy.shape_class = c;
      t.entries.push_back(copy);
    }
  }
  return t;
}

/// standard_table() with its eager prefill threshold in every prefill class.
inline CrossoverTables standard_tables() {
  CrossoverTables t;
  t.add(every_prefill_class(standard_table()));
  return t;
}

/// A plan cache stand-in: holds built keys, records requests.
class FakeRegistry : public CudnnPlanRegistry {
 public:
  bool has_plan(const CudnnPlanKey& key) const override { return built.count(key) != 0; }
  void request_plan(const CudnnPlanKey& key) override { requested.push_back(key); }
  std::unordered_set<CudnnPlanKey, CudnnPlanKeyHash> built;
  std::vector<CudnnPlanKey> requested;
};

inline int64_t work_of(const std::vector<int32_t>& q, const std::vector<int32_t>& kv,
                       int64_t heads) {
  int64_t w = 0;
  for (size_t i = 0; i < q.size(); ++i) w += causal_pairs(q[i], kv[i]);
  return w * heads;
}

}  // namespace pagellm::test
