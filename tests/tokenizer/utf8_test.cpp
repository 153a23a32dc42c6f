// UTF-8 repair, code points, NFC and the byte-level alphabet.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>
#include <set>

#include "pagellm/tokenizer/byte_level.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm {
namespace {

const std::string R(utf8::kReplacement);

TEST(Utf8, RepairsLikePythonReplace) {
  // Expected values are what bytes.decode("utf-8", "replace") gives (maximal subparts).
  EXPECT_EQ(utf8::make_valid("plain"), "plain");
  EXPECT_EQ(utf8::make_valid("a\xff" "b"), "a" + R + "b");
  EXPECT_EQ(utf8::make_valid("\xe2\x82"), R);                         // truncated: one subpart
  EXPECT_EQ(utf8::make_valid("\xe2\x82x"), R + "x");
  EXPECT_EQ(utf8::make_valid("\xed\xa0\x80"), R + R + R);              // surrogate: ED then A0, 80
  EXPECT_EQ(utf8::make_valid("\xc0\x80"), R + R);                      // overlong
  EXPECT_EQ(utf8::make_valid("\xf0\x80\x80\x80"), R + R + R + R);      // overlong 4-byte
  EXPECT_EQ(utf8::make_valid("\xf4\x90\x80\x80"), R + R + R + R);      // above U+10FFFF
  EXPECT_EQ(utf8::make_valid("\xf0\x9f\x98"), R);                      // emoji cut short
  EXPECT_EQ(utf8::make_valid("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");  // the emoji itself
  EXPECT_EQ(utf8::make_valid("\xe2\x28\xa1"), R + "(" + R);
  EXPECT_EQ(utf8::make_valid("\xf8\x88\x80\x80\x80"), R + R + R + R + R);
}

TEST(Utf8, StreamingLeavesAnIncompleteTail) {
  std::string out;
  EXPECT_EQ(utf8::append_lossy(out, "ab\xe4\xbd", /*final=*/false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_lossy(out, "ab\xe4\xbd", /*final=*/true), 4u);
  EXPECT_EQ(out, "ab" + R);
  out.clear();
  // An invalid byte is final even when more could follow.
  EXPECT_EQ(utf8::append_lossy(out, "\xff", /*final=*/false), 1u);
  EXPECT_EQ(out, R);
}

TEST(Utf8, ValidityAgreesWithRepair) {
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 0x80 : 0x80 + rng() % 0x80);
    const std::string fixed = utf8::make_valid(s);
    ASSERT_TRUE(utf8::is_valid(fixed));
    EXPECT_EQ(utf8::is_valid(s), fixed == s);
  }
}

TEST(Utf8, CodePointsRoundTrip) {
  for (char32_t cp : {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFDu, 0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    utf8::append_code_point(s, cp);
    size_t pos = 0;
    EXPECT_EQ(utf8::next_code_point(s, pos), cp);
    EXPECT_EQ(pos, s.size());
  }
}

TEST(Utf8, Nfc) {
  EXPECT_EQ(utf8::nfc("e\xcc\x81"), "\xc3\xa9");                    // e + U+0301 -> é
  EXPECT_EQ(utf8::nfc("\xe2\x84\xab"), "\xc3\x85");                 // ANGSTROM SIGN -> Å
  EXPECT_EQ(utf8::nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"), "\xea\xb0\x81");  // jamo -> 각
  EXPECT_EQ(utf8::nfc("\xe0\xa5\x98"), "\xe0\xa4\x95\xe0\xa4\xbc");  // U+0958 is excluded: stays decomposed
  EXPECT_EQ(utf8::nfc("q\xcc\xa3\xcc\x87"), "q\xcc\xa3\xcc\x87");    // already canonical order
  EXPECT_EQ(utf8::nfc("q\xcc\x87\xcc\xa3"), "q\xcc\xa3\xcc\x87");    // reordered
  EXPECT_EQ(utf8::nfc("ASCII stays"), "ASCII stays");
  EXPECT_EQ(utf8::nfc("\xef\xac\x81"), "\xef\xac\x81");              // ligature ﬁ: compatibility only
}

// The quick check may only say "stable" when NFC really leaves the text alone.
TEST(Utf8, NfcQuickCheckIsSound) {
  std::mt19937 rng(7);
  const std::vector<std::pair<char32_t, char32_t>> blocks = {
      {0x20, 0x7E},     {0xA0, 0x36F},    {0x370, 0x52F},   {0x590, 0x6FF},   {0x900, 0xDFF},
      {0x1100, 0x11FF}, {0x1E00, 0x1FFF}, {0x2000, 0x2BFF}, {0x3000, 0x30FF}, {0x4E00, 0x4FFF},
      {0xAC00, 0xAD00}, {0xF900, 0xFB4F}, {0x1D100, 0x1D1FF}, {0x1F300, 0x1F6FF}, {0x2F800, 0x2FA1F}};
  int stable = 0;
  for (int i = 0; i < 50000; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) {
      const auto& [lo, hi] = blocks[rng() % blocks.size()];
      const char32_t cp = lo + static_cast<char32_t>(rng() % (hi - lo + 1));
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      utf8::append_code_point(s, cp);
    }
    if (!utf8::is_nfc_quick(s)) continue;
    ++stable;
    utf8proc_uint8_t* full = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(full)), s) << "quick check wrongly passed";
    std::free(full);
  }
  EXPECT_GT(stable, 1000);  // the check is not vacuous
}

// nfc() normalizes only the spans around non-inert code points; the result must equal
// utf8proc's NFC of the whole text.
TEST(Utf8, PiecewiseNfcEqualsWholeNfc) {
  std::mt19937 rng(11);
  const std::vector<std::pair<char32_t, char32_t>> blocks = {
      {0x41, 0x7A},     {0xC0, 0x17F},    {0x300, 0x36F},   {0x1E00, 0x1EFF}, {0x900, 0x97F},
      {0x1100, 0x11FF}, {0xAC00, 0xAC40}, {0x3040, 0x30FF}, {0xF900, 0xF90F}, {0x0620, 0x0660},
      {0x2000, 0x2010}, {0x212A, 0x212B}, {0x0B00, 0x0B7F}, {0x1D15E, 0x1D164}, {0x20, 0x20}};
  for (int i = 0; i < 30000; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) {
      const auto& [lo, hi] = blocks[rng() % blocks.size()];
      utf8::append_code_point(s, lo + static_cast<char32_t>(rng() % (hi - lo + 1)));
    }
    utf8proc_uint8_t* full = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(utf8::nfc(s), std::string(reinterpret_cast<char*>(full))) << s;
    std::free(full);
  }
}

// Hugging Face's NFC has Unicode 9.0 tables: later combining marks and compositions are
// plain starters to it, and pagellm must agree.
TEST(Utf8, NfcLeavesPostUnicode9MarksAlone) {
  // DIVES AKURU (Unicode 13): utf8proc composes U+11935 U+11930 into U+11938; HF does not.
  EXPECT_EQ(utf8::nfc("\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0"), "\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0");
  // U+1AC1 (Unicode 14, ccc 230 in utf8proc) does not reorder with U+0323 (ccc 220).
  EXPECT_EQ(utf8::nfc("a\xe1\xab\x81\xcc\xa3"), "a\xe1\xab\x81\xcc\xa3");
  // ... but the marks Hugging Face knows still compose: a + U+0301 -> á, then U+1AC1 stays.
  EXPECT_EQ(utf8::nfc("a\xcc\x81\xe1\xab\x81"), "\xc3\xa1\xe1\xab\x81");
}

TEST(ByteLevel, AlphabetIsABijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_level::byte_to_char(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(byte_level::char_to_byte(cp), static_cast<uint8_t>(b));
  }
  EXPECT_EQ(byte_level::byte_to_char(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_level::byte_to_char('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_level::byte_to_char('A'), U'A');
  EXPECT_EQ(byte_level::encode(" hi"), "\xc4\xa0hi");
  EXPECT_EQ(byte_level::decode("\xc4\xa0hi"), std::optional<std::string>(" hi"));
  EXPECT_EQ(byte_level::decode("a b"), std::nullopt);  // a raw space is not in the alphabet
}

}  // namespace
}  // namespace pagellm
