// Model-folder preparation that the library owns (make-model and the tests use it).
#pragma once

#include <cstdint>
#include <string>

namespace pagellm::api {

/// Rewrites the special-token ids of DIR/config.json and DIR/generation_config.json (bos,
/// pad, eos) to the ids "<|endoftext|>" and "<|im_end|>" have in DIR's tokenizer: the
/// small tokenizer that replaces Qwen3's when its files are absent numbers them
/// differently. Does nothing when the tokenizer lacks either token.
void align_special_ids(const std::string& model_dir);

/// Puts a tokenizer into a model folder whose embedding has `vocab_size` rows: Qwen3's real
/// files when find_qwen3_tokenizer_dir(source_dir) finds them ($PAGELLM_QWEN3_TOKENIZER_DIR,
/// source_dir/data/qwen3-tokenizer, the installed copy) and the vocabulary fits, else the
/// small byte-level tokenizer; then aligns the folder's special ids with it. `source_dir`:
/// the source tree for the CLI, the installed package folder for the Python package.
void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size,
                           const std::string& source_dir);

}  // namespace pagellm::api
