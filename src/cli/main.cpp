// pagellm: the command-line program. Each subcommand group lives in its own file.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "pagellm/common/check.h"

int main(int argc, char** argv) {
  CLI::App app{"pagellm: Qwen3 inference with a paged KV cache"};
  app.require_subcommand(1);
  pagellm::cli::register_model_commands(app);
  pagellm::cli::register_bench_command(app);
  pagellm::cli::register_tokenizer_commands(app);
  pagellm::cli::register_attention_commands(app);
  pagellm::cli::register_score_command(app);
  pagellm::cli::register_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const pagellm::Error& e) {
    std::fprintf(stderr, "pagellm: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
