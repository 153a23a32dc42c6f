// Tokenizer: BPE merge order, added tokens, decoding, streaming, loading errors, and the
// real Qwen3 tokenizer's known ids (skipped when its files are absent). Hugging Face
// parity on a large corpus is in tests/oracles/tokenizer/parity.py (ctest tokenizer_parity_*).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

using testing_util::small_tokenizer;

// A toy BPE over the letters a, b, c (no pre-tokenizer, no normalizer).
nlohmann::json toy_spec(bool ignore_merges) {
  nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                               {"use_regex", false}};
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"ignore_merges", ignore_merges},
            {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}, {"ba", 7}}},
            {"merges", nlohmann::json::array({nlohmann::json::array({"b", "c"}), nlohmann::json::array({"a", "b"}),
                                              nlohmann::json::array({"a", "bc"}), nlohmann::json::array({"a", "a"})})}}}};
}

Tokenizer toy(bool ignore_merges = false) {
  return Tokenizer::from_json(toy_spec(ignore_merges).dump(), "", "toy");
}

using Ids = std::vector<int32_t>;

// Expected ids are Hugging Face tokenizers' output for the same tokenizer.json.
TEST(Bpe, MergesByRankThenLeftmost) {
  const Tokenizer t = toy();
  EXPECT_EQ(t.encode("abc"), (Ids{5}));     // (b,c) has the lower rank: a+bc -> abc
  EXPECT_EQ(t.encode("aaa"), (Ids{6, 0}));  // a tie goes to the leftmost pair
  EXPECT_EQ(t.encode("aaaa"), (Ids{6, 6}));
  EXPECT_EQ(t.encode("abab"), (Ids{3, 3}));
  EXPECT_EQ(t.encode("cab"), (Ids{2, 3}));
  EXPECT_EQ(t.encode("ba"), (Ids{1, 0}));   // no merge for (b,a)
  EXPECT_EQ(t.encode("d"), Ids{});          // no token for "d" and no unk: dropped
  EXPECT_EQ(t.encode("adb"), (Ids{3}));     // ... and its neighbours become adjacent
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(Bpe, IgnoreMergesLooksUpWholePieces) {
  const Tokenizer t = toy(/*ignore_merges=*/true);
  EXPECT_EQ(t.encode("ba"), (Ids{7}));
  EXPECT_EQ(t.encode("aaa"), (Ids{6, 0}));
}

TEST(Bpe, LongPiecesAreLinearEnough) {
  // A 1 MB run of letters is a single pre-token; the heap-based merge handles it.
  const Tokenizer& t = small_tokenizer();
  std::string text;
  while (text.size() < (1 << 20)) text += "the";
  const Ids ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_LT(ids.size(), text.size());
}

TEST(Tokenizer, SmallTokenizerRoundTrips) {
  const Tokenizer& t = small_tokenizer();
  for (const std::string& text : std::vector<std::string>{"Hello, world!", "  leading and trailing  ", "line\r\nbreaks\n\n\nand\ttabs", "你好，世界！", "👨‍👩‍👧‍👦 🏳️‍🌈",
        "مرحبا بالعالم", "नमस्ते", "x = [i ** 2 for i in range(10)]", "<|im_start|>user\nhi<|im_end|>",
        "<think>\nhmm\n</think>\n\n", std::string(5000, ' '), "it's I'M we'll"}) {
    const Ids ids = t.encode(text);
    EXPECT_EQ(t.decode(ids), utf8::nfc(text)) << text;
  }
}

TEST(Tokenizer, NormalizesToNfc) {
  const Tokenizer& t = small_tokenizer();
  EXPECT_EQ(t.encode("e\xcc\x81"), t.encode("\xc3\xa9"));
  EXPECT_EQ(t.decode(t.encode("e\xcc\x81")), "\xc3\xa9");
}

TEST(Tokenizer, RepairsInvalidUtf8BeforeEncoding) {
  const Tokenizer& t = small_tokenizer();
  const std::string replacement(utf8::kReplacement);
  EXPECT_EQ(t.encode("a\xff" "b"), t.encode("a" + replacement + "b"));
  EXPECT_EQ(t.encode("\xed\xa0\x80"), t.encode(replacement + replacement + replacement));
  EXPECT_EQ(t.decode(t.encode("x\xe2\x82")), "x" + replacement);
}

TEST(Tokenizer, AddedTokensAreMatchedBeforeBpe) {
  const Tokenizer& t = small_tokenizer();
  const int32_t im_start = *t.token_to_id("<|im_start|>");
  const int32_t im_end = *t.token_to_id("<|im_end|>");
  const int32_t think = *t.token_to_id("<think>");
  EXPECT_TRUE(t.is_special(im_start));
  EXPECT_FALSE(t.is_special(think));
  const Ids ids = t.encode("<|im_start|>user<|im_end|><think>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids[ids.size() - 2], im_end);
  EXPECT_EQ(ids.back(), think);
  // Partial tokens are plain text.
  for (int32_t id : t.encode("<|im_start <|im_end| <think")) EXPECT_LT(id, im_start);
  // split_special_tokens: special tokens become text, <think> (not special) still matches.
  EncodeOptions split;
  split.split_special_tokens = true;
  const Ids plain = t.encode("<|im_end|><think>", split);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_EQ(plain.back(), think);
  EXPECT_EQ(t.decode(plain), "<|im_end|><think>");
}

TEST(Tokenizer, DecodeSkipsSpecialTokensOnRequestAndUnknownIds) {
  const Tokenizer& t = small_tokenizer();
  const Ids ids = t.encode("<|im_start|>assistant\n<think>x</think><|im_end|>");
  EXPECT_EQ(t.decode(ids), "<|im_start|>assistant\n<think>x</think><|im_end|>");
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(t.decode(ids, skip), "assistant\n<think>x</think>");
  // Ids without a token (embedding padding rows) decode to nothing, as in Hugging Face.
  EXPECT_EQ(t.decode(Ids{t.vocab_size(), 1000000, -5}), "");
}

TEST(Tokenizer, StreamDecoderNeverSplitsACharacter) {
  const Tokenizer& t = small_tokenizer();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    Ids ids;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      // Mostly raw byte tokens (ids 0..255), which split multi-byte characters.
      ids.push_back(rng() % 3 == 0 ? static_cast<int32_t>(rng() % t.vocab_size()) : static_cast<int32_t>(rng() % 256));
    }
    for (bool skip : {false, true}) {
      DecodeOptions options;
      options.skip_special_tokens = skip;
      StreamDecoder stream = t.stream_decoder(options);
      std::string joined;
      for (int32_t id : ids) {
        const std::string piece = stream.push(id);
        ASSERT_TRUE(utf8::is_valid(piece));
        joined += piece;
        EXPECT_LE(stream.pending_bytes(), 3u);
      }
      joined += stream.finish();
      EXPECT_EQ(joined, t.decode(ids, options));
    }
  }
}

TEST(Tokenizer, StreamDecoderHoldsBackPartialCharacters) {
  const Tokenizer& t = small_tokenizer();
  const Ids ids = t.encode("é");  // two bytes; the small vocabulary has no token for it
  ASSERT_EQ(ids.size(), 2u);
  StreamDecoder stream = t.stream_decoder();
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.pending_bytes(), 1u);
  EXPECT_EQ(stream.push(ids[1]), "é");
  EXPECT_EQ(stream.finish(), "");
  // An unfinished character at the end becomes U+FFFD.
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.finish(), std::string(utf8::kReplacement));
}

TEST(Tokenizer, SpecialTokenIds) {
  const Tokenizer& t = small_tokenizer();
  ASSERT_TRUE(t.eos_token_id().has_value());
  EXPECT_EQ(t.id_to_token(*t.eos_token_id()), std::optional<std::string>("<|im_end|>"));
  EXPECT_EQ(t.id_to_token(*t.pad_token_id()), std::optional<std::string>("<|endoftext|>"));
  EXPECT_FALSE(t.bos_token_id().has_value());
  const Ids stops = t.stop_token_ids();
  EXPECT_EQ(stops, (Ids{*t.token_to_id("<|im_end|>"), *t.token_to_id("<|endoftext|>")}));
  EXPECT_EQ(t.id_to_token(220), std::optional<std::string>("\xc4\xa0"));  // "Ġ", as in Qwen3
  EXPECT_EQ(t.token_bytes(220), " ");
  EXPECT_EQ(t.id_to_token(-1), std::nullopt);
}

void expect_load_error(const std::string& json, const std::string& fragment) {
  try {
    Tokenizer::from_json(json, "", "test.json");
    FAIL() << "expected an error mentioning \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, LoadErrorsNameTheProblem) {
  expect_load_error("{not json", "not valid JSON");
  expect_load_error("[]", "\"model\"");
  nlohmann::json spec = toy_spec(false);
  spec["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(spec.dump(), "normalizer \"NFKC\" is not supported");
  spec = toy_spec(false);
  spec["model"]["merges"].push_back(nlohmann::json::array({"a", "zz"}));
  expect_load_error(spec.dump(), "\"zz\", which is not in the vocabulary");
  spec = toy_spec(false);
  spec["model"]["type"] = "WordPiece";
  expect_load_error(spec.dump(), "model type \"WordPiece\"");
  spec = toy_spec(false);
  spec["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_load_error(spec.dump(), "pre_tokenizer type \"Metaspace\"");
  spec = toy_spec(false);
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_load_error(spec.dump(), "does not compile");
  spec = toy_spec(false);
  spec["decoder"] = nullptr;
  expect_load_error(spec.dump(), "decoder");
  try {
    Tokenizer::load("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json in /nonexistent/model"), std::string::npos);
  }
}

TEST(Tokenizer, MissingChatTemplateIsReportedOnUse) {
  const Tokenizer t = toy();
  EXPECT_FALSE(t.has_chat_template());
  EXPECT_EQ(t.encode("ab"), (Ids{3}));  // still usable
  try {
    t.chat_template();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat_template"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& t = small_tokenizer();
  const std::string text = "The cache is shared between threads; 共享缓存 😀 " + std::string(100, 'x');
  const Ids expected = t.encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (t.encode(text) != expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- the real Qwen3 tokenizer ------------------------------------------------------

class Qwen3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing_util::qwen3_dir();
    if (!dir.empty()) tokenizer_ = new Tokenizer(Tokenizer::load(dir));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr) << testing_util::kQwen3Missing;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* Qwen3Tokenizer::tokenizer_ = nullptr;

TEST_F(Qwen3Tokenizer, KnownIds) {
  const Tokenizer& t = *tokenizer_;
  // Reference ids from Hugging Face tokenizers 0.23 on Qwen3's tokenizer.json.
  EXPECT_EQ(t.encode("Hello world<|im_end|> <think>x</think>"), (Ids{9707, 1879, 151645, 220, 151667, 87, 151668}));
  EXPECT_EQ(t.encode("  \r\n\r\n  abc   123456 ' 'S 'ſ"),
            (Ids{72745, 220, 39022, 256, 220, 16, 17, 18, 19, 20, 21, 364, 364, 50, 364, 144815}));
  EXPECT_EQ(t.encode("\xe3\x80\x80" "a\xc2\xa0" "b\xc2\x85" "c\xe2\x80\xa8" "d\xe1\xa0\x8e" "e\xe2\x80\x8b" "f"),
            (Ids{22441, 64, 4102, 65, 126, 227, 66, 378, 101, 67, 123970, 236, 68, 15692, 69}));
  EXPECT_EQ(t.encode("e\xcc\x81 \xe1\xba\x9b\xcc\xa3"), (Ids{963, 220, 149616, 136, 96}));
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.eos_token_id(), std::optional<int32_t>(151645));
  EXPECT_EQ(t.pad_token_id(), std::optional<int32_t>(151643));
  EXPECT_EQ(t.stop_token_ids(), (Ids{151645, 151643}));
  EXPECT_EQ(t.decode(Ids{9707, 151669, 151935, 151645}), "Hello<|im_end|>");
}

TEST_F(Qwen3Tokenizer, ChatTemplate) {
  const Tokenizer& t = *tokenizer_;
  ASSERT_TRUE(t.has_chat_template());
  ChatRequest request = ChatRequest::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "<think>\nplan\n</think>\n\nHello!"},
                 {"role": "user", "content": "Bye"}],
    "add_generation_prompt": true, "enable_thinking": false})"));
  EXPECT_EQ(t.chat_template().render(request),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace pagellm
