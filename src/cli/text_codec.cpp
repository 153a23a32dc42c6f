// The tokenizer that make-model writes into a model folder (text itself is the library's:
// pagellm/api/text_model.h).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "pagellm/api/model_folder.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm::cli {

void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size) {
  const std::string real = find_qwen3_tokenizer_dir(PAGELLM_SOURCE_DIR);
  write_tokenizer_for_model(model_dir, vocab_size, real);
  api::align_special_ids(model_dir);
}

}  // namespace pagellm::cli
