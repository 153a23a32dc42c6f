#include "pagellm/api/model_folder.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm::api {

void align_special_ids(const std::string& model_dir) {
  const Tokenizer tok = Tokenizer::load(model_dir);
  const std::optional<int32_t> eot = tok.token_to_id("<|endoftext|>");
  const std::optional<int32_t> im_end = tok.token_to_id("<|im_end|>");
  if (!eot || !im_end) return;
  for (const char* name : {"config.json", "generation_config.json"}) {
    const std::filesystem::path path = std::filesystem::path(model_dir) / name;
    std::ifstream in(path);
    if (!in) continue;
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      PAGELLM_FAIL() << path.string() << " is not JSON: " << e.what();
    }
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

void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size,
                           const std::string& source_dir) {
  write_tokenizer_for_model(model_dir, vocab_size, find_qwen3_tokenizer_dir(source_dir));
  align_special_ids(model_dir);
}

}  // namespace pagellm::api
