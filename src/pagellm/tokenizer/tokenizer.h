// The tokenizer of a Hugging Face model folder: tokenizer.json + tokenizer_config.json.
//
// Encoding reproduces Hugging Face `tokenizers` (Tokenizer.encode with default options):
//   1. ill-formed UTF-8 in the input is replaced, one U+FFFD per maximal subpart (what
//      Python's bytes.decode("utf-8", "replace") gives, which is the only way such input
//      can reach Hugging Face);
//   2. added tokens with normalized=false are split out (added_vocabulary.h);
//   3. each remaining segment is normalized (NFC, or nothing);
//   4. added tokens with normalized=true are split out of the normalized text;
//   5. the pre-tokenizer cuts the text into pieces (pre_tokenizer.h);
//   6. byte-level BPE encodes each piece (bpe.h), through a bounded cache.
// Decoding reproduces Tokenizer.decode: each id becomes its token (an added token's content
// first, then the vocabulary), special tokens are dropped on request, the ByteLevel decoder
// maps each token back to bytes (a token with a character outside the byte alphabet is kept
// as its UTF-8), and the bytes are read as UTF-8 with U+FFFD for ill-formed parts. Ids with
// no token (for example the padding rows of a 151,936-row embedding) decode to nothing, as
// in Hugging Face.
//
// Supported tokenizer.json: model BPE (byte-level: no unk_token needed, no subword
// prefix/suffix, dropout null), normalizer NFC or null, pre_tokenizer per pre_tokenizer.h,
// decoder ByteLevel, post_processor ByteLevel or null. Anything else is rejected at load
// with an error naming it.
//
// A Tokenizer is immutable after loading, cheap to copy (shared state) and safe to use
// from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagellm/tokenizer/added_vocabulary.h"

namespace pagellm {

class ChatTemplate;
class StreamDecoder;

/// Options of Tokenizer::encode.
struct EncodeOptions {
  /// Treat special tokens written in the text as plain text (transformers'
  /// split_special_tokens; Hugging Face tokenizers' encode_special_tokens). Use it for
  /// untrusted user text so that "<|im_end|>" typed by a user cannot end a turn.
  /// Non-special added tokens (<think>, <tool_call>) are matched either way.
  bool split_special_tokens = false;
};

/// Options of Tokenizer::decode and StreamDecoder.
struct DecodeOptions {
  /// Drop special tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...).
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  /// Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (special token
  /// names, chat template) and DIR/chat_template.jinja. Throws Error naming the file and
  /// the problem.
  static Tokenizer load(const std::string& model_dir);

  /// Builds from file contents. `tokenizer_config_json` and `chat_template` may be empty.
  /// `source` names the origin in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                             const std::string& source, std::string_view chat_template = {});

  /// Token ids of `text` (any bytes; see the repair rule above).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

  /// Text of `ids`; always well-formed UTF-8.
  std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& options = {}) const;
  std::string decode(const int32_t* ids, size_t count, const DecodeOptions& options = {}) const;

  /// A decoder that turns ids into text one at a time (see StreamDecoder).
  StreamDecoder stream_decoder(const DecodeOptions& options = {}) const;

  /// One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  /// The id of a token given as written in the vocabulary (byte-level form, "Ġthe") or an
  /// added token's content ("<|im_end|>").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The vocabulary string of `id` (added token content first), nullopt if none.
  std::optional<std::string> id_to_token(int32_t id) const;
  /// The bytes that `id` decodes to (empty for an id with no token).
  std::string_view token_bytes(int32_t id) const;
  /// True for ids of special added tokens.
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  /// tokenizer_config.json's eos_token ("<|im_end|>" for Qwen3), if any.
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  /// Ids that end generation: eos_token_id plus "<|endoftext|>" and "<|im_end|>" when the
  /// vocabulary has them (Qwen3's generation_config.json lists 151645 and 151643).
  std::vector<int32_t> stop_token_ids() const;

  /// The special tokens that tokenizer_config.json names, as chat templates see them:
  /// {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"} for Qwen3.
  const nlohmann::ordered_json& special_tokens_map() const;

  /// True when tokenizer_config.json (or chat_template.jinja) carries a chat template.
  bool has_chat_template() const;
  /// The chat template; throws Error if the model has none.
  const ChatTemplate& chat_template() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

/// Incremental detokenization for streaming generation. push() returns the text that the
/// new id completes; a multi-byte character split across tokens is held back until its
/// last byte arrives, so every returned string is well-formed UTF-8, and the
/// concatenation of all push() results and finish() equals Tokenizer::decode of all ids.
class StreamDecoder {
 public:
  /// Appends the text completed by `id` (possibly empty).
  std::string push(int32_t id);
  /// Flushes what is held back: an unfinished character becomes U+FFFD. The decoder can
  /// be reused afterwards for a new stream.
  std::string finish();
  /// Bytes held back, waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  friend class Tokenizer;
  StreamDecoder(std::shared_ptr<const Tokenizer::Impl> impl, DecodeOptions options)
      : impl_(std::move(impl)), options_(options) {}
  std::shared_ptr<const Tokenizer::Impl> impl_;
  DecodeOptions options_;
  std::string pending_;
};

}  // namespace pagellm
