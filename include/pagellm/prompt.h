// A prompt as the public API takes it: text, token ids or chat messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagellm {

/// One chat message; for tools, tool calls or reasoning fields use Prompt::messages_json.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

/// What to generate from. Exactly one of the three forms; build it with the factories.
///   - text: encoded with the model's tokenizer (special tokens written in the text count
///     as special tokens, as in vLLM);
///   - token ids: used as given (each must be inside the model's vocabulary);
///   - chat: rendered with the model's chat template, then encoded; the assistant's turn is
///     opened (add_generation_prompt) unless the object form of messages_json says
///     "add_generation_prompt": false or "continue_final_message": true (the final message
///     left open for the model to continue; or the name of its field to continue, as
///     "reasoning_content"), as transformers' apply_chat_template takes them;
///     chat_template_kwargs are extra template variables, e.g. {"enable_thinking": false}.
struct Prompt {
  enum class Kind { kText, kTokenIds, kChat };
  Kind kind = Kind::kText;
  std::string text;
  std::vector<int32_t> token_ids;
  /// Chat messages as a JSON text: an array of message objects, or an object
  /// {"messages": [...], "tools": [...], "add_generation_prompt": bool,
  /// "continue_final_message": bool or field, <template variables>...} (ChatRequest's).
  std::string messages_json;
  /// Extra chat template variables as a JSON object text ("" for none).
  std::string chat_template_kwargs_json;

  static Prompt from_text(std::string text);
  static Prompt from_token_ids(std::vector<int32_t> ids);
  /// Chat from messages; enable_thinking, when given, becomes a template variable.
  static Prompt from_messages(const std::vector<ChatMessage>& messages,
                              std::optional<bool> enable_thinking = std::nullopt);
  /// Chat from a JSON text (see messages_json).
  static Prompt from_messages_json(std::string messages_json,
                                   std::string chat_template_kwargs_json = "");
};

}  // namespace pagellm
