// Model-folder preparation that the library owns (make-model and the tests use it).
#pragma once

#include <string>

namespace pagellm::api {

/// Rewrites the special-token ids of DIR/config.json and DIR/generation_config.json (bos,
/// pad, eos) to the ids "<|endoftext|>" and "<|im_end|>" have in DIR's tokenizer: the
/// small tokenizer that replaces Qwen3's when its files are absent numbers them
/// differently. Does nothing when the tokenizer lacks either token.
void align_special_ids(const std::string& model_dir);

}  // namespace pagellm::api
