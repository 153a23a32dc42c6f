#include "pagellm/prompt.h"

#include <nlohmann/json.hpp>

namespace pagellm {

Prompt Prompt::from_text(std::string text) {
  Prompt p;
  p.kind = Kind::kText;
  p.text = std::move(text);
  return p;
}

Prompt Prompt::from_token_ids(std::vector<int32_t> ids) {
  Prompt p;
  p.kind = Kind::kTokenIds;
  p.token_ids = std::move(ids);
  return p;
}

Prompt Prompt::from_messages(const std::vector<ChatMessage>& messages,
                             std::optional<bool> enable_thinking) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) array.push_back({{"role", m.role}, {"content", m.content}});
  std::string kwargs;
  if (enable_thinking) kwargs = nlohmann::ordered_json{{"enable_thinking", *enable_thinking}}.dump();
  return from_messages_json(array.dump(), kwargs);
}

Prompt Prompt::from_messages_json(std::string messages_json, std::string chat_template_kwargs_json) {
  Prompt p;
  p.kind = Kind::kChat;
  p.messages_json = std::move(messages_json);
  p.chat_template_kwargs_json = std::move(chat_template_kwargs_json);
  return p;
}

}  // namespace pagellm
