// UTF-8 helpers for the tokenizer: validation, lossy repair, code point iteration, NFC.
//
// Invalid UTF-8 is repaired the way Python's bytes.decode("utf-8", errors="replace") and
// Rust's String::from_utf8_lossy do it (Unicode's "maximal subpart" practice, Unicode 15
// section 3.9): each maximal subpart of an ill-formed sequence becomes one U+FFFD. Both the
// encoder (bytes in) and the decoder (bytes out) use this one rule, so that pagellm and
// Hugging Face agree byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagellm::utf8 {

/// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

/// What lies at the start of a byte range.
enum class SequenceStatus {
  kComplete,    ///< a well-formed sequence of `length` bytes
  kInvalid,     ///< an ill-formed maximal subpart of `length` bytes (one U+FFFD)
  kIncomplete,  ///< a well-formed prefix cut off by the end of the range (`length` bytes)
};

struct Sequence {
  SequenceStatus status;
  size_t length;  // >= 1 for a non-empty range
};

/// Classifies the sequence starting at data[0]. Requires size >= 1.
Sequence classify(const uint8_t* data, size_t size);

/// True when `text` is well-formed UTF-8.
bool is_valid(std::string_view text);

/// Appends `bytes` to `out` as well-formed UTF-8, replacing ill-formed parts with U+FFFD.
/// With `final` false, a well-formed prefix cut off at the end is left unconsumed (for
/// streaming); with `final` true it becomes one U+FFFD. Returns the number of bytes consumed.
size_t append_lossy(std::string& out, std::string_view bytes, bool final);

/// `text` if well-formed, otherwise its lossy repair.
std::string make_valid(std::string_view text);

/// Decodes the code point at text[pos] of well-formed UTF-8 and advances pos.
char32_t next_code_point(std::string_view text, size_t& pos);

/// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value).
void append_code_point(std::string& out, char32_t cp);

/// Unicode Normalization Form C of well-formed UTF-8 as Hugging Face tokenizers computes it:
/// utf8proc's NFC (Unicode 15), except that the few dozen combining marks and compositions
/// added after Unicode 9.0 (Hugging Face's tables) are left alone, as Hugging Face does.
/// Text that is NFC-stable by a quick check (all code points are starters that never
/// compose or decompose, the common case for ASCII, CJK, kana and emoji) is returned
/// without running utf8proc.
std::string nfc(std::string_view text);

/// True when the quick check proves nfc(text) == text.
bool is_nfc_quick(std::string_view text);

/// Python's str.isspace() for one code point (what str.strip()/split() treat as blanks).
bool is_python_space(char32_t cp);

}  // namespace pagellm::utf8
