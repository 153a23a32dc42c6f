// The persistent page table (ForwardBatch::seq_slots) on the CUDA backend against the dense
// path: random tables changed by random runs (overlapping ones included) over several
// steps give per-batch page-table rows identical to the dense upload's, and attention over
// either batch is identical bit for bit. Also: the attention plan/run contract (a stale or
// missing plan is refused) and the persistent batch's argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"

namespace pagellm {
namespace {

constexpr int64_t kHq = 8, kHkv = 2, kD = 128, kPage = 16;

class PersistentPageTableTest : public test::CudaOpTest {
 protected:
  // A random step: B sequences (each a slot of the table or, now and then, the padding
  // row 0), q lengths of 1 (decode) or up to 40 (prefill), KV lengths within the row.
  struct Step {
    ForwardBatch dense;
    ForwardBatch persistent;
  };

  Step make_step(std::vector<std::vector<int32_t>>& table, int32_t num_pages, bool decode) {
    const int32_t rows = static_cast<int32_t>(table.size());
    const int32_t cols = static_cast<int32_t>(table[0].size());
    Step s;
    ForwardBatch& p = s.persistent;
    p.page_size = static_cast<int32_t>(kPage);
    p.max_pages_per_seq = cols;
    p.page_table_rows = rows;
    // Random runs, in order, some rows named twice (later runs win), never row 0.
    const int runs = uniform_int(0, 12);
    for (int u = 0; u < runs; ++u) {
      PageTableUpdate up;
      up.row = uniform_int(1, rows - 1);
      up.begin = uniform_int(0, cols);
      up.end = uniform_int(up.begin, cols);
      p.page_table_updates.push_back(up);
      for (int32_t j = up.begin; j < up.end; ++j) {
        const int32_t page = uniform_int(1, num_pages - 1);
        p.page_table_values.push_back(page);
        table[static_cast<size_t>(up.row)][static_cast<size_t>(j)] = page;
      }
    }
    const int B = uniform_int(1, 9);
    p.query_start.push_back(0);
    for (int b = 0; b < B; ++b) {
      const int32_t slot = uniform_int(0, 5) == 0 ? 0 : uniform_int(1, rows - 1);
      p.seq_slots.push_back(slot);
      const int32_t q = decode ? 1 : uniform_int(1, 40);
      const int32_t kv = uniform_int(q, cols * static_cast<int32_t>(kPage));
      for (int32_t i = 0; i < q; ++i) {
        const int32_t pos = kv - q + i;
        p.token_ids.push_back(0);
        p.positions.push_back(pos);
        p.slot_mapping.push_back(0);  // attention does not write the pools
      }
      p.query_start.push_back(static_cast<int32_t>(p.token_ids.size()));
      p.kv_lens.push_back(kv);
      p.logits_indices.push_back(p.query_start.back() - 1);
    }
    s.dense = p;
    s.dense.seq_slots.clear();
    s.dense.page_table_rows = 0;
    s.dense.page_table_updates.clear();
    s.dense.page_table_values.clear();
    for (int32_t slot : p.seq_slots) {
      const std::vector<int32_t>& row = table[static_cast<size_t>(slot)];
      s.dense.page_table.insert(s.dense.page_table.end(), row.begin(), row.end());
    }
    return s;
  }

  // Uploads `batch`, runs attention through plan_attention and returns the page table
  // the device holds for it and the attention output's raw bf16 bits.
  std::pair<std::vector<int32_t>, std::vector<uint16_t>> run(const ForwardBatch& batch,
                                                              const LayerKv& kv,
                                                              const Tensor& q_all) {
    const BatchTensors bt = gpu().upload_batch(batch);
    const int64_t T = batch.num_tokens();
    Tensor q = q_all.rows(0, T);
    Tensor out = alloc(gpu(), DType::BF16, {T, kHq * kD});
    poison(gpu(), out);
    const AttentionShape shape{kHq, kHkv, kD, kPage, 1.0f / std::sqrt(float(kD))};
    const AttentionPlanRef plan = gpu().plan_attention(bt, shape, kv);
    gpu().attention(q, kv, shape, bt, plan, out);
    std::vector<int32_t> table(static_cast<size_t>(bt.page_table.numel()));
    gpu().copy_to_host(table.data(), bt.page_table.data, table.size() * sizeof(int32_t));
    std::vector<uint16_t> bits(static_cast<size_t>(out.numel()));
    gpu().copy_to_host(bits.data(), out.data, bits.size() * sizeof(uint16_t));
    return {table, bits};
  }

  void make_pools(int32_t num_pages, LayerKv& kv, Tensor& q_all) {
    const int64_t pool = int64_t{num_pages} * kHkv * kPage * kD;
    kv.k = put(gpu(), DType::BF16, {num_pages, kHkv, kPage, kD}, randn_bf16(pool));
    kv.v = put(gpu(), DType::BF16, {num_pages, kHkv, kPage, kD}, randn_bf16(pool));
    q_all = put(gpu(), DType::BF16, {400, kHq, kD}, randn_bf16(400 * kHq * kD));
  }
};

TEST_F(PersistentPageTableTest, RandomUpdatesMatchTheDensePathBitForBit) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(gpu().supports_persistent_page_table());
  cuda->set_attention_backend("native");
  const int32_t rows = 12, cols = 9, num_pages = 64;
  LayerKv kv;
  Tensor q_all;
  make_pools(num_pages, kv, q_all);
  std::vector<std::vector<int32_t>> table(rows, std::vector<int32_t>(cols, 0));
  for (int step = 0; step < 24; ++step) {
    const bool decode = step % 3 != 0;
    const Step s = make_step(table, num_pages, decode);
    const std::string where = "step " + std::to_string(step) + (decode ? " (decode) " : " (prefill) ") + seed_note();
    const auto dense = run(s.dense, kv, q_all);
    const auto persistent = run(s.persistent, kv, q_all);
    EXPECT_EQ(persistent.first, s.dense.page_table) << where;
    EXPECT_EQ(dense.first, s.dense.page_table) << where;
    ASSERT_EQ(persistent.second.size(), dense.second.size());
    EXPECT_TRUE(std::equal(dense.second.begin(), dense.second.end(), persistent.second.begin()))
        << "attention over the persistent table differs from the dense one, " << where;
    for (uint16_t b : persistent.second) {
      ASSERT_NE(b & 0x7f80, 0x7f80) << "non-finite attention output, " << where;
    }
  }
}

TEST_F(PersistentPageTableTest, TableGrowsKeepingItsRows) {
  const int32_t num_pages = 32;
  LayerKv kv;
  Tensor q_all;
  make_pools(num_pages, kv, q_all);
  std::vector<std::vector<int32_t>> table(4, std::vector<int32_t>(3, 0));
  Step s = make_step(table, num_pages, true);
  run(s.persistent, kv, q_all);
  // Taller and wider: the old rows must survive, new entries read 0.
  for (auto& row : table) row.resize(6, 0);
  table.resize(10, std::vector<int32_t>(6, 0));
  s = make_step(table, num_pages, true);
  EXPECT_EQ(run(s.persistent, kv, q_all).first, s.dense.page_table) << seed_note();
}

TEST_F(PersistentPageTableTest, BadPersistentBatchesAreRefusedByName) {
  ForwardBatch b;
  b.page_size = static_cast<int32_t>(kPage);
  b.max_pages_per_seq = 4;
  b.page_table_rows = 8;
  b.token_ids = {0};
  b.positions = {0};
  b.slot_mapping = {0};
  b.query_start = {0, 1};
  b.kv_lens = {1};
  b.logits_indices = {0};
  b.seq_slots = {9};
  auto message = [&](const ForwardBatch& batch) {
    try {
      gpu().upload_batch(batch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = message(b);
  EXPECT_NE(e.find("seq_slots[0] = 9"), std::string::npos) << e;
  b.seq_slots = {3};
  b.page_table_updates = {{0, 0, 2}};
  b.page_table_values = {5, 6};
  e = message(b);
  EXPECT_NE(e.find("row 0 being the reserved all-zero row"), std::string::npos) << e;
  b.page_table_updates = {{3, 2, 5}};
  b.page_table_values = {5, 6, 7};
  e = message(b);
  EXPECT_NE(e.find("entries [2, 5)"), std::string::npos) << e;
  b.page_table_updates = {{3, 1, 3}};
  b.page_table_values = {5};
  e = message(b);
  EXPECT_NE(e.find("cover 2 entries but page_table_values holds 1"), std::string::npos) << e;
  b.page_table_values = {5, 6};
  b.page_table = {1, 2, 3, 4};
  e = message(b);
  EXPECT_NE(e.find("must leave page_table empty"), std::string::npos) << e;
  b.page_table.clear();
  EXPECT_EQ(message(b), "");
}

TEST_F(PersistentPageTableTest, AttentionRefusesAMissingOrStalePlan) {
  const int32_t num_pages = 16;
  LayerKv kv;
  Tensor q_all;
  make_pools(num_pages, kv, q_all);
  std::vector<std::vector<int32_t>> table(4, std::vector<int32_t>(2, 0));
  const Step s = make_step(table, num_pages, true);
  const AttentionShape shape{kHq, kHkv, kD, kPage, 0.1f};
  const BatchTensors bt = gpu().upload_batch(s.dense);
  const int64_t T = s.dense.num_tokens();
  Tensor q = q_all.rows(0, T);
  Tensor out = alloc(gpu(), DType::BF16, {T, kHq * kD});
  auto message = [&](const AttentionPlanRef& plan) {
    try {
      gpu().attention(q, kv, shape, bt, plan, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(AttentionPlanRef{}).find("no plan"), std::string::npos);
  const AttentionPlanRef plan = gpu().plan_attention(bt, shape, kv);
  EXPECT_EQ(message(plan), "");
  const BatchTensors again = gpu().upload_batch(s.dense);  // ends the forward
  (void)again;
  EXPECT_NE(message(plan).find("an earlier forward"), std::string::npos);
  AttentionShape other = shape;
  other.scale = 0.2f;
  const AttentionPlanRef fresh = gpu().plan_attention(bt, shape, kv);
  try {
    gpu().attention(q, kv, other, bt, fresh, out);
    ADD_FAILURE() << "a shape the plan was not made for was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the one plan_attention was given"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagellm
