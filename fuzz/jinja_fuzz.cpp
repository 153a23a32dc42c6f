// libFuzzer target: the Jinja interpreter never crashes, hangs or overflows its stack on
// any template source; errors must come out as pagellm::Error. The template renders a
// fixed conversation (with tools and thinking) so that evaluation is exercised too.
#include <cstdint>
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
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    pagellm::ChatTemplate chat(source, nlohmann::ordered_json{{"eos_token", "<|im_end|>"}});
    const std::string out = chat.render(request);
    (void)out;
  } catch (const pagellm::Error&) {
    // Rejected templates and template errors are fine; crashes are not.
  }
  return 0;
}
