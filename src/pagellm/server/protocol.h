// The server's wire formats: OpenAI request bodies (completions, chat) and the token-level
// /generate body parsed into Prompt + SamplingParams, and responses, SSE chunks and error
// objects formatted as the `openai` Python client reads them. No sockets here: every
// function is a pure translation, unit-tested in tests/server.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagellm/outputs.h"
#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"
#include "pagellm/server/chat_output.h"
#include "pagellm/weight_broadcast.h"
#include "pagellm/weight_update.h"

namespace pagellm::server {

/// An error answered as an OpenAI error object:
///   {"error": {"message", "type", "param", "code"}} with HTTP `status`.
/// param names the request field that was wrong ("" when none).
struct HttpError : std::runtime_error {
  HttpError(int status, std::string message, std::string param = "",
            std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)),
        type(std::move(type)) {}
  int status;
  std::string param;
  std::string type;
};

/// The error object's JSON text for `e` (param null when empty, code = the status's name).
std::string error_body(const HttpError& e);

/// What the parsers need to know of the server: its model name, the engine's max_model_len
/// (chat's default max_tokens) and which LoRA adapters are loaded. A request's "model" is
/// the base model (or absent: no adapter), a loaded adapter's name (run with it, as vLLM
/// does), or anything else: 404.
struct ProtocolContext {
  std::string model_name;
  int32_t max_model_len = 0;
  /// True when a LoRA adapter of this name is loaded; unset: none are.
  std::function<bool(const std::string&)> has_adapter;
  /// Chat output parsing (vLLM's flags): "qwen3" takes the reasoning out of the content
  /// ("" leaves the text as generated); "hermes" with enable_auto_tool_choice turns
  /// <tool_call> blocks of requests that give tools into tool_calls.
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
};

/// A parsed OpenAI request (completions or chat): one engine request per prompt, all with
/// the same sampling params; the response's choice index is prompt * n + sample.
struct OpenAiRequest {
  bool chat = false;
  std::vector<Prompt> prompts;
  SamplingParams params;
  bool stream = false;
  /// stream_options.include_usage: a last chunk with empty choices and the usage.
  bool include_usage = false;
  /// Completions: the prompt's text before each choice's text.
  bool echo = false;
  /// vLLM's extension: prompt_token_ids and token_ids in each choice.
  bool return_token_ids = false;
  /// Completions' logprobs (k alternatives, 0 = the sampled token's only) or chat's
  /// logprobs: true; nullopt: no logprobs in the response.
  std::optional<int> logprobs;
  /// The LoRA adapter the request's "model" named; "" for the base model.
  std::string lora;
  /// vLLM's prompt_logprobs (completions): each prompt token's log-probability and, k > 0,
  /// the k most likely tokens at its position, in each choice's "prompt_logprobs".
  std::optional<int> prompt_logprobs;
  /// Chat: split the reasoning out of the content / parse tool calls (ChatOutputParser).
  bool parse_reasoning = false;
  bool parse_tool_calls = false;

  /// The top-k the prompts must be scored with (the larger of echo-with-logprobs' and
  /// prompt_logprobs'); nullopt: the response says nothing of the prompt's log-probabilities.
  std::optional<int> prompt_score_top_k() const;
};

/// Parses a POST /v1/completions body. Throws HttpError 400 naming the bad field (or 404
/// for an unknown model).
OpenAiRequest parse_completion_request(const std::string& body, const ProtocolContext& ctx);
/// Parses a POST /v1/chat/completions body (messages rendered later by the chat template).
OpenAiRequest parse_chat_request(const std::string& body, const ProtocolContext& ctx);

/// A POST /tokenize body (vLLM's): {"prompt": text} or a chat's {"messages", "tools",
/// "add_generation_prompt", "continue_final_message", "chat_template_kwargs"} as
/// /v1/chat/completions takes them; returns the prompt to encode.
Prompt parse_tokenize_request(const std::string& body);
/// A POST /detokenize body, {"tokens": [ids]}; returns the ids.
std::vector<int32_t> parse_detokenize_request(const std::string& body);

/// A parsed POST /generate body: token ids in, the engine's own outputs back.
struct GenerateRequest {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  bool stream = false;
  /// "lora_name": a loaded LoRA adapter to run with; "" (or absent, or null) none.
  std::string lora_name;
};
GenerateRequest parse_generate_request(const std::string& body);

/// The "ipc_tensors" list of a POST /update_weights body: per tensor {"name", "handle"
/// (base64 of the 64-byte cudaIpcMemHandle_t), "offset" (bytes into the shared
/// allocation), "dtype" ("bfloat16", "float16", "float32"), "shape"}. Throws HttpError 400
/// naming the element and field ("ipc_tensors[3].handle").
std::vector<IpcTensor> parse_ipc_tensors(const nlohmann::json& list);

/// A POST /init_weights_group body: the trainer's weight-broadcast group for the engine to
/// join (docs/design.md, "Server", weight updates). {"backend": "nccl" (default) or "tcp",
/// "unique_id": base64 of ncclGetUniqueId's 128 bytes (nccl), "master_address" and
/// "master_port" where the trainer listens (tcp), "rank_offset" (the engine's first rank,
/// >= 1; default 1), "world_size" (the trainer and every engine rank; default rank_offset +
/// engine_ranks), "group_name" (optional), "timeout_seconds" (tcp; default 300)}. The
/// engine's `engine_ranks` tensor-parallel ranks join as rank_offset .. rank_offset +
/// engine_ranks - 1, which must lie below world_size. Throws HttpError 400 naming the field.
WeightGroupSpec parse_init_weights_group(const nlohmann::json& body, int engine_ranks = 1);

/// The "broadcast" object of a POST /update_weights body: {"tensors": [{"name", "dtype",
/// "shape"}, ...] in the order the trainer packs them, "bucket_bytes" (the trainer's
/// bucket size), "group_name" (optional)}. Throws HttpError 400 naming the field.
struct BroadcastUpdateRequest {
  std::vector<BroadcastTensor> tensors;
  uint64_t bucket_bytes = 0;
  std::string group_name;
};
BroadcastUpdateRequest parse_broadcast_update(const nlohmann::json& broadcast);

/// A POST /v1/load_lora_adapter body, {"lora_name", "lora_path"} (vLLM's); "lora_int_id"
/// is accepted as the caller's own number. Throws HttpError 400 naming the missing field.
struct LoadLoraRequest {
  std::string name;
  std::string path;
  int64_t id = 0;
};
LoadLoraRequest parse_load_lora_request(const std::string& body);
/// A POST /v1/unload_lora_adapter body, {"lora_name"}; returns the name.
std::string parse_unload_lora_request(const std::string& body);

/// Standard base64 (RFC 4648, padding optional) to bytes; nullopt for anything else.
std::optional<std::string> decode_base64(const std::string& text);

/// Detokenization the formatters need: ids -> text, keeping special tokens when asked.
using DecodeFn = std::function<std::string(const std::vector<int32_t>&, bool skip_special)>;

/// The pieces every response shares.
struct ResponseMeta {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

/// Token counts for "usage".
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

/// The whole (non-streamed) response: outputs[i] is prompt i's merged RequestOutput.
/// prompt_scores: with request.prompt_score_top_k(), prompt i's score (prompt length 1;
/// a one-token prompt's has no logprobs); empty otherwise.
nlohmann::json format_response(const OpenAiRequest& request, const ResponseMeta& meta,
                               const std::vector<RequestOutput>& outputs,
                               const DecodeFn& decode,
                               const std::vector<ScoreOutput>& prompt_scores = {});

/// Tool call ids: id_prefix(meta, choice) + the call's index.
std::string tool_call_id_prefix(const ResponseMeta& meta, int choice_index);

/// What a streamed chunk carries beyond the engine's delta.
struct ChunkExtras {
  /// The prompt's score (first chunk, with request.prompt_score_top_k()).
  const ScoreOutput* prompt_score = nullptr;
  /// The delta's text parsed (request.parse_reasoning or parse_tool_calls): the chunk says
  /// these pieces instead of delta.text.
  const ChatPieces* pieces = nullptr;
  /// The choice has made tool calls: a "stop" finish is said as "tool_calls".
  bool called_tools = false;
};

/// The SSE chunk for one sample's delta. choice_index = prompt * n + sample; first: this is
/// the choice's first chunk (chat sends the assistant role in it; completions with echo
/// send the prompt text, given as prompt_text). The chunk's text is delta.text, its
/// finish_reason set when the delta finished the sample.
nlohmann::json format_chunk(const OpenAiRequest& request, const ResponseMeta& meta,
                            int choice_index, const CompletionOutput& delta,
                            const std::vector<int32_t>& prompt_token_ids, bool first,
                            const std::string& prompt_text, const DecodeFn& decode,
                            const ChunkExtras& extras = {});

/// The last chunk with stream_options.include_usage: empty choices, the usage.
nlohmann::json format_usage_chunk(const OpenAiRequest& request, const ResponseMeta& meta,
                                  int64_t prompt_tokens, int64_t completion_tokens);

/// One /generate result or streamed delta: the engine's token ids, logprobs (raw, processed
/// with params.processed_logprobs, top-k as [id, logprob] pairs with ranks), per-token
/// weights versions, finish reasons.
nlohmann::json format_generate(const RequestOutput& output, const SamplingParams& params);

/// "data: <json>\n\n".
std::string sse_event(const nlohmann::json& chunk);

}  // namespace pagellm::server
