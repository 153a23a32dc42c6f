// The GPU sampler against the host sampler (engine/sampler.h): the same logits, parameters,
// seeds and output indices must give the same tokens and close log-probabilities.
//
// Both use the same counter-based random bits, exp polynomial, thresholds and tie rules,
// so tokens should agree exactly. A disagreement is tolerated only where the two can
// legitimately differ by float rounding -- two Gumbel scores within 1e-9, or a top-p /
// min-p threshold that lands within rounding of a token -- and such rows are counted and
// bounded (at most 1 per comparison or 1 in 200 rows). Log-probabilities of agreeing rows must be within
// 1e-4 + 1e-5 |value| (both are float casts of double computations that differ only in
// summation order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/common/random.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {
namespace {

class GpuSamplerTest : public test::CudaOpTest {
 protected:
  enum class Shape { kPeaked, kFlat, kQuantised, kSpecial };

  // One row of LLM-like logits: N(0, 2.5) with a few tokens 8-15 above the rest, or a
  // nearly flat row, or values on a 0.25 grid (many exact ties), or peaked with NaN/inf.
  std::vector<float> make_logits(int64_t V, Shape shape) {
    std::vector<float> row(static_cast<size_t>(V));
    std::normal_distribution<float> base(0.0f, shape == Shape::kFlat ? 0.05f : 2.5f);
    for (float& v : row) v = base(rng_);
    if (shape == Shape::kQuantised) {
      for (float& v : row) v = std::round(v * 4.0f) / 4.0f;
    }
    if (shape != Shape::kFlat) {
      const int peaks = uniform_int(1, 5);
      for (int i = 0; i < peaks; ++i) {
        row[static_cast<size_t>(uniform_int(0, static_cast<int>(V - 1)))] +=
            std::uniform_real_distribution<float>(8.0f, 15.0f)(rng_);
      }
    }
    if (shape == Shape::kSpecial) {
      for (int i = 0; i < 20; ++i) row[static_cast<size_t>(uniform_int(0, static_cast<int>(V - 1)))] = NAN;
      for (int i = 0; i < 20; ++i) row[static_cast<size_t>(uniform_int(0, static_cast<int>(V - 1)))] = -INFINITY;
      row[static_cast<size_t>(uniform_int(0, static_cast<int>(V - 1)))] = INFINITY;
    }
    return row;
  }

  std::vector<int32_t> random_tokens(int64_t V, int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    // Draw from a narrow range so that tokens repeat (frequency counts > 1).
    const int hi = static_cast<int>(std::min<int64_t>(V - 1, 3 * n + 10));
    for (int32_t& x : t) x = uniform_int(0, hi);
    return t;
  }

  // Why the host and GPU may disagree on this row (a rounding-level tie), or "" if they
  // should not.
  std::string ambiguity(const float* logits, int64_t V, const SamplingRow& row, int32_t a,
                        int32_t b) {
    const SamplingParams& p = *row.params;
    if (p.greedy()) return "";
    SamplerWorkspace ws;
    const ProcessedRow pr = process_logits(logits, V, row, false, ws);
    const std::vector<float>& x = ws.processed();
    const uint64_t key = sampling_stream_key(row.seed, static_cast<uint64_t>(row.output_index));
    const double sa = double(x[static_cast<size_t>(a)]) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(a)));
    const double sb = double(x[static_cast<size_t>(b)]) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(b)));
    if (std::fabs(sa - sb) <= 1e-9 * std::max(1.0, std::fabs(sa))) return "Gumbel scores tie";
    for (int32_t t : {a, b}) {
      if (std::isfinite(pr.threshold) &&
          std::fabs(double(x[static_cast<size_t>(t)]) - pr.threshold) <= 1e-6 * std::max(1.0, std::fabs(pr.threshold))) {
        return "token at the threshold";
      }
    }
    if (p.top_p < 1.0f) {
      // The host's top-p walk: sorted (value desc, id asc) over the top-k set, cumulative
      // probability against (top_p - 1e-6) x total.
      std::vector<std::pair<float, int32_t>> c;
      for (int64_t i = 0; i < V; ++i) {
        if (x[static_cast<size_t>(i)] > -INFINITY) c.push_back({x[static_cast<size_t>(i)], static_cast<int32_t>(i)});
      }
      std::sort(c.begin(), c.end(), [](const auto& l, const auto& r) {
        return l.first > r.first || (l.first == r.first && l.second < r.second);
      });
      if (p.top_k > 0 && p.top_k < V && static_cast<size_t>(p.top_k) <= c.size()) {
        const float kth = c[static_cast<size_t>(p.top_k - 1)].first;
        while (!c.empty() && c.back().first < kth) c.pop_back();
      }
      const float m = pr.max_value;
      double total = 0.0;
      for (const auto& e : c) total += std::exp(double(e.first) - m);
      const double target = (double(p.top_p) - 1e-6) * total;
      double cumulative = 0.0;
      for (const auto& e : c) {
        cumulative += std::exp(double(e.first) - m);
        if (std::fabs(cumulative - target) <= 1e-6 * total) return "top-p boundary";
      }
    }
    return "";
  }

  // Samples rows of logits [R, V] on both sides and compares. Returns the number of
  // tolerated (ambiguous) mismatches.
  int compare(const std::vector<float>& logits, int64_t R, int64_t V,
              const std::vector<SamplingRow>& rows, const std::string& what) {
    Tensor g = alloc(gpu(), DType::F32, {R, V});
    gpu().upload(g, 0, logits.data(), DType::F32, R * V);
    const std::vector<SampledToken> got = gpu().sample(g, rows);
    const std::vector<SampledToken> ref = sample_rows(logits.data(), R, V, rows);
    EXPECT_EQ(got.size(), ref.size());
    int tolerated = 0;
    for (int64_t r = 0; r < R; ++r) {
      const SampledToken& a = got[static_cast<size_t>(r)];
      const SampledToken& b = ref[static_cast<size_t>(r)];
      const SamplingParams& p = *rows[static_cast<size_t>(r)].params;
      const std::string row_note = what + ", row " + std::to_string(r) + " (temperature " +
                                   std::to_string(p.temperature) + ", top_k " +
                                   std::to_string(p.top_k) + ", top_p " + std::to_string(p.top_p) +
                                   ", min_p " + std::to_string(p.min_p) + ", penalties " +
                                   std::to_string(p.repetition_penalty) + "/" +
                                   std::to_string(p.presence_penalty) + "/" +
                                   std::to_string(p.frequency_penalty) + "); " + seed_note();
      if (a.token != b.token) {
        const std::string why = ambiguity(logits.data() + r * V, V, rows[static_cast<size_t>(r)],
                                          a.token, b.token);
        EXPECT_FALSE(why.empty()) << "GPU token " << a.token << ", host token " << b.token
                                  << ": " << row_note;
        if (!why.empty()) {
          std::printf("tolerated mismatch (%s): %s\n", why.c_str(), row_note.c_str());
          ++tolerated;
        }
        continue;
      }
      EXPECT_NEAR(a.logprob, b.logprob, 1e-4 + 1e-5 * std::fabs(b.logprob))
          << "logprob of token " << a.token << ": " << row_note;
      EXPECT_NEAR(a.processed_logprob, b.processed_logprob,
                  1e-4 + 1e-5 * std::fabs(b.processed_logprob))
          << "processed logprob of token " << a.token << ": " << row_note;
    }
    EXPECT_LE(tolerated, std::max<int64_t>(1, R / 200)) << what << ": " << tolerated << " ambiguous rows of " << R
                                  << "; " << seed_note();
    return tolerated;
  }

  std::vector<SamplingParams> parameter_sets() {
    std::vector<SamplingParams> sets;
    auto add = [&](float t, int k, float top_p, float min_p, bool processed) {
      SamplingParams p;
      p.temperature = t;
      p.top_k = k;
      p.top_p = top_p;
      p.min_p = min_p;
      p.processed_logprobs = processed;
      sets.push_back(p);
    };
    add(1.0f, 0, 1.0f, 0.0f, true);       // plain sampling: the race over the whole row
    add(1.0f, 0, 1.0f, 0.0f, false);      // the same without the normaliser (W2's rows)
    add(0.6f, 20, 0.95f, 0.0f, true);     // Qwen3's recommended settings
    add(0.7f, 0, 0.8f, 0.0f, true);       // top-p alone
    add(1.0f, 50, 1.0f, 0.0f, false);     // top-k alone
    add(1.3f, 0, 1.0f, 0.05f, true);      // min-p alone
    add(1.0f, 3000, 1.0f, 0.0f, true);    // top-k beyond the shared-memory candidates
    add(0.8f, 100, 0.9f, 0.02f, true);    // everything together
    add(1.0f, 1, 1.0f, 0.0f, true);       // top-1
    add(2.0f, 0, 0.999f, 0.0f, true);     // top-p close to 1 at high temperature
    add(0.05f, 0, 1.0f, 0.0f, true);      // very low temperature
    return sets;
  }
};

TEST_F(GpuSamplerTest, GreedyMatchesHost) {
  for (int64_t V : {1000, 151936}) {
    const int64_t R = 48;
    std::vector<float> logits;
    for (int64_t r = 0; r < R; ++r) {
      std::vector<float> row = make_logits(V, r % 4 == 3 ? Shape::kSpecial : Shape::kQuantised);
      if (r % 5 == 0) {  // an exact tie for the maximum: the lowest id must win
        const float m = *std::max_element(row.begin(), row.end(), [](float a, float b) {
          return std::isnan(a) || (!std::isnan(b) && a < b);
        });
        row[7] = m;
        row[static_cast<size_t>(V - 2)] = m;
      }
      logits.insert(logits.end(), row.begin(), row.end());
    }
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingParams greedy_penalised = greedy;
    greedy_penalised.repetition_penalty = 1.5f;
    greedy_penalised.presence_penalty = 1.0f;
    greedy_penalised.frequency_penalty = 0.5f;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(R)), outputs(static_cast<size_t>(R));
    std::vector<SamplingRow> rows(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      prompts[static_cast<size_t>(r)] = random_tokens(V, 50);
      outputs[static_cast<size_t>(r)] = random_tokens(V, 20);
      SamplingRow& row = rows[static_cast<size_t>(r)];
      row.params = r % 2 ? &greedy_penalised : &greedy;
      row.seed = rng_();
      row.output_index = uniform_int(0, 1000);
      row.prompt_tokens = &prompts[static_cast<size_t>(r)];
      row.output_tokens = &outputs[static_cast<size_t>(r)];
    }
    compare(logits, R, V, rows, "greedy, vocab " + std::to_string(V));
  }
}

TEST_F(GpuSamplerTest, SeededSamplingMatchesHost) {
  const std::vector<SamplingParams> sets = parameter_sets();
  for (int64_t V : {1000, 151936}) {
    for (Shape shape : {Shape::kPeaked, Shape::kFlat, Shape::kQuantised, Shape::kSpecial}) {
      const int64_t R = static_cast<int64_t>(sets.size()) * 4;
      std::vector<float> logits;
      std::vector<SamplingRow> rows(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) {
        const std::vector<float> row = make_logits(V, shape);
        logits.insert(logits.end(), row.begin(), row.end());
        rows[static_cast<size_t>(r)].params = &sets[static_cast<size_t>(r) % sets.size()];
        rows[static_cast<size_t>(r)].seed = rng_();
        rows[static_cast<size_t>(r)].output_index = uniform_int(0, 5000);
      }
      compare(logits, R, V, rows,
              "seeded sampling, vocab " + std::to_string(V) + ", logits shape " +
                  std::to_string(static_cast<int>(shape)));
    }
  }
}

TEST_F(GpuSamplerTest, PenalisedSamplingMatchesHost) {
  const int64_t V = 151936, R = 32;
  std::vector<SamplingParams> sets(4);
  sets[0].repetition_penalty = 1.3f;
  sets[0].temperature = 0.9f;
  sets[0].top_p = 0.9f;
  sets[1].presence_penalty = 1.5f;
  sets[1].frequency_penalty = -0.7f;
  sets[1].top_k = 40;
  sets[2].repetition_penalty = 0.8f;  // < 1 boosts repeated tokens
  sets[2].frequency_penalty = 2.0f;
  sets[2].processed_logprobs = true;
  sets[3].repetition_penalty = 1.1f;
  sets[3].presence_penalty = 0.5f;
  sets[3].frequency_penalty = 0.5f;
  sets[3].temperature = 0.7f;
  sets[3].top_k = 20;
  sets[3].top_p = 0.95f;
  sets[3].processed_logprobs = true;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(R)), outputs(static_cast<size_t>(R));
  std::vector<float> logits;
  std::vector<SamplingRow> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> row = make_logits(V, Shape::kPeaked);
    prompts[static_cast<size_t>(r)] = random_tokens(V, uniform_int(0, 300));
    outputs[static_cast<size_t>(r)] = random_tokens(V, uniform_int(0, 100));
    // Make the penalised tokens matter: lift them to the top of the distribution.
    for (int32_t t : outputs[static_cast<size_t>(r)]) row[static_cast<size_t>(t)] += 10.0f;
    logits.insert(logits.end(), row.begin(), row.end());
    SamplingRow& s = rows[static_cast<size_t>(r)];
    s.params = &sets[static_cast<size_t>(r) % sets.size()];
    s.seed = rng_();
    s.output_index = static_cast<int64_t>(outputs[static_cast<size_t>(r)].size());
    s.prompt_tokens = &prompts[static_cast<size_t>(r)];
    s.output_tokens = &outputs[static_cast<size_t>(r)];
  }
  compare(logits, R, V, rows, "penalised sampling");
}

TEST_F(GpuSamplerTest, BannedTokensMatchHost) {
  // min_tokens: the engine bans EOS and stop ids; here the banned tokens are lifted to the
  // top so that an unmasked sampler would pick them. Greedy, plain, filtered and penalised.
  const int64_t V = 151936, R = 16;
  std::vector<SamplingParams> sets(4);
  sets[0].temperature = 0.0f;
  sets[1].temperature = 1.0f;
  sets[1].processed_logprobs = true;
  sets[2].top_k = 20;
  sets[2].top_p = 0.9f;
  sets[3].presence_penalty = 0.5f;
  sets[3].repetition_penalty = 1.2f;
  std::vector<std::vector<int32_t>> outputs(static_cast<size_t>(R)), banned(static_cast<size_t>(R));
  std::vector<float> logits;
  std::vector<SamplingRow> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> row = make_logits(V, Shape::kPeaked);
    outputs[static_cast<size_t>(r)] = random_tokens(V, uniform_int(0, 20));
    banned[static_cast<size_t>(r)] = random_tokens(V, uniform_int(1, 3));
    for (int32_t t : banned[static_cast<size_t>(r)]) row[static_cast<size_t>(t)] += 30.0f;
    logits.insert(logits.end(), row.begin(), row.end());
    SamplingRow& s = rows[static_cast<size_t>(r)];
    s.params = &sets[static_cast<size_t>(r) % sets.size()];
    s.seed = rng_();
    s.output_index = static_cast<int64_t>(outputs[static_cast<size_t>(r)].size());
    s.output_tokens = &outputs[static_cast<size_t>(r)];
    s.banned_tokens = &banned[static_cast<size_t>(r)];
  }
  compare(logits, R, V, rows, "banned tokens");
  Tensor g = alloc(gpu(), DType::F32, {R, V});
  gpu().upload(g, 0, logits.data(), DType::F32, R * V);
  const std::vector<SampledToken> got = gpu().sample(g, rows);
  for (int64_t r = 0; r < R; ++r) {
    const auto& b = banned[static_cast<size_t>(r)];
    EXPECT_EQ(std::find(b.begin(), b.end(), got[static_cast<size_t>(r)].token), b.end()) << r;
  }
}

TEST_F(GpuSamplerTest, TokenDoesNotDependOnTheRestOfTheBatch) {
  const int64_t V = 151936, R = 16;
  const std::vector<SamplingParams> sets = parameter_sets();
  std::vector<float> logits;
  std::vector<SamplingRow> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> row = make_logits(V, Shape::kPeaked);
    logits.insert(logits.end(), row.begin(), row.end());
    rows[static_cast<size_t>(r)].params = &sets[static_cast<size_t>(r) % sets.size()];
    rows[static_cast<size_t>(r)].seed = rng_();
    rows[static_cast<size_t>(r)].output_index = r;
  }
  Tensor all = alloc(gpu(), DType::F32, {R, V});
  gpu().upload(all, 0, logits.data(), DType::F32, R * V);
  const std::vector<SampledToken> together = gpu().sample(all, rows);
  const std::vector<SampledToken> again = gpu().sample(all, rows);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<SampledToken> alone =
        gpu().sample(all.rows(r, 1), {rows[static_cast<size_t>(r)]});
    EXPECT_EQ(alone[0].token, together[static_cast<size_t>(r)].token) << "row " << r << "; " << seed_note();
    EXPECT_EQ(again[static_cast<size_t>(r)].token, together[static_cast<size_t>(r)].token)
        << "row " << r << " not deterministic; " << seed_note();
  }
}

// Pipelined decode's halves: two tickets outstanding at once (a third refused), each
// ticket's tokens the bits of a synchronous sample() of the same logits, and the first
// ticket's tokens fed on the device into a poisoned int32 tensor in a permuted order
// before either is waited for.
TEST_F(GpuSamplerTest, AsyncTicketsAndTokensFedOnTheDevice) {
  const int64_t V = 1000, R = 37;
  std::vector<SamplingParams> params(static_cast<size_t>(R));
  std::vector<SamplingRow> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    SamplingParams& p = params[static_cast<size_t>(r)];
    p.temperature = r % 3 == 0 ? 0.0f : 0.9f;
    p.top_k = r % 2 == 0 ? 40 : -1;
    rows[static_cast<size_t>(r)].params = &p;
    rows[static_cast<size_t>(r)].seed = rng_();
    rows[static_cast<size_t>(r)].output_index = uniform_int(0, 500);
  }
  std::vector<float> a, b;
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> ra = make_logits(V, Shape::kPeaked);
    const std::vector<float> rb = make_logits(V, Shape::kFlat);
    a.insert(a.end(), ra.begin(), ra.end());
    b.insert(b.end(), rb.begin(), rb.end());
  }
  Tensor ga = alloc(gpu(), DType::F32, {R, V});
  Tensor gb = alloc(gpu(), DType::F32, {R, V});
  gpu().upload(ga, 0, a.data(), DType::F32, R * V);
  gpu().upload(gb, 0, b.data(), DType::F32, R * V);
  const std::vector<SampledToken> want_a = gpu().sample(ga, rows);
  const std::vector<SampledToken> want_b = gpu().sample(gb, rows);

  const int32_t kPoison = -7;
  Tensor ids = alloc_i32(gpu(), std::vector<int32_t>(64, kPoison));
  std::vector<int32_t> src;
  for (int32_t r = static_cast<int32_t>(R) - 1; r >= 0; r -= 2) src.push_back(r);

  SampleTicket ta = gpu().sample_async(ga, rows);
  SampleTicket tb = gpu().sample_async(gb, rows);
  try {
    gpu().sample_async(ga, rows);
    FAIL() << "a third outstanding ticket was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outstanding"), std::string::npos) << e.what();
  }
  gpu().feed_sampled_tokens(ta, src, ids);
  const std::vector<SampledToken> got_a = gpu().wait_sampled(ta);
  const std::vector<SampledToken> got_b = gpu().wait_sampled(tb);
  EXPECT_THROW(gpu().wait_sampled(ta), Error);  // waited for already
  ASSERT_EQ(got_a.size(), want_a.size());
  ASSERT_EQ(got_b.size(), want_b.size());
  for (size_t r = 0; r < got_a.size(); ++r) {
    EXPECT_EQ(got_a[r].token, want_a[r].token) << "row " << r;
    EXPECT_EQ(got_b[r].token, want_b[r].token) << "row " << r;
    EXPECT_EQ(std::memcmp(&got_a[r].logprob, &want_a[r].logprob, sizeof(float)), 0) << r;
    EXPECT_EQ(std::memcmp(&got_b[r].logprob, &want_b[r].logprob, sizeof(float)), 0) << r;
  }
  std::vector<int32_t> fed(64);
  gpu().copy_to_host(fed.data(), ids.data, fed.size() * sizeof(int32_t));
  for (size_t i = 0; i < fed.size(); ++i) {
    const int32_t want = i < src.size() ? want_a[static_cast<size_t>(src[i])].token : kPoison;
    EXPECT_EQ(fed[i], want) << "token " << i;
  }
  // The two flat-row steps differ from the peaked ones: the feed read ticket a, not b.
  int differ = 0;
  for (size_t r = 0; r < got_a.size(); ++r) differ += got_a[r].token != got_b[r].token;
  EXPECT_GT(differ, 0);
}

TEST_F(GpuSamplerTest, RowsWithoutFiniteLogitsAndBadParametersFailClearly) {
  const int64_t V = 1000;
  std::vector<float> logits(static_cast<size_t>(2 * V), 1.0f);
  std::fill(logits.begin() + V, logits.end(), NAN);
  Tensor g = alloc(gpu(), DType::F32, {2, V});
  gpu().upload(g, 0, logits.data(), DType::F32, 2 * V);
  SamplingParams p;
  std::vector<SamplingRow> rows(2);
  rows[0].params = rows[1].params = &p;
  try {
    gpu().sample(g, rows);
    FAIL() << "an all-NaN row was sampled";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("row 1"), std::string::npos) << m;
    EXPECT_NE(m.find("no finite"), std::string::npos) << m;
  }
  SamplingParams bad;
  bad.top_p = 0.0f;
  rows[1].params = &bad;
  EXPECT_THROW(gpu().sample(g, rows), Error);
  SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;
  std::vector<int32_t> out_of_vocab = {5, static_cast<int32_t>(V)};
  rows[1].params = &penalised;
  rows[1].output_tokens = &out_of_vocab;
  try {
    gpu().sample(g, rows);
    FAIL() << "an out-of-vocabulary output token was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagellm
