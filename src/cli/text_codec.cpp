// TextCodec over the tokenizer library, and the tokenizer that make-model writes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "pagellm/model/config.h"
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
  Tokenizer tok = Tokenizer::load(model_dir);
  const std::string warning = check_tokenizer_covers_vocab(tok, load_qwen3_config(model_dir).vocab_size);
  if (!warning.empty()) std::fprintf(stderr, "pagellm: warning: %s: %s\n", model_dir.c_str(), warning.c_str());
  return std::make_unique<TokenizerCodec>(std::move(tok));
}

namespace {

// Rewrites the special-token ids of DIR/config.json and DIR/generation_config.json to
// the ids they have in the tokenizer beside them: the small tokenizer that replaces
// Qwen3's when its files are absent numbers <|endoftext|> and <|im_end|> differently.
void align_special_ids(const std::string& model_dir, const Tokenizer& tok) {
  const std::optional<int32_t> eot = tok.token_to_id("<|endoftext|>");
  const std::optional<int32_t> im_end = tok.token_to_id("<|im_end|>");
  if (!eot || !im_end) return;
  for (const char* name : {"config.json", "generation_config.json"}) {
    const std::filesystem::path path = std::filesystem::path(model_dir) / name;
    std::ifstream in(path);
    if (!in) continue;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(in);
    in.close();
    if (j.contains("bos_token_id")) j["bos_token_id"] = *eot;
    if (j.contains("pad_token_id")) j["pad_token_id"] = *eot;
    if (j.contains("eos_token_id")) {
      j["eos_token_id"] = j["eos_token_id"].is_array() ? nlohmann::ordered_json{*im_end, *eot}
                                                       : nlohmann::ordered_json(*im_end);
    }
    std::ofstream out(path);
    PAGELLM_CHECK(out) << "cannot rewrite " << path.string();
    out << j.dump(2) << "\n";
  }
}

}  // namespace

void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size) {
  const std::string real = find_qwen3_tokenizer_dir(PAGELLM_SOURCE_DIR);
  write_tokenizer_for_model(model_dir, vocab_size, real);
  align_special_ids(model_dir, Tokenizer::load(model_dir));
}

}  // namespace pagellm::cli
