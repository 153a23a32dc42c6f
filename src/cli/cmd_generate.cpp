// make-model, make-lora and generate.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/api/engine_core.h"
#include "pagellm/api/model_folder.h"
#include "pagellm/api/text_model.h"
#include "pagellm/common/progress.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/make_model.h"
#include "pagellm/pagellm.h"

namespace pagellm::cli {
namespace {

struct MakeModelArgs {
  std::string preset = "tiny";
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  double shard_gb = 4.0;
};

struct MakeLoraArgs {
  std::string model;
  std::string out;
  int64_t rank = 8;
  double alpha = 16.0;
  std::string targets = "all-linear";
  bool rslora = false;
  uint64_t seed = 0;
};

struct GenerateArgs {
  std::string model;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;
  std::string messages_file;
  std::string input_file;
  bool no_thinking = false;
  int n = 1;
  SamplingParams params;
  std::string stop_ids;
  std::string seed;  // text: parsed here so that "-1" is an error, not 2^64 - 1
  bool json = false;
  std::string dump_logits;
  /// --lora NAME=PATH (repeatable) and --lora-name: the adapter every prompt runs with.
  std::vector<std::string> loras;
  std::string lora_name;
  EngineSettings engine = offline_engine_settings();
};

/// --lora NAME=PATH values, checked (each folder read against config.json) before the
/// weights load, and the adapter the prompts use.
struct CliLoras {
  std::vector<LoraRequest> load;
  std::string use;
};

CliLoras loras_from_flags(const GenerateArgs& args, const std::string& model_dir) {
  CliLoras out;
  for (const std::string& spec : args.loras) {
    const size_t eq = spec.find('=');
    PAGELLM_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < spec.size())
        << "--lora: '" << spec << "' is not NAME=PATH (a name, '=', then a PEFT adapter folder)";
    LoraRequest r;
    r.name = spec.substr(0, eq);
    r.path = spec.substr(eq + 1);
    r.id = static_cast<int64_t>(out.load.size()) + 1;
    for (const LoraRequest& earlier : out.load) {
      PAGELLM_CHECK(earlier.name != r.name) << "--lora: the name '" << r.name
                                            << "' is given twice";
    }
    try {
      read_lora_adapter(r.path, load_qwen3_config(model_dir));
    } catch (const Error& e) {
      PAGELLM_FAIL() << "--lora " << r.name << ": " << e.what();
    }
    out.load.push_back(std::move(r));
  }
  if (!args.lora_name.empty()) {
    bool known = false;
    for (const LoraRequest& r : out.load) known = known || r.name == args.lora_name;
    PAGELLM_CHECK(known) << "--lora-name: '" << args.lora_name
                         << "' is not among the adapters given with --lora NAME=PATH";
    out.use = args.lora_name;
  } else if (out.load.size() == 1) {
    out.use = out.load[0].name;
  } else {
    PAGELLM_CHECK(out.load.empty())
        << "--lora: " << out.load.size()
        << " adapters are loaded; say which one the prompts use with --lora-name NAME";
  }
  return out;
}

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
  api::write_model_tokenizer(args.out, preset_config(args.preset).vocab_size, PAGELLM_SOURCE_DIR);
  std::printf("wrote %s (%s, seed %llu, %s) to %s\n", args.preset.c_str(),
              dtype_name(opt.dtype), static_cast<unsigned long long>(args.seed),
              preset_config(args.preset).tie_word_embeddings ? "tied" : "untied",
              args.out.c_str());
}

void run_make_lora(const MakeLoraArgs& args) {
  PAGELLM_CHECK(!args.model.empty() && !args.out.empty()) << "make-lora needs --model DIR and --out DIR";
  const Qwen3Config model = load_qwen3_config(args.model);
  // The flags become an adapter_config.json, so that they are checked as a folder's are.
  nlohmann::json config = {{"r", args.rank}, {"lora_alpha", args.alpha},
                           {"use_rslora", args.rslora}};
  if (args.targets == "all-linear") {
    config["target_modules"] = "all-linear";
  } else {
    config["target_modules"] = nlohmann::json::array();
    std::stringstream ss(args.targets);
    for (std::string t; std::getline(ss, t, ',');) config["target_modules"].push_back(t);
  }
  const LoraConfig lora = parse_lora_config(config.dump(), "make-lora flags");
  make_lora_adapter(args.out, model, lora, args.seed);
  std::printf("wrote a random LoRA adapter (r %lld, scale %g, %zu modules, seed %llu) to %s\n",
              static_cast<long long>(lora.rank), lora.scale(), lora.target_modules.size(),
              static_cast<unsigned long long>(args.seed), args.out.c_str());
}

// The option that sets each SamplingParams field, for errors that name what the user typed.
const char* option_of_field(const std::string& message) {
  static const std::pair<const char*, const char*> fields[] = {
      {"n (samples", "-n"},
      {"temperature", "--temperature"},
      {"top_k", "--top-k"},
      {"top_p", "--top-p"},
      {"min_p", "--min-p"},
      {"repetition_penalty", "--repetition-penalty"},
      {"presence_penalty", "--presence-penalty"},
      {"frequency_penalty", "--frequency-penalty"},
      {"max_tokens", "--max-tokens"},
      {"min_tokens", "--min-tokens"},
      {"stop_token_ids", "--stop-token-ids"},
      {"stop strings", "--stop"},
  };
  const std::string prefix = "invalid sampling parameters: ";
  if (message.rfind(prefix, 0) != 0) return nullptr;
  for (const auto& [field, option] : fields) {
    if (message.compare(prefix.size(), std::strlen(field), field) == 0) return option;
  }
  return nullptr;
}

// Runs `check`, prefixing an Error's message with `option`.
template <class F>
void check_option(const std::string& option, F&& check) {
  try {
    check();
  } catch (const Error& e) {
    PAGELLM_FAIL() << option << ": " << e.what();
  }
}

SamplingParams sampling_from_flags(const GenerateArgs& args) {
  SamplingParams params = args.params;
  params.n = args.n;
  check_option("--stop-token-ids", [&] { params.stop_token_ids = parse_ids(args.stop_ids); });
  if (!args.seed.empty()) {
    size_t used = 0;
    unsigned long long v = 0;
    const bool digits = args.seed.find_first_not_of("0123456789") == std::string::npos;
    try {
      if (digits) v = std::stoull(args.seed, &used);
    } catch (const std::logic_error&) {  // out of range
      used = 0;
    }
    PAGELLM_CHECK(digits && used == args.seed.size())
        << "--seed must be an integer in [0, 18446744073709551615], got " << args.seed;
    params.seed = v;
  }
  try {
    validate_sampling_params(params);
  } catch (const Error& e) {
    const char* option = option_of_field(e.what());
    PAGELLM_FAIL() << (option ? option : "sampling options") << ": " << e.what();
  }
  return params;
}

// One request of the run: from the flags or from a line of --input.
struct CliRequest {
  std::string origin;  // "--prompt", "--prompt-ids", "--messages FILE", or "line N"
  int line = 0;        // --input line number (0: from a flag)
  std::string id;
  Prompt prompt;
  SamplingParams params;
  api::EncodedPrompt encoded;
  std::string error;  // set: the request failed its checks and is not run
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  PAGELLM_CHECK(in) << what << ": cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<CliRequest> requests_from_flags(const GenerateArgs& args, const SamplingParams& params,
                                            const api::TextModel& text) {
  std::vector<CliRequest> out;
  for (const std::string& s : args.prompt_ids) {
    CliRequest r;
    r.origin = "--prompt-ids";
    check_option("--prompt-ids", [&] { r.prompt = Prompt::from_token_ids(parse_ids(s)); });
    out.push_back(std::move(r));
  }
  for (const std::string& s : args.prompts) {
    CliRequest r;
    r.origin = "--prompt";
    r.prompt = Prompt::from_text(s);
    out.push_back(std::move(r));
  }
  if (!args.messages_file.empty()) {
    CliRequest r;
    r.origin = "--messages " + args.messages_file;
    r.prompt = Prompt::from_messages_json(
        read_file(args.messages_file, "--messages"),
        args.no_thinking ? std::string("{\"enable_thinking\": false}") : std::string());
    out.push_back(std::move(r));
  }
  if (out.empty()) {
    // The default: a short text prompt (or plain ids without a tokenizer).
    CliRequest r;
    r.origin = "the default prompt";
    r.prompt = text.has_tokenizer() ? Prompt::from_text("The paged KV cache is")
                                    : Prompt::from_token_ids({1, 2, 3});
    out.push_back(std::move(r));
  }
  for (CliRequest& r : out) r.params = params;
  return out;
}

std::vector<CliRequest> requests_from_input(const std::string& path, const SamplingParams& defaults) {
  std::ifstream in(path, std::ios::binary);
  PAGELLM_CHECK(in) << "--input: cannot read " << path;
  std::vector<CliRequest> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    CliRequest r;
    r.origin = "line " + std::to_string(number);
    r.line = number;
    r.id = std::to_string(number);
    try {
      BatchRequest b = parse_batch_request(line, defaults);
      if (!b.id.empty()) r.id = b.id;
      r.prompt = std::move(b.prompt);
      r.params = std::move(b.params);
    } catch (const Error& e) {
      r.error = e.what();
    }
    out.push_back(std::move(r));
  }
  return out;
}

void run_generate(GenerateArgs args) {
  // Everything that can be checked is checked before the weights load (14 s for 0.6B):
  // flags, config.json (max_model_len, vocabulary), the tokenizer, every prompt.
  const bool batch = !args.input_file.empty();
  PAGELLM_CHECK(!batch || (args.prompts.empty() && args.prompt_ids.empty() &&
                           args.messages_file.empty()))
      << "--input cannot be combined with --prompt, --prompt-ids or --messages";
  const SamplingParams params = sampling_from_flags(args);
  const std::string model_dir = args.model.empty() ? default_model_dir() : args.model;
  const EngineOptions options = engine_options(args.engine);
  api::RequestLimits limits;
  check_option("--max-model-len", [&] { limits = api::limits_from_config(options, model_dir); });
  const CliLoras loras = loras_from_flags(args, model_dir);
  const api::TextModel text(model_dir);
  if (const std::string warning = text.vocab_warning(limits.vocab_size); !warning.empty()) {
    std::fprintf(stderr, "pagellm: warning: %s: %s\n", model_dir.c_str(), warning.c_str());
  }

  std::vector<CliRequest> requests =
      batch ? requests_from_input(args.input_file, params) : requests_from_flags(args, params, text);
  for (CliRequest& r : requests) {
    if (!r.error.empty()) continue;
    try {
      r.encoded = text.encode_prompt(r.prompt);
      api::check_request(r.encoded, r.params, limits, text.has_tokenizer());
    } catch (const Error& e) {
      if (!batch) PAGELLM_FAIL() << r.origin << ": " << e.what();
      r.error = e.what();
    }
  }

  std::vector<Prompt> prompts;
  std::vector<SamplingParams> per;
  std::vector<size_t> which;  // index into requests of each prompt run
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].error.empty()) continue;
    prompts.push_back(Prompt::from_token_ids(requests[i].encoded.ids));
    per.push_back(requests[i].params);
    which.push_back(i);
  }
  std::vector<RequestOutput> results;
  double secs = 0;
  if (!prompts.empty()) {
    ProgressBar bar("loading " + model_dir);
    LLM llm(model_dir, options, [&](size_t done, size_t total) {
      if (total > (size_t{256} << 20)) bar.update(done, total);
    });
    bar.finish();
    std::ofstream dump;
    if (!args.dump_logits.empty()) {
      // Records of int64 sample number, int64 output index, int64 vocab, float32[vocab].
      dump.open(args.dump_logits, std::ios::binary);
      PAGELLM_CHECK(dump) << "--dump-logits: cannot write " << args.dump_logits;
      llm.set_logits_hook([&dump](int64_t sample, int64_t index, const float* logits,
                                  int64_t vocab) {
        const int64_t header[3] = {sample, index, vocab};
        dump.write(reinterpret_cast<const char*>(header), sizeof(header));
        dump.write(reinterpret_cast<const char*>(logits), static_cast<std::streamsize>(vocab * 4));
      });
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const LoraRequest& r : loras.load) llm.load_lora_adapter(r);
    results = llm.generate(prompts, per, {LoraRequest{loras.use, 0, ""}});
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  int64_t generated = 0;
  size_t failed = 0, samples = 0;
  std::vector<const RequestOutput*> result_of(requests.size(), nullptr);
  for (size_t k = 0; k < which.size(); ++k) result_of[which[k]] = &results[k];
  for (size_t i = 0; i < requests.size(); ++i) {
    const CliRequest& r = requests[i];
    if (!r.error.empty()) {
      ++failed;
      std::cout << format_batch_error(r.id, r.line, "line " + std::to_string(r.line) + ": " + r.error)
                << "\n";
      continue;
    }
    RequestOutput out = *result_of[i];
    out.request_id = r.id;
    for (const CompletionOutput& o : out.outputs) {
      ++samples;
      generated += static_cast<int64_t>(o.token_ids.size());
      if (o.finish_reason == FinishReason::kError) ++failed;
    }
    if (batch) {
      std::cout << format_batch_result(out, r.params.processed_logprobs) << "\n";
      continue;
    }
    for (const CompletionOutput& o : out.outputs) {
      nlohmann::json j;
      j["prompt"] = i;
      j["sample"] = o.index;
      j["prompt_tokens"] = out.prompt_token_ids.size();
      j["token_ids"] = o.token_ids;
      j["logprobs"] = o.logprobs;
      if (r.params.processed_logprobs) j["processed_logprobs"] = o.processed_logprobs;
      if (!o.top_logprobs.empty()) {
        j["top_logprobs"] = nlohmann::json::array();
        for (const auto& list : o.top_logprobs) {
          nlohmann::json one = nlohmann::json::array();
          for (const TokenLogprob& t : list) one.push_back({t.token_id, t.logprob});
          j["top_logprobs"].push_back(std::move(one));
        }
        j["logprob_ranks"] = o.logprob_ranks;
      }
      j["finish_reason"] = finish_reason_name(o.finish_reason);
      if (!o.error.empty()) j["error"] = o.error;
      if (text.has_tokenizer()) j["text"] = o.text;
      if (args.json) {
        std::cout << j.dump() << "\n";
      } else {
        std::cout << "prompt " << i << " sample " << o.index << " ("
                  << out.prompt_token_ids.size() << " prompt tokens, " << o.token_ids.size()
                  << " generated, " << finish_reason_name(o.finish_reason) << ")\n";
        if (!o.error.empty()) std::cout << "  error: " << o.error << "\n";
        std::cout << "  token_ids: " << j["token_ids"].dump() << "\n";
        std::cout << "  logprobs:  " << j["logprobs"].dump() << "\n";
        if (text.has_tokenizer()) std::cout << "  text:      " << j["text"].dump() << "\n";
      }
    }
  }
  std::fprintf(stderr, "pagellm: %zu requests, %zu samples, %lld generated tokens, %.1f tok/s\n",
               requests.size(), samples, static_cast<long long>(generated),
               secs > 0 ? generated / secs : 0.0);
  std::cout.flush();
  PAGELLM_CHECK(failed == 0) << failed << " of " << requests.size()
                             << (batch ? " requests failed (their error lines are printed above)"
                                       : " requests were rejected (their errors are printed above)");
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

  auto ml = std::make_shared<MakeLoraArgs>();
  CLI::App* make_lora = app.add_subcommand(
      "make-lora", "write a seeded random LoRA adapter folder (PEFT layout) for a model");
  make_lora->add_option("--model", ml->model, "the Qwen3 folder the adapter is for")->required();
  make_lora->add_option("--out", ml->out, "output folder")->required();
  make_lora->add_option("--rank", ml->rank, "r (1..64)")->capture_default_str();
  make_lora->add_option("--alpha", ml->alpha, "lora_alpha")->capture_default_str();
  make_lora->add_option("--targets", ml->targets,
                        "comma-separated modules among q_proj, k_proj, v_proj, o_proj, "
                        "gate_proj, up_proj, down_proj, or all-linear")
      ->capture_default_str();
  make_lora->add_flag("--rslora", ml->rslora, "scale by alpha / sqrt(r) (rsLoRA)");
  make_lora->add_option("--seed", ml->seed, "random seed")->capture_default_str();
  make_lora->callback([ml] { run_make_lora(*ml); });

  auto ga = std::make_shared<GenerateArgs>();
  CLI::App* gen = app.add_subcommand("generate", "generate tokens for prompts");
  gen->add_option("--model", ga->model,
                  "Hugging Face Qwen3 folder (default: an embedded tiny model made on first use)");
  gen->add_option("--prompt-ids", ga->prompt_ids, "a prompt as comma-separated token ids (repeatable)");
  gen->add_option("--prompt", ga->prompts, "a prompt as text (repeatable)");
  gen->add_option("--messages", ga->messages_file, "chat messages JSON file, rendered by the chat template");
  gen->add_flag("--no-thinking", ga->no_thinking, "render the chat template with enable_thinking=false");
  gen->add_option("--input", ga->input_file,
                  "JSON-lines batch file: one request per line ({\"prompt\": ...} | "
                  "{\"prompt_token_ids\": [...]} | {\"messages\": [...]}, with optional \"id\" "
                  "and sampling overrides); one JSON result per line, in input order");
  gen->add_option("-n,--num-samples", ga->n, "samples per prompt (>= 1)");
  gen->add_option("--max-tokens", ga->params.max_tokens, "tokens to generate")->capture_default_str();
  gen->add_option("--min-tokens", ga->params.min_tokens,
                  "fewest tokens: EOS and stop tokens are masked until then (0..max-tokens)");
  gen->add_option("--temperature", ga->params.temperature, "0 = greedy")->capture_default_str();
  gen->add_option("--top-k", ga->params.top_k, "0 = off");
  gen->add_option("--top-p", ga->params.top_p, "1 = off");
  gen->add_option("--min-p", ga->params.min_p, "0 = off");
  gen->add_option("--repetition-penalty", ga->params.repetition_penalty);
  gen->add_option("--presence-penalty", ga->params.presence_penalty);
  gen->add_option("--frequency-penalty", ga->params.frequency_penalty);
  gen->add_option("--seed", ga->seed,
                  "per-request seed in [0, 2^64 - 1]; sample j of a prompt uses seed + j "
                  "(default: derived from the request number, so runs are repeatable)");
  gen->add_option("--stop", ga->params.stop, "a string that ends a sample (repeatable)");
  gen->add_option("--stop-token-ids", ga->stop_ids, "comma-separated ids that end a request");
  gen->add_flag("--ignore-eos", ga->params.ignore_eos, "keep going past EOS");
  gen->add_option("--logprobs", ga->params.logprobs,
                  "top-k alternatives per token (0..20; 0 = none): the k most likely tokens "
                  "with their logprobs, and the sampled token's rank");
  gen->add_flag("--processed-logprobs", ga->params.processed_logprobs,
                "also report log-probabilities under the processed distribution");
  gen->add_flag("--json", ga->json, "one JSON object per sample");
  gen->add_flag("!--keep-special-tokens", ga->params.skip_special_tokens,
                "keep special tokens (<|im_end|>, ...) in the output text");
  gen->add_option("--dump-logits", ga->dump_logits,
                  "write every sampled step's float32 logits to FILE (testing)");
  gen->add_option("--lora", ga->loras,
                  "load a LoRA adapter: NAME=PATH, PATH a PEFT folder (adapter_config.json + "
                  "adapter_model.safetensors; repeatable)");
  gen->add_option("--lora-name", ga->lora_name,
                  "the --lora adapter the prompts run with (default: the only one given)");
  add_engine_options(gen, ga->engine);
  gen->callback([ga] { run_generate(*ga); });
}

}  // namespace pagellm::cli
