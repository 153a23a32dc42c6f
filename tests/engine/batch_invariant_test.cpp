// Batch-invariant mode on the CPU backend (EngineOptions::batch_invariant): one seeded
// request's tokens, sampled log-probabilities and logits are the same bits when it runs
// alone, beside 63 random requests, arriving while those already decode (its prompt
// chunked and mixed with their decode rows), and under another chunk size
// (max_num_batched_tokens). The scenarios are meaningful because the request's rows go
// through matrix products of many different row counts (asserted), which is what makes
// sgemm's blocking, and so its rounding, differ without the mode.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

/// Records the row count of every matrix product.
class CountingBackend : public CpuBackend {
 public:
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    row_counts.insert(x.size(0));
    CpuBackend::matmul(x, w, out);
  }
  std::set<int64_t> row_counts;
};

/// What the engine produced for the request under test.
struct Observed {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::map<int64_t, std::vector<float>> logits;  // output index -> logits [V]
  std::set<int64_t> row_counts;                   // every matmul's M in the run
};

enum class Scenario {
  kAlone,     // the request by itself
  kCrowd,     // submitted with 63 random requests, in the middle of them
  kMidRun,    // submitted after the 63 others have decoded for a few steps
};

Qwen3Config test_config() {
  Qwen3Config c = testing::small_config(false);
  c.hidden_size = 64;
  c.intermediate_size = 136;  // K = 136 for down_proj: a tail after the 8-wide sums
  return c;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int len, int vocab) {
  std::uniform_int_distribution<int> tok(1, vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = tok(rng);
  return p;
}

Observed run(Scenario scenario, int32_t max_batched_tokens, bool invariant,
             const Qwen3Config& c, const testing::HostWeights& w) {
  auto backend = std::make_unique<CountingBackend>();
  CountingBackend* counting = backend.get();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = 16;
  ec.num_pages = 1200;  // room for all 64 requests: no preemption
  ec.max_num_seqs = 64;
  ec.max_num_batched_tokens = max_batched_tokens;
  ec.max_model_len = 256;
  ec.batch_invariant = invariant;
  Engine engine(std::move(backend), std::move(model), ec);
  EXPECT_EQ(engine.backend().batch_invariant(), invariant);

  std::mt19937_64 rng(2026);
  const std::vector<int32_t> prompt = random_prompt(rng, 100, static_cast<int>(c.vocab_size));
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 1234;
  sp.max_tokens = 24;
  sp.ignore_eos = true;

  // The 63 others: random lengths, outputs and sampling, the same in every scenario.
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> others;
  std::uniform_int_distribution<int> prompt_len(1, 120), out_len(1, 40), seed(0, 1 << 30);
  for (int i = 0; i < 63; ++i) {
    SamplingParams o;
    o.temperature = i % 3 == 0 ? 0.0f : 0.7f;
    o.seed = seed(rng);
    o.max_tokens = out_len(rng);
    o.ignore_eos = true;
    others.emplace_back(random_prompt(rng, prompt_len(rng), static_cast<int>(c.vocab_size)), o);
  }

  Observed r;
  int64_t id = -1;
  engine.set_logits_hook([&](int64_t rid, int64_t i, const float* l, int64_t v) {
    if (rid == id) r.logits[i] = std::vector<float>(l, l + v);
  });
  switch (scenario) {
    case Scenario::kAlone:
      id = engine.add_request(prompt, sp);
      break;
    case Scenario::kCrowd:
      for (int i = 0; i < 63; ++i) {
        if (i == 31) id = engine.add_request(prompt, sp);
        engine.add_request(others[i].first, others[i].second);
      }
      break;
    case Scenario::kMidRun:
      for (const auto& [p, o] : others) engine.add_request(p, o);
      for (int s = 0; s < 6; ++s) engine.step();
      id = engine.add_request(prompt, sp);
      break;
  }
  while (engine.has_unfinished()) engine.step();
  const Sequence& seq = engine.request(id);
  EXPECT_EQ(seq.finish_reason, FinishReason::kLength) << seq.error;
  r.tokens = seq.output;
  for (const SampledToken& t : seq.sampled) r.logprobs.push_back(t.logprob);
  r.row_counts = counting->row_counts;
  engine.check_invariants();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_identical(const Observed& want, const Observed& got) {
  ASSERT_EQ(want.tokens.size(), 24u);
  EXPECT_EQ(want.tokens, got.tokens);
  EXPECT_TRUE(same_bits(want.logprobs, got.logprobs)) << "sampled log-probabilities differ";
  ASSERT_EQ(want.logits.size(), got.logits.size());
  for (const auto& [i, l] : want.logits) {
    EXPECT_TRUE(same_bits(l, got.logits.at(i))) << "logits of output token " << i << " differ";
  }
}

TEST(BatchInvariant, RequestBitsDoNotDependOnTheBatch) {
  const Qwen3Config c = test_config();
  const testing::HostWeights w = testing::random_weights(c, 5);
  const Observed alone = run(Scenario::kAlone, 2048, true, c, w);
  {
    SCOPED_TRACE("with 63 others");
    const Observed crowd = run(Scenario::kCrowd, 2048, true, c, w);
    expect_identical(alone, crowd);
    // The request's rows met products of many other row counts.
    EXPECT_GT(crowd.row_counts.size(), alone.row_counts.size() + 10);
  }
  {
    SCOPED_TRACE("arriving mid-run, chunked prefill beside decode rows");
    const Observed mid = run(Scenario::kMidRun, 64, true, c, w);
    expect_identical(alone, mid);
    EXPECT_GT(mid.row_counts.size(), alone.row_counts.size() + 10);
  }
  for (int32_t chunk : {64, 100, 77}) {
    SCOPED_TRACE("alone, max_num_batched_tokens " + std::to_string(chunk));
    const Observed chunked = run(Scenario::kAlone, chunk, true, c, w);
    expect_identical(alone, chunked);
  }
}

// The mode changes how products are summed, not what they compute: tokens of the mode
// and of sgemm agree for the request alone, logits to float32 rounding.
TEST(BatchInvariant, ModeAgreesWithTheDefaultPathWithinRounding) {
  const Qwen3Config c = test_config();
  const testing::HostWeights w = testing::random_weights(c, 5);
  const Observed on = run(Scenario::kAlone, 2048, true, c, w);
  const Observed off = run(Scenario::kAlone, 2048, false, c, w);
  ASSERT_EQ(on.logits.size(), off.logits.size());
  for (const auto& [i, l] : on.logits) {
    const std::vector<float>& o = off.logits.at(i);
    for (size_t v = 0; v < l.size(); ++v) ASSERT_NEAR(l[v], o[v], 1e-4f) << "token " << i;
  }
  EXPECT_EQ(on.tokens, off.tokens);
}

// The product alone: row r of x·wᵀ is the same bits whatever rows surround it and however
// many there are, and it is within float32 rounding of a float64 product. Inputs are fresh
// per M; the output is poisoned with NaN first.
TEST(BatchInvariant, FixedOrderMatmulRowsDoNotDependOnM) {
  CpuBackend backend;
  backend.set_batch_invariant(true);
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t K : {8, 61, 256}) {
    const int64_t N = 37;
    std::vector<float> w(static_cast<size_t>(N * K)), row(static_cast<size_t>(K));
    for (auto& v : w) v = normal(rng);
    for (auto& v : row) v = normal(rng);
    Tensor wt(w.data(), DType::F32, {N, K});
    std::vector<float> first;
    for (int64_t M : {1, 2, 7, 33, 200}) {
      std::vector<float> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = normal(rng);
      const int64_t at = M / 2;  // the row under test sits among fresh random rows
      std::copy(row.begin(), row.end(), x.begin() + at * K);
      std::vector<float> out(static_cast<size_t>(M * N), std::nanf(""));
      Tensor xt(x.data(), DType::F32, {M, K}), ot(out.data(), DType::F32, {M, N});
      backend.matmul(xt, wt, ot);
      for (float v : out) ASSERT_TRUE(std::isfinite(v)) << "M " << M;
      std::vector<float> got(out.begin() + at * N, out.begin() + (at + 1) * N);
      if (first.empty()) {
        first = got;
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0.0;
          for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(row[k]) * w[n * K + k];
          EXPECT_NEAR(got[n], ref, 1e-5 * K) << "K " << K << " column " << n;
        }
      }
      EXPECT_TRUE(same_bits(first, got)) << "K " << K << ": row bits changed at M " << M;
    }
  }
}

TEST(BatchInvariant, OffByDefault) {
  EXPECT_FALSE(EngineOptions{}.batch_invariant);
  EXPECT_FALSE(CpuBackend{}.batch_invariant());
}

}  // namespace
}  // namespace pagellm
