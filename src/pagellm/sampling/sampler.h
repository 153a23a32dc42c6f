// Token sampling on the host: penalties, temperature, top-k / top-p / min-p, seeded
// Gumbel-max sampling and log-probabilities. The reference that a CUDA sampler must match.
//
// For one row of logits l[V] (float32) and its request's SamplingParams:
//
//   1. Raw log-probabilities: logprob(t) = l[t] - logsumexp(l), over the unmodified logits.
//   2. Penalties, on a copy of the logits:
//        repetition (each distinct token of prompt + output, once):
//            l > 0 ? l / repetition_penalty : l * repetition_penalty
//        then frequency and presence (each distinct token of the output, with count c):
//            l = l - frequency_penalty * c;  l = l - presence_penalty
//   3. Greedy (temperature == 0): token = argmax of the penalised logits, lowest id on ties.
//      The processed distribution is the one-hot at that token (processed logprob 0).
//   4. Otherwise x = l / temperature, then three filters, each keeping an upper set of x
//      (every token whose x is at least a threshold, so ties at an edge are all kept):
//        top-k: the k largest x (k <= 0 or k >= V: off);
//        top-p: over the top-k survivors renormalised, walk the tokens in descending x and
//               stop at the first whose cumulative probability is >= top_p - 1e-6; keep
//               every token with x >= its x (top_p == 1: off);
//        min-p: the tokens with p >= min_p * p_max * exp(-1e-6), i.e.
//               x >= x_max + log(min_p) - 1e-6 (min_p == 0: off).
//      The most likely token always survives. The 1e-6 slack makes a parameter that lands
//      exactly on a boundary (top_p = 0.8 over probabilities 0.5, 0.3, 0.2) keep the
//      boundary token despite float rounding of top_p and of the softmax.
//   5. token = argmax over kept i of (x_i - log(E_i)), E_i = -log(u_i),
//      u_i = sampling_uniform(seed, output_index, i) (common/random.h), in double, lowest
//      id on ties. This is an exact sample from softmax(x) restricted to the kept set, and
//      it depends only on (seed, output_index, token id) and the row's own logits.
//   6. processed logprob (when SamplingParams::processed_logprobs) =
//      x[t] - logsumexp over the kept set of x.
//   7. Top-k alternatives (SamplingParams::logprobs = k > 0; add_top_logprobs): the k
//      largest raw logits (ties: lower id first) with their step-1 logprobs, the sampled
//      token's rank; with processed_logprobs, the k largest x of the kept set with their
//      step-6 logprobs. Computed on the host (a device backend copies those rows back).
//
// Precision: the logits arrive in float32 (whatever the backend's activation dtype);
// max and the logprob subtraction are in double, exp in float (relative error < 3e-7),
// summed in double; the result is rounded to float32 once.
//
// Non-finite logits: NaN counts as -inf (never sampled); +inf is clamped to the largest
// float. A row with no finite logit is an error.
#pragma once

#include <cstdint>
#include <vector>

#include "pagellm/sampling/rules.h"
#include "pagellm/sampling/sampling_params.h"

namespace pagellm {

/// What the sampler needs to know about the request behind one logits row.
struct SamplingRow {
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;             // the request's effective seed
  int64_t output_index = 0;      // how many tokens the request has generated so far
  const std::vector<int32_t>* prompt_tokens = nullptr;
  const std::vector<int32_t>* output_tokens = nullptr;
  /// Tokens that must not be sampled at this step, null or empty for none: a sample below
  /// its min_tokens cannot end (its EOS and stop token ids). Their processed logits become
  /// -inf (after the penalties); the raw logprobs and top-k lists are unchanged.
  const std::vector<int32_t>* banned_tokens = nullptr;
};

namespace detail {
class RowSampler;  // sampler.cpp
}  // namespace detail

// validate_sampling_params (declared in the public pagellm/sampling_params.h, defined in
// sampler.cpp) throws Error naming the first invalid field of params and the accepted range:
// n >= 1; temperature finite and >= 0; top_k >= -1 (-1 and 0 disable it); top_p in (0, 1];
// min_p in [0, 1]; repetition_penalty finite and > 0; presence_penalty and
// frequency_penalty in [-2, 2] (OpenAI's range); max_tokens >= 1; stop_token_ids >= 0;
// stop strings non-empty; logprobs in [0, SamplingParams::kMaxLogprobs].

/// Scratch memory for sampling rows of one vocabulary size, reused across rows to avoid
/// allocating ~1.5 MB per row at V = 151,936. One per thread; not thread-safe.
class SamplerWorkspace {
 public:
  /// The penalised, temperature-scaled logits x[V] of the last row passed to
  /// process_logits() (non-greedy) or sample_row().
  const std::vector<float>& processed() const { return processed_; }

  /// A token id with its processed logit.
  struct Candidate {
    float value;
    int32_t id;
  };

 private:
  friend class detail::RowSampler;
  void reserve(int64_t vocab_size);

  std::vector<float> processed_;      // [V]
  PenaltyCounter penalty_counter_;     // the penalties' token counts (sampling/rules.h)
  std::vector<PenaltyCount> penalties_;  // the row's touched tokens, until clamped
  std::vector<float> top_k_heap_;     // min-heap of the k largest values, or nth_element copy
  std::vector<Candidate> candidates_; // superset of the kept set, when one is known
};

/// The processed (penalised, tempered, filtered) distribution of one non-greedy row:
/// token i is kept iff processed[i] is finite and (double)processed[i] >= threshold.
struct ProcessedRow {
  float max_value = 0.0f;   // largest processed logit (always kept)
  int32_t max_id = -1;      // lowest id holding max_value
  double threshold = 0.0;   // keep processed[i] >= threshold
  /// log sum over kept i of exp(processed[i] - max_value); filled only when asked for.
  double log_normalizer = 0.0;
};

/// Applies the repetition, frequency and presence penalties of params (step 2 above) in
/// place to logits[V]. prompt and output may be null (empty). Throws Error for a token id
/// outside [0, V).
void apply_penalties(float* logits, int64_t vocab_size, const SamplingParams& params,
                     const std::vector<int32_t>* prompt, const std::vector<int32_t>* output,
                     SamplerWorkspace& workspace);

/// Runs steps 2 and 4 for a non-greedy row: writes x into workspace.processed() and
/// returns the kept set's threshold (and its log-normaliser when with_normalizer).
/// Throws Error if row.params is greedy or invalid, or if the row has no finite logit.
ProcessedRow process_logits(const float* logits, int64_t vocab_size, const SamplingRow& row,
                            bool with_normalizer, SamplerWorkspace& workspace);

/// Samples one token from logits[V] (steps 1 to 6). Throws Error for invalid params, a
/// token id outside [0, V) in the row's prompt or output, or a row with no finite logit.
SampledToken sample_row(const float* logits, int64_t vocab_size, const SamplingRow& row,
                        SamplerWorkspace& workspace);

/// What scoring reports of one token under one row of logits: its raw log-probability
/// (step 1, the same float the sampler reports, bit for bit), its rank among the raw
/// logits (1 + the number of tokens with a larger logit) and the k most likely tokens.
struct TokenScore {
  float logprob = 0.0f;
  int32_t rank = 0;
  /// Most likely first, ties by lower id; NaN and -inf logits are never listed.
  std::vector<TokenLogprob> top;
};

/// Scores `token` under logits[V] (raw distribution), with the top k (0..20) alternatives.
/// Throws Error for a token outside [0, V), a bad k, or a row without a finite logit.
TokenScore score_token(const float* logits, int64_t vocab_size, int32_t token, int k);

/// For a token already sampled from logits[V] with row's params and params.logprobs = k > 0,
/// fills token.top and token.rank (score_token) and, with params.processed_logprobs,
/// token.processed_top: the k most likely tokens of the processed distribution among those
/// the filters kept (x desc, lower id first), logprob x - logsumexp over the kept set as in
/// step 6 (greedy: the chosen token alone with 0). Does nothing when params.logprobs == 0.
/// Separate from sample_row so a device sampler can call it on the rows that ask for it.
void add_top_logprobs(const float* logits, int64_t vocab_size, const SamplingRow& row,
                      SamplerWorkspace& workspace, SampledToken& token);

/// Samples one token per row of logits[num_rows, V] (row-major), rows in parallel with
/// OpenMP, one workspace per thread. The result does not depend on the thread count or on
/// the order or company of the rows. If rows fail, throws the Error of the lowest failing
/// row, prefixed with its index.
std::vector<SampledToken> sample_rows(const float* logits, int64_t num_rows, int64_t vocab_size,
                                      const std::vector<SamplingRow>& rows);

}  // namespace pagellm
