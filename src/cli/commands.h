// The pagellm program's subcommands. Each group registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace pagellm::cli {

// cmd_generate.cpp: make-model, generate
void register_model_commands(CLI::App& app);
// cmd_bench.cpp: bench
void register_bench_command(CLI::App& app);
// cmd_tokenize.cpp: tokenize, detokenize, chat-template
void register_tokenizer_commands(CLI::App& app);
// cmd_attention.cpp: attention-plan, calibrate-attention
void register_attention_commands(CLI::App& app);
// cmd_score.cpp: score
void register_score_command(CLI::App& app);
// cmd_serve.cpp: serve
void register_serve_command(CLI::App& app);

}  // namespace pagellm::cli
