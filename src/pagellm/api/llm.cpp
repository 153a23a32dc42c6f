#include "pagellm/llm.h"

#include <algorithm>

#include "pagellm/api/engine_core.h"
#include "pagellm/async_engine.h"
#include "pagellm/common/check.h"

namespace pagellm {

struct LLM::Impl {
  std::shared_ptr<const api::TextModel> text;
  std::unique_ptr<api::EngineCore> core;
  api::RequestLimits limits;
  uint64_t next_request = 0;
};

LLM::LLM(const std::string& model_dir, const EngineOptions& options, const LoadProgress& progress)
    : impl_(std::make_unique<Impl>()) {
  const EngineConfig config = api::to_engine_config(options, model_dir);
  impl_->text = std::make_shared<const api::TextModel>(model_dir);
  impl_->core = std::make_unique<api::EngineCore>(Engine::create(model_dir, config, progress),
                                                  impl_->text);
  impl_->limits = api::limits_of(impl_->core->engine());
}

LLM::~LLM() = default;

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const std::vector<SamplingParams>& params) {
  return generate(prompts, params, std::vector<LoraRequest>{}, StepCallback());
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const std::vector<SamplingParams>& params,
                                         const StepCallback& on_step) {
  return generate(prompts, params, std::vector<LoraRequest>{}, on_step);
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const std::vector<SamplingParams>& params,
                                         const std::vector<LoraRequest>& lora_requests,
                                         const StepCallback& on_step) {
  PAGELLM_CHECK(lora_requests.size() <= 1 || lora_requests.size() == prompts.size())
      << "generate: " << lora_requests.size() << " LoRA requests for " << prompts.size()
      << " prompts (give none, one for all or one per prompt)";
  PAGELLM_CHECK(params.size() == 1 || params.size() == prompts.size())
      << "generate: " << params.size() << " sampling parameter sets for " << prompts.size()
      << " prompts (give one for all or one per prompt)";
  PAGELLM_CHECK(!impl_->core->engine().asleep())
      << "generate: the LLM is asleep (sleep() released its memory); call wake_up() first";
  // Every prompt is checked before any is queued, so bad input costs no work.
  std::vector<api::EncodedPrompt> encoded(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    try {
      encoded[i] = impl_->text->encode_prompt(prompts[i]);
      api::check_request(encoded[i], params.size() == 1 ? params[0] : params[i], impl_->limits,
                         impl_->text->has_tokenizer());
    } catch (const Error& e) {
      PAGELLM_FAIL() << "prompt " << i << ": " << e.what();
    }
  }
  // Adapters named for the first time are loaded now, before any request is queued.
  Engine& engine = impl_->core->engine();
  for (const LoraRequest& lora : lora_requests) {
    if (lora.name.empty()) continue;
    const std::vector<LoraAdapterInfo> loaded = engine.lora_adapters();
    const auto it = std::find_if(loaded.begin(), loaded.end(),
                                 [&](const LoraAdapterInfo& a) { return a.name == lora.name; });
    if (it == loaded.end()) {
      PAGELLM_CHECK(!lora.path.empty())
          << "generate: LoRA adapter '" << lora.name
          << "' is not loaded and its request gives no path to load it from";
      engine.load_lora_adapter(lora);
    } else {
      PAGELLM_CHECK(lora.path.empty() || lora.path == it->path)
          << "generate: LoRA adapter '" << lora.name << "' is loaded from " << it->path
          << ", not " << lora.path << "; call load_lora_adapter to replace it";
    }
  }
  std::vector<RequestOutput> results(prompts.size());
  size_t finished = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    api::TrackedRequest r;
    if (!lora_requests.empty()) {
      r.lora = lora_requests[lora_requests.size() == 1 ? 0 : i].name;
    }
    r.request_id = std::to_string(impl_->next_request++);
    r.prompt = std::move(encoded[i]);
    r.params = params.size() == 1 ? params[0] : params[i];
    RequestOutput* slot = &results[i];
    r.sink = [slot, &finished](RequestOutput&& delta) {
      merge_delta(*slot, delta);
      if (delta.finished) ++finished;
    };
    impl_->core->add(std::move(r));
  }
  try {
    while (impl_->core->has_requests()) {
      impl_->core->step();
      if (on_step && !on_step(finished, prompts.size())) {
        impl_->core->abort_all();
        impl_->core->emit();
        break;
      }
    }
  } catch (...) {
    // An engine failure: end every request here (the sinks point into `results`), so that
    // the next call starts clean.
    impl_->core->abort_all();
    impl_->core->emit();
    throw;
  }
  return results;
}

LoraAdapterInfo LLM::load_lora_adapter(const LoraRequest& request) {
  return impl_->core->engine().load_lora_adapter(request);
}

void LLM::unload_lora_adapter(const std::string& name) {
  impl_->core->engine().unload_lora_adapter(name);
}

std::vector<LoraAdapterInfo> LLM::list_lora_adapters() const {
  return impl_->core->engine().lora_adapters();
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>{params});
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts,
                                         const SamplingParams& params) {
  std::vector<Prompt> p;
  for (const std::string& text : prompts) p.push_back(Prompt::from_text(text));
  return generate(p, std::vector<SamplingParams>{params});
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                         const SamplingParams& params) {
  std::vector<Prompt> p;
  for (const auto& ids : prompt_token_ids) p.push_back(Prompt::from_token_ids(ids));
  return generate(p, std::vector<SamplingParams>{params});
}

std::vector<RequestOutput> LLM::chat(const std::vector<std::vector<ChatMessage>>& conversations,
                                     const SamplingParams& params,
                                     std::optional<bool> enable_thinking) {
  std::vector<Prompt> p;
  for (const auto& c : conversations) p.push_back(Prompt::from_messages(c, enable_thinking));
  return generate(p, std::vector<SamplingParams>{params});
}

std::vector<int32_t> LLM::encode(const std::string& text) const { return impl_->text->encode(text); }

std::string LLM::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->text->decode(ids, skip_special_tokens);
}

std::string LLM::apply_chat_template(const Prompt& chat_prompt) const {
  return impl_->text->render_chat(chat_prompt);
}

std::vector<int32_t> LLM::prompt_token_ids(const Prompt& prompt) const {
  return impl_->text->encode_prompt(prompt).ids;
}

bool LLM::has_tokenizer() const { return impl_->text->has_tokenizer(); }
int64_t LLM::vocab_size() const { return impl_->limits.vocab_size; }
int32_t LLM::max_model_len() const { return impl_->limits.max_model_len; }
int64_t LLM::num_free_pages() const { return impl_->core->engine().allocator().num_free(); }
int64_t LLM::num_usable_pages() const { return impl_->core->engine().allocator().num_usable(); }
uint64_t LLM::weights_version() const { return impl_->core->engine().weights_version(); }

WeightUpdateResult LLM::update_weights(const std::vector<NamedTensor>& tensors) {
  return impl_->core->engine().update_weights(tensors, PauseMode::kWait);
}

WeightUpdateResult LLM::load_weights(const std::string& path) {
  return impl_->core->engine().load_weights(path, PauseMode::kWait);
}

SleepReport LLM::sleep(const SleepOptions& options) {
  return impl_->core->engine().sleep(options);
}
WakeReport LLM::wake_up() { return impl_->core->engine().wake_up(); }
bool LLM::is_sleeping() const { return impl_->core->engine().asleep(); }

void LLM::reset_prefix_cache() { impl_->core->engine().reset_prefix_cache(); }
PrefixCacheStats LLM::prefix_cache_stats() const {
  return impl_->core->engine().prefix_cache_stats();
}

void LLM::set_logits_hook(LogitsHook hook) {
  if (!hook) {
    impl_->core->engine().set_logits_hook(nullptr);
    return;
  }
  // Engine ids count from 1 in the order samples are added.
  impl_->core->engine().set_logits_hook(
      [hook = std::move(hook)](int64_t id, int64_t index, const float* logits, int64_t vocab) {
        hook(id - 1, index, logits, vocab);
      });
}

std::vector<ScoreOutput> LLM::score(const std::vector<std::vector<int32_t>>& sequences,
                                    const std::vector<int32_t>& prompt_lengths, int top_k,
                                    const std::string& lora) {
  // generate() returns with every request finished, so the whole cache is free here.
  return impl_->core->engine().score(sequences, prompt_lengths, top_k, lora);
}

void merge_delta(RequestOutput& total, const RequestOutput& delta) {
  if (total.request_id.empty()) total.request_id = delta.request_id;
  if (total.prompt.empty()) total.prompt = delta.prompt;
  if (total.prompt_token_ids.empty()) total.prompt_token_ids = delta.prompt_token_ids;
  for (const CompletionOutput& d : delta.outputs) {
    auto it = std::find_if(total.outputs.begin(), total.outputs.end(),
                           [&](const CompletionOutput& o) { return o.index == d.index; });
    if (it == total.outputs.end()) {
      CompletionOutput fresh;
      fresh.index = d.index;
      it = total.outputs.insert(
          std::upper_bound(total.outputs.begin(), total.outputs.end(), d.index,
                           [](int index, const CompletionOutput& o) { return index < o.index; }),
          fresh);
    }
    it->text += d.text;
    it->token_ids.insert(it->token_ids.end(), d.token_ids.begin(), d.token_ids.end());
    it->logprobs.insert(it->logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    it->processed_logprobs.insert(it->processed_logprobs.end(), d.processed_logprobs.begin(),
                                  d.processed_logprobs.end());
    it->weights_versions.insert(it->weights_versions.end(), d.weights_versions.begin(),
                                d.weights_versions.end());
    it->top_logprobs.insert(it->top_logprobs.end(), d.top_logprobs.begin(),
                            d.top_logprobs.end());
    it->logprob_ranks.insert(it->logprob_ranks.end(), d.logprob_ranks.begin(),
                             d.logprob_ranks.end());
    it->processed_top_logprobs.insert(it->processed_top_logprobs.end(),
                                      d.processed_top_logprobs.begin(),
                                      d.processed_top_logprobs.end());
    it->cumulative_logprob = d.cumulative_logprob;
    it->finish_reason = d.finish_reason;
    if (!d.error.empty()) it->error = d.error;
  }
  total.finished = delta.finished;
  total.weights_version = std::max(total.weights_version, delta.weights_version);
}

}  // namespace pagellm
