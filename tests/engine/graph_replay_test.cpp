// Decode through captured graphs, checked on the CPU: a backend that records operations
// between begin_capture() and end_capture() and replays them on the same buffers, as a
// CUDA graph does. The engine must then produce exactly the tokens and logits it produces
// without graphs: padding rows, bucket choice and fixed batch buffers are all exercised,
// with the persistent page table (only changed entries uploaded) and with dense rows.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

class RecordingBackend : public CpuBackend {
 public:
  explicit RecordingBackend(bool persistent) : persistent_(persistent) {}
  bool supports_graphs() const override { return true; }
  bool supports_persistent_page_table() const override { return persistent_; }

  void reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages,
                     int32_t max_rows) override {
    CpuBackend::reserve_batch(max_tokens, max_seqs, max_pages, max_rows);
    reserved_ = true;
    for (auto* v : {&fixed_.token_ids, &fixed_.positions, &fixed_.slot_mapping}) v->reserve(max_tokens);
    fixed_.query_start.reserve(max_seqs + 1);
    fixed_.kv_lens.reserve(max_seqs);
    fixed_.page_table.reserve(static_cast<size_t>(max_seqs) * max_pages);
    fixed_.logits_indices.reserve(max_rows);
  }
  // Copies into one fixed ForwardBatch, so captured operations see each new step.
  BatchTensors upload_batch(const ForwardBatch& batch) override {
    if (!reserved_) return CpuBackend::upload_batch(batch);
    // assign() within the reserved capacity keeps every address, as device buffers do.
    fixed_.page_size = batch.page_size;
    fixed_.max_pages_per_seq = batch.max_pages_per_seq;
    fixed_.kv_len_capacity = batch.kv_len_capacity;
    fixed_.token_ids.assign(batch.token_ids.begin(), batch.token_ids.end());
    fixed_.positions.assign(batch.positions.begin(), batch.positions.end());
    fixed_.slot_mapping.assign(batch.slot_mapping.begin(), batch.slot_mapping.end());
    fixed_.query_start.assign(batch.query_start.begin(), batch.query_start.end());
    fixed_.kv_lens.assign(batch.kv_lens.begin(), batch.kv_lens.end());
    fixed_.page_table.assign(batch.page_table.begin(), batch.page_table.end());
    fixed_.logits_indices.assign(batch.logits_indices.begin(), batch.logits_indices.end());
    // The persistent table's fields are consumed by upload_batch, not read by operations.
    fixed_.seq_slots = batch.seq_slots;
    fixed_.page_table_rows = batch.page_table_rows;
    fixed_.page_table_updates = batch.page_table_updates;
    fixed_.page_table_values = batch.page_table_values;
    ++uploads_;
    return CpuBackend::upload_batch(fixed_);
  }
  void begin_capture() override { recording_ = std::make_shared<std::vector<std::function<void()>>>(); }
  std::unique_ptr<RecordedGraph> end_capture() override {
    struct Graph : RecordedGraph {
      std::shared_ptr<std::vector<std::function<void()>>> ops;
      RecordingBackend* owner;
      void replay() override {
        ++owner->replays_;
        for (auto& op : *ops) op();
      }
    };
    auto g = std::make_unique<Graph>();
    g->ops = std::move(recording_);
    g->owner = this;
    recording_.reset();
    return g;
  }

#define PAGELLM_RECORD(call) \
  if (recording_) {          \
    recording_->push_back([=]() mutable { call; }); \
  } else {                   \
    call;                    \
  }
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::embedding(table, ids, out));
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::rms_norm(x, w, eps, out));
  }
  void add_rms_norm(Tensor& r, const Tensor& d, const Tensor& w, float eps, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::add_rms_norm(r, d, w, eps, out));
  }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::matmul(x, w, out));
  }
  void qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& qn, const Tensor& kn, float eps,
                             const RopeParams& rope, const AttentionShape& shape,
                             const BatchTensors& batch, Tensor& q, LayerKv& kv) override {
    PAGELLM_RECORD(CpuBackend::qk_norm_rope_store_kv(qkv, qn, kn, eps, rope, shape, batch, q, kv));
  }
  void attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                 const BatchTensors& batch, const AttentionPlanRef& plan, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::attention(q, kv, shape, batch, plan, out));
  }
  void silu_mul(const Tensor& gu, Tensor& out) override { PAGELLM_RECORD(CpuBackend::silu_mul(gu, out)); }
  void gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) override {
    PAGELLM_RECORD(CpuBackend::gather_rows(x, idx, out));
  }
#undef PAGELLM_RECORD

  int64_t replays_ = 0;
  int64_t uploads_ = 0;

 private:
  bool persistent_;
  bool reserved_ = false;
  ForwardBatch fixed_;
  std::shared_ptr<std::vector<std::function<void()>>> recording_;
};

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> logits;
  EngineStats stats;
  int64_t replays = 0;
  std::vector<int32_t> buckets;
};

RunResult run(bool graphs, bool persistent, const Qwen3Config& c,
              const testing::HostWeights& w) {
  auto backend = std::make_unique<RecordingBackend>(persistent);
  RecordingBackend* raw = backend.get();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = 16;
  ec.num_pages = 64;
  ec.max_num_seqs = 11;  // buckets 1, 2, 4, 8, 11
  ec.max_num_batched_tokens = 128;
  ec.max_model_len = 128;
  ec.use_graphs = graphs;
  Engine engine(std::move(backend), std::move(model), ec);
  RunResult r;
  engine.set_logits_hook([&](int64_t id, int64_t i, const float* l, int64_t v) {
    r.logits[{id, i}] = std::vector<float>(l, l + v);
  });
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 9; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 3 + 7 * i; ++j) p.push_back((j * 31 + i * 17) % 90 + 1);
    prompts.push_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  sp.seed = 7;
  sp.ignore_eos = true;
  std::vector<SamplingParams> per;
  for (int i = 0; i < 9; ++i) {
    per.push_back(sp);
    per.back().max_tokens = 4 + 3 * i;  // ragged finishing: the batch shrinks across buckets
  }
  for (const Sequence* s : engine.generate(prompts, per)) r.tokens.push_back(s->output);
  r.stats = engine.stats();
  r.replays = raw->replays_;
  r.buckets = engine.graph_buckets();
  return r;
}

TEST(GraphReplay, DecodeThroughGraphsMatchesEager) {
  Qwen3Config c = testing::small_config(false);
  testing::HostWeights w = testing::random_weights(c, 99);
  for (bool persistent : {true, false}) {
    SCOPED_TRACE(persistent ? "persistent page table" : "dense page table");
    RunResult eager = run(false, persistent, c, w);
    RunResult graph = run(true, persistent, c, w);
    EXPECT_EQ(eager.stats.graph_steps, 0);
    EXPECT_EQ(graph.buckets, (std::vector<int32_t>{1, 2, 4, 8, 11}));
    EXPECT_GT(graph.stats.graph_steps, 10);
    EXPECT_EQ(graph.replays, graph.stats.graph_steps);
    ASSERT_EQ(eager.tokens, graph.tokens);
    ASSERT_EQ(eager.logits.size(), graph.logits.size());
    for (const auto& [key, want] : eager.logits) {
      const auto& got = graph.logits.at(key);
      for (size_t v = 0; v < want.size(); ++v) {
        ASSERT_NEAR(got[v], want[v], 1e-5f) << "request " << key.first << " token " << key.second;
      }
    }
  }
}

// The two page-table paths run the same computation on the same pages, so the persistent
// path gives bit for bit the tokens and logits of the dense path, eager and through graphs,
// while uploading a small fraction of the page-table entries.
TEST(GraphReplay, PersistentPageTableMatchesDenseExactly) {
  Qwen3Config c = testing::small_config(false);
  testing::HostWeights w = testing::random_weights(c, 99);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    RunResult dense = run(graphs, false, c, w);
    RunResult persistent = run(graphs, true, c, w);
    EXPECT_EQ(persistent.stats.graph_steps, dense.stats.graph_steps);
    ASSERT_EQ(dense.tokens, persistent.tokens);
    ASSERT_EQ(dense.logits, persistent.logits);
    // Dense: every row of every batch (up to 11 rows of 8 entries). Persistent: the pages
    // of the 9 requests (under 128 tokens each, so at most 8 pages) and their zeroing.
    EXPECT_LE(persistent.stats.page_table_entries_uploaded, 9 * 8 * 2);
    EXPECT_GT(dense.stats.page_table_entries_uploaded,
              20 * persistent.stats.page_table_entries_uploaded);
  }
}

}  // namespace
}  // namespace pagellm
