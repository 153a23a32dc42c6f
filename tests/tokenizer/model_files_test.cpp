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
  if (real.empty()) GTEST_SKIP() << testing_util::kQwen3Missing;
  TempDir full;
  EXPECT_TRUE(write_tokenizer_for_model(full.str(), 151936, real));
  EXPECT_EQ(slurp(full.path() / "tokenizer.json"), slurp(fs::path(real) / "tokenizer.json"));
  EXPECT_EQ(slurp(full.path() / "tokenizer_config.json"), slurp(fs::path(real) / "tokenizer_config.json"));
  TempDir tiny;
  EXPECT_FALSE(write_tokenizer_for_model(tiny.str(), 1024, real));  // 151,669 ids do not fit
  EXPECT_LT(max_id(slurp(tiny.path() / "tokenizer.json")), 1024);
}

TEST(ModelFiles, FindsTheQwen3Folder) {
  TempDir fake_checkout;
  const fs::path shared = fake_checkout.path() / "shared" / "models" / "qwen3-tokenizer";
  fs::create_directories(shared);
  fs::create_directories(fake_checkout.path() / "main");
  const std::string source = (fake_checkout.path() / "main").string();
  const char* saved = std::getenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  EXPECT_EQ(find_qwen3_tokenizer_dir(source), "");  // no tokenizer.json yet
  std::ofstream(shared / "tokenizer.json") << "{}";
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir(source)), shared.lexically_normal());
  TempDir other;
  std::ofstream(other.path() / "tokenizer.json") << "{}";
  ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", other.str().c_str(), 1);
  EXPECT_EQ(find_qwen3_tokenizer_dir(source), other.str());  // the environment wins
  ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", "/nonexistent", 1);
  EXPECT_EQ(fs::path(find_qwen3_tokenizer_dir(source)), shared.lexically_normal());
  EXPECT_EQ(find_qwen3_tokenizer_dir(""), "");
  if (saved) {
    ::setenv("PAGELLM_QWEN3_TOKENIZER_DIR", saved_value.c_str(), 1);
  } else {
    ::unsetenv("PAGELLM_QWEN3_TOKENIZER_DIR");
  }
}

}  // namespace
}  // namespace pagellm
