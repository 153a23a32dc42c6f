// GPT-2's byte-level alphabet: every byte 0..255 is written as one printable code point,
// so that a vocabulary of Unicode strings can hold arbitrary bytes (a space is "Ġ",
// U+0120; a newline is "Ċ", U+010A). Printable Latin-1 bytes map to themselves; the other
// 68 bytes map to U+0100 + n in byte order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pagellm::byte_level {

/// The code point that stands for `byte`.
char32_t byte_to_char(uint8_t byte);

/// The byte that `cp` stands for, or nullopt when `cp` is not in the alphabet.
std::optional<uint8_t> char_to_byte(char32_t cp);

/// Writes raw bytes in the byte-level alphabet (UTF-8 of the mapped code points).
std::string encode(std::string_view bytes);

/// Maps a vocabulary string back to bytes. nullopt when a code point is outside the
/// alphabet (Hugging Face's ByteLevel decoder then keeps the whole token's UTF-8 as is).
std::optional<std::string> decode(std::string_view token);

}  // namespace pagellm::byte_level
