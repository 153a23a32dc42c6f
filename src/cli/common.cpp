#include "cli/common.h"

#include <cstdlib>
#include <filesystem>

#include "pagellm/api/model_folder.h"
#include "pagellm/common/progress.h"
#include "pagellm/model/make_model.h"

namespace pagellm::cli {

void add_engine_options(CLI::App* cmd, EngineSettings& s) {
  cmd->add_option("--backend", s.config.backend, "cpu | cuda")->capture_default_str();
  cmd->add_option("--page-size", s.config.page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("--num-pages", s.config.num_pages, "KV pages (default: from --kv-cache-gb)");
  cmd->add_option("--kv-cache-gb", s.kv_cache_gb, "memory for the KV cache (default: automatic)");
  cmd->add_option("--max-num-seqs", s.config.max_num_seqs, "most requests running at once")
      ->capture_default_str();
  cmd->add_option("--max-batched-tokens", s.config.max_num_batched_tokens,
                  "most tokens in one step, the chunked-prefill budget (default 0: the "
                  "backend's choice, at least --max-num-seqs: on cpu 2048; on cuda 8192, "
                  "or for generate, bench and score on a GPU of 70 GiB or more 16384 in "
                  "steps that begin with at most 64 decodes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-model-len", s.config.max_model_len,
                  "longest prompt + output (default: the model's)");
  cmd->add_option("--attention-backend", s.config.attention_backend,
                  "paged attention: auto (cuDNN only where a measured crossover table says it "
                  "wins, else native), native, or cudnn (cuda backend; an error where cuDNN "
                  "cannot serve a call)")
      ->check(CLI::IsMember({"auto", "native", "cudnn"}))
      ->capture_default_str();
  cmd->add_flag("--float32-head", s.config.float32_head,
                "final RMSNorm and lm_head in float32 (cuda: float32 copies of both, 4 x vocab "
                "x hidden bytes; a no-op on the float32 cpu backend)");
  cmd->add_flag("--batch-invariant", s.config.batch_invariant,
                "a request's tokens and log-probabilities do not depend on the rest of the "
                "batch, the chunk size or the decode bucket (slower; native attention)");
  cmd->add_option("--max-lora-rank", s.config.max_lora_rank,
                  "the largest rank of a LoRA adapter this engine loads (1..64; higher ranks "
                  "are refused; the CUDA decode kernels are sized by it)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--max-loras", s.config.max_loras,
                  "LoRA adapter slots (adapters loaded at once; each LoRA decode graph covers "
                  "them all)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return !v.empty() && v[0] == '-' ? "must be >= 0 (adapter slots), got " + v : "";
          },
          "N >= 0"))
      ->capture_default_str();
  cmd->add_option("--tensor-parallel-size", s.config.tensor_parallel_size,
                  "split the model over N ranks, one process each (this one and N - 1 "
                  "pagellm-worker processes; rank r on GPU r); N must divide the model's "
                  "heads, intermediate size and vocabulary")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--pipelined-decode-steps", s.config.pipelined_decode_steps,
                  "run up to N decode steps back to back, each launched before the previous "
                  "one's tokens reach the host (1: off; same tokens, delivered up to N at a "
                  "time)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("!--no-prefix-caching", s.config.enable_prefix_caching,
                "do not keep KV pages by their tokens for later requests to reuse (outputs "
                "are the same; every prompt is prefilled in full)");
}

EngineSettings offline_engine_settings() {
  EngineSettings s;
  s.config.pipelined_decode_steps = kOfflinePipelinedDecodeSteps;
  s.config.offline = true;
  return s;
}

EngineOptions engine_options(const EngineSettings& s) {
  EngineOptions o = s.config;  // the public part of the engine's settings
  if (s.kv_cache_gb > 0) o.kv_cache_bytes = static_cast<size_t>(s.kv_cache_gb * 1e9);
  return o;
}

std::unique_ptr<Engine> load_engine(const std::string& model_dir, const EngineSettings& s) {
  EngineConfig config = s.config;
  if (s.kv_cache_gb > 0) config.kv_cache_bytes = static_cast<size_t>(s.kv_cache_gb * 1e9);
  ProgressBar bar("loading " + model_dir);
  auto engine = Engine::create(model_dir, config, [&](size_t done, size_t total) {
    if (total > (size_t{256} << 20)) bar.update(done, total);
  });
  bar.finish();
  return engine;
}

std::string default_model_dir() {
  std::filesystem::path base;
  if (const char* cache = std::getenv("PAGELLM_CACHE")) {
    base = cache;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME")) {
    base = std::filesystem::path(xdg) / "pagellm";
  } else if (const char* home = std::getenv("HOME")) {
    base = std::filesystem::path(home) / ".cache" / "pagellm";
  } else {
    base = std::filesystem::temp_directory_path() / "pagellm";
  }
  const std::filesystem::path dir = base / "tiny-seed0";
  if (!std::filesystem::exists(dir / "config.json") ||
      !std::filesystem::exists(dir / "tokenizer.json")) {
    std::fprintf(stderr, "pagellm: no --model given; making the embedded tiny model in %s\n",
                 dir.c_str());
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.out_dir = dir.string();
    opt.seed = 0;
    make_model(opt);
    api::write_model_tokenizer(dir.string(), preset_config("tiny").vocab_size, PAGELLM_SOURCE_DIR);
  }
  return dir.string();
}

}  // namespace pagellm::cli
