// Pieces shared by the pagellm subcommands: engine options, the default model, text.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "pagellm/engine/engine.h"

namespace pagellm::cli {

/// Engine flags common to generate, bench and serve.
struct EngineSettings {
  EngineConfig config;
  double kv_cache_gb = 0.0;
};
void add_engine_options(CLI::App* cmd, EngineSettings& settings);

/// Loads a model folder into an engine, with a progress bar for large models.
std::unique_ptr<Engine> load_engine(const std::string& model_dir, const EngineSettings& settings);

/// The embedded default: a tiny random-weight model (seed 0) with a tokenizer, made on
/// first use under $PAGELLM_CACHE or ~/.cache/pagellm. Returns its folder.
std::string default_model_dir();

/// Puts a tokenizer into a model folder: the real Qwen3 files when they are found and the
/// vocabulary fits, else a small byte-level tokenizer.
void write_model_tokenizer(const std::string& model_dir, int64_t vocab_size);

/// Text in and out for a model folder that has a tokenizer.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  /// nullptr when the folder has no tokenizer.json.
  static std::unique_ptr<TextCodec> open(const std::string& model_dir);
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// Renders a messages JSON file with the chat template (add_generation_prompt) and encodes.
  virtual std::vector<int32_t> encode_chat_file(const std::string& path,
                                                bool enable_thinking) const = 0;
};

}  // namespace pagellm::cli
