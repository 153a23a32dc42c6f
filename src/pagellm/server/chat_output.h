// What a chat completion's text says once Qwen3's reasoning (`<think> ... </think>`) and
// its tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the "hermes"
// format its chat template asks for) are taken out of it: the pieces an OpenAI response
// puts in `reasoning_content`, `content` and `tool_calls`, as vLLM's `--reasoning-parser
// qwen3` and `--tool-call-parser hermes` give them. One incremental parser serves both a
// whole response (fed the text at once) and a stream (fed each delta), so a stream's
// pieces joined are the whole response's. docs/design.md, "Server", "Reasoning and tool
// calls", has the rules.
#pragma once

#include <string>
#include <vector>

namespace pagellm::server {

/// One parsed tool call. index counts the choice's tool calls from 0; arguments is JSON
/// text (an object).
struct ToolCall {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

/// What one piece of text (or the end) adds to each field.
struct ChatPieces {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  /// Appends `more`'s pieces after this one's.
  void append(ChatPieces more);
};

/// The rules (each only when switched on):
///   - reasoning: the output opens with `<think>` (or the prompt left one open, as Qwen3's
///     template does for the thinking-only models); what follows up to `</think>` is
///     reasoning, what follows that is content. Newlines next to the tags are dropped. An
///     output that ends inside its thinking (max_tokens) has reasoning and no content; one
///     that does not open with `<think>` is all content.
///   - tool calls: each `<tool_call> JSON </tool_call>` in the content whose JSON is an
///     object with a string "name" (and "arguments", an object or a JSON string; absent:
///     {}) becomes a tool call; whitespace around tool calls is dropped; a block that does
///     not parse, or one the output ends inside, stays in the content as written.
/// Text that may be the start of a tag (or whitespace whose fate the next text decides) is
/// held back until the text after it, or finish(), settles it.
class ChatOutputParser {
 public:
  /// id_prefix: tool call i gets id id_prefix + i.
  ChatOutputParser(bool reasoning, bool tool_calls, bool prompt_opened_thinking,
                   std::string id_prefix);

  ChatPieces feed(const std::string& text);
  /// The end of the output: what was held back, settled as the end settles it.
  ChatPieces finish();
  /// Tool calls parsed so far.
  int tool_calls() const { return calls_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };
  void run(ChatPieces& out, bool end);
  bool strip_leading();
  void say(std::string& field, const std::string& text, const char* chars);
  void settle_at_end(std::string& field, bool keep_held);
  void close_tool_call(ChatPieces& out);

  bool tools_;
  std::string id_prefix_;
  State state_;
  std::string pending_;     // text not yet looked at (may hold a tag's start)
  std::string held_ws_;     // whitespace whose place the next text decides
  std::string call_body_;   // text inside an open <tool_call>
  const char* strip_ = nullptr;  // characters dropped at the start of the current field
  int calls_ = 0;
};

/// True when the rendered prompt leaves a `<think>` open (its last `<think>` has no
/// `</think>` after it): the model's output then starts inside its reasoning.
bool prompt_opens_thinking(const std::string& prompt_text);

}  // namespace pagellm::server
