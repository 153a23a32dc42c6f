// Tensor parallelism on the CPU backend (docs/design.md, "Tensor parallelism"): a model split
// over 2 and 4 ranks (threads of one process, InProcessGroup, each rank its own backend and
// KV pools holding its KV heads) gives the single-rank model's logits, for ragged prefill
// and decode steps, with KV heads divided (2 ranks) and replicated (4 ranks over 2 KV
// heads), tied and untied heads; every rank gets the same bits. A split model loaded with
// other weights and updated with the full tensors (each rank writing its share: column
// ranges of o_proj and down, the head's vocabulary rows, the tied head with the embedding)
// gives the same. Plans that do not divide are refused, naming each dimension; what is not
// built for TP > 1 yet is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/backend/backend.h"
#include "pagellm/backend/communicator.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/model/tensor_parallel.h"

namespace pagellm {
namespace {

// A ragged step: sequence s adds new_tokens[s] tokens after its first `done[s]`; pages are
// consecutive per sequence (page 0 unused); logits for each sequence's last token.
ForwardBatch make_step(const std::vector<std::vector<int32_t>>& tokens,
                       const std::vector<int32_t>& done, const std::vector<int32_t>& upto,
                       int32_t page_size, int32_t max_pages) {
  ForwardBatch b;
  b.page_size = page_size;
  b.max_pages_per_seq = max_pages;
  b.query_start.push_back(0);
  for (size_t s = 0; s < tokens.size(); ++s) {
    for (int32_t pos = done[s]; pos < upto[s]; ++pos) {
      const int32_t page = 1 + static_cast<int32_t>(s) * max_pages + pos / page_size;
      b.token_ids.push_back(tokens[s][static_cast<size_t>(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(page * page_size + pos % page_size);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.kv_lens.push_back(upto[s]);
    for (int32_t j = 0; j < max_pages; ++j) {
      b.page_table.push_back(1 + static_cast<int32_t>(s) * max_pages + j);
    }
    b.logits_indices.push_back(b.query_start.back() - 1);
  }
  return b;
}

// One rank's model, pools and backend, run through the same steps as the others.
struct RankRun {
  std::vector<std::vector<float>> logits;  // per step, [num_seqs, V]
  std::string error;
};

// Every tensor of `w` as an update (host float32).
std::vector<NamedTensor> update_of(const testing::HostWeights& w) {
  std::vector<NamedTensor> out;
  for (const auto& [name, data] : w.data) {
    NamedTensor t;
    t.name = name;
    t.data = data.data();
    t.dtype = TensorDType::kFloat32;
    t.shape = w.shapes.at(name);
    out.push_back(std::move(t));
  }
  return out;
}

// Runs `steps` (a prefill, then decode steps) on a model split over `size` ranks (size 1:
// no communicator) and returns each rank's logits per step. With `load_first`, each rank
// loads those weights and then updates to `w` (Qwen3Model::update_weights).
std::vector<RankRun> run_split(const Qwen3Config& c, const testing::HostWeights& w, int size,
                               const std::vector<ForwardBatch>& steps, int32_t num_pages,
                               int32_t page_size,
                               const testing::HostWeights* load_first = nullptr) {
  std::vector<RankRun> runs(static_cast<size_t>(size));
  InProcessGroup group(size);
  auto rank_main = [&](int rank) {
    std::unique_ptr<Communicator> comm = group.communicator(rank);
    try {
      auto backend = create_backend("cpu");
      TensorParallel tp{plan_tensor_parallel(c, size, rank), comm.get()};
      Qwen3Model model(*backend, c, (load_first != nullptr ? *load_first : w).lookup(), nullptr,
                       size > 1 ? &tp : nullptr);
      if (load_first != nullptr) model.update_weights(update_of(w));
      model.reserve(128, 8);
      const int64_t kv_heads = model.shard().kv_heads;
      std::vector<DeviceBuffer> storage;
      std::vector<LayerKv> kv(static_cast<size_t>(c.num_hidden_layers));
      const int64_t elems = int64_t{num_pages} * kv_heads * page_size * c.head_dim;
      for (LayerKv& layer : kv) {
        storage.emplace_back(backend.get(), elems * 4);
        layer.k = storage.back().tensor(DType::F32, {num_pages, kv_heads, page_size, c.head_dim});
        storage.emplace_back(backend.get(), elems * 4);
        layer.v = storage.back().tensor(DType::F32, {num_pages, kv_heads, page_size, c.head_dim});
        backend->fill(layer.k, std::nanf(""));
        backend->fill(layer.v, std::nanf(""));
      }
      for (const ForwardBatch& fb : steps) {
        const BatchTensors bt = backend->upload_batch(fb);
        runs[static_cast<size_t>(rank)].logits.push_back(
            backend->download_f32(model.forward(bt, kv)));
      }
    } catch (const std::exception& e) {
      runs[static_cast<size_t>(rank)].error = e.what();
      comm->abort(e.what());  // the other ranks stop waiting for this one
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  return runs;
}

// With `updated`, the split model loads other weights and is updated to the compared ones.
void check_split(bool tied, int size, uint64_t seed, bool updated = false) {
  Qwen3Config c = testing::small_config(tied);
  c.vocab_size = 96;  // divisible by 2 and 4
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  const testing::HostWeights w = testing::random_weights(c, seed);
  const int32_t page_size = 4, max_pages = 6;
  const std::vector<int32_t> prompt = {1, 5, 13};
  std::vector<std::vector<int32_t>> tokens(prompt.size());
  uint64_t x = seed;
  for (size_t s = 0; s < prompt.size(); ++s) {
    for (int32_t i = 0; i < prompt[s] + 3; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      tokens[s].push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(c.vocab_size)));
    }
  }
  // The prompts, then three decode steps (the tokens fixed in advance: every run sees the
  // same inputs).
  std::vector<ForwardBatch> steps;
  std::vector<int32_t> done(prompt.size(), 0), upto = prompt;
  for (int step = 0; step < 4; ++step) {
    steps.push_back(make_step(tokens, done, upto, page_size, max_pages));
    steps.back().validate();
    done = upto;
    for (int32_t& u : upto) ++u;
  }
  const int32_t num_pages = 1 + static_cast<int32_t>(prompt.size()) * max_pages;
  const std::vector<RankRun> one = run_split(c, w, 1, steps, num_pages, page_size);
  ASSERT_EQ(one[0].error, "");
  const testing::HostWeights other = testing::random_weights(c, seed + 1000);
  const std::vector<RankRun> split =
      run_split(c, w, size, steps, num_pages, page_size, updated ? &other : nullptr);
  const std::string what = std::string(tied ? "tied" : "untied") + ", " +
                           std::to_string(size) + " ranks, seed " + std::to_string(seed) +
                           (updated ? ", updated" : "");
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(split[static_cast<size_t>(r)].error, "") << what << ", rank " << r;
  }
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<float>& want = one[0].logits[step];
    const std::vector<float>& got = split[0].logits[step];
    ASSERT_EQ(got.size(), want.size()) << what;
    double err = 0, ref = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << ", step " << step << ", logit " << i;
      err += (got[i] - want[i]) * (got[i] - want[i]);
      ref += want[i] * want[i];
    }
    // Only the order of float32 sums differs from one rank.
    EXPECT_LT(std::sqrt(err / ref), 1e-5) << what << ", step " << step;
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(split[static_cast<size_t>(r)].logits[step], got)
          << what << ", step " << step << ": rank " << r << " differs from rank 0";
    }
  }
}

TEST(TensorParallel, TwoRanksMatchOneRank) {
  check_split(false, 2, 11);
  check_split(true, 2, 12);
}

TEST(TensorParallel, FourRanksWithReplicatedKvHeadsMatchOneRank) {
  check_split(false, 4, 21);
  check_split(true, 4, 22);
}

TEST(TensorParallel, RanksUpdatedWithFullTensorsMatchOneRankOfThoseWeights) {
  check_split(false, 2, 31, true);
  check_split(true, 2, 32, true);
  check_split(false, 4, 33, true);
  check_split(true, 4, 34, true);
}

TEST(TensorParallel, PlanSplitsHeadsAndReplicatesKvHeads) {
  Qwen3Config c = testing::small_config(false);
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.vocab_size = 96;
  const TpShard two = plan_tensor_parallel(c, 2, 1);
  EXPECT_EQ(two.q_head_begin, 4);
  EXPECT_EQ(two.q_heads, 4);
  EXPECT_EQ(two.kv_head_begin, 1);
  EXPECT_EQ(two.kv_heads, 1);
  EXPECT_EQ(two.inter_begin, 24);
  EXPECT_EQ(two.vocab_begin, 48);
  // 4 ranks over 2 KV heads: ranks 0-1 hold head 0, ranks 2-3 head 1; q heads 2r, 2r + 1
  // (group size 4) read exactly that head.
  for (int r = 0; r < 4; ++r) {
    const TpShard s = plan_tensor_parallel(c, 4, r);
    EXPECT_EQ(s.kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, r / 2);
    EXPECT_EQ(s.q_head_begin / (c.num_attention_heads / c.num_key_value_heads), s.kv_head_begin);
  }
}

TEST(TensorParallel, RefusesSizesThatDoNotDivide) {
  Qwen3Config c = testing::small_config(false);  // Hq 4, Hkv 2, I 48, V 97
  try {
    plan_tensor_parallel(c, 3, 0);
    ADD_FAILURE() << "a split over 3 ranks was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("num_attention_heads 4"), std::string::npos) << m;
    EXPECT_NE(m.find("num_key_value_heads 2"), std::string::npos) << m;
    EXPECT_NE(m.find("vocab_size 97"), std::string::npos) << m;
    EXPECT_EQ(m.find("intermediate_size"), std::string::npos) << m;  // 48 = 3 x 16
  }
  EXPECT_THROW(plan_tensor_parallel(c, 2, 2), Error);
  EXPECT_THROW(plan_tensor_parallel(c, 0, 0), Error);
  EXPECT_THROW(InProcessGroup(0), Error);
}

// A rank that fails does not leave the others waiting: tensors that disagree abort the
// group inside the collective, and a rank that aborts between collectives wakes the others
// with its reason.
TEST(TensorParallel, AFailedRankAbortsTheGroupInsteadOfHangingIt) {
  {
    InProcessGroup group(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto backend = create_backend("cpu");
        std::unique_ptr<Communicator> comm = group.communicator(r);
        DeviceBuffer buf(backend.get(), 64);
        Tensor t = buf.tensor(DType::F32, {r == 0 ? 4 : 6});
        backend->fill(t, 1.0f);
        try {
          comm->all_reduce_sum(*backend, t);
        } catch (const Error& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("all_reduce_sum: ranks passed tensors of"), std::string::npos) << e;
    }
  }
  {
    InProcessGroup group(2);
    std::string error;
    std::thread waiting([&] {
      auto backend = create_backend("cpu");
      std::unique_ptr<Communicator> comm = group.communicator(0);
      DeviceBuffer buf(backend.get(), 16);
      Tensor t = buf.tensor(DType::F32, {4});
      backend->fill(t, 1.0f);
      try {
        comm->all_reduce_sum(*backend, t);
        comm->all_reduce_sum(*backend, t);
      } catch (const Error& e) {
        error = e.what();
      }
    });
    group.communicator(1)->abort("could not load its weights");
    waiting.join();
    EXPECT_NE(error.find("rank 1: could not load its weights"), std::string::npos) << error;
  }
}

TEST(TensorParallel, RefusesWhatIsNotBuiltForItYet) {
  Qwen3Config c = testing::small_config(false);
  c.vocab_size = 96;
  const testing::HostWeights w = testing::random_weights(c, 5);
  auto backend = create_backend("cpu");
  InProcessGroup group(2);
  std::unique_ptr<Communicator> comm = group.communicator(0);
  TensorParallel tp{plan_tensor_parallel(c, 2, 0), comm.get()};
  Qwen3Model model(*backend, c, w.lookup(), nullptr, &tp);
  try {
    model.enable_lora(2);
    ADD_FAILURE() << "LoRA was accepted at TP 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA"), std::string::npos) << e.what();
  }
  // A communicator of another rank than the plan's is refused.
  std::unique_ptr<Communicator> other = group.communicator(1);
  TensorParallel wrong{plan_tensor_parallel(c, 2, 0), other.get()};
  EXPECT_THROW(Qwen3Model(*backend, c, w.lookup(), nullptr, &wrong), Error);
}

}  // namespace
}  // namespace pagellm
