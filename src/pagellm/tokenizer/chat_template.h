// Chat templates: renders a model's Jinja chat_template the way transformers'
// tokenizer.apply_chat_template(..., tokenize=False) does.
//
// What transformers does around the template, and this class repeats:
//   - keys whose value is null are dropped from each message;
//   - a message with "reasoning_content", "thinking" or "reasoning" gets all of
//     "thinking" (first) and "reasoning_content" (last) set to that value;
//   - the template sees: messages, tools (null when absent), documents (null when absent),
//     add_generation_prompt, the tokenizer's special tokens (eos_token, pad_token, ...) and
//     any other request variable (enable_thinking, ...), which override special tokens;
//   - the Jinja environment has trim_blocks and lstrip_blocks on, loop controls, and the
//     globals raise_exception, strftime_now, namespace, dict and range; tojson is
//     Python's json.dumps with ensure_ascii=False;
//   - continue_final_message (transformers 5's way): a tag is appended to the final
//     message's field (its content, or the field named; every copy of the reasoning when
//     that is the field; the last text block of a list content), the chat rendered, and the
//     text cut where the tag stands, so that the final message stays open.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace pagellm {

namespace jinja {
class Template;
}

/// The arguments of apply_chat_template.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null: no tools
  nlohmann::ordered_json documents;  // null: no documents
  bool add_generation_prompt = false;
  /// The final message's field to leave open ("content" for continue_final_message: true),
  /// "" for none. Not with add_generation_prompt.
  std::string continue_final_message;
  /// Other template variables, e.g. {"enable_thinking": false}. An object.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();

  /// Reads either a JSON array of messages, or an object {"messages": [...], "tools": [...],
  /// "documents": [...], "add_generation_prompt": true, "continue_final_message": true or
  /// a field name, <other variables>...}.
  /// Throws Error describing the accepted shapes on anything else.
  static ChatRequest from_json(const nlohmann::ordered_json& request);
};

/// A parsed chat template. Immutable; render() is safe to call from several threads.
class ChatTemplate {
 public:
  /// Parses `source`. `special_tokens`: an object of template variables that the tokenizer
  /// provides ({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}). Throws Error
  /// with the line and the construct for a syntax error or an unsupported construct.
  ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  /// The prompt text. Throws Error for invalid messages or a template error
  /// (raise_exception, an undefined value used in an operation, ...).
  std::string render(const ChatRequest& request) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  nlohmann::ordered_json special_tokens_;
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace pagellm
