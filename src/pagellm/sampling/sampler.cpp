// Host sampler. The semantics are in sampler.h; this file is about doing them quickly at
// V = 151,936: every full-vocabulary pass is a branch-free loop the compiler vectorises
// (a polynomial exp instead of libm's), top-k uses a k-element heap or nth_element, top-p
// sorts only the tokens of the narrowest window below the maximum that holds top_p, and
// the Gumbel race skips every token whose random bits prove it cannot beat the best score
// so far, so that the two double logarithms are evaluated for a handful of tokens per row
// instead of for all of them.

// GCC will not if-convert a float select that feeds arithmetic while floating-point
// traps are modelled, so the exp and sanitising loops would stay scalar (3x slower). The
// sampler never reads FP exception flags. Set before any include so that every function
// of this file, the inlined standard library included, is compiled alike.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include "pagellm/sampling/sampler.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/common/random.h"
#include "pagellm/sampling/rules.h"

namespace pagellm {
namespace {

constexpr float kNegInf = -INFINITY;
// Threshold slack of top-p (probability) and min-p (nats); see sampler.h.
constexpr double kThresholdSlack = 1e-6;
// Top-p pre-selection: windows, in nats below the maximum, whose mass is measured first.
constexpr float kTopPWindows[4] = {2.0f, 5.0f, 10.0f, 20.0f};
// Top-k by a k-element min-heap up to this k, by nth_element on a copy above it.
constexpr int64_t kTopKHeapLimit = 1024;

// Value (not reference) min and max, so that loops over them vectorise. max_of(m, NaN)
// is m; min_of(NaN, c) is NaN.
inline float max_of(float a, float b) { return b > a ? b : a; }
inline float min_of(float a, float b) { return b < a ? b : a; }
// NaN -> -inf (never sampled), +inf -> FLT_MAX (so that x - max stays finite).
inline float sanitize(float x) { return x != x ? kNegInf : min_of(x, FLT_MAX); }

// exp(x) for x <= 0, relative error below 3e-7; 0 below -87, for -inf and for NaN.
// Written without branches or libm calls so that loops over it vectorise.
inline float exp_nonpositive(float x) {
  const bool underflow = !(x >= -87.0f);
  const float xc = underflow ? -87.0f : x;
  // x = n ln2 + r, |r| <= ln2 / 2; n rounded to nearest (x <= 0, so truncating t - 0.5).
  const float t = xc * 1.44269504088896341f;
  const int n = static_cast<int>(t - 0.5f);
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;  // Cody-Waite ln2 split
  // Taylor polynomial of degree 6: remainder |r|^7 / 7! < 1.3e-7.
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n with n in [-126, 0]: a normal float built from its exponent bits.
  const uint32_t scale_bits = static_cast<uint32_t>(n + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return underflow ? 0.0f : p * scale;
}

// Statistics of the unmodified logits: max, lowest argmax, log sum exp(l - max).
struct RawStats {
  float max = kNegInf;
  int32_t argmax = -1;
  double log_sum = 0.0;
  double logprob(float logit) const { return double(sanitize(logit)) - max - log_sum; }
};

int32_t first_index_of(const float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == value) return static_cast<int32_t>(i);
  return -1;
}

RawStats raw_stats(const float* logits, int64_t vocab_size) {
  RawStats s;
  float m = kNegInf;
  // max_of(m, NaN) is m, so NaN needs no sanitising here; +inf is clamped below.
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < vocab_size; ++i) m = max_of(m, logits[i]);
  m = min_of(m, FLT_MAX);
  PAGELLM_CHECK(m > kNegInf) << "sampling: the row of logits has no finite value (all "
                             << vocab_size << " are NaN or -inf)";
  s.max = m;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (sanitize(logits[i]) == m) {
      s.argmax = static_cast<int32_t>(i);
      break;
    }
  }
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < vocab_size; ++i) sum += exp_nonpositive(min_of(logits[i], FLT_MAX) - m);
  s.log_sum = std::log(sum);
  return s;
}

bool has_penalties(const SamplingParams& p) {
  return penalties_enabled(p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
}

// The race's pruning table (sampling/rules.h), built once.
const std::array<uint64_t, kPruneTableSize>& prune_table() {
  static const std::array<uint64_t, kPruneTableSize> table = [] {
    std::array<uint64_t, kPruneTableSize> t{};
    for (int j = 0; j < kPruneTableSize; ++j) t[j] = prune_table_entry(j);
    return t;
  }();
  return table;
}

// Sorting order of candidates: larger value first, then lower id.
inline bool before(const SamplerWorkspace::Candidate& a, const SamplerWorkspace::Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// The k best (value, id) pairs of x[V] in `before` order (larger value first, then lower
// id), skipping -inf (and NaN, which sanitize() maps to -inf) and, when keep_from is
// finite, every value below it. A k-element heap: O(V log k).
template <class Value>
std::vector<SamplerWorkspace::Candidate> top_candidates(int64_t vocab, int k, double keep_from,
                                                        Value value) {
  std::vector<SamplerWorkspace::Candidate> heap;  // `before`-max heap: worst at the front
  heap.reserve(static_cast<size_t>(k) + 1);
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = value(i);
    if (!(v > kNegInf) || double(v) < keep_from) continue;
    const SamplerWorkspace::Candidate c{v, static_cast<int32_t>(i)};
    if (static_cast<int>(heap.size()) < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), before);  // best first
  return heap;
}

// The sampler fields of validate_sampling_params.
void validate_sampler_fields(const SamplingParams& p) {
  PAGELLM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f)
      << "invalid sampling parameters: temperature must be a finite number >= 0 (0 means "
         "greedy), got "
      << p.temperature;
  PAGELLM_CHECK(p.top_k >= -1) << "invalid sampling parameters: top_k must be -1 or 0 "
                                  "(disabled) or a positive number of tokens, got "
                               << p.top_k;
  PAGELLM_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f)
      << "invalid sampling parameters: top_p must be in (0, 1] (1 disables it), got " << p.top_p;
  PAGELLM_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f)
      << "invalid sampling parameters: min_p must be in [0, 1] (0 disables it), got " << p.min_p;
  PAGELLM_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)
      << "invalid sampling parameters: repetition_penalty must be a finite number > 0 (1 "
         "disables it), got "
      << p.repetition_penalty;
  PAGELLM_CHECK(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)
      << "invalid sampling parameters: presence_penalty must be in [-2, 2] (0 disables it), got "
      << p.presence_penalty;
  PAGELLM_CHECK(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)
      << "invalid sampling parameters: frequency_penalty must be in [-2, 2] (0 disables it), "
         "got "
      << p.frequency_penalty;
}

}  // namespace

void validate_sampling_params(const SamplingParams& params) {
  PAGELLM_CHECK(params.n >= 1) << "invalid sampling parameters: n (samples per prompt) must be "
                                  ">= 1, got "
                               << params.n;
  validate_sampler_fields(params);
  PAGELLM_CHECK(params.max_tokens >= 1)
      << "invalid sampling parameters: max_tokens must be >= 1, got " << params.max_tokens;
  PAGELLM_CHECK(params.min_tokens >= 0 && params.min_tokens <= params.max_tokens)
      << "invalid sampling parameters: min_tokens must be in [0, max_tokens = "
      << params.max_tokens << "], got " << params.min_tokens;
  PAGELLM_CHECK(params.logprobs >= 0 && params.logprobs <= SamplingParams::kMaxLogprobs)
      << "invalid sampling parameters: logprobs (top-k alternatives per token) must be in [0, "
      << SamplingParams::kMaxLogprobs << "] (0: none), got " << params.logprobs;
  for (int32_t id : params.stop_token_ids)
    PAGELLM_CHECK(id >= 0) << "invalid sampling parameters: stop_token_ids must be token ids "
                              ">= 0, got "
                           << id;
  for (const std::string& s : params.stop)
    PAGELLM_CHECK(!s.empty()) << "invalid sampling parameters: stop strings must be non-empty";
}

namespace detail {

// The implementation, with access to the workspace's buffers.
class RowSampler {
 public:
  RowSampler(const float* logits, int64_t vocab_size, const SamplingRow& row,
             SamplerWorkspace& ws)
      : logits_(logits), vocab_(vocab_size), row_(row), ws_(ws) {
    PAGELLM_CHECK(logits != nullptr && vocab_size > 0)
        << "sampling: need a row of at least one logit, got vocab_size " << vocab_size;
    PAGELLM_CHECK(vocab_size <= INT32_MAX) << "sampling: vocab_size " << vocab_size
                                           << " does not fit token ids (int32)";
    PAGELLM_CHECK(row.params != nullptr) << "sampling: the row has no SamplingParams";
    PAGELLM_CHECK(row.output_index >= 0)
        << "sampling: output_index must be >= 0, got " << row.output_index;
    validate_sampler_fields(*row.params);
    ws_.reserve(vocab_size);
  }

  // Step 2 on an arbitrary buffer (the public apply_penalties and the sampler's copy):
  // the rules of sampling/rules.h, which the GPU sampler shares. Leaves the touched
  // tokens in ws.penalties_ for clamp_touched.
  static void penalise(float* x, int64_t vocab, const SamplingParams& p,
                       const std::vector<int32_t>* prompt, const std::vector<int32_t>* output,
                       const std::vector<int32_t>* banned, SamplerWorkspace& ws) {
    ws.penalties_.clear();
    if (!has_penalties(p) && !has_banned(banned)) return;
    ws.penalty_counter_.count(prompt, output, p.repetition_penalty != 1.0f, vocab,
                              ws.penalties_, banned);
    for (const PenaltyCount& e : ws.penalties_) {
      x[e.token] = penalised_logit(x[e.token], p.repetition_penalty, p.frequency_penalty,
                                   p.presence_penalty, e.output_count);
    }
  }

  static void forget_touched(SamplerWorkspace& ws) { ws.penalties_.clear(); }

  static bool has_banned(const std::vector<int32_t>* banned) {
    return banned != nullptr && !banned->empty();
  }

  SampledToken sample() {
    const SamplingParams& p = *row_.params;
    const RawStats raw = raw_stats(logits_, vocab_);
    SampledToken out;
    if (p.greedy()) {
      out.token = raw.argmax;
      if (has_penalties(p) || has_banned(row_.banned_tokens)) {
        float* x = ws_.processed_.data();
        copy_sanitized(x);
        penalise(x, vocab_, p, row_.prompt_tokens, row_.output_tokens, row_.banned_tokens, ws_);
        clamp_touched(x);
        float m = kNegInf;
#pragma omp simd reduction(max : m)
        for (int64_t i = 0; i < vocab_; ++i) m = max_of(m, x[i]);
        PAGELLM_CHECK(m > kNegInf) << "sampling: no finite logit is left after the penalties";
        out.token = first_index_of(x, vocab_, m);
      }
      out.logprob = static_cast<float>(raw.logprob(logits_[out.token]));
      out.processed_logprob = 0.0f;  // the processed distribution is one-hot
      return out;
    }
    const ProcessedRow processed = process(p.processed_logprobs);
    out.token = race(processed);
    out.logprob = static_cast<float>(raw.logprob(logits_[out.token]));
    if (p.processed_logprobs) {
      const float x = ws_.processed_[out.token];
      out.processed_logprob = static_cast<float>(double(x) - processed.max_value -
                                                 processed.log_normalizer);
    }
    return out;
  }

  // The k most likely kept tokens of the processed distribution (non-greedy), with the
  // processed logprob formula of sample(), so the sampled token's entry equals it bitwise.
  std::vector<TokenLogprob> processed_top(int k) {
    const ProcessedRow row = process(true);
    const float* x = ws_.processed_.data();
    std::vector<TokenLogprob> out;
    for (const auto& c :
         top_candidates(vocab_, k, row.threshold, [x](int64_t i) { return x[i]; })) {
      out.push_back({c.id, static_cast<float>(double(c.value) - row.max_value -
                                              row.log_normalizer)});
    }
    return out;
  }

  // Steps 2 and 4: penalties, temperature and the filters' threshold.
  ProcessedRow process(bool with_normalizer) {
    const SamplingParams& p = *row_.params;
    PAGELLM_CHECK(!p.greedy()) << "sampling: process_logits needs temperature > 0";
    float* x = ws_.processed_.data();
    copy_sanitized(x);
    penalise(x, vocab_, p, row_.prompt_tokens, row_.output_tokens, row_.banned_tokens, ws_);
    clamp_touched(x);

    const float temperature = p.temperature;
    float m = kNegInf;
    if (temperature != 1.0f) {
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < vocab_; ++i) {
        const float v = min_of(x[i] / temperature, FLT_MAX);
        x[i] = v;
        m = max_of(m, v);
      }
    } else {
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < vocab_; ++i) m = max_of(m, x[i]);
    }
    PAGELLM_CHECK(m > kNegInf) << "sampling: the row of logits has no finite value";
    ProcessedRow row;
    row.max_value = m;
    row.max_id = first_index_of(x, vocab_, m);

    double threshold = -INFINITY;
    have_candidates_ = false;
    const int64_t k = p.top_k > 0 && p.top_k < vocab_ ? p.top_k : 0;
    if (k > 0) {
      const float kth = kth_largest(x, k);
      threshold = kth;
      collect_candidates([&](float v) { return v >= kth; });
    }
    if (p.top_p < 1.0f) threshold = std::max(threshold, top_p_threshold(m, p.top_p));
    if (p.min_p > 0.0f)
      threshold = std::max(threshold, double(m) + std::log(double(p.min_p)) - kThresholdSlack);
    row.threshold = threshold;

    if (with_normalizer) {
      double sum = 0.0;
      if (have_candidates_) {
        for (const auto& c : ws_.candidates_)
          if (double(c.value) >= threshold) sum += exp_nonpositive(c.value - m);
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < vocab_; ++i) {
          const float v = x[i];
          sum += double(v) >= threshold ? exp_nonpositive(v - m) : 0.0f;
        }
      }
      row.log_normalizer = std::log(sum);
    }
    return row;
  }

 private:
  void copy_sanitized(float* x) const {
#pragma omp simd
    for (int64_t i = 0; i < vocab_; ++i) x[i] = sanitize(logits_[i]);
  }

  // Penalties can push FLT_MAX to +inf; keep every value below +inf.
  void clamp_touched(float* x) const {
    for (const PenaltyCount& e : ws_.penalties_) x[e.token] = sanitize(x[e.token]);
    ws_.penalties_.clear();
  }

  // The k-th largest value of x (k < V); -inf when fewer than k values are finite.
  float kth_largest(const float* x, int64_t k) {
    std::vector<float>& heap = ws_.top_k_heap_;
    if (k <= kTopKHeapLimit) {
      heap.assign(x, x + k);
      std::make_heap(heap.begin(), heap.end(), std::greater<float>());  // min at front
      for (int64_t i = k; i < vocab_; ++i) {
        if (x[i] > heap.front()) {
          std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
          heap.back() = x[i];
          std::push_heap(heap.begin(), heap.end(), std::greater<float>());
        }
      }
      return heap.front();
    }
    heap.assign(x, x + vocab_);
    std::nth_element(heap.begin(), heap.begin() + (k - 1), heap.end(), std::greater<float>());
    return heap[k - 1];
  }

  // Candidates = finite tokens with keep(value), in id order.
  template <class Keep>
  void collect_candidates(Keep keep) {
    const float* x = ws_.processed_.data();
    auto& c = ws_.candidates_;
    c.clear();
    for (int64_t i = 0; i < vocab_; ++i)
      if (x[i] > kNegInf && keep(x[i])) c.push_back({x[i], static_cast<int32_t>(i)});
    have_candidates_ = true;
  }

  // Value of the token at which the cumulative probability of the largest tokens (over the
  // top-k candidates if any, else over all tokens) first reaches top_p - slack.
  double top_p_threshold(float m, float top_p) {
    const float* x = ws_.processed_.data();
    auto& c = ws_.candidates_;
    double total = 0.0;
    if (have_candidates_) {
      std::sort(c.begin(), c.end(), before);
      for (const auto& e : c) total += exp_nonpositive(e.value - m);
    } else {
      // The probability mass within a few windows below the maximum, in one vectorised
      // pass; then only the tokens of the narrowest window that reaches top_p are
      // collected and sorted (the top-p set is an upper set, so it lies inside).
      const float lo0 = m - kTopPWindows[0], lo1 = m - kTopPWindows[1],
                  lo2 = m - kTopPWindows[2], lo3 = m - kTopPWindows[3];
      double w0 = 0.0, w1 = 0.0, w2 = 0.0, w3 = 0.0;
#pragma omp simd reduction(+ : total, w0, w1, w2, w3)
      for (int64_t i = 0; i < vocab_; ++i) {
        const float v = x[i];
        const float e = exp_nonpositive(v - m);
        total += e;
        w0 += v >= lo0 ? e : 0.0f;
        w1 += v >= lo1 ? e : 0.0f;
        w2 += v >= lo2 ? e : 0.0f;
        w3 += v >= lo3 ? e : 0.0f;
      }
      const double target = (double(top_p) - kThresholdSlack) * total;
      const float lo = w0 >= target   ? lo0
                       : w1 >= target ? lo1
                       : w2 >= target ? lo2
                       : w3 >= target ? lo3
                                      : kNegInf;
      collect_candidates([lo](float v) { return v >= lo; });
      std::sort(c.begin(), c.end(), before);
    }
    const double target = (double(top_p) - kThresholdSlack) * total;
    double cumulative = 0.0;
    for (const auto& e : c) {
      cumulative += exp_nonpositive(e.value - m);
      if (cumulative >= target) return e.value;
    }
    // Summation order made the candidates fall short by a rounding error: if they are
    // all the finite tokens, keep them all; else retry with every finite token.
    if (c.size() > 0 && (int64_t)c.size() == count_finite()) return c.back().value;
    collect_candidates([](float) { return true; });
    std::sort(c.begin(), c.end(), before);
    cumulative = 0.0;
    for (const auto& e : c) {
      cumulative += exp_nonpositive(e.value - m);
      if (cumulative >= target) return e.value;
    }
    return c.back().value;
  }

  int64_t count_finite() const {
    const float* x = ws_.processed_.data();
    int64_t n = 0;
    for (int64_t i = 0; i < vocab_; ++i) n += x[i] > kNegInf;
    return n;
  }

  // Step 5: the exponential race / Gumbel-max over the kept tokens.
  int32_t race(const ProcessedRow& row) const {
    const float* x = ws_.processed_.data();
    const uint64_t key = sampling_stream_key(row_.seed, static_cast<uint64_t>(row_.output_index));
    const auto& table = prune_table();
    const double threshold = row.threshold;
    // The most likely token is always kept; its score starts the running best.
    int32_t best_id = row.max_id;
    double best = double(row.max_value) + gumbel_from_bits(sampling_bits(key, best_id));
    auto visit = [&](float v, int32_t id) {
      const double gap = best - double(v);
      if (race_out_of_reach(gap)) return;
      const uint64_t bits = sampling_bits(key, static_cast<uint32_t>(id));
      if (race_pruned(gap, bits, table.data())) return;
      const double score = double(v) + gumbel_from_bits(bits);
      if (score > best || (score == best && id < best_id)) {
        best = score;
        best_id = id;
      }
    };
    if (have_candidates_) {
      for (const auto& c : ws_.candidates_)
        if (double(c.value) >= threshold) visit(c.value, c.id);
    } else {
      for (int64_t i = 0; i < vocab_; ++i) {
        const float v = x[i];
        if (v > kNegInf && double(v) >= threshold) visit(v, static_cast<int32_t>(i));
      }
    }
    return best_id;
  }

  const float* logits_;
  int64_t vocab_;
  const SamplingRow& row_;
  SamplerWorkspace& ws_;
  // ws_.candidates_ holds every kept token (a superset of the kept set).
  bool have_candidates_ = false;
};

}  // namespace detail

using detail::RowSampler;

void SamplerWorkspace::reserve(int64_t vocab_size) {
  const size_t v = static_cast<size_t>(vocab_size);
  if (processed_.size() != v) processed_.assign(v, 0.0f);
}

void apply_penalties(float* logits, int64_t vocab_size, const SamplingParams& params,
                     const std::vector<int32_t>* prompt, const std::vector<int32_t>* output,
                     SamplerWorkspace& workspace) {
  validate_sampler_fields(params);
  RowSampler::penalise(logits, vocab_size, params, prompt, output, nullptr, workspace);
  RowSampler::forget_touched(workspace);
}

ProcessedRow process_logits(const float* logits, int64_t vocab_size, const SamplingRow& row,
                            bool with_normalizer, SamplerWorkspace& workspace) {
  return RowSampler(logits, vocab_size, row, workspace).process(with_normalizer);
}

SampledToken sample_row(const float* logits, int64_t vocab_size, const SamplingRow& row,
                        SamplerWorkspace& workspace) {
  return RowSampler(logits, vocab_size, row, workspace).sample();
}

TokenScore score_token(const float* logits, int64_t vocab_size, int32_t token, int k) {
  PAGELLM_CHECK(logits != nullptr && vocab_size > 0 && vocab_size <= INT32_MAX)
      << "score_token: need a row of 1 to 2^31-1 logits, got " << vocab_size;
  PAGELLM_CHECK(token >= 0 && token < vocab_size)
      << "score_token: token id " << token << " is outside the vocabulary [0, " << vocab_size
      << ")";
  PAGELLM_CHECK(k >= 0 && k <= SamplingParams::kMaxLogprobs)
      << "score_token: k (top-k alternatives) must be in [0, " << SamplingParams::kMaxLogprobs
      << "], got " << k;
  const RawStats raw = raw_stats(logits, vocab_size);
  TokenScore out;
  out.logprob = static_cast<float>(raw.logprob(logits[token]));
  const float mine = sanitize(logits[token]);
  int64_t better = 0;
  for (int64_t i = 0; i < vocab_size; ++i) better += sanitize(logits[i]) > mine;
  out.rank = static_cast<int32_t>(better + 1);
  if (k > 0) {
    for (const auto& c : top_candidates(vocab_size, k, -INFINITY,
                                        [logits](int64_t i) { return sanitize(logits[i]); })) {
      out.top.push_back({c.id, static_cast<float>(raw.logprob(c.value))});
    }
  }
  return out;
}

void add_top_logprobs(const float* logits, int64_t vocab_size, const SamplingRow& row,
                      SamplerWorkspace& workspace, SampledToken& token) {
  PAGELLM_CHECK(row.params != nullptr) << "add_top_logprobs: the row has no SamplingParams";
  const SamplingParams& p = *row.params;
  if (p.logprobs <= 0) return;
  const TokenScore score = score_token(logits, vocab_size, token.token, p.logprobs);
  token.top = score.top;
  token.rank = score.rank;
  token.processed_top.clear();
  if (!p.processed_logprobs) return;
  if (p.greedy()) {
    token.processed_top.push_back({token.token, 0.0f});  // one-hot
  } else {
    token.processed_top =
        RowSampler(logits, vocab_size, row, workspace).processed_top(p.logprobs);
  }
}

std::vector<SampledToken> sample_rows(const float* logits, int64_t num_rows, int64_t vocab_size,
                                      const std::vector<SamplingRow>& rows) {
  PAGELLM_CHECK(num_rows >= 0 && static_cast<size_t>(num_rows) == rows.size())
      << "sampling: " << num_rows << " rows of logits but " << rows.size() << " sampling rows";
  std::vector<SampledToken> out(static_cast<size_t>(num_rows));
  std::vector<std::string> errors(static_cast<size_t>(num_rows));
  std::vector<uint8_t> failed(static_cast<size_t>(num_rows), 0);
#pragma omp parallel for schedule(dynamic, 1) if (num_rows > 1)
  for (int64_t r = 0; r < num_rows; ++r) {
    // One workspace per thread, kept between calls: OpenMP reuses its threads.
    thread_local SamplerWorkspace workspace;
    try {
      out[r] = sample_row(logits + r * vocab_size, vocab_size, rows[r], workspace);
    } catch (const std::exception& e) {
      failed[r] = 1;
      errors[r] = e.what();
    }
  }
  for (int64_t r = 0; r < num_rows; ++r)
    PAGELLM_CHECK(!failed[r]) << "row " << r << ": " << errors[r];
  return out;
}

}  // namespace pagellm
