#include "pagellm/tokenizer/chat_template.h"

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/jinja.h"

namespace pagellm {

ChatRequest ChatRequest::from_json(const nlohmann::ordered_json& request) {
  ChatRequest out;
  if (request.is_array()) {
    out.messages = request;
    return out;
  }
  PAGELLM_CHECK(request.is_object() && request.contains("messages"))
      << "a chat request must be a JSON array of messages or an object with a \"messages\" "
         "array (and optional \"tools\", \"documents\", \"add_generation_prompt\", and other "
         "template variables such as \"enable_thinking\")";
  for (auto it = request.begin(); it != request.end(); ++it) {
    const std::string& key = it.key();
    if (key == "messages") {
      out.messages = it.value();
    } else if (key == "tools") {
      out.tools = it.value();
    } else if (key == "documents") {
      out.documents = it.value();
    } else if (key == "add_generation_prompt") {
      PAGELLM_CHECK(it.value().is_boolean()) << "\"add_generation_prompt\" must be true or false";
      out.add_generation_prompt = it.value().get<bool>();
    } else {
      out.variables[key] = it.value();
    }
  }
  return out;
}

ChatTemplate::ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens)
    : source_(source),
      special_tokens_(std::move(special_tokens)),
      template_(std::make_unique<jinja::Template>(source)) {}

ChatTemplate::~ChatTemplate() = default;

namespace {

// transformers' _normalize_chat_messages and _alias_reasoning_fields.
jinja::Value prepare_messages(const nlohmann::ordered_json& messages) {
  PAGELLM_CHECK(messages.is_array()) << "\"messages\" must be a JSON array of message objects";
  std::vector<jinja::Value> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    PAGELLM_CHECK(message.is_object())
        << "message " << i << " must be an object like {\"role\": \"user\", \"content\": \"...\"}, got "
        << message.dump();
    std::vector<std::pair<std::string, jinja::Value>> fields;
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      auto it = message.find(key);
      if (it != message.end() && !it->is_null()) {
        reasoning = &*it;
        break;
      }
    }
    if (reasoning != nullptr) fields.emplace_back("thinking", jinja::Value::from_json(*reasoning));
    for (auto it = message.begin(); it != message.end(); ++it) {
      if (it.value().is_null()) continue;  // transformers drops keys whose value is None
      fields.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
    if (reasoning != nullptr) fields.emplace_back("reasoning_content", jinja::Value::from_json(*reasoning));
    // Value::dict keeps the first position of a repeated key and the last value, like a
    // Python dict literal {"thinking": r, **message, "reasoning_content": r}.
    out.push_back(jinja::Value::dict(std::move(fields)));
  }
  return jinja::Value::list(std::move(out));
}

}  // namespace

std::string ChatTemplate::render(const ChatRequest& request) const {
  std::vector<std::pair<std::string, jinja::Value>> variables;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    variables.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  }
  PAGELLM_CHECK(request.variables.is_object()) << "chat template variables must be a JSON object";
  for (auto it = request.variables.begin(); it != request.variables.end(); ++it) {
    PAGELLM_CHECK(it.key() != "messages" && it.key() != "tools" && it.key() != "documents" &&
                  it.key() != "add_generation_prompt")
        << "chat template variable \"" << it.key() << "\" is reserved";
    variables.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  }
  if (!request.tools.is_null()) {
    PAGELLM_CHECK(request.tools.is_array()) << "\"tools\" must be a JSON array of tool schemas";
    for (const auto& tool : request.tools) {
      PAGELLM_CHECK(tool.is_object())
          << "each tool must be a JSON schema object (e.g. {\"type\": \"function\", \"function\": "
             "{...}}), got "
          << tool.dump();
    }
  }
  if (!request.documents.is_null()) {
    PAGELLM_CHECK(request.documents.is_array()) << "\"documents\" must be a JSON array";
    for (const auto& document : request.documents) {
      PAGELLM_CHECK(document.is_object()) << "documents should be a list of dicts with 'title' and 'text' keys";
    }
  }
  variables.emplace_back("messages", prepare_messages(request.messages));
  variables.emplace_back("tools", jinja::Value::from_json(request.tools));
  variables.emplace_back("documents", jinja::Value::from_json(request.documents));
  variables.emplace_back("add_generation_prompt", jinja::Value(request.add_generation_prompt));
  return template_->render(variables);
}

}  // namespace pagellm
