// The pagellm program's subcommands. Each group registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace pagellm::cli {

// cmd_generate.cpp: make-model, generate, bench
void register_model_commands(CLI::App& app);
// cmd_tokenize.cpp: tokenize, detokenize, chat-template
void register_tokenizer_commands(CLI::App& app);

}  // namespace pagellm::cli
