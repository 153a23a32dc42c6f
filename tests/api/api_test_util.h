// A tiny random-weight Qwen3 folder with a tokenizer, made once per test program.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "pagellm/api/model_folder.h"
#include "pagellm/model/make_model.h"
#include "pagellm/tokenizer/model_files.h"

namespace pagellm::testing {

/// The folder of the made model (float32 weights, seed 5), with the small byte-level
/// tokenizer (or Qwen3's, where its files are found) and special ids aligned to it.
inline const std::string& tiny_model_dir() {
  static const std::string dir = [] {
    const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                    ("pagellm-api-test-" + std::to_string(::getpid()));
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.out_dir = d.string();
    opt.seed = 5;
    opt.dtype = DType::F32;
    make_model(opt);
    api::write_model_tokenizer(d.string(), preset_config("tiny").vocab_size, PAGELLM_SOURCE_DIR);
    return d.string();
  }();
  return dir;
}

/// Removes the folder when the program ends.
struct TinyModelCleanup {
  ~TinyModelCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                    ("pagellm-api-test-" + std::to_string(::getpid())),
                                ec);
  }
};

}  // namespace pagellm::testing
