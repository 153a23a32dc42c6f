// Added tokens (<|im_start|>, <think>, ...): found in the text before normalization and
// BPE, the way Hugging Face's AddedVocabulary does it.
//
// Matching is leftmost-longest over all added tokens and non-overlapping: scanning from the
// left, the longest token that starts at the earliest position wins, and scanning resumes
// after it. A special token that the caller asked not to match (split_special_tokens) is
// still consumed by the scan and left as plain text, so nothing inside it matches either
// (same as Hugging Face's encode_special_tokens). single_word, lstrip and rstrip follow
// Hugging Face's rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm {

/// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  // matched after normalization instead of before
};

/// A piece of text after splitting out added tokens: [begin, end) is an added token when
/// `token_id` >= 0, plain text otherwise.
struct AddedSegment {
  uint32_t begin;
  uint32_t end;
  int32_t token_id;
};

/// Finds a fixed set of added tokens in text. Immutable; safe to share between threads.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  /// `tokens` are matched by their `content` as given.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  /// Splits `text` (valid UTF-8) into plain and added-token segments, replacing `out`.
  /// With `match_special` false, special tokens are left in the plain text.
  void split(std::string_view text, bool match_special, std::vector<AddedSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_ if terminal
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;    // nodes_[0] is the root
  int32_t first_[256];         // root's child for each first byte, -1 if none
};

/// Unicode White_Space (what Rust's char::is_whitespace and regex \s accept).
bool is_unicode_whitespace(char32_t cp);

}  // namespace pagellm
