// write_tokenizer_for_model and find_qwen3_tokenizer_dir (what make-model uses).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("pagellm-tok-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t max_id(const std::string& tokenizer_json) {
  const auto j = nlohmann::json::parse(tokenizer_json);
  int64_t m = -1;
  for (const auto& [key, id] : j["model"]["vocab"].items()) m = std::max<int64_t>(m, id.get<int64_t>());
  for (const auto& t : j["added_tokens"]) m = std::max<int64_t>(m, t["id"].get<int64_t>());
  return m;
}

TEST(ModelFiles, SmallTokenizerFitsTheVocabulary) {
  for (int64_t vocab_size : {265, 300, 1024, 151936}) {
    TempDir dir;
    EXPECT_FALSE(write_tokenizer_for_model(dir.str(), vocab_size, ""));
    const std::string json = slurp(dir.path() / "tokenizer.json");
    EXPECT_LT(max_id(json), vocab_size);
    const Tokenizer t = Tokenizer::load(dir.str());
    EXPECT_LE(t.vocab_size(), vocab_size);
    EXPECT_EQ(t.decode(t.encode("Hello, 世界! <|im_end|>")), "Hello, 世界! <|im_end|>");
    EXPECT_TRUE(t.eos_token_id().has_value());
    ChatRequest request = ChatRequest::from_json(
        nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"));
    request.add_generation_prompt = true;
    EXPECT_EQ(t.chat_template().render(request), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  }
}

TEST(ModelFiles, SmallTokenizerIsDeterministic) {
  EXPECT_EQ(small_tokenizer_json(1024), small_tokenizer_json(1024));
  EXPECT_EQ(small_tokenizer_config_json(1024), small_tokenizer_config_json(1024));
}

TEST(ModelFiles, TooSmallAVocabularyIsAnError) {
  TempDir dir;
  try {
    write_tokenizer_for_model(dir.str(), 100, "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 100 is too small"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_tokenizer_for_model((dir.path() / "missing").string(), 1024, ""), Error);
}

TEST(ModelFiles, CopiesTheRealTokenizerWhenItFits) {
  const std::string real = testing_util::qwen3_dir();
  ASSERT_FALSE(real.empty()) << testing_util::kQwen3Missing;
  TempDir full;
  EXPECT_TRUE(write_tokenizer_for_model(full.str(), 151936, real));
  EXPECT_EQ(slurp(full.path() / "tokenizer.json"), slurp(fs::path(real) / "tokenizer.json"));
  EXPECT_EQ(slurp(full.path() / "tokenizer_config.json"), slurp(fs::path(real) / "tokenizer_config.json"));
  TempDir tiny;
  EXPECT_FALSE(write_tokenizer_for_model(tiny.str(), 1024, real));  // 151,669 ids do not fit
  EXPECT_LT(max_id(slurp(tiny.path() / "tokenizer.json")), 1024);
}

TEST(ModelFiles, FindsTheQwen3Folder) {
  // A source tree and an install (bin/pagellm, share/pagellm/qwen3-tokenizer), both fake.
  TempDir root;
  const fs::path in_source = root.path() / "src" / "data" / "qwen3-tokenizer";
  const fs::path installed = root.path() / "prefix" / "share" / "pagellm" / "qwen3-tokenizer";
  fs::create_directories(in_source);
  fs::create_directories(installed);
  fs::create_directories(root.path() / "prefix" / "bin");
  const std::string source = (root.path() / "src").string();
  const std::string exe = (root.path() / "prefix" / "bin" / "pagellm").string();
  const char* saved = std::getenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  EXPECT_EQ(find_qwen3_tokenizer_dir(source, exe), "");  // no tokenizer.json yet
  std::ofstream(installed / "tokenizer.json") << "{}";
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir(source, exe)), installed.lexically_normal());
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir("", exe)), installed.lexically_normal());
  std::ofstream(in_source / "tokenizer.json") << "{}";
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir(source, exe)), in_source.lexically_normal());  // source first
  TempDir other;
  std::ofstream(other.path() / "tokenizer.json") << "{}";
  ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", other.str().c_str(), 1);
  EXPECT_EQ(find_qwen3_tokenizer_dir(source, exe), other.str());  // the environment wins
  ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", "/nonexistent", 1);
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir(source, exe)), in_source.lexically_normal());
  EXPECT_EQ(find_qwen3_tokenizer_dir("", ""), "");
  if (saved) {
    ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", saved_value.c_str(), 1);
  } else {
    ::unsetenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  }
}

TEST(ModelFiles, TheSourceTreeHoldsQwen3sTokenizer) {
  // No test skips for want of the real tokenizer: the checkout carries it.
  const fs::path dir = fs::path(PAGELLM_SOURCE_DIR) / "data" / "qwen3-tokenizer";
  const Tokenizer tok = Tokenizer::load(dir.string());
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_TRUE(fs::exists(dir / "LICENSE"));
}

TEST(ModelFiles, WarnsWhenTheTokenizerDoesNotFitTheVocabulary) {
  const Tokenizer& small = testing_util::small_tokenizer();  // ids 0..small.vocab_size() - 1
  const int64_t n = small.vocab_size();
  EXPECT_EQ(check_tokenizer_covers_vocab(small, n), "");
  EXPECT_EQ(check_tokenizer_covers_vocab(small, 1024), "");       // make-model's tiny model
  EXPECT_EQ(check_tokenizer_covers_vocab(small, 2 * n), "");      // padding rows up to 2x
  const std::string too_big = check_tokenizer_covers_vocab(small, n - 1);
  EXPECT_NE(too_big.find("ids up to " + std::to_string(n - 1) + " but the model embeds only " +
                         std::to_string(n - 1)),
            std::string::npos)
      << too_big;
  const std::string too_small = check_tokenizer_covers_vocab(small, 2 * n + 1);
  EXPECT_NE(too_small.find("covers only " + std::to_string(n) + " of the model's " + std::to_string(2 * n + 1)),
            std::string::npos)
      << too_small;
  const Tokenizer qwen3 = Tokenizer::load(testing_util::qwen3_dir());
  EXPECT_EQ(check_tokenizer_covers_vocab(qwen3, 151936), "");  // Qwen3's own padding
  EXPECT_NE(check_tokenizer_covers_vocab(qwen3, 151643), "");  // added tokens past the rows
}

}  // namespace
}  // namespace pagellm
