// The paged forward on the CPU backend against the naive contiguous reference: ragged
// prefill batches with shuffled physical pages, then decode steps, for several page sizes,
// with a dense page table built per batch and with the persistent one (rows kept by the
// backend, only new pages sent).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "common/reference_qwen3.h"
#include "pagellm/backend/backend.h"
#include "pagellm/model/qwen3.h"

namespace pagellm {
namespace {

struct PagedSeq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  int32_t computed = 0;
  int32_t pages_sent = 0;  // persistent path: pages already in the backend's table
};

// Builds a step where sequence i contributes new_tokens[i] tokens and asks logits for the
// last token of each.
ForwardBatch make_batch(const std::vector<PagedSeq>& seqs, const std::vector<int32_t>& new_tokens,
                        int32_t page_size, int32_t max_pages) {
  ForwardBatch b;
  b.page_size = page_size;
  b.max_pages_per_seq = max_pages;
  b.query_start.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const PagedSeq& seq = seqs[s];
    for (int32_t i = 0; i < new_tokens[s]; ++i) {
      int32_t pos = seq.computed + i;
      b.token_ids.push_back(seq.tokens[pos]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(seq.pages[pos / page_size] * page_size + pos % page_size);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.kv_lens.push_back(seq.computed + new_tokens[s]);
    for (int32_t j = 0; j < max_pages; ++j) {
      b.page_table.push_back(j < static_cast<int32_t>(seq.pages.size()) ? seq.pages[j] : 0);
    }
    b.logits_indices.push_back(b.query_start.back() - 1);
  }
  return b;
}

// The same step with the persistent page table: sequence s lives in row num_seqs - s (rows
// out of batch order) and only the pages its KV length now reaches are sent.
ForwardBatch make_persistent_batch(std::vector<PagedSeq>& seqs,
                                   const std::vector<int32_t>& new_tokens, int32_t page_size,
                                   int32_t max_pages, std::vector<int32_t>* host_table) {
  ForwardBatch b = make_batch(seqs, new_tokens, page_size, max_pages);
  b.page_table.clear();
  const int32_t n = static_cast<int32_t>(seqs.size());
  b.page_table_rows = n + 1;
  for (int32_t s = 0; s < n; ++s) {
    const int32_t row = n - s;
    b.seq_slots.push_back(row);
    const int32_t need = (b.kv_lens[s] + page_size - 1) / page_size;
    PagedSeq& seq = seqs[s];
    if (need > seq.pages_sent) {
      b.page_table_updates.push_back({row, seq.pages_sent, need});
      for (int32_t j = seq.pages_sent; j < need; ++j) {
        b.page_table_values.push_back(seq.pages[j]);
        (*host_table)[static_cast<size_t>(row) * max_pages + j] = seq.pages[j];
      }
      seq.pages_sent = need;
    }
  }
  return b;
}

void run_case(int32_t page_size, bool tied, uint64_t seed, bool persistent = false) {
  Qwen3Config c = testing::small_config(tied);
  testing::HostWeights w = testing::random_weights(c, seed);
  auto backend = create_backend("cpu");
  Qwen3Model model(*backend, c, w.lookup());
  model.reserve(256, 16);

  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<int32_t> prompt_lens = {1, 7, 33, 64, 70};
  const int32_t decode_steps = 6;
  const int32_t max_len = 70 + decode_steps + 1;
  const int32_t max_pages = (max_len + page_size - 1) / page_size;
  const int32_t num_pages = 1 + max_pages * static_cast<int32_t>(prompt_lens.size());

  // Physical pages 1..num_pages-1 handed out in a shuffled order; page 0 stays reserved.
  std::vector<int32_t> free_pages(num_pages - 1);
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);

  std::vector<PagedSeq> seqs(prompt_lens.size());
  std::vector<testing::ReferenceQwen3> refs;
  for (size_t s = 0; s < seqs.size(); ++s) {
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
    for (int32_t i = 0; i < prompt_lens[s]; ++i) seqs[s].tokens.push_back(tok(rng));
    for (int32_t j = 0; j < max_pages; ++j) {
      seqs[s].pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
    refs.emplace_back(c, w);
  }

  const int64_t pool_elems = int64_t{num_pages} * c.num_key_value_heads * page_size * c.head_dim;
  std::vector<DeviceBuffer> pool_storage;
  std::vector<LayerKv> kv(static_cast<size_t>(c.num_hidden_layers));
  for (auto& layer : kv) {
    pool_storage.emplace_back(backend.get(), pool_elems * 4);
    layer.k = pool_storage.back().tensor(DType::F32, {num_pages, c.num_key_value_heads, page_size, c.head_dim});
    pool_storage.emplace_back(backend.get(), pool_elems * 4);
    layer.v = pool_storage.back().tensor(DType::F32, {num_pages, c.num_key_value_heads, page_size, c.head_dim});
    // Poison the pools: a read of an unwritten slot would show up as NaN.
    backend->fill(layer.k, std::nanf(""));
    backend->fill(layer.v, std::nanf(""));
  }

  std::vector<int32_t> host_table((seqs.size() + 1) * max_pages, 0);
  int64_t entries_sent = 0;
  for (int32_t step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> new_tokens;
    for (auto& s : seqs) new_tokens.push_back(static_cast<int32_t>(s.tokens.size()) - s.computed);
    ForwardBatch fb =
        persistent ? make_persistent_batch(seqs, new_tokens, page_size, max_pages, &host_table)
                   : make_batch(seqs, new_tokens, page_size, max_pages);
    fb.validate(host_table);
    entries_sent += static_cast<int64_t>(fb.page_table_values.size());
    BatchTensors bt = backend->upload_batch(fb);
    Tensor logits = model.forward(bt, kv);
    std::vector<float> got = backend->download_f32(logits);
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<double> want;
      for (int32_t i = seqs[s].computed; i < static_cast<int32_t>(seqs[s].tokens.size()); ++i) {
        want = refs[s].step(seqs[s].tokens[i]);
      }
      double err = 0, ref = 0;
      int32_t best = 0;
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        float g = got[s * c.vocab_size + v];
        ASSERT_TRUE(std::isfinite(g)) << "step " << step << " seq " << s << " logit " << v;
        err += (g - want[v]) * (g - want[v]);
        ref += want[v] * want[v];
        if (want[v] > want[best]) best = static_cast<int32_t>(v);
      }
      EXPECT_LT(std::sqrt(err / ref), 1e-5) << "page_size " << page_size << " step " << step
                                            << " seq " << s;
      seqs[s].computed = static_cast<int32_t>(seqs[s].tokens.size());
      seqs[s].tokens.push_back(best);  // greedy continuation from the reference
    }
  }
  if (persistent) {
    // Each sequence's pages up to its final length, each sent once.
    int64_t pages = 0;
    for (const PagedSeq& s : seqs) pages += (s.computed + page_size - 1) / page_size;
    EXPECT_EQ(entries_sent, pages);
  }
}

// Attention runs with the forward's plan (plan/run): without one it is refused, naming the
// call that makes it.
TEST(PagedForward, AttentionNeedsTheForwardsPlan) {
  auto backend = create_backend("cpu");
  const int64_t Hq = 2, Hkv = 1, D = 4, P = 4, pages = 2;
  ForwardBatch fb;
  fb.page_size = P;
  fb.max_pages_per_seq = 1;
  fb.token_ids = {3};
  fb.positions = {0};
  fb.slot_mapping = {P};
  fb.query_start = {0, 1};
  fb.kv_lens = {1};
  fb.page_table = {1};
  fb.logits_indices = {0};
  fb.validate();
  const BatchTensors bt = backend->upload_batch(fb);
  DeviceBuffer kbuf(backend.get(), pages * Hkv * P * D * 4), vbuf(backend.get(), pages * Hkv * P * D * 4);
  LayerKv kv{kbuf.tensor(DType::F32, {pages, Hkv, P, D}), vbuf.tensor(DType::F32, {pages, Hkv, P, D})};
  backend->fill(kv.k, 1.0f);
  backend->fill(kv.v, 2.0f);
  DeviceBuffer qbuf(backend.get(), Hq * D * 4), obuf(backend.get(), Hq * D * 4);
  Tensor q = qbuf.tensor(DType::F32, {1, Hq, D}), out = obuf.tensor(DType::F32, {1, Hq * D});
  backend->fill(q, 0.5f);
  AttentionShape shape{Hq, Hkv, D, P, 0.5f};
  try {
    backend->attention(q, kv, shape, bt, AttentionPlanRef{}, out);
    ADD_FAILURE() << "attention without a plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan_attention"), std::string::npos) << e.what();
  }
  const AttentionPlanRef plan = backend->plan_attention(bt, shape, kv);
  EXPECT_NE(plan.serial, 0u);
  backend->fill(out, std::nanf(""));
  backend->attention(q, kv, shape, bt, plan, out);
  // One key: the output is its value row.
  for (float v : backend->download_f32(out)) EXPECT_EQ(v, 2.0f);
}

TEST(PagedForward, MatchesNaiveReferencePageSize1) { run_case(1, false, 11); }
TEST(PagedForward, MatchesNaiveReferencePageSize16) { run_case(16, false, 12); }
TEST(PagedForward, MatchesNaiveReferencePageSize64Tied) { run_case(64, true, 13); }
TEST(PagedForward, PersistentTableMatchesNaiveReferencePageSize1) { run_case(1, false, 11, true); }
TEST(PagedForward, PersistentTableMatchesNaiveReferencePageSize16) {
  run_case(16, false, 12, true);
}

// The CPU backend's persistent table: its shape is fixed by the first batch, updates must
// stay inside it, and a sequence reads the row its slot names.
TEST(PagedForward, CpuPersistentTableRejectsBadUpdates) {
  auto backend = create_backend("cpu");
  ASSERT_TRUE(backend->supports_persistent_page_table());
  ForwardBatch b;
  b.page_size = 4;
  b.max_pages_per_seq = 2;
  b.token_ids = {1};
  b.positions = {0};
  b.slot_mapping = {12};
  b.query_start = {0, 1};
  b.kv_lens = {1};
  b.logits_indices = {0};
  b.seq_slots = {2};
  b.page_table_rows = 3;
  b.page_table_updates = {{2, 0, 2}, {2, 1, 2}};  // a later run overwrites an earlier one
  b.page_table_values = {3, 4, 9};
  BatchTensors t = backend->upload_batch(b);
  EXPECT_EQ(backend->download_f32(t.page_table), (std::vector<float>{3, 9}));
  // The next batch sends nothing and still reads the kept row; row 0 is zeros.
  b.page_table_updates.clear();
  b.page_table_values.clear();
  b.seq_slots = {2, 0};
  b.token_ids = {1, 0};
  b.positions = {0, 0};
  b.slot_mapping = {12, 0};
  b.query_start = {0, 1, 2};
  b.kv_lens = {1, 1};
  t = backend->upload_batch(b);
  EXPECT_EQ(backend->download_f32(t.page_table), (std::vector<float>{3, 9, 0, 0}));

  ForwardBatch bad = b;
  bad.page_table_rows = 4;
  EXPECT_THROW(backend->upload_batch(bad), Error);
  bad = b;
  bad.page_table_updates = {{0, 0, 1}};
  bad.page_table_values = {5};
  EXPECT_THROW(backend->upload_batch(bad), Error);
  bad.page_table_updates = {{1, 1, 3}};
  bad.page_table_values = {5, 6};
  EXPECT_THROW(backend->upload_batch(bad), Error);
  bad.page_table_updates = {{1, 0, 1}};
  bad.page_table_values = {5, 6};
  EXPECT_THROW(backend->upload_batch(bad), Error);
  bad.page_table_values = {};
  EXPECT_THROW(backend->upload_batch(bad), Error);
  bad = b;
  bad.seq_slots = {3, 0};
  EXPECT_THROW(backend->upload_batch(bad), Error);
}

}  // namespace
}  // namespace pagellm
