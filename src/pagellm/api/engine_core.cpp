#include "pagellm/api/engine_core.h"

#include <algorithm>

#include "pagellm/common/check.h"
#include "pagellm/model/config.h"

namespace pagellm::api {

EngineConfig to_engine_config(const EngineOptions& o, const std::string& model_dir) {
  const Qwen3Config mc = load_qwen3_config(model_dir);
  PAGELLM_CHECK(o.max_model_len >= 0)
      << "max_model_len must be >= 0 (0: the model's " << mc.max_position_embeddings
      << "), got " << o.max_model_len;
  PAGELLM_CHECK(o.max_model_len <= mc.max_position_embeddings)
      << "max_model_len " << o.max_model_len << " is above the model's max_position_embeddings "
      << mc.max_position_embeddings << " (config.json); use at most "
      << mc.max_position_embeddings;
  EngineConfig c;
  static_cast<EngineOptions&>(c) = o;
  return c;
}

RequestLimits limits_from_config(const EngineOptions& options, const std::string& model_dir) {
  to_engine_config(options, model_dir);  // the max_model_len check
  const Qwen3Config mc = load_qwen3_config(model_dir);
  RequestLimits l;
  l.vocab_size = mc.vocab_size;
  // Engine's rule for max_model_len 0.
  l.max_model_len = options.max_model_len > 0
                        ? options.max_model_len
                        : static_cast<int32_t>(std::min<int64_t>(mc.max_position_embeddings, 1 << 20));
  l.max_num_seqs = options.max_num_seqs;
  return l;
}

RequestLimits limits_of(Engine& engine) {
  RequestLimits l;
  l.vocab_size = engine.model().config().vocab_size;
  l.max_model_len = engine.config().max_model_len;
  l.max_num_seqs = engine.config().max_num_seqs;
  return l;
}

EngineCore::EngineCore(std::unique_ptr<Engine> engine, std::shared_ptr<const TextModel> text)
    : engine_(std::move(engine)), text_(std::move(text)) {}

void EngineCore::add(TrackedRequest request) {
  PAGELLM_CHECK(!requests_.count(request.request_id))
      << "request id '" << request.request_id << "' is already in use by an unfinished request";
  Active active;
  const SamplingParams& params = request.params;
  for (const std::string& s : params.stop) longest_stop_ = std::max(longest_stop_, s.size());
  // One group: the prompt is prefilled once and fanned out (sample j: seed s + j).
  for (int64_t engine_id : engine_->add_request_group(request.prompt.ids, params, {},
                                                                request.lora)) {
    Sample sample;
    sample.engine_id = engine_id;
    if (text_->has_tokenizer()) {
      DecodeOptions options;
      options.skip_special_tokens = params.skip_special_tokens;
      sample.decoder = text_->tokenizer().stream_decoder(options);
    }
    active.samples.push_back(std::move(sample));
  }
  active.request = std::move(request);
  const std::string id = active.request.request_id;
  requests_.emplace(id, std::move(active));
}

bool EngineCore::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  for (const Sample& s : it->second.samples) {
    if (s.finish == FinishReason::kNone) engine_->abort(s.engine_id);
  }
  return true;
}

void EngineCore::abort_all() {
  for (auto& [id, active] : requests_) abort(id);
}

void EngineCore::step() {
  if (engine_->has_runnable()) engine_->step();
  emit();
}

bool EngineCore::advance(Active& active, int index, CompletionOutput& out) {
  Sample& s = active.samples[static_cast<size_t>(index)];
  if (s.reported_finish) return false;
  const SamplingParams& params = active.request.params;
  const Sequence& seq = engine_->request(s.engine_id);
  out.index = index;
  const size_t first = s.seen;
  const auto take_engine_finish = [&] {
    s.finish = seq.finish_reason;
    out.error = seq.error;
    if (s.decoder) s.text += s.decoder->finish();
  };
  // Stop strings: search only where a match could end in the new text. The earliest match
  // ends the sample; the text is cut before it. Below min_tokens none may end it (vLLM):
  // the text so far is passed over as if it held no match. `count`: output tokens taken.
  const auto check_stop = [&](size_t count) {
    const bool below_min_tokens = static_cast<int64_t>(count) < params.min_tokens;
    if (below_min_tokens && s.text.size() + 1 > longest_stop_) {
      s.stop_search_from = std::max(s.stop_search_from, s.text.size() + 1 - longest_stop_);
    }
    if (params.stop.empty() || below_min_tokens || s.finish == FinishReason::kError ||
        s.stop_search_from >= s.text.size()) {
      return;
    }
    size_t best = std::string::npos;
    for (const std::string& stop : params.stop) {
      const size_t at = s.text.find(stop, s.stop_search_from);
      if (at < best) best = at;
    }
    if (best != std::string::npos) {
      s.text.resize(best);
      if (!seq.finished()) engine_->abort(s.engine_id);  // frees its pages now
      s.finish = FinishReason::kStopString;
    } else if (s.text.size() + 1 > longest_stop_) {
      s.stop_search_from = s.text.size() + 1 - longest_stop_;
    }
  };
  // Token by token, so that a stop string ends the sample at the token that completes it
  // however many tokens one engine step brought (pipelined decode brings up to N): the
  // tokens after it are not reported, as they would not have been sampled step by step.
  const size_t available = seq.output.size();
  while (s.seen < available && s.finish == FinishReason::kNone) {
    const SampledToken& t = seq.sampled[s.seen];
    out.token_ids.push_back(t.token);
    out.logprobs.push_back(t.logprob);
    if (params.processed_logprobs) out.processed_logprobs.push_back(t.processed_logprob);
    out.weights_versions.push_back(t.weights_version);  // the version it was sampled under
    if (params.logprobs > 0) {
      out.top_logprobs.push_back(t.top);
      out.logprob_ranks.push_back(t.rank);
      if (params.processed_logprobs) out.processed_top_logprobs.push_back(t.processed_top);
    }
    s.cumulative_logprob += t.logprob;
    if (s.decoder) s.text += s.decoder->push(t.token);
    ++s.seen;
    if (s.seen == available && seq.finished()) take_engine_finish();
    check_stop(s.seen);
  }
  // Finished with no token to take (an error, an abort, a request with nothing to sample).
  if (s.seen == available && seq.finished() && s.finish == FinishReason::kNone) {
    take_engine_finish();
    check_stop(s.seen);
  }
  // Text that a stop string could still claim is held back until it cannot.
  size_t limit = s.text.size();
  if (s.finish == FinishReason::kNone && !params.stop.empty()) {
    limit = s.text.size() >= longest_stop_ ? s.text.size() - (longest_stop_ - 1) : 0;
    limit = std::max(limit, s.emitted);
    while (limit > s.emitted && limit < s.text.size() &&
           (static_cast<uint8_t>(s.text[limit]) & 0xC0) == 0x80) {
      --limit;  // never split a UTF-8 character
    }
  }
  out.text = s.text.substr(s.emitted, limit - s.emitted);
  s.emitted = limit;
  out.cumulative_logprob = s.cumulative_logprob;
  out.finish_reason = s.finish;
  if (s.finish != FinishReason::kNone) {
    s.reported_finish = true;
    engine_->release(s.engine_id);
    return true;
  }
  return s.seen > first || !out.text.empty();
}

void EngineCore::emit() {
  const uint64_t version = engine_->weights_version();
  for (auto it = requests_.begin(); it != requests_.end();) {
    Active& active = it->second;
    RequestOutput delta;
    delta.request_id = active.request.request_id;
    bool finished = true;
    for (int j = 0; j < static_cast<int>(active.samples.size()); ++j) {
      CompletionOutput out;
      if (advance(active, j, out)) delta.outputs.push_back(std::move(out));
      finished = finished && active.samples[static_cast<size_t>(j)].reported_finish;
    }
    if (delta.outputs.empty() && !finished) {
      ++it;
      continue;
    }
    // The newest token's version; the current one for a delta without tokens.
    bool has_tokens = false;
    for (const CompletionOutput& out : delta.outputs) {
      if (out.weights_versions.empty()) continue;
      delta.weights_version =
          has_tokens ? std::max(delta.weights_version, out.weights_versions.back())
                     : out.weights_versions.back();
      has_tokens = true;
    }
    if (!has_tokens) delta.weights_version = version;
    if (!active.prompt_sent) {
      delta.prompt = active.request.prompt.text;
      delta.prompt_token_ids = active.request.prompt.ids;
      active.prompt_sent = true;
    }
    delta.finished = finished;
    // Forget a finished request before its sink runs, so that the sink may reuse its id.
    auto sink = active.request.sink;
    if (finished) {
      it = requests_.erase(it);
    } else {
      ++it;
    }
    if (sink) sink(std::move(delta));
  }
}

}  // namespace pagellm::api
