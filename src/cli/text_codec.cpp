// TextCodec over the tokenizer library, and the tokenizer that make-model writes.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "pagellm/api/model_folder.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm::cli {
namespace {

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(Tokenizer tok) : tok_(std::move(tok)) {}

  std::vector<int32_t> encode(const std::string& text) const override { return tok_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  std::vector<int32_t> encode_chat_file(const std::string& path,
                                        bool enable_thinking) const override {
    std::ifstream in(path);
    PAGELLM_CHECK(in) << "cannot read messages file " << path;
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      PAGELLM_FAIL() << path << " is not JSON: " << e.what();
    }
    ChatRequest req = ChatRequest::from_json(j);
    req.add_generation_prompt = true;
    if (!req.variables.contains("enable_thinking")) req.variables["enable_thinking"] = enable_thinking;
    return tok_.encode(tok_.chat_template().render(req));
  }

 private:
  Tokenizer tok_;
};

}  // namespace

std::unique_ptr<TextCodec> TextCodec::open(const std::string& model_dir) {
  if (!std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) return nullptr;
  return std::make_unique<TokenizerCodec>(Tokenizer::load(model_dir));
}

void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size) {
  const std::string real = find_qwen3_tokenizer_dir(PAGELLM_SOURCE_DIR);
  write_tokenizer_for_model(model_dir, vocab_size, real);
  api::align_special_ids(model_dir);
}

}  // namespace pagellm::cli
