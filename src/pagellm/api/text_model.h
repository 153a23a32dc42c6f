// The text side of a model folder: its tokenizer (optional) and the checks a request passes
// before it reaches the engine. Shared by LLM, AsyncEngine, the batch-file parser and the
// CLI, so that every front end rejects the same input with the same message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm::api {

/// Byte offset of the first ill-formed UTF-8 sequence in `text`, nullopt if well-formed.
std::optional<size_t> first_invalid_utf8(std::string_view text);

/// A prompt turned into what the engine takes.
struct EncodedPrompt {
  std::string text;  // the text, or the rendered chat template; empty for token ids
  std::vector<int32_t> ids;
};

/// The limits a request is checked against: the model's vocabulary and the engine's
/// max_model_len (both known from config.json, before any weight is loaded).
struct RequestLimits {
  int64_t vocab_size = 0;
  int32_t max_model_len = 0;
  /// The engine's max_num_seqs: the most samples (n) one request may ask for, since all n
  /// run together after the prompt's fan-out. 0: not checked.
  int32_t max_num_seqs = 0;
};

/// Throws Error naming the problem: invalid sampling params, an empty prompt, a prompt of
/// max_model_len tokens or more, an id outside [0, vocab_size), stop strings without a
/// tokenizer, n above max_num_seqs.
void check_request(const EncodedPrompt& prompt, const SamplingParams& params,
                   const RequestLimits& limits, bool has_tokenizer);

/// The tokenizer of a model folder, when it has one. Immutable; safe from any thread.
class TextModel {
 public:
  /// Loads DIR/tokenizer.json when it exists.
  explicit TextModel(const std::string& model_dir);

  bool has_tokenizer() const { return tokenizer_.has_value(); }
  /// Throws Error (naming `what` needs it) without a tokenizer.
  const Tokenizer& tokenizer(const char* what = "text") const;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  /// The rendered chat template of a chat Prompt (add_generation_prompt on).
  std::string render_chat(const Prompt& prompt) const;
  /// Text must be well-formed UTF-8 (the error names the byte offset); chat messages must
  /// have the shapes ChatRequest accepts.
  EncodedPrompt encode_prompt(const Prompt& prompt) const;
  /// Why this folder's tokenizer does not fit a model of `vocab_size` rows (ids it can
  /// produce that the model cannot embed, or far fewer tokens than rows), or empty: see
  /// check_tokenizer_covers_vocab. Empty without a tokenizer.
  std::string vocab_warning(int64_t vocab_size) const;

 private:
  std::string model_dir_;
  std::optional<Tokenizer> tokenizer_;
};

}  // namespace pagellm::api
