// Batch-invariant mode on the CUDA backend (CudaBackend::set_batch_invariant).
//
// Per op: a row's output bits do not change with the row count M (products: skinny kernel
// with 64-token tiles and a split count fixed by the shape, M from 1 to 1,000) or with the
// batch it comes in (attention: a query row alone, among other decode rows, and as the
// last row of a prefill chunk), and the results stay within the usual bf16 tolerance of
// the CPU backend. Fresh random inputs (seed printed; PAGELLM_TEST_SEED replays), outputs
// poisoned with NaN first.
//
// End to end, graphs on: one seeded request's tokens, log-probabilities and logits are the
// same bits alone, beside 63 random requests, arriving while those decode (its prefill
// chunked and mixed with their decode rows) and under another chunk size; its first
// token's logits agree with the CPU backend's in the same mode. The samples of an n = 8
// group (copy-on-write of their shared page) are the bits of single requests.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "model/model_test_util.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/lora.h"

namespace pagellm {
namespace {

using test::CudaOpTest;
using test::relative_close;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> row_of(const std::vector<float>& m, int64_t row, int64_t width) {
  return std::vector<float>(m.begin() + row * width, m.begin() + (row + 1) * width);
}

class BatchInvariantOpTest : public CudaOpTest {
 protected:
  void SetUp() override {
    CudaOpTest::SetUp();
    if (IsSkipped()) return;
    gpu().set_batch_invariant(true);
    cpu().set_batch_invariant(true);
    std::printf("batch invariant test %s\n", seed_note().c_str());
  }
};

// Row `at` of x · wᵀ (and of the fused SiLU product) holds the same bits for every M.
TEST_F(BatchInvariantOpTest, ProductRowsDoNotDependOnM) {
  struct Shape {
    int64_t N, K;
    bool f32;
  };
  // Qwen3-4B's o_proj (narrow N: the largest split count) and qkv, an f32 "lm_head" with a
  // ragged N, a small K with one split.
  for (const Shape s : {Shape{2560, 4096, false}, Shape{6144, 2560, false},
                        Shape{4000, 1024, true}, Shape{384, 256, false}}) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " K " + std::to_string(s.K));
    const DType out_type = s.f32 ? DType::F32 : DType::BF16;
    const std::vector<float> wv = randn_bf16(static_cast<size_t>(s.N * s.K), 0.05f);
    const std::vector<float> row = randn_bf16(static_cast<size_t>(s.K));
    Tensor w = put(gpu(), DType::BF16, {s.N, s.K}, wv);
    gpu().prepare_matrix(w);  // the packed copy, as the model has it
    Tensor wc = put(cpu(), DType::F32, {s.N, s.K}, wv);
    std::vector<float> first;
    for (int64_t M : {1, 2, 7, 8, 9, 31, 32, 33, 64, 65, 127, 300, 1000}) {
      std::vector<float> xv = randn_bf16(static_cast<size_t>(M * s.K));
      const int64_t at = M - 1 - M / 3;
      std::copy(row.begin(), row.end(), xv.begin() + at * s.K);
      Tensor x = put(gpu(), DType::BF16, {M, s.K}, xv);
      Tensor out = alloc(gpu(), out_type, {M, s.N});
      poison(gpu(), out);
      gpu().matmul(x, w, out);
      const std::vector<float> got = gpu().download_f32(out);
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "M " << M << "; " << seed_note();
      const std::vector<float> r = row_of(got, at, s.N);
      if (first.empty()) {
        first = r;
        Tensor xc = put(cpu(), DType::F32, {M, s.K}, xv);
        Tensor oc = alloc(cpu(), DType::F32, {M, s.N});
        cpu().matmul(xc, wc, oc);
        EXPECT_TRUE(relative_close(got, cpu().download_f32(oc), s.f32 ? 1e-3 : 1e-2,
                                   "product vs cpu", seed_note()));
      }
      ASSERT_TRUE(same_bits(first, r)) << "row bits changed at M " << M << "; " << seed_note();
    }
  }
  // The fused gate|up product with SiLU.
  const int64_t I = 1024, K = 512;
  const std::vector<float> wv = randn_bf16(static_cast<size_t>(2 * I * K), 0.05f);
  const std::vector<float> row = randn_bf16(static_cast<size_t>(K));
  Tensor w = put(gpu(), DType::BF16, {2 * I, K}, wv);
  gpu().prepare_matrix(w, I);
  std::vector<float> first;
  for (int64_t M : {1, 5, 32, 33, 64, 200}) {
    std::vector<float> xv = randn_bf16(static_cast<size_t>(M * K));
    std::copy(row.begin(), row.end(), xv.begin());
    Tensor x = put(gpu(), DType::BF16, {M, K}, xv);
    Tensor gate_up = alloc(gpu(), DType::BF16, {M, 2 * I});
    Tensor out = alloc(gpu(), DType::BF16, {M, I});
    poison(gpu(), out);
    gpu().matmul_silu_mul(x, w, gate_up, out);
    const std::vector<float> got = gpu().download_f32(out);
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "gated M " << M;
    const std::vector<float> r = row_of(got, 0, I);
    if (first.empty()) first = r;
    ASSERT_TRUE(same_bits(first, r)) << "gated row bits changed at M " << M << "; " << seed_note();
  }
}

// A query row's attention output is the same bits as a lone decode row, as one of 40 decode
// rows, and as the last row of a 100-token prefill chunk beside other sequences; and it is
// within bf16 tolerance of the CPU backend.
TEST_F(BatchInvariantOpTest, AttentionRowsDoNotDependOnTheBatch) {
  const int64_t Hq = 32, Hkv = 8, D = 128, P = 16, pages = 1200;
  AttentionShape shape{Hq, Hkv, D, P, 1.0f / std::sqrt(static_cast<float>(D))};
  const int32_t max_pages = 64;  // 1,024 tokens per sequence
  const std::vector<float> kv_host = randn_bf16(static_cast<size_t>(pages * Hkv * P * D));
  const std::vector<float> vv_host = randn_bf16(static_cast<size_t>(pages * Hkv * P * D));
  LayerKv kv{put(gpu(), DType::BF16, {pages, Hkv, P, D}, kv_host),
             put(gpu(), DType::BF16, {pages, Hkv, P, D}, vv_host)};
  LayerKv kvc{put(cpu(), DType::F32, {pages, Hkv, P, D}, kv_host),
              put(cpu(), DType::F32, {pages, Hkv, P, D}, vv_host)};
  // Sequence 0 (the one under test) owns pages 1..; every other sequence random pages.
  const int32_t len = 700;
  std::vector<int32_t> own(max_pages, 0);
  for (int j = 0; j < (len + P - 1) / P; ++j) own[j] = 1 + j;
  const std::vector<float> q_row = randn_bf16(static_cast<size_t>(Hq * D));

  // Builds a batch: sequence 0 with `q_len` query tokens ending at position len - 1 (its
  // last row is q_row), then `others` sequences with random lengths and query lengths.
  auto run = [&](int32_t q_len, int others, int32_t other_q, Backend& b, const LayerKv& pools,
                 DType dtype) {
    ForwardBatch fb;
    fb.page_size = P;
    fb.max_pages_per_seq = max_pages;
    fb.query_start = {0};
    auto add = [&](int32_t kv_len, int32_t ql, const std::vector<int32_t>& table) {
      for (int i = 0; i < ql; ++i) {
        const int32_t pos = kv_len - ql + i;
        fb.token_ids.push_back(1);
        fb.positions.push_back(pos);
        fb.slot_mapping.push_back(table[pos / P] * static_cast<int32_t>(P) + pos % P);
      }
      fb.query_start.push_back(fb.query_start.back() + ql);
      fb.kv_lens.push_back(kv_len);
      fb.page_table.insert(fb.page_table.end(), table.begin(), table.end());
    };
    add(len, q_len, own);
    for (int o = 0; o < others; ++o) {
      const int32_t l = uniform_int(other_q, 1000);
      std::vector<int32_t> t(max_pages, 0);
      for (int j = 0; j < (l + P - 1) / P; ++j) t[j] = uniform_int(1, static_cast<int>(pages) - 1);
      add(l, other_q, t);
    }
    fb.logits_indices = {0};
    const int64_t T = fb.num_tokens();
    std::vector<float> qv = randn_bf16(static_cast<size_t>(T * Hq * D));
    std::copy(q_row.begin(), q_row.end(), qv.begin() + (q_len - 1) * Hq * D);
    Tensor q = put(b, dtype, {T, Hq, D}, qv);
    Tensor out = alloc(b, dtype, {T, Hq * D});
    poison(b, out);
    BatchTensors bt = b.upload_batch(fb);
    const AttentionPlanRef plan = b.plan_attention(bt, shape, pools);
    b.attention(q, pools, shape, bt, plan, out);
    const std::vector<float> all = b.download_f32(out);
    for (float v : all) EXPECT_TRUE(std::isfinite(v)) << seed_note();
    return row_of(all, q_len - 1, Hq * D);
  };
  const std::vector<float> alone = run(1, 0, 1, gpu(), kv, DType::BF16);
  EXPECT_TRUE(same_bits(alone, run(1, 40, 1, gpu(), kv, DType::BF16)))
      << "among 40 decode rows; " << seed_note();
  EXPECT_TRUE(same_bits(alone, run(100, 5, 37, gpu(), kv, DType::BF16)))
      << "last row of a prefill chunk; " << seed_note();
  EXPECT_TRUE(same_bits(alone, run(len, 0, 1, gpu(), kv, DType::BF16)))
      << "last row of a whole-prompt prefill; " << seed_note();
  const std::vector<float> ref = run(1, 0, 1, cpu(), kvc, DType::F32);
  EXPECT_TRUE(relative_close(alone, ref, 1e-2, "attention vs cpu", seed_note()));
}

TEST_F(BatchInvariantOpTest, CudnnIsRefused) {
  gpu().set_batch_invariant(false);
  try {
    gpu().set_attention_backend("cudnn");
  } catch (const Error&) {
    GTEST_SKIP() << "no cuDNN here";
  }
  EXPECT_THROW(gpu().set_batch_invariant(true), Error);
  gpu().set_attention_backend("native");
  gpu().set_batch_invariant(true);
  EXPECT_TRUE(gpu().batch_invariant());
}

// ---- end to end ---------------------------------------------------------------------------

struct Observed {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::map<int64_t, std::vector<float>> logits;
  int64_t graph_steps = 0;
};

enum class Scenario { kAlone, kCrowd, kMidRun };

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int len, int vocab) {
  std::uniform_int_distribution<int> tok(1, vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = tok(rng);
  return p;
}

// A batch-invariant engine of config c with weights w: 16-token pages, 1,600 of them, 64
// sequences, chunks of `chunk` tokens.
std::unique_ptr<Engine> invariant_engine(const std::string& backend_name, int32_t chunk,
                                         const Qwen3Config& c, const testing::HostWeights& w,
                                         int32_t pipelined_decode_steps = 1) {
  auto backend = create_backend(backend_name);
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.backend = backend_name;
  ec.page_size = 16;
  ec.num_pages = 1600;
  ec.max_num_seqs = 64;
  ec.max_num_batched_tokens = chunk;
  ec.max_model_len = 512;
  ec.batch_invariant = true;
  ec.pipelined_decode_steps = pipelined_decode_steps;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

// With adapter_dirs, adapters a0, a1, ... are loaded; the observed request runs with a0 and
// the others with a0, a1 or none in turn.
Observed generate(const std::string& backend_name, Scenario scenario, int32_t chunk,
                  const Qwen3Config& c, const testing::HostWeights& w,
                  const std::vector<std::string>& adapter_dirs = {}) {
  const std::unique_ptr<Engine> owned = invariant_engine(backend_name, chunk, c, w);
  Engine& engine = *owned;
  for (size_t i = 0; i < adapter_dirs.size(); ++i) {
    engine.load_lora_adapter({"a" + std::to_string(i), static_cast<int64_t>(i + 1), adapter_dirs[i]});
  }
  const std::string lora = adapter_dirs.empty() ? "" : "a0";
  auto other_lora = [&](int i) -> std::string {
    if (adapter_dirs.empty() || i % 3 == 0) return "";
    return i % 3 == 1 ? "a0" : "a" + std::to_string(adapter_dirs.size() - 1);
  };
  std::mt19937_64 rng(99);
  const std::vector<int32_t> prompt = random_prompt(rng, 150, static_cast<int>(c.vocab_size));
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 4321;
  sp.max_tokens = 40;
  sp.ignore_eos = true;
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> others;
  std::uniform_int_distribution<int> plen(1, 300), olen(1, 60), seed(0, 1 << 30);
  for (int i = 0; i < 63; ++i) {
    SamplingParams o;
    o.temperature = i % 2 ? 0.8f : 0.0f;
    o.seed = seed(rng);
    o.max_tokens = olen(rng);
    o.ignore_eos = true;
    others.emplace_back(random_prompt(rng, plen(rng), static_cast<int>(c.vocab_size)), o);
  }
  Observed r;
  int64_t id = -1;
  engine.set_logits_hook([&](int64_t rid, int64_t i, const float* l, int64_t v) {
    if (rid == id) r.logits[i] = std::vector<float>(l, l + v);
  });
  switch (scenario) {
    case Scenario::kAlone:
      id = engine.add_request(prompt, sp, lora);
      break;
    case Scenario::kCrowd:
      for (int i = 0; i < 63; ++i) {
        if (i == 20) id = engine.add_request(prompt, sp, lora);
        engine.add_request(others[i].first, others[i].second, other_lora(i));
      }
      break;
    case Scenario::kMidRun:
      for (int i = 0; i < 63; ++i) engine.add_request(others[i].first, others[i].second, other_lora(i));
      for (int s = 0; s < 8; ++s) engine.step();
      id = engine.add_request(prompt, sp, lora);
      break;
  }
  while (engine.has_unfinished()) engine.step();
  const Sequence& seq = engine.request(id);
  EXPECT_EQ(seq.finish_reason, FinishReason::kLength) << seq.error;
  r.tokens = seq.output;
  for (const SampledToken& t : seq.sampled) r.logprobs.push_back(t.logprob);
  r.graph_steps = engine.stats().graph_steps;
  return r;
}

void expect_identical(const Observed& want, const Observed& got) {
  ASSERT_EQ(want.tokens.size(), 40u);
  EXPECT_EQ(want.tokens, got.tokens);
  EXPECT_TRUE(same_bits(want.logprobs, got.logprobs)) << "sampled log-probabilities differ";
  ASSERT_EQ(want.logits.size(), got.logits.size());
  for (const auto& [i, l] : want.logits) {
    EXPECT_TRUE(same_bits(l, got.logits.at(i))) << "logits of output token " << i << " differ";
  }
}

TEST(BatchInvariantEngine, RequestBitsDoNotDependOnTheBatchWithGraphs) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 17);
  const Observed alone = generate("cuda", Scenario::kAlone, 2048, c, w);
  EXPECT_GT(alone.graph_steps, 30);  // its decode steps replayed captured graphs
  {
    SCOPED_TRACE("with 63 others");
    const Observed crowd = generate("cuda", Scenario::kCrowd, 2048, c, w);
    EXPECT_GT(crowd.graph_steps, 30);
    expect_identical(alone, crowd);
  }
  {
    SCOPED_TRACE("arriving mid-run, chunks of 64 beside decode rows");
    expect_identical(alone, generate("cuda", Scenario::kMidRun, 64, c, w));
  }
  {
    SCOPED_TRACE("alone, chunks of 100");
    expect_identical(alone, generate("cuda", Scenario::kAlone, 100, c, w));
  }
  // The same mode on the CPU backend (float32): the first token's logits agree within the
  // bf16 tolerance (later ones may follow another sampled history).
  const Observed cpu = generate("cpu", Scenario::kAlone, 2048, c, w);
  ASSERT_TRUE(cpu.logits.count(0) && alone.logits.count(0));
  EXPECT_TRUE(relative_close(alone.logits.at(0), cpu.logits.at(0), 3e-2, "first logits vs cpu",
                             "fixed weights seed 17"));
}

// The same promise with LoRA: the observed request runs with an adapter among requests of
// another adapter and of none, through LoRA decode graphs and prefill chunks.
TEST(BatchInvariantEngine, LoraRequestBitsDoNotDependOnTheBatch) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 23);
  testing::TempDir d0, d1;
  LoraConfig cfg;
  cfg.rank = 16;
  cfg.alpha = 32;
  cfg.target_modules = {kAllLoraModules.begin(), kAllLoraModules.end()};
  make_lora_adapter(d0.path(), c, cfg, 31, DType::BF16, 0.05f);
  cfg.rank = 8;
  cfg.target_modules = {LoraModule::kQ, LoraModule::kV, LoraModule::kDown};
  make_lora_adapter(d1.path(), c, cfg, 32, DType::BF16, 0.05f);
  const std::vector<std::string> dirs = {d0.path(), d1.path()};
  const Observed alone = generate("cuda", Scenario::kAlone, 2048, c, w, dirs);
  EXPECT_GT(alone.graph_steps, 30);  // LoRA decode graphs
  {
    SCOPED_TRACE("with 63 others (two adapters and none)");
    const Observed crowd = generate("cuda", Scenario::kCrowd, 2048, c, w, dirs);
    EXPECT_GT(crowd.graph_steps, 30);
    expect_identical(alone, crowd);
  }
  {
    SCOPED_TRACE("arriving mid-run, chunks of 64 beside decode rows");
    expect_identical(alone, generate("cuda", Scenario::kMidRun, 64, c, w, dirs));
  }
  // The adapter matters: without it the request's first logits differ.
  const Observed base = generate("cuda", Scenario::kAlone, 2048, c, w);
  ASSERT_TRUE(base.logits.count(0) && alone.logits.count(0));
  EXPECT_FALSE(same_bits(base.logits.at(0), alone.logits.at(0)));
}

// n-sample fan-out with graphs: a group of 8 samples shares its prompt's pages and the 7
// forked samples copy the partly filled last page (CudaBackend::copy_kv_pages, one launch)
// before writing into it. Each sample's tokens, log-probabilities and logits are the bits
// of a single request with its seed: a page copied late, short or into the wrong place would
// change what the samples attend over.
TEST(BatchInvariantEngine, FanOutSamplesAreTheBitsOfSingleRequests) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 23);
  std::mt19937_64 rng(5);
  // 150 tokens: 9 full pages of 16 and 6 tokens on the last, shared one.
  const std::vector<int32_t> prompt = random_prompt(rng, 150, static_cast<int>(c.vocab_size));
  constexpr int kSamples = 8;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 700;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  auto run = [&](bool group, int64_t* cow_copies) {
    const std::unique_ptr<Engine> owned = invariant_engine("cuda", 2048, c, w);
    Engine& engine = *owned;
    std::vector<Observed> r(kSamples);
    std::map<int64_t, size_t> index;
    engine.set_logits_hook([&](int64_t rid, int64_t i, const float* l, int64_t v) {
      r[index.at(rid)].logits[i] = std::vector<float>(l, l + v);
    });
    std::vector<int64_t> ids;
    if (group) {
      SamplingParams g = sp;
      g.n = kSamples;
      ids = engine.add_request_group(prompt, g);
    } else {
      for (int j = 0; j < kSamples; ++j) {
        SamplingParams one = sp;
        one.seed = *sp.seed + static_cast<uint64_t>(j);
        ids.push_back(engine.add_request(prompt, one));
      }
    }
    for (size_t j = 0; j < ids.size(); ++j) index[ids[j]] = j;
    while (engine.has_unfinished()) engine.step();
    for (size_t j = 0; j < ids.size(); ++j) {
      const Sequence& seq = engine.request(ids[j]);
      EXPECT_EQ(seq.finish_reason, FinishReason::kLength) << seq.error;
      r[j].tokens = seq.output;
      for (const SampledToken& t : seq.sampled) r[j].logprobs.push_back(t.logprob);
    }
    *cow_copies = engine.stats().cow_page_copies;
    EXPECT_GT(engine.stats().graph_steps, 20);
    return r;
  };
  int64_t group_copies = 0, single_copies = 0;
  const std::vector<Observed> group = run(true, &group_copies);
  const std::vector<Observed> single = run(false, &single_copies);
  EXPECT_EQ(group_copies, kSamples - 1);
  EXPECT_EQ(single_copies, 0);
  for (int j = 0; j < kSamples; ++j) {
    SCOPED_TRACE("sample " + std::to_string(j));
    ASSERT_EQ(group[j].tokens.size(), 24u);
    EXPECT_EQ(group[j].tokens, single[j].tokens);
    EXPECT_TRUE(same_bits(group[j].logprobs, single[j].logprobs));
    ASSERT_EQ(group[j].logits.size(), single[j].logits.size());
    for (const auto& [i, l] : single[j].logits) {
      EXPECT_TRUE(same_bits(l, group[j].logits.at(i))) << "logits of output token " << i;
    }
  }
  // The samples differ from one another (their seeds do), so equal bits are not a
  // coincidence of one shared history.
  EXPECT_NE(group[0].tokens, group[1].tokens);
}

// Pipelined decode on the GPU (docs/design.md, "Pipelined decode"): an n = 8 group and 24
// single requests of different lengths, some ending by a stop token taken from a first
// run, give the same tokens and log-probability bits with pipelined_decode_steps 8 as
// step by step, with decode graphs, the async sampler and the fed tokens.
TEST(BatchInvariantEngine, PipelinedDecodeGivesTheBitsOfStepByStep) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 29);
  std::mt19937_64 rng(17);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  std::uniform_int_distribution<int> plen(1, 200), olen(1, 80), seed(0, 1 << 30);
  for (int i = 0; i < 25; ++i) {
    prompts.push_back(random_prompt(rng, plen(rng), static_cast<int>(c.vocab_size)));
    SamplingParams p;
    p.temperature = i % 2 ? 0.8f : 0.0f;
    p.seed = seed(rng);
    p.max_tokens = olen(rng);
    p.ignore_eos = true;
    if (i == 0) {
      p.n = 8;
      p.temperature = 1.0f;
    }
    params.push_back(p);
  }
  struct Run {
    std::map<int64_t, Observed> by_id;
    int64_t pipelined = 0;
    int64_t graph_steps = 0;
  };
  auto run = [&](int32_t steps, const std::map<int64_t, Observed>* stops) {
    const std::unique_ptr<Engine> owned = invariant_engine("cuda", 2048, c, w, steps);
    Engine& engine = *owned;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p = params[i];
      const int64_t first = static_cast<int64_t>(ids.size()) + 1;
      if (stops != nullptr && i % 3 == 1) {
        const Observed& o = stops->at(first);
        if (o.tokens.size() > 6) p.stop_token_ids = {o.tokens[o.tokens.size() / 2]};
      }
      for (int64_t id : engine.add_request_group(prompts[i], p)) ids.push_back(id);
    }
    while (engine.has_unfinished()) engine.step();
    Run r;
    for (int64_t id : ids) {
      const Sequence& seq = engine.request(id);
      EXPECT_NE(seq.finish_reason, FinishReason::kError) << seq.error;
      Observed& o = r.by_id[id];
      o.tokens = seq.output;
      for (const SampledToken& t : seq.sampled) o.logprobs.push_back(t.logprob);
    }
    EXPECT_EQ(engine.allocator().num_referenced(), 0);
    r.pipelined = engine.stats().pipelined_steps;
    r.graph_steps = engine.stats().graph_steps;
    return r;
  };
  const Run unstopped = run(1, nullptr);
  const Run want = run(1, &unstopped.by_id);
  const Run got = run(8, &unstopped.by_id);
  EXPECT_EQ(want.pipelined, 0);
  EXPECT_GT(got.pipelined, 30);
  EXPECT_GT(got.graph_steps, 30);
  ASSERT_EQ(want.by_id.size(), got.by_id.size());
  int shorter = 0;
  for (const auto& [id, o] : want.by_id) {
    SCOPED_TRACE("request " + std::to_string(id));
    EXPECT_EQ(o.tokens, got.by_id.at(id).tokens);
    EXPECT_TRUE(same_bits(o.logprobs, got.by_id.at(id).logprobs));
    shorter += o.tokens.size() < unstopped.by_id.at(id).tokens.size() ? 1 : 0;
  }
  EXPECT_GE(shorter, 3) << "requests meant to end by a stop token inside runs";
}

}  // namespace
}  // namespace pagellm
