// How one request is sampled: the one definition, used by the public API, the engine and
// the host and GPU samplers alike. A vocabulary header: it includes no other pagellm
// header, so every layer of the library may include it (src/CMakeLists.txt links the
// vocabulary headers into the lowest layer's view).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagellm {

/// How to pick the next tokens of one request, shaped like vLLM's SamplingParams. The
/// defaults sample from the raw distribution, 16 tokens, one sample.
///
/// Order of processing (vLLM's and transformers'): penalties on the raw logits, then
/// temperature, then the top-k, top-p and min-p filters. temperature == 0 means greedy.
/// src/pagellm/sampling/sampler.h gives the exact semantics; validate_sampling_params()
/// the accepted ranges.
///
/// Seeds: a request with a seed draws from a random stream keyed by (seed, output index),
/// so the same seed gives the same tokens in any batch. Without a seed the engine derives
/// one from the request's engine id (the first output of SplitMix64 seeded with the id),
/// so a run without seeds is deterministic too: the same requests submitted in the same
/// order give the same tokens. With n > 1, sample j (0-based) of a request with seed s uses
/// seed s + j, so it equals a single request with seed s + j; without a seed, sample j
/// derives its seed from its own engine id (Engine::add_request_group hands a group n
/// consecutive ids, sample 0 first), as a single request does. A sample's tokens thus
/// depend only on its own seed, never on n, on the other samples or on their order.
struct SamplingParams {
  /// Samples per prompt (vLLM's n), at most the engine's max_num_seqs (they run together).
  /// The prompt is prefilled once and its KV pages are shared by the n samples
  /// (copy-on-write of the partly filled last page); each sample then decodes on its own.
  int n = 1;
  float temperature = 1.0f;
  int top_k = 0;                    // -1 or 0: disabled
  float top_p = 1.0f;               // 1: disabled
  float min_p = 0.0f;               // 0: disabled
  float repetition_penalty = 1.0f;  // over prompt and output tokens (transformers semantics)
  float presence_penalty = 0.0f;    // over output tokens (OpenAI semantics)
  float frequency_penalty = 0.0f;   // over output tokens (OpenAI semantics)
  /// Unset: derived from the request id (see above).
  std::optional<uint64_t> seed;
  /// Most tokens to generate per sample.
  int max_tokens = 16;
  /// Fewest tokens per sample (vLLM's min_tokens): until a sample has this many, its EOS
  /// tokens (unless ignore_eos) and stop_token_ids are masked out of the processed
  /// distribution (never sampled; the raw logprobs are unchanged) and stop strings are not
  /// matched. 0..max_tokens.
  int min_tokens = 0;
  /// Token ids that end a sample (the id is kept in the output, as vLLM does).
  std::vector<int32_t> stop_token_ids;
  /// Strings that end a sample when its text contains one; the text is cut before the
  /// stop string (token_ids keep the token that completed it), as vLLM does. Needs a
  /// tokenizer.
  std::vector<std::string> stop;
  bool ignore_eos = false;
  /// Drop special tokens (<|im_end|>, ...) from the output text (vLLM's default).
  bool skip_special_tokens = true;
  /// Also report each token's log-probability under the processed distribution
  /// (after penalties, temperature and filters, renormalised over the kept tokens;
  /// greedy's processed distribution is one-hot, so 0).
  bool processed_logprobs = false;
  /// Top-k alternatives (vLLM's logprobs = k): with k > 0, each output token also reports
  /// the k most likely tokens of the raw distribution with their raw log-probabilities
  /// (CompletionOutput::top_logprobs) and the sampled token's rank in it; with
  /// processed_logprobs also set, the k most likely tokens of the processed distribution
  /// (CompletionOutput::processed_top_logprobs). 0..kMaxLogprobs; 0: none.
  int logprobs = 0;
  /// The most top-k alternatives a request may ask for (vLLM's default max_logprobs).
  static constexpr int kMaxLogprobs = 20;

  bool greedy() const { return temperature <= 0.0f; }
};

/// Throws pagellm::Error naming the first invalid field, its value and the accepted range
/// ("invalid sampling parameters: top_p must be in (0, 1] (1 disables it), got 2").
void validate_sampling_params(const SamplingParams& params);

}  // namespace pagellm
