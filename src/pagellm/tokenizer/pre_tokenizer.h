// Pre-tokenization: cuts normalized text into the pieces that BPE encodes one by one.
//
// Supported tokenizer.json pre_tokenizers (anything else is rejected when loading):
//   Split {pattern: {Regex|String}, behavior: "Isolated", invert: false}
//   ByteLevel {add_prefix_space: false, use_regex: true|false}
//   Sequence of the above.
// A Split keeps every match and every gap between matches as its own piece (Hugging Face's
// "Isolated" behaviour). ByteLevel with use_regex adds GPT-2's split regex; its byte-to-
// character mapping is not done here: BPE works on raw bytes (see bpe.h).
//
// Regexes run on PCRE2 with UTF and Unicode-property semantics (\p{L}, \s follow Unicode),
// JIT-compiled. Qwen3's pattern uses a lookahead, which rules out RE2.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pagellm {

/// A byte range [begin, end) of the text being split.
struct TextPiece {
  uint32_t begin;
  uint32_t end;
};

/// One compiled split pattern (PCRE2, UTF + UCP, JIT when available). Immutable and safe
/// to use from several threads at once.
class RegexSplitter {
 public:
  /// `literal`: the pattern is a plain string to split on (tokenizer.json's {"String": ...}).
  RegexSplitter(const std::string& pattern, bool literal);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  /// Appends the pieces of text[piece.begin, piece.end) to `out`: every match and every
  /// non-empty gap, in order (offsets are into `text`). `text` must be valid UTF-8.
  void split(std::string_view text, TextPiece piece, std::vector<TextPiece>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

/// The pre-tokenizer pipeline of one tokenizer.json.
class PreTokenizer {
 public:
  /// Builds from the "pre_tokenizer" field (null allowed: the whole text is one piece).
  /// Throws Error naming an unsupported type or option.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& config);

  /// Splits `text` (valid UTF-8) into pieces, replacing the contents of `out`.
  /// `scratch` is working memory that the caller may reuse between calls.
  void split(std::string_view text, std::vector<TextPiece>& out,
             std::vector<TextPiece>& scratch) const;

 private:
  std::vector<std::unique_ptr<RegexSplitter>> stages_;
};

}  // namespace pagellm
