// pagellm_tokenizer_tool: the tokenize / detokenize / chat-template subcommands alone
// (src/cli/cmd_tokenize.cpp over pagellm_tokenizer), so that the Hugging Face parity tests
// need neither the engine nor the rest of the pagellm program. Adds `write-tokenizer`,
// which runs write_tokenizer_for_model (what make-model does) for the tests.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "pagellm/common/check.h"
#include "pagellm/tokenizer/model_files.h"

int main(int argc, char** argv) {
  CLI::App app{"pagellm tokenizer commands"};
  app.require_subcommand(1);
  pagellm::cli::register_tokenizer_commands(app);

  std::string dir, qwen3_dir;
  int64_t vocab_size = 0;
  CLI::App* write = app.add_subcommand("write-tokenizer", "Write a model folder's tokenizer files");
  write->add_option("--dir", dir, "Existing folder to write into")->required();
  write->add_option("--vocab-size", vocab_size, "Rows of the model's embedding")->required();
  write->add_option("--qwen3-dir", qwen3_dir, "Folder with the real Qwen3 tokenizer files ('' = none)");
  write->callback([&] {
    const bool real = pagellm::write_tokenizer_for_model(dir, vocab_size, qwen3_dir);
    std::printf("%s\n", real ? "qwen3" : "small");
  });
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
