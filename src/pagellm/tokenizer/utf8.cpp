#include "pagellm/tokenizer/utf8.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "pagellm/common/check.h"

namespace pagellm::utf8 {

Sequence classify(const uint8_t* data, size_t size) {
  const uint8_t lead = data[0];
  if (lead < 0x80) return {SequenceStatus::kComplete, 1};
  // Allowed range of the second byte and total length, per Unicode Table 3-7.
  uint8_t low = 0x80, high = 0xBF;
  size_t length;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {SequenceStatus::kInvalid, 1};  // 80..C1 or F5..FF can start nothing
  }
  for (size_t i = 1; i < length; ++i) {
    if (i >= size) return {SequenceStatus::kIncomplete, i};
    const uint8_t byte = data[i];
    const uint8_t lo = i == 1 ? low : 0x80;
    const uint8_t hi = i == 1 ? high : 0xBF;
    if (byte < lo || byte > hi) return {SequenceStatus::kInvalid, i};
  }
  return {SequenceStatus::kComplete, length};
}

bool is_valid(std::string_view text) {
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= size) {
      uint64_t word;
      std::memcpy(&word, data + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= size) break;
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    const Sequence seq = classify(data + i, size - i);
    if (seq.status != SequenceStatus::kComplete) return false;
    i += seq.length;
  }
  return true;
}

size_t append_lossy(std::string& out, std::string_view bytes, bool final) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  size_t i = 0;
  size_t run_start = 0;  // start of the current run of well-formed bytes
  while (i < size) {
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    const Sequence seq = classify(data + i, size - i);
    if (seq.status == SequenceStatus::kComplete) {
      i += seq.length;
      continue;
    }
    out.append(bytes.data() + run_start, i - run_start);
    if (seq.status == SequenceStatus::kIncomplete && !final) return i;
    out.append(kReplacement);
    i += seq.length;
    run_start = i;
  }
  out.append(bytes.data() + run_start, size - run_start);
  return size;
}

std::string make_valid(std::string_view text) {
  if (is_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  append_lossy(out, text, /*final=*/true);
  return out;
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    pos += 2;
    return (char32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    pos += 3;
    return (char32_t(b0 & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  pos += 4;
  return (char32_t(b0 & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

constexpr char32_t kCodeSpace = 0x110000;

// Code points whose normalization properties Hugging Face tokenizers does not know: its NFC
// (the unicode-normalization-alignments crate) has Unicode 9.0 tables, so combining marks
// and compositions added later are, to it, plain starters that never change. utf8proc has
// Unicode 15. These are the code points where the two disagree (found by normalizing every
// code point, every canonical pair and every code point between combining marks with both;
// tests/oracles/tokenizer/corpus.py keeps examples in the parity corpus). We treat them as inert:
// copied as they are and never handed to utf8proc.
constexpr std::pair<char32_t, char32_t> kUnknownToHuggingFace[] = {
    {0x898, 0x898},     {0x89C, 0x89F},     {0x8CA, 0x8CE},     {0x9FE, 0x9FE},     {0x1AC1, 0x1AC2},
    {0x1AC5, 0x1AC9},   {0x1ACB, 0x1ACE},   {0x1DF6, 0x1DF8},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
    {0x10F48, 0x10F4A}, {0x10F4C, 0x10F4C}, {0x10F82, 0x10F82}, {0x10F84, 0x10F84}, {0x1145E, 0x1145E},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4ED}, {0x1E4EF, 0x1E4EF},
};

bool unknown_to_hugging_face(char32_t cp) {
  if (cp < 0x898) return false;
  for (const auto& [lo, hi] : kUnknownToHuggingFace) {
    if (cp < lo) return false;
    if (cp <= hi) return true;
  }
  return false;
}

// One bit per code point: set when the code point is an NFC-inert starter, that is
// canonical combining class 0, no canonical decomposition, and never the second element
// of a canonical composition (or one unknown to Hugging Face, see above). A string made only of such code points is its own NFC: NFD
// leaves it alone, there is nothing to reorder and no pair that composes. (Hangul
// syllables decompose algorithmically and recompose to themselves; the jamo that could
// extend them are marked unsafe.)
class InertStarters {
 public:
  InertStarters() : bits_(kCodeSpace / 64, 0) {
    std::vector<bool> second(kCodeSpace, false);
    utf8proc_int32_t decomposed[8];
    for (char32_t cp = 0; cp < kCodeSpace; ++cp) {
      const utf8proc_property_t* prop = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      const bool canonical = prop->decomp_seqindex != UINT16_MAX && prop->decomp_type == 0;
      if (!canonical || prop->comp_exclusion) continue;
      const utf8proc_ssize_t n = utf8proc_decompose_char(
          static_cast<utf8proc_int32_t>(cp), decomposed, 8, UTF8PROC_DECOMPOSE, nullptr);
      for (utf8proc_ssize_t i = 1; i < n && i < 8; ++i) second[decomposed[i]] = true;
    }
    for (char32_t cp = 0x1161; cp <= 0x1175; ++cp) second[cp] = true;  // Hangul V jamo
    for (char32_t cp = 0x11A8; cp <= 0x11C2; ++cp) second[cp] = true;  // Hangul T jamo
    for (char32_t cp = 0; cp < kCodeSpace; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* prop = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      const bool canonical = prop->decomp_seqindex != UINT16_MAX && prop->decomp_type == 0;
      if ((prop->combining_class == 0 && !canonical && !second[cp]) || unknown_to_hugging_face(cp)) {
        bits_[cp / 64] |= uint64_t{1} << (cp % 64);
      }
    }
  }
  bool inert(char32_t cp) const { return (bits_[cp / 64] >> (cp % 64)) & 1; }

 private:
  std::vector<uint64_t> bits_;
};

const InertStarters& inert_starters() {
  static const InertStarters table;
  return table;
}

}  // namespace

bool is_nfc_quick(std::string_view text) {
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  const size_t size = text.size();
  // Everything below U+0300 is an inert starter; ASCII and Latin-1 need no table.
  while (i < size && data[i] < 0xCC) {
    if (data[i] < 0x80) {
      ++i;
    } else if (data[i] >= 0xC2 && data[i] < 0xCC) {  // U+0080..U+02FF
      i += 2;
    } else {
      break;
    }
  }
  if (i >= size) return true;
  const InertStarters& table = inert_starters();
  while (i < size) {
    const char32_t cp = next_code_point(text, i);
    if (cp >= 0x300 && !table.inert(cp)) return false;
  }
  return true;
}

namespace {

// utf8proc's NFC of one span, appended to `out`.
void append_nfc_span(std::string& out, std::string_view span, std::vector<utf8proc_int32_t>& buffer) {
  const auto* data = reinterpret_cast<const utf8proc_uint8_t*>(span.data());
  const auto options = static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  // Decomposition never needs more than a few code points per input byte; retry if
  // utf8proc says the buffer was short.
  if (buffer.size() < span.size() + 8) buffer.resize(span.size() + 8);
  utf8proc_ssize_t n = 0;
  for (;;) {
    n = utf8proc_decompose(data, static_cast<utf8proc_ssize_t>(span.size()), buffer.data(),
                           static_cast<utf8proc_ssize_t>(buffer.size()), options);
    PAGELLM_CHECK(n >= 0) << "NFC normalization failed: " << utf8proc_errmsg(n);
    if (static_cast<size_t>(n) <= buffer.size()) break;
    buffer.resize(static_cast<size_t>(n));
  }
  n = utf8proc_normalize_utf32(buffer.data(), n, options);
  PAGELLM_CHECK(n >= 0) << "NFC normalization failed: " << utf8proc_errmsg(n);
  for (utf8proc_ssize_t i = 0; i < n; ++i) append_code_point(out, static_cast<char32_t>(buffer[i]));
}

}  // namespace

std::string nfc(std::string_view text) {
  if (is_nfc_quick(text)) return std::string(text);
  // Normalization only reaches across non-inert code points: an inert starter neither
  // changes nor interacts with its neighbours, so the text is cut at inert starters and
  // only the spans between them that hold something else go through utf8proc.
  const InertStarters& table = inert_starters();
  std::string out;
  out.reserve(text.size() + 16);
  std::vector<utf8proc_int32_t> buffer;
  size_t copied = 0;       // text[0, copied) is already in `out`
  size_t last_inert = 0;   // start of the last inert starter seen (a safe span start)
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t cp = next_code_point(text, pos);
    if (cp < 0x300 || table.inert(cp)) {
      // A span may start at an inert starter (marks after it may compose with it), but
      // not at a code point unknown to Hugging Face: utf8proc must not see those.
      last_inert = unknown_to_hugging_face(cp) ? pos : start;
      continue;
    }
    // A span from the inert starter before this code point to the next inert starter.
    size_t span_end = pos;
    while (span_end < text.size()) {
      size_t next = span_end;
      const char32_t c = next_code_point(text, next);
      if (c < 0x300 || table.inert(c)) break;
      span_end = next;
    }
    const size_t span_start = std::max(last_inert, copied);
    out.append(text.substr(copied, span_start - copied));
    append_nfc_span(out, text.substr(span_start, span_end - span_start), buffer);
    copied = pos = span_end;
    last_inert = span_end;
  }
  out.append(text.substr(copied));
  return out;
}

bool is_python_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace pagellm::utf8
