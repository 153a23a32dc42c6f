// What a request produces: RequestOutput and its CompletionOutputs, shaped like vLLM's, and
// why a sample ended. A vocabulary header (no other pagellm header), so the engine uses the
// same FinishReason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagellm {

/// Why a sample ended. finish_reason_name() gives the fine name, finish_reason_openai()
/// the coarse one that vLLM and the OpenAI API report.
enum class FinishReason {
  kNone,          // still running
  kEos,           // sampled one of the model's EOS tokens            ("eos" / "stop")
  kStopToken,     // sampled one of params.stop_token_ids             ("stop" / "stop")
  kStopString,    // the text reached one of params.stop              ("stop_string" / "stop")
  kLength,        // reached params.max_tokens                        ("length" / "length")
  kContextLimit,  // reached the engine's max_model_len               ("context_limit" / "length")
  kAborted,       // cancelled by the caller or by shutdown           ("aborted" / "abort")
  kError,         // rejected; see CompletionOutput::error            ("error" / "error")
};

/// "none", "eos", "stop", "stop_string", "length", "context_limit", "aborted", "error".
const char* finish_reason_name(FinishReason reason);
/// vLLM's and OpenAI's names: "stop" (eos, stop token, stop string), "length" (max_tokens,
/// context limit), "abort", "error"; "" while running.
const char* finish_reason_openai(FinishReason reason);

/// One entry of a top-k list: a token id and its log-probability (natural log, float32).
struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
  bool operator==(const TokenLogprob& o) const {
    return token_id == o.token_id && logprob == o.logprob;
  }
};

/// One sample of a request (vLLM's CompletionOutput). In a streamed delta, token_ids, text,
/// logprobs and processed_logprobs hold only what is new since the previous delta.
struct CompletionOutput {
  /// Which of the request's n samples (0-based).
  int index = 0;
  /// Decoded output (special tokens dropped when params.skip_special_tokens); empty when
  /// the model folder has no tokenizer.
  std::string text;
  std::vector<int32_t> token_ids;
  /// Per token: the model's log-probability of the sampled token (log-softmax of the raw
  /// logits, before penalties, temperature and filters).
  std::vector<float> logprobs;
  /// Per token, only with params.processed_logprobs: the log-probability under the
  /// processed distribution that the token was drawn from.
  std::vector<float> processed_logprobs;
  /// Per token, only with params.logprobs = k > 0: the k most likely tokens of the raw
  /// distribution, most likely first (ties: lower id first), with their raw logprobs (the
  /// same numbers as `logprobs` would hold for them). Fewer than k only when the vocabulary
  /// has fewer finite logits.
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  /// Per token, with params.logprobs = k > 0: the sampled token's rank in the raw
  /// distribution (1 = most likely; ties share the better rank, as in vLLM).
  std::vector<int32_t> logprob_ranks;
  /// Per token, with params.logprobs = k > 0 and params.processed_logprobs: the k most
  /// likely tokens of the processed distribution, only tokens the filters kept (so fewer
  /// than k when fewer survive; greedy: the chosen token alone, with 0).
  std::vector<std::vector<TokenLogprob>> processed_top_logprobs;
  /// Sum of logprobs over all tokens so far (also in a delta).
  double cumulative_logprob = 0.0;
  /// Per token: the engine's weights version when the token was sampled.
  std::vector<uint64_t> weights_versions;
  FinishReason finish_reason = FinishReason::kNone;
  /// With FinishReason::kError: what was wrong.
  std::string error;

  bool finished() const { return finish_reason != FinishReason::kNone; }
};

/// The result of one request (vLLM's RequestOutput): its prompt and its n samples. From
/// LLM::generate the outputs are complete; from an AsyncEngine stream each RequestOutput is
/// a delta holding the samples that advanced.
struct RequestOutput {
  std::string request_id;
  /// The prompt text when one was given (for chat messages: the rendered template).
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;
  /// All n samples have finished (in a stream: this is the last delta).
  bool finished = false;
  /// The weights version of the newest tokens in this output; never decreases along a stream.
  uint64_t weights_version = 0;
};

/// The scored log-probabilities of one given token sequence (LLM::score, AsyncEngine::score):
/// what the model assigns to each token after the first prompt_length, computed by prefill
/// forwards without sampling. docs/design.md, "The log-probability contract", says how
/// these numbers relate to the logprobs of a generate run.
struct ScoreOutput {
  /// The scored sequence, as given.
  std::vector<int32_t> token_ids;
  /// Tokens before the first scored one (1 scores every token after the first).
  int32_t prompt_length = 1;
  /// logprobs[i] = log p(token_ids[prompt_length + i] | token_ids[0 .. prompt_length + i)),
  /// the raw distribution (log-softmax of the logits, as CompletionOutput::logprobs).
  std::vector<float> logprobs;
  /// Per scored token, its rank in that distribution (1 = most likely; ties share the
  /// better rank).
  std::vector<int32_t> ranks;
  /// Per scored token, with top_k > 0: the top_k most likely tokens (ties: lower id first).
  std::vector<std::vector<TokenLogprob>> top_logprobs;
};

}  // namespace pagellm
