#include "pagellm/tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm {
namespace {

// GPT-2's pre-tokenizer regex, used by ByteLevel {use_regex: true}.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode White_Space, which is what \s means to Hugging Face's regex engine (Oniguruma).
// PCRE2's \s in UCP mode also matches U+180E MONGOLIAN VOWEL SEPARATOR (a format character
// since Unicode 6.3), so \s and \S are spelled out before compiling (found by the parity
// corpus).
constexpr const char* kWhiteSpace =
    R"(\t\n\x0b\f\r\x20\x85\xa0\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

// Code points that Hugging Face's regex engine puts in \p{N} and PCRE2 10.42 does not:
// the Kaktovik numerals (Unicode 15.0, category No). Found by pre-tokenizing every code
// point with both.
constexpr const char* kExtraNumbers = R"(\x{1D2C0}-\x{1D2D3})";

// Rewrites a Hugging Face split regex so that PCRE2 matches what Oniguruma matches:
// \s and \S as Unicode White_Space, \p{N} with the Kaktovik numerals.
std::string adapt_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else if ((e == 'p' || e == 'P') && pattern.compare(i + 2, 3, "{N}") == 0 && (e == 'p' || !in_class)) {
        const std::string numbers = std::string("\\p{N}") + kExtraNumbers;
        if (in_class) {
          out += numbers;
        } else {
          out += (e == 'p' ? "[" : "[^") + numbers + "]";
        }
        i += 3;  // the "{N}"
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out.push_back(c);
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread PCRE2 working memory: one match-data block (group 0 only, which is all a
// split needs) and a JIT stack that may grow to 8 MiB. Patterns never share state, so a
// single set per thread serves every RegexSplitter.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    PAGELLM_CHECK(match_data && context && jit_stack) << "out of memory creating PCRE2 match state";
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  const std::string compiled = literal ? pattern : adapt_pattern(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   options, &error_code, &error_offset, nullptr);
  PAGELLM_CHECK(code != nullptr) << "pre-tokenizer regex does not compile at offset "
                                 << error_offset << ": " << pcre2_message(error_code)
                                 << " (pattern: " << pattern << ")";
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, TextPiece piece,
                          std::vector<TextPiece>& out) const {
  ThreadMatchState& state = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The subject is the piece alone, as in Hugging Face: a lookahead at the piece's end
  // sees the end of the subject, not the text after it.
  const PCRE2_SIZE end = piece.end;
  PCRE2_SIZE pos = piece.begin;
  PCRE2_SIZE gap_start = piece.begin;
  auto* code = static_cast<pcre2_code*>(code_);
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
  // PCRE2's default limit (10 million backtracking steps per match) is reached by
  // legitimate input such as 10 MB of spaces, where `\s*[\r\n]+` scans the run once before
  // `\s+(?!\S)` takes it. The work per match is linear in the piece for these patterns, so
  // the limit scales with the piece.
  const uint64_t limit = uint64_t{10'000'000} + uint64_t{16} * (end - pos);
  pcre2_set_match_limit(state.context, static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX)));
  while (pos < end) {
    const int rc = jit_ ? pcre2_jit_match(code, subject + piece.begin, end - piece.begin,
                                          pos - piece.begin, 0, state.match_data, state.context)
                        : pcre2_match(code, subject + piece.begin, end - piece.begin,
                                      pos - piece.begin, PCRE2_NO_UTF_CHECK, state.match_data,
                                      state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    PAGELLM_CHECK(rc >= 0) << "pre-tokenizer regex failed on a " << (end - piece.begin)
                           << "-byte piece: " << pcre2_message(rc);
    const PCRE2_SIZE match_begin = piece.begin + ovector[0];
    const PCRE2_SIZE match_end = piece.begin + ovector[1];
    if (match_end == match_begin) {
      // An empty match splits nothing; step over one code point, as Hugging Face does.
      size_t next = match_begin;
      if (next >= end) break;
      utf8::next_code_point(text, next);
      pos = next;
      continue;
    }
    if (match_begin > gap_start) {
      out.push_back({static_cast<uint32_t>(gap_start), static_cast<uint32_t>(match_begin)});
    }
    out.push_back({static_cast<uint32_t>(match_begin), static_cast<uint32_t>(match_end)});
    gap_start = pos = match_end;
  }
  if (end > gap_start) {
    out.push_back({static_cast<uint32_t>(gap_start), static_cast<uint32_t>(end)});
  }
}

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& config) {
  auto result = std::make_unique<PreTokenizer>();
  if (config.is_null()) return result;
  // Flatten nested Sequences into a list of leaf configs.
  std::vector<const nlohmann::json*> leaves;
  std::vector<const nlohmann::json*> todo{&config};
  while (!todo.empty()) {
    const nlohmann::json* node = todo.back();
    todo.pop_back();
    PAGELLM_CHECK(node->is_object() && node->contains("type"))
        << "tokenizer.json: a pre_tokenizer must be an object with a \"type\"";
    if ((*node)["type"] == "Sequence") {
      const nlohmann::json& list = node->at("pretokenizers");
      for (auto it = list.rbegin(); it != list.rend(); ++it) todo.push_back(&*it);
    } else {
      leaves.push_back(node);
    }
  }
  for (const nlohmann::json* leaf : leaves) {
    const std::string type = leaf->at("type").get<std::string>();
    if (type == "Split") {
      const std::string behavior = leaf->value("behavior", "Isolated");
      PAGELLM_CHECK(behavior == "Isolated")
          << "tokenizer.json: Split pre_tokenizer behavior \"" << behavior
          << "\" is not supported (supported: \"Isolated\")";
      PAGELLM_CHECK(!leaf->value("invert", false))
          << "tokenizer.json: Split pre_tokenizer with invert=true is not supported";
      const nlohmann::json& pattern = leaf->at("pattern");
      if (pattern.contains("Regex")) {
        result->stages_.push_back(
            std::make_unique<RegexSplitter>(pattern["Regex"].get<std::string>(), false));
      } else if (pattern.contains("String")) {
        result->stages_.push_back(
            std::make_unique<RegexSplitter>(pattern["String"].get<std::string>(), true));
      } else {
        PAGELLM_FAIL() << "tokenizer.json: Split pattern must have \"Regex\" or \"String\"";
      }
    } else if (type == "ByteLevel") {
      PAGELLM_CHECK(!leaf->value("add_prefix_space", false))
          << "tokenizer.json: ByteLevel pre_tokenizer with add_prefix_space=true is not "
             "supported (Qwen-style tokenizers use false)";
      if (leaf->value("use_regex", true)) {
        result->stages_.push_back(std::make_unique<RegexSplitter>(kGpt2Pattern, false));
      }
    } else {
      PAGELLM_FAIL() << "tokenizer.json: pre_tokenizer type \"" << type
                     << "\" is not supported (supported: Split, ByteLevel, Sequence)";
    }
  }
  return result;
}

void PreTokenizer::split(std::string_view text, std::vector<TextPiece>& out,
                         std::vector<TextPiece>& scratch) const {
  out.clear();
  if (text.empty()) return;
  out.push_back({0, static_cast<uint32_t>(text.size())});
  for (const auto& stage : stages_) {
    scratch.clear();
    for (const TextPiece& piece : out) stage->split(text, piece, scratch);
    out.swap(scratch);
  }
}

}  // namespace pagellm
