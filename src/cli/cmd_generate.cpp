// make-model and generate.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/common/progress.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/make_model.h"

namespace pagellm::cli {
namespace {

struct MakeModelArgs {
  std::string preset = "tiny";
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  double shard_gb = 4.0;
};

struct GenerateArgs {
  std::string model;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;
  std::string messages_file;
  bool no_thinking = false;
  int n = 1;
  SamplingParams params;
  std::string stop_ids;
  uint64_t seed = 0;
  bool has_seed = false;
  bool json = false;
  std::string dump_logits;
  EngineSettings engine;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::logic_error&) {  // not a number, or out of range
      used = 0;
    }
    PAGELLM_CHECK(used > 0 && item.find_first_not_of(" \t", used) == std::string::npos &&
                  v >= INT32_MIN && v <= INT32_MAX)
        << "'" << item << "' in '" << text
        << "' is not a token id (expected comma-separated integers)";
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void run_make_model(const MakeModelArgs& args) {
  PAGELLM_CHECK(!args.out.empty()) << "make-model needs --out DIR";
  MakeModelOptions opt;
  opt.preset = args.preset;
  opt.out_dir = args.out;
  opt.seed = args.seed;
  opt.dtype = parse_dtype(args.dtype);
  opt.shard_bytes = static_cast<uint64_t>(args.shard_gb * 1e9);
  ProgressBar bar("writing " + args.preset);
  opt.progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
  make_model(opt);
  bar.finish();
  write_model_tokenizer(args.out, preset_config(args.preset).vocab_size);
  std::printf("wrote %s (%s, seed %llu, %s) to %s\n", args.preset.c_str(),
              dtype_name(opt.dtype), static_cast<unsigned long long>(args.seed),
              preset_config(args.preset).tie_word_embeddings ? "tied" : "untied",
              args.out.c_str());
}

void run_generate(GenerateArgs args) {
  const std::string model_dir = args.model.empty() ? default_model_dir() : args.model;
  std::unique_ptr<Engine> engine = load_engine(model_dir, args.engine);
  std::unique_ptr<TextCodec> codec = TextCodec::open(model_dir);

  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& s : args.prompt_ids) prompts.push_back(parse_ids(s));
  for (const std::string& text : args.prompts) {
    PAGELLM_CHECK(codec) << "--prompt needs a tokenizer in " << model_dir
                         << " (tokenizer.json); use --prompt-ids";
    prompts.push_back(codec->encode(text));
  }
  if (!args.messages_file.empty()) {
    PAGELLM_CHECK(codec) << "--messages needs a tokenizer in " << model_dir;
    prompts.push_back(codec->encode_chat_file(args.messages_file, !args.no_thinking));
  }
  if (prompts.empty()) {
    // The main job's default: a short chat prompt (or plain ids without a tokenizer).
    prompts.push_back(codec ? codec->encode("The paged KV cache is") : std::vector<int32_t>{1, 2, 3});
  }
  SamplingParams params = args.params;
  params.stop_token_ids = parse_ids(args.stop_ids);
  if (args.has_seed) params.seed = args.seed;

  // n samples per prompt (GRPO-style); with a seed, sample j uses seed + j.
  std::vector<std::vector<int32_t>> all;
  std::vector<SamplingParams> per;
  std::vector<std::pair<int, int>> origin;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int j = 0; j < args.n; ++j) {
      SamplingParams sp = params;
      if (params.seed) sp.seed = *params.seed + static_cast<uint64_t>(j);
      all.push_back(prompts[p]);
      per.push_back(sp);
      origin.emplace_back(static_cast<int>(p), j);
    }
  }
  std::ofstream dump;
  if (!args.dump_logits.empty()) {
    // Records of int64 request index, int64 output index, int64 vocab, float32[vocab].
    dump.open(args.dump_logits, std::ios::binary);
    PAGELLM_CHECK(dump) << "cannot write " << args.dump_logits;
    engine->set_logits_hook([&dump](int64_t id, int64_t index, const float* logits, int64_t vocab) {
      const int64_t header[3] = {id - 1, index, vocab};
      dump.write(reinterpret_cast<const char*>(header), sizeof(header));
      dump.write(reinterpret_cast<const char*>(logits), static_cast<std::streamsize>(vocab * 4));
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<const Sequence*> results = engine->generate(all, per);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t generated = 0;
  size_t failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Sequence& s = *results[i];
    generated += static_cast<int64_t>(s.output.size());
    if (s.finish_reason == FinishReason::kError) ++failed;
    nlohmann::json j;
    j["prompt"] = origin[i].first;
    j["sample"] = origin[i].second;
    j["prompt_tokens"] = s.prompt.size();
    j["token_ids"] = s.output;
    std::vector<float> lp;
    for (const SampledToken& t : s.sampled) lp.push_back(t.logprob);
    j["logprobs"] = lp;
    if (params.processed_logprobs) {
      std::vector<float> plp;
      for (const SampledToken& t : s.sampled) plp.push_back(t.processed_logprob);
      j["processed_logprobs"] = plp;
    }
    j["finish_reason"] = finish_reason_name(s.finish_reason);
    if (!s.error.empty()) j["error"] = s.error;
    if (codec) j["text"] = codec->decode(s.output);
    if (args.json) {
      std::cout << j.dump() << "\n";
    } else {
      std::cout << "prompt " << origin[i].first << " sample " << origin[i].second << " ("
                << s.prompt.size() << " prompt tokens, " << s.output.size() << " generated, "
                << finish_reason_name(s.finish_reason) << ")\n";
      if (!s.error.empty()) std::cout << "  error: " << s.error << "\n";
      std::cout << "  token_ids: " << j["token_ids"].dump() << "\n";
      std::cout << "  logprobs:  " << j["logprobs"].dump() << "\n";
      if (codec) std::cout << "  text:      " << j["text"].dump() << "\n";
    }
  }
  const EngineStats& st = engine->stats();
  std::fprintf(stderr,
               "pagellm: %s backend, %lld steps, %lld prefill + %lld decode tokens, "
               "%lld preemptions, %.1f generated tok/s\n",
               engine->backend().name().c_str(), static_cast<long long>(st.steps),
               static_cast<long long>(st.prefill_tokens), static_cast<long long>(st.decode_tokens),
               static_cast<long long>(st.preemptions), secs > 0 ? generated / secs : 0.0);
  std::cout.flush();
  PAGELLM_CHECK(failed == 0) << failed << " of " << results.size()
                             << " requests were rejected (their errors are printed above)";
}

}  // namespace

void register_model_commands(CLI::App& app) {
  auto mm = std::make_shared<MakeModelArgs>();
  CLI::App* make = app.add_subcommand("make-model", "write a seeded random-weight Qwen3 folder");
  make->add_option("--preset", mm->preset, "tiny | qwen3-0.6b | qwen3-1.7b | qwen3-4b | qwen3-8b")
      ->capture_default_str();
  make->add_option("--out", mm->out, "output folder")->required();
  make->add_option("--seed", mm->seed, "random seed")->capture_default_str();
  make->add_option("--dtype", mm->dtype, "bf16 | f16 | f32")->capture_default_str();
  make->add_option("--shard-gb", mm->shard_gb, "shard size in GB")->capture_default_str();
  make->callback([mm] { run_make_model(*mm); });

  auto ga = std::make_shared<GenerateArgs>();
  CLI::App* gen = app.add_subcommand("generate", "generate tokens for prompts");
  gen->add_option("--model", ga->model,
                  "Hugging Face Qwen3 folder (default: an embedded tiny model made on first use)");
  gen->add_option("--prompt-ids", ga->prompt_ids, "a prompt as comma-separated token ids (repeatable)");
  gen->add_option("--prompt", ga->prompts, "a prompt as text (repeatable)");
  gen->add_option("--messages", ga->messages_file, "chat messages JSON file, rendered by the chat template");
  gen->add_flag("--no-thinking", ga->no_thinking, "render the chat template with enable_thinking=false");
  gen->add_option("-n,--num-samples", ga->n, "samples per prompt")->check(CLI::PositiveNumber);
  gen->add_option("--max-tokens", ga->params.max_tokens, "tokens to generate")->capture_default_str();
  gen->add_option("--temperature", ga->params.temperature, "0 = greedy")->capture_default_str();
  gen->add_option("--top-k", ga->params.top_k, "0 = off");
  gen->add_option("--top-p", ga->params.top_p, "1 = off");
  gen->add_option("--min-p", ga->params.min_p, "0 = off");
  gen->add_option("--repetition-penalty", ga->params.repetition_penalty);
  gen->add_option("--presence-penalty", ga->params.presence_penalty);
  gen->add_option("--frequency-penalty", ga->params.frequency_penalty);
  gen->add_option("--seed", ga->seed, "per-request seed (sample j of a prompt uses seed + j)")
      ->each([ga](const std::string&) { ga->has_seed = true; });
  gen->add_option("--stop-token-ids", ga->stop_ids, "comma-separated ids that end a request");
  gen->add_flag("--ignore-eos", ga->params.ignore_eos, "keep going past EOS");
  gen->add_flag("--processed-logprobs", ga->params.processed_logprobs,
                "also report log-probabilities under the processed distribution");
  gen->add_flag("--json", ga->json, "one JSON object per sample");
  gen->add_option("--dump-logits", ga->dump_logits,
                  "write every sampled step's float32 logits to FILE (testing)");
  add_engine_options(gen, ga->engine);
  gen->callback([ga] { run_generate(*ga); });
}

}  // namespace pagellm::cli
