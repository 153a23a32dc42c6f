#include "pagellm/api/text_model.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm::api {

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    const utf8::Sequence s = utf8::classify(data + pos, text.size() - pos);
    if (s.status != utf8::SequenceStatus::kComplete) return pos;
    pos += s.length;
  }
  return std::nullopt;
}

void check_request(const EncodedPrompt& prompt, const SamplingParams& params,
                   const RequestLimits& limits, bool has_tokenizer) {
  validate_sampling_params(params);
  PAGELLM_CHECK(!prompt.ids.empty()) << "the prompt is empty; a prompt needs at least one token";
  for (size_t i = 0; i < prompt.ids.size(); ++i) {
    PAGELLM_CHECK(prompt.ids[i] >= 0 && prompt.ids[i] < limits.vocab_size)
        << "prompt token " << i << " has id " << prompt.ids[i] << ", outside the vocabulary [0, "
        << limits.vocab_size << ")";
  }
  PAGELLM_CHECK(static_cast<int64_t>(prompt.ids.size()) < limits.max_model_len)
      << "the prompt has " << prompt.ids.size() << " tokens but max_model_len is "
      << limits.max_model_len << "; the prompt must be at most " << limits.max_model_len - 1
      << " tokens so that at least one token can be generated";
  PAGELLM_CHECK(limits.max_num_seqs <= 0 || params.n <= limits.max_num_seqs)
      << "the request asks for n = " << params.n << " samples but max_num_seqs is "
      << limits.max_num_seqs << ": the n samples of a request run together, sharing the "
      << "prompt's KV pages; use n <= " << limits.max_num_seqs << " or raise max_num_seqs";
  PAGELLM_CHECK(params.stop.empty() || has_tokenizer)
      << "stop strings need a tokenizer (tokenizer.json in the model folder); use "
         "stop_token_ids";
}

TextModel::TextModel(const std::string& model_dir) : model_dir_(model_dir) {
  if (std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) {
    tokenizer_ = Tokenizer::load(model_dir);
  }
}

std::string TextModel::vocab_warning(int64_t vocab_size) const {
  return tokenizer_ ? check_tokenizer_covers_vocab(*tokenizer_, vocab_size) : std::string();
}

const Tokenizer& TextModel::tokenizer(const char* what) const {
  PAGELLM_CHECK(tokenizer_) << what << " needs a tokenizer, and " << model_dir_
                            << " has no tokenizer.json; give token ids instead";
  return *tokenizer_;
}

std::vector<int32_t> TextModel::encode(const std::string& text) const {
  return tokenizer("encoding text").encode(text);
}

std::string TextModel::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  DecodeOptions options;
  options.skip_special_tokens = skip_special_tokens;
  return tokenizer("decoding").decode(ids, options);
}

std::string TextModel::render_chat(const Prompt& prompt) const {
  PAGELLM_CHECK(prompt.kind == Prompt::Kind::kChat) << "render_chat needs a chat prompt";
  const Tokenizer& tok = tokenizer("a chat prompt");
  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(prompt.messages_json);
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << "chat messages are not JSON: " << e.what();
  }
  ChatRequest request = ChatRequest::from_json(messages);
  if (!prompt.chat_template_kwargs_json.empty()) {
    nlohmann::ordered_json kwargs;
    try {
      kwargs = nlohmann::ordered_json::parse(prompt.chat_template_kwargs_json);
    } catch (const nlohmann::json::exception& e) {
      PAGELLM_FAIL() << "chat_template_kwargs is not JSON: " << e.what();
    }
    PAGELLM_CHECK(kwargs.is_object())
        << "chat_template_kwargs must be a JSON object of template variables, got "
        << kwargs.dump();
    for (const auto& [key, value] : kwargs.items()) request.variables[key] = value;
  }
  // The assistant's turn is opened unless the request says otherwise, or continues its
  // final message instead.
  if (!messages.is_object() || !messages.contains("add_generation_prompt")) {
    request.add_generation_prompt = request.continue_final_message.empty();
  }
  return tok.chat_template().render(request);
}

EncodedPrompt TextModel::encode_prompt(const Prompt& prompt) const {
  EncodedPrompt out;
  switch (prompt.kind) {
    case Prompt::Kind::kTokenIds:
      out.ids = prompt.token_ids;
      break;
    case Prompt::Kind::kText:
      if (const auto bad = first_invalid_utf8(prompt.text)) {
        PAGELLM_FAIL() << "the prompt text is not valid UTF-8: byte " << *bad << " (0x"
                       << std::hex << static_cast<int>(static_cast<uint8_t>(prompt.text[*bad]))
                       << std::dec << ") starts an ill-formed sequence";
      }
      out.text = prompt.text;
      out.ids = encode(prompt.text);
      break;
    case Prompt::Kind::kChat:
      out.text = render_chat(prompt);
      out.ids = tokenizer("a chat prompt").encode(out.text);
      break;
  }
  return out;
}

}  // namespace pagellm::api
