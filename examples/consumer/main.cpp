// consumer MODEL_DIR [PROMPT]: greedy text generation through pagellm's public API.
#include <cstdio>
#include <iostream>

#include <pagellm/pagellm.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [PROMPT]\n", argv[0]);
    return 2;
  }
  try {
    pagellm::EngineOptions options;
    options.max_num_seqs = 8;  // a small KV cache is plenty for one prompt
    pagellm::LLM llm(argv[1], options);
    pagellm::SamplingParams params;
    params.temperature = 0.0f;  // greedy
    params.max_tokens = 8;
    params.ignore_eos = true;
    const std::string prompt = argc > 2 ? argv[2] : "The paged KV cache is";
    const pagellm::RequestOutput out = llm.generate({prompt}, params)[0];
    const pagellm::CompletionOutput& c = out.outputs[0];
    std::cout << "pagellm " << pagellm::kVersion << ": " << out.prompt_token_ids.size()
              << " prompt tokens, generated " << c.token_ids.size() << " tokens ("
              << pagellm::finish_reason_openai(c.finish_reason) << "), cumulative logprob "
              << c.cumulative_logprob << "\n"
              << "text: " << c.text << "\n";
  } catch (const pagellm::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
