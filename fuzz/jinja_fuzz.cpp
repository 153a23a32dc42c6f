// libFuzzer target: the Jinja interpreter never crashes, hangs or overflows its stack on
// any template source; errors must come out as pagellm::Error. The template renders a
// fixed conversation (with tools and thinking) so that evaluation is exercised too, and a
// second one whose final assistant message is continued (continue_final_message: its
// reasoning, so that the tag goes into every copy and the cut falls wherever the template
// put it).
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const pagellm::ChatRequest request = [] {
    pagellm::ChatRequest r = pagellm::ChatRequest::from_json(nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi ünï"},
                   {"role": "assistant", "content": "<think>\nx\n</think>\n\nHello", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
                   {"role": "tool", "content": "42"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "add_generation_prompt": true, "enable_thinking": false})"));
    return r;
  }();
  static const pagellm::ChatRequest continued = [] {
    return pagellm::ChatRequest::from_json(nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hel", "reasoning": "I greet "}],
      "continue_final_message": "reasoning"})"));
  }();
  const std::string source(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<pagellm::ChatTemplate> chat;
  try {
    chat = std::make_unique<pagellm::ChatTemplate>(
        source, nlohmann::ordered_json{{"eos_token", "<|im_end|>"}});
  } catch (const pagellm::Error&) {
    return 0;  // a template that does not parse is refused; crashes are not fine
  }
  for (const pagellm::ChatRequest* r : {&request, &continued}) {
    try {
      const std::string out = chat->render(*r);
      (void)out;
    } catch (const pagellm::Error&) {
      // Template errors are fine.
    }
  }
  return 0;
}
