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
///   - chat: rendered with the model's chat template (add_generation_prompt on), then
///     encoded; chat_template_kwargs are extra template variables, e.g.
///     {"enable_thinking": false}.
struct Prompt {
  enum class Kind { kText, kTokenIds, kChat };
  Kind kind = Kind::kText;
  std::string text;
  std::vector<int32_t> token_ids;
  /// Chat messages as a JSON text: an array of message objects, or an object
  /// {"messages": [...], "tools": [...], <template variables>...} (ChatRequest's shapes).
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
