#include "pagellm/tokenizer/chat_template.h"

#include <algorithm>
#include <vector>

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
    } else if (key == "continue_final_message") {
      const auto& v = it.value();
      PAGELLM_CHECK(v.is_boolean() || (v.is_string() && !v.get<std::string>().empty()))
          << "\"continue_final_message\" must be true, false or the name of the final "
             "message's field to continue (\"reasoning_content\", say), got "
          << v.dump();
      out.continue_final_message =
          v.is_string() ? v.get<std::string>() : (v.get<bool>() ? "content" : "");
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

const std::string kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";
const char* const kPythonSpace = " \t\n\r\v\f";

std::string strip(const std::string& s) {
  const size_t first = s.find_first_not_of(kPythonSpace);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(kPythonSpace) - first + 1);
}

std::string rstrip(const std::string& s) {
  const size_t last = s.find_last_not_of(kPythonSpace);
  return last == std::string::npos ? "" : s.substr(0, last + 1);
}

/// continue_final_message's first half (transformers' render_jinja_template): the final
/// message, its reasoning aliased as prepare_messages will alias it, with kContinueTag
/// appended to the field to continue. Returns the field's text before the tag.
std::string tag_final_message(nlohmann::ordered_json& messages, const std::string& field,
                              const std::string& template_source) {
  PAGELLM_CHECK(messages.is_array()) << "\"messages\" must be a JSON array of message objects";
  PAGELLM_CHECK(!messages.empty()) << "continue_final_message is set but the conversation is empty";
  nlohmann::ordered_json& last = messages.back();
  PAGELLM_CHECK(last.is_object()) << "message " << messages.size() - 1
                                  << " must be an object like {\"role\": \"user\", "
                                     "\"content\": \"...\"}, got "
                                  << last.dump();
  const std::vector<std::string> reasoning_fields = {"reasoning_content", "thinking", "reasoning"};
  for (const std::string& key : reasoning_fields) {
    auto it = last.find(key);
    if (it == last.end() || it->is_null()) continue;
    // The Python dict literal {"thinking": r, **message, "reasoning_content": r}: a key keeps
    // its first position and takes its last value.
    const nlohmann::ordered_json r = *it;
    nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
    aliased["thinking"] = r;
    for (auto m = last.begin(); m != last.end(); ++m) aliased[m.key()] = m.value();
    aliased["reasoning_content"] = r;
    last = std::move(aliased);
    break;
  }
  auto found = last.find(field);
  PAGELLM_CHECK(found != last.end() && !found->is_null())
      << "continue_final_message is set but the final message has no \"" << field
      << "\" to continue";
  const nlohmann::ordered_json final_value = *found;
  std::vector<std::string> fields = {field};
  if (std::find(reasoning_fields.begin(), reasoning_fields.end(), field) !=
      reasoning_fields.end()) {
    // Reasoning is copied under several names: tag every copy that holds the same value.
    fields.clear();
    for (const std::string& key : reasoning_fields) {
      auto it = last.find(key);
      if (it != last.end() && *it == final_value) fields.push_back(key);
    }
  }
  bool in_template = false;
  for (const std::string& f : fields) in_template |= template_source.find(f) != std::string::npos;
  PAGELLM_CHECK(in_template) << "continue_final_message is set to \"" << field
                             << "\" but this is not an accepted field in the chat_template";
  if (final_value.is_array()) {
    nlohmann::ordered_json& blocks = last[field];
    for (size_t i = blocks.size(); i-- > 0;) {
      if (blocks[i].is_object() && blocks[i].contains("text") && blocks[i]["text"].is_string()) {
        const std::string text = blocks[i]["text"].get<std::string>();
        blocks[i]["text"] = text + kContinueTag;
        return text;
      }
    }
    PAGELLM_FAIL() << "continue_final_message is set but we could not find any text to "
                      "continue in the final message";
  }
  PAGELLM_CHECK(final_value.is_string())
      << "continue_final_message: the final message's \"" << field
      << "\" must be a string or a list of content blocks, got " << final_value.dump();
  for (const std::string& f : fields) last[f] = final_value.get<std::string>() + kContinueTag;
  return final_value.get<std::string>();
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
                  it.key() != "add_generation_prompt" && it.key() != "continue_final_message")
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
  const bool continuing = !request.continue_final_message.empty();
  PAGELLM_CHECK(!(continuing && request.add_generation_prompt))
      << "continue_final_message and add_generation_prompt are not compatible: "
         "continue_final_message continues the final message, add_generation_prompt opens a "
         "new assistant message";
  nlohmann::ordered_json messages = request.messages;
  std::string final_text;
  if (continuing) {
    final_text = tag_final_message(messages, request.continue_final_message, source_);
  }
  variables.emplace_back("messages", prepare_messages(messages));
  variables.emplace_back("tools", jinja::Value::from_json(request.tools));
  variables.emplace_back("documents", jinja::Value::from_json(request.documents));
  variables.emplace_back("add_generation_prompt", jinja::Value(request.add_generation_prompt));
  std::string rendered = template_->render(variables);
  if (!continuing) return rendered;
  const std::string tag = strip(kContinueTag);
  PAGELLM_CHECK(rendered.find(strip(final_text)) != std::string::npos &&
                rendered.find(tag) != std::string::npos)
      << "continue_final_message is set but the final message does not appear in the chat "
         "after applying the chat template (the template drops part of it)";
  const size_t at = rendered.rfind(tag);
  if (rendered.compare(at, kContinueTag.size(), kContinueTag) == 0) return rendered.substr(0, at);
  return rstrip(rendered.substr(0, at));  // the template trimmed the tag's trailing space
}

}  // namespace pagellm
