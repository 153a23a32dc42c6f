// Batch requests as JSON lines: `pagellm generate --input FILE` (like `vllm run-batch`),
// and the parser the server will share.
#pragma once

#include <string>
#include <string_view>

#include "pagellm/outputs.h"
#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"

namespace pagellm {

/// One line of a batch file, parsed.
struct BatchRequest {
  std::string id;  // "id" from the line, or "" (the caller numbers it)
  Prompt prompt;
  SamplingParams params;
};

/// Parses one JSON object:
///   {"prompt": "text"} | {"prompt_token_ids": [1, 2]} | {"messages": [...]}   (exactly one)
///   optional "id" (string or integer), "chat_template_kwargs" (object, with "messages"),
///   and sampling overrides of `defaults`: "n", "temperature", "top_k", "top_p", "min_p",
///   "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "max_tokens",
///   "stop" (string or array of strings), "stop_token_ids", "ignore_eos",
///   "skip_special_tokens", "processed_logprobs", "logprobs" (top-k alternatives, 0..20).
/// The params are validated. Throws pagellm::Error naming the key and the problem (unknown
/// keys included, so that a misspelt option is not silently ignored).
BatchRequest parse_batch_request(std::string_view json_line, const SamplingParams& defaults);

/// One result line: {"id", "prompt_token_ids", "outputs": [{"index", "text", "token_ids",
/// "logprobs", "cumulative_logprob", "finish_reason" (OpenAI name), "finish_detail" (fine
/// name), ["processed_logprobs"], with logprobs = k > 0 ["top_logprobs" (per token a list
/// of {"token_id", "logprob"}), "logprob_ranks", ["processed_top_logprobs"]], ["error"]}],
/// "weights_version"}. No newline.
std::string format_batch_result(const RequestOutput& output, bool processed_logprobs);
/// {"id": ..., "error": {"line": N, "message": ...}}. No newline.
std::string format_batch_error(const std::string& id, int line, const std::string& message);

}  // namespace pagellm
