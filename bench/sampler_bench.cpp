// Host sampler throughput at Qwen3's vocabulary (V = 151,936): rows x V float32 logits
// through sample_rows (OpenMP over rows), for greedy, plain temperature sampling, top-p,
// and Qwen3's recommended top-k 20 + top-p 0.95 + T 0.6.
//
// The limit for a pass over the logits is host memory bandwidth: the counter
// "logits_bytes_per_second" is R x V x 4 bytes per call, and "fraction_of_memcpy" sets it
// against the read bandwidth of a 256 MB memcpy measured at start-up. Greedy reads each
// row about three times and sampling about five (stats, copy, temperature, race), mostly
// from L2 once the row (600 KB) is there, so a fraction near 1 would be the ceiling. The peer, BM_NaiveFullSortTopP, is the textbook top-p: softmax in
// double, a full sort of the vocabulary, a cumulative sum and an inverse-CDF draw, one
// row at a time; it shows what the histogram pre-selection and the pruned race save.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "pagellm/sampling/sampler.h"

namespace {

using pagellm::SampledToken;
using pagellm::SamplingParams;
using pagellm::SamplingRow;

constexpr int64_t kVocab = 151936;

// Logits shaped like a language model's: N(0, 2.5) with a few strong candidates.
std::vector<float> make_logits(int64_t rows) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> body(0.0f, 2.5f);
  std::uniform_int_distribution<int64_t> pick(0, kVocab - 1);
  std::vector<float> x(static_cast<size_t>(rows * kVocab));
  for (float& v : x) v = body(rng);
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < 8; ++i) x[r * kVocab + pick(rng)] = 12.0f + 1.5f * i;
  return x;
}

// Bytes per second a 256 MB memcpy reads (best of 3): the host bandwidth yardstick.
double memcpy_read_bandwidth() {
  static const double bandwidth = [] {
    const size_t bytes = size_t{256} << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    double best = 0.0;
    for (int i = 0; i < 3; ++i) {
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
      benchmark::DoNotOptimize(dst.data());
      best = std::max(best, double(bytes) / seconds.count());
    }
    return best;
  }();
  return bandwidth;
}

enum Mode { kGreedy, kTemperature, kTopP, kQwenRecommended };
const char* const kModeNames[] = {"greedy", "T=1", "T=0.7 top_p=0.95",
                                  "T=0.6 top_k=20 top_p=0.95"};

SamplingParams params_for(Mode mode) {
  SamplingParams p;
  switch (mode) {
    case kGreedy:
      p.temperature = 0.0f;
      break;
    case kTemperature:
      p.temperature = 1.0f;
      break;
    case kTopP:
      p.temperature = 0.7f;
      p.top_p = 0.95f;
      break;
    case kQwenRecommended:
      p.temperature = 0.6f;
      p.top_k = 20;
      p.top_p = 0.95f;
      break;
  }
  return p;
}

void BM_SampleRows(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Mode mode = static_cast<Mode>(state.range(1));
  const std::vector<float> logits = make_logits(rows);
  const SamplingParams params = params_for(mode);
  std::vector<int32_t> output = {1, 2, 3};
  std::vector<SamplingRow> sampling_rows(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    sampling_rows[r].params = &params;
    sampling_rows[r].seed = static_cast<uint64_t>(r);
    sampling_rows[r].output_tokens = &output;
  }
  state.SetLabel(kModeNames[mode]);
  int64_t step = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (auto& row : sampling_rows) row.output_index = step;
    std::vector<SampledToken> out = pagellm::sample_rows(logits.data(), rows, kVocab, sampling_rows);
    benchmark::DoNotOptimize(out.data());
    ++step;
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  state.SetItemsProcessed(state.iterations() * rows);
  const double bytes = double(state.iterations()) * rows * kVocab * sizeof(float);
  state.counters["logits_bytes_per_second"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["fraction_of_memcpy"] = bytes / elapsed.count() / memcpy_read_bandwidth();
}

void sample_rows_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "mode"});
  for (int64_t mode = kGreedy; mode <= kQwenRecommended; ++mode)
    for (int64_t rows : {1, 8, 64}) b->Args({rows, mode});
}
BENCHMARK(BM_SampleRows)->Apply(sample_rows_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// The peer: textbook top-p over one row with a full sort.
int32_t naive_top_p(const float* x, int64_t vocab, float temperature, float top_p,
                    std::mt19937_64& rng, std::vector<double>& probs, std::vector<int32_t>& order) {
  double m = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) m = std::max(m, double(x[i]) / temperature);
  double z = 0.0;
  for (int64_t i = 0; i < vocab; ++i) z += probs[i] = std::exp(double(x[i]) / temperature - m);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  double kept = 0.0;
  int64_t n = 0;
  while (n < vocab && kept < top_p * z) kept += probs[order[n++]];
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (int64_t i = 0; i < n; ++i) {
    u -= probs[order[i]];
    if (u <= 0.0) return order[i];
  }
  return order[n - 1];
}

void BM_NaiveFullSortTopP(benchmark::State& state) {
  const std::vector<float> logits = make_logits(1);
  std::vector<double> probs(kVocab);
  std::vector<int32_t> order(kVocab);
  std::mt19937_64 rng(1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(naive_top_p(logits.data(), kVocab, 0.7f, 0.95f, rng, probs, order));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NaiveFullSortTopP)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
