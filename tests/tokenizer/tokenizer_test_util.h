// Shared helpers for the tokenizer tests.
#pragma once

#include <cstdlib>
#include <string>

#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm::testing_util {

/// Qwen3's tokenizer folder: data/qwen3-tokenizer in the source tree (or
/// $PAGELLM_QWEN3_TOKENIZER_DIR); "" only if the checkout is broken (tests then fail).
inline std::string qwen3_dir() { return find_qwen3_tokenizer_dir(PAGELLM_SOURCE_DIR); }

/// The small byte-level tokenizer that make-model writes, built in memory.
inline const Tokenizer& small_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_json(small_tokenizer_json(1024), small_tokenizer_config_json(1024),
                                                    "small tokenizer");
  return tok;
}

inline const char* kQwen3Missing =
    "Qwen3 tokenizer files not found: data/qwen3-tokenizer/tokenizer.json belongs to the source tree";

}  // namespace pagellm::testing_util
