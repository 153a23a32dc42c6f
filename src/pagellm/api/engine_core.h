// The request tracker between the public API and the engine: expands a request into its n
// samples, steps the engine, and turns each step's new tokens into per-request deltas
// (incremental text, stop strings, logprobs, weights versions). LLM drives it on the
// caller's thread, AsyncEngine on its loop thread; it is not thread-safe itself.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagellm/api/text_model.h"
#include "pagellm/engine/engine.h"
#include "pagellm/engine_options.h"
#include "pagellm/outputs.h"

namespace pagellm::api {

/// EngineOptions -> EngineConfig, after checking max_model_len against the model's
/// max_position_embeddings (config.json, read without loading weights).
EngineConfig to_engine_config(const EngineOptions& options, const std::string& model_dir);

/// The limits requests will be checked against, from config.json alone (no weights read),
/// after the same max_model_len check as to_engine_config.
RequestLimits limits_from_config(const EngineOptions& options, const std::string& model_dir);

/// The limits requests are checked against, from the running engine.
RequestLimits limits_of(Engine& engine);

/// One request on its way through the engine.
struct TrackedRequest {
  std::string request_id;
  EncodedPrompt prompt;
  SamplingParams params;
  /// The loaded LoRA adapter the request runs with ("" for none; Engine::add_request).
  std::string lora;
  /// Receives each delta; the last has finished == true. Runs on the driving thread.
  std::function<void(RequestOutput&&)> sink;
};

class EngineCore {
 public:
  EngineCore(std::unique_ptr<Engine> engine, std::shared_ptr<const TextModel> text);

  /// Adds the request's n samples to the engine (sample j with seed s gets s + j). A sample
  /// the engine rejects at once finishes with kError and is reported by the next emit().
  void add(TrackedRequest request);
  /// Aborts every unfinished sample of the request (the engine frees their pages now).
  /// Returns false for an unknown id.
  bool abort(const std::string& request_id);
  void abort_all();
  /// Runs one engine step (when any sample is unfinished) and emits the deltas.
  void step();
  /// Delivers the deltas of every request that advanced; forgets finished requests.
  void emit();
  bool has_requests() const { return !requests_.empty(); }
  bool contains(const std::string& request_id) const { return requests_.count(request_id) > 0; }

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }

 private:
  struct Sample {
    int64_t engine_id = 0;
    size_t seen = 0;  // output tokens already turned into deltas
    std::optional<StreamDecoder> decoder;
    std::string text;    // all text decoded so far (cut at a stop string)
    size_t emitted = 0;  // bytes of text already delivered
    size_t stop_search_from = 0;
    double cumulative_logprob = 0.0;
    FinishReason finish = FinishReason::kNone;
    bool reported_finish = false;
  };
  struct Active {
    TrackedRequest request;
    std::vector<Sample> samples;
    bool prompt_sent = false;
  };
  /// Appends the new tokens of `sample` to `out`; true when there was anything to report.
  bool advance(Active& active, int index, CompletionOutput& out);

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const TextModel> text_;
  std::map<std::string, Active> requests_;
  size_t longest_stop_ = 0;
};

}  // namespace pagellm::api
