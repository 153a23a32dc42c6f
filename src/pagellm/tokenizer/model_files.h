// Tokenizer files for model folders that pagellm makes (make-model, the default tiny model).
#pragma once

#include <cstdint>
#include <string>

#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm {

/// Where an install puts Qwen3's tokenizer, relative to the installed executable's folder
/// (CMake: ${CMAKE_INSTALL_DATADIR}/pagellm/qwen3-tokenizer beside ${CMAKE_INSTALL_BINDIR}).
extern const char* const kInstalledQwen3TokenizerFromBin;

/// The folder with Qwen3's tokenizer.json, or "" when none is found. Looks, in order, at
///  1. the environment variable PAGELLM_QWEN3_TOKENIZER_DIR;
///  2. <source_dir>/data/qwen3-tokenizer, the copy in the source tree (source_dir: the pagellm
///     checkout the binary was built from, PAGELLM_SOURCE_DIR; may be "");
///  3. <folder of executable_path>/kInstalledQwen3TokenizerFromBin, where `cmake --install`
///     puts that copy (executable_path may be "").
/// A folder counts only if it holds tokenizer.json.
std::string find_qwen3_tokenizer_dir(const std::string& source_dir, const std::string& executable_path);
/// The same for the running executable (/proc/self/exe).
std::string find_qwen3_tokenizer_dir(const std::string& source_dir);

/// A warning when a model folder's tokenizer and its embedding do not fit together, else "".
/// `vocab_size` is config.json's vocab_size (rows of the embedding and of lm_head). Warns
///  - when the tokenizer has ids >= vocab_size (vocabulary or added tokens): the model cannot
///    embed them, and encoding text that holds them fails;
///  - when the tokenizer covers less than half of vocab_size: the folder's tokenizer is most
///    likely not the model's (Qwen3's 151,669 ids in 151,936 rows is normal padding, so is
///    make-model's small tokenizer in its tiny model's 1,024 rows).
std::string check_tokenizer_covers_vocab(const Tokenizer& tokenizer, int64_t vocab_size);

/// Writes tokenizer.json and tokenizer_config.json into `dir` (which must exist) for a
/// model whose embedding has `vocab_size` rows. Copies the real Qwen3 files from
/// `qwen3_tokenizer_dir` when that folder has them and all their ids fit below vocab_size
/// (Qwen3 needs 151,669; its models have 151,936). Otherwise writes a small byte-level BPE
/// tokenizer (see small_tokenizer_json) whose ids all fit below vocab_size. Returns true
/// when the real files were copied. Throws Error if vocab_size cannot hold even the small
/// tokenizer's 256 bytes and 9 added tokens, or if a file cannot be written.
bool write_tokenizer_for_model(const std::string& dir, int64_t vocab_size,
                               const std::string& qwen3_tokenizer_dir);

/// The small tokenizer: the 256 byte tokens (ids 0..255, in GPT-2/Qwen order, so "Ġ" is
/// 220 as in Qwen3), merges learned deterministically from a built-in text (as many as fit,
/// at most 512), then the added tokens <|endoftext|>, <|im_start|>, <|im_end|> (special),
/// <think>, </think>, <tool_call>, </tool_call>, <tool_response>, </tool_response>. The
/// normalizer, pre-tokenizer and decoder are Qwen3's, so it behaves like Qwen3's tokenizer
/// with a smaller vocabulary. Loads in Hugging Face tokenizers and transformers.
std::string small_tokenizer_json(int64_t vocab_size);
/// Its tokenizer_config.json: eos <|im_end|>, pad <|endoftext|>, Qwen3's chat template.
std::string small_tokenizer_config_json(int64_t vocab_size);

/// Qwen3's chat template (the one in Qwen3's tokenizer_config.json).
const std::string& qwen3_chat_template();

}  // namespace pagellm
