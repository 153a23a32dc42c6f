#include "pagellm/tokenizer/added_vocabulary.h"

#include <algorithm>

#include <utf8proc.h>

#include "pagellm/tokenizer/utf8.h"

namespace pagellm {

bool is_unicode_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

// Regex \w as Rust's regex crate defines it (Alphabetic, Mark, Decimal_Number,
// Connector_Punctuation, Join_Control), approximated by general categories.
bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The code point that ends text[0, end) (end > 0, valid UTF-8).
char32_t code_point_before(std::string_view text, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return utf8::next_code_point(text, pos);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher() {
  std::fill(std::begin(first_), std::end(first_), -1);
  nodes_.emplace_back();
}

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : AddedTokenMatcher() {
  tokens_ = std::move(tokens);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    int32_t node = 0;
    for (unsigned char byte : content) {
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(std::upper_bound(children.begin(), children.end(),
                                         std::make_pair(byte, int32_t{-1})),
                        {byte, next});
        if (node == 0) first_[byte] = next;
      }
      node = next;
    }
    // Two added tokens with the same content: the later one wins (as in a hash map).
    nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return first_[byte];
  for (const auto& [b, index] : nodes_[node].children) {
    if (b == byte) return index;
    if (b > byte) break;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, bool match_special,
                              std::vector<AddedSegment>& out) const {
  out.clear();
  const size_t n = text.size();
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  size_t plain_start = 0;  // start of the text not yet emitted
  size_t i = 0;
  while (i < n) {
    int32_t node = first_[data[i]];
    if (node < 0) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t best = -1;
    size_t best_end = 0;
    size_t j = i + 1;
    while (true) {
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = j;
      }
      if (j >= n) break;
      const int32_t next = child(node, data[j]);
      if (next < 0) break;
      node = next;
      ++j;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[best];
    size_t start = i;
    size_t stop = best_end;
    i = best_end;  // the scan resumes after this match whether or not it is used
    if (token.special && !match_special) continue;
    if (token.single_word) {
      size_t unused;
      const bool word_before = start > 0 && is_word_char(code_point_before(text, start, unused));
      size_t after = stop;
      const bool word_after = stop < n && is_word_char(utf8::next_code_point(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (start > plain_start) {
        size_t prev;
        if (!is_unicode_whitespace(code_point_before(text, start, prev))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < n) {
        size_t next = stop;
        if (!is_unicode_whitespace(utf8::next_code_point(text, next))) break;
        stop = next;
      }
      i = stop;
    }
    if (start > plain_start) {
      out.push_back({static_cast<uint32_t>(plain_start), static_cast<uint32_t>(start), -1});
    }
    out.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(stop), token.id});
    plain_start = stop;
  }
  if (n > plain_start) {
    out.push_back({static_cast<uint32_t>(plain_start), static_cast<uint32_t>(n), -1});
  }
}

}  // namespace pagellm
