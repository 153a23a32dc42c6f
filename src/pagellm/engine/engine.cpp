#include "pagellm/engine/engine.h"

#include <algorithm>
#include <chrono>

#include "pagellm/common/random.h"

namespace pagellm {

Engine::Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
               const EngineConfig& config)
    : config_(config) {
  try {
    backend->set_attention_backend(config_.attention_backend);
    resolve_config(model->config());
  } catch (...) {
    model.reset();  // its buffers belong to the backend: free them while it exists
    throw;
  }

  ModelRunnerConfig rc;
  rc.page_size = config_.page_size;
  rc.num_pages = config_.num_pages;
  rc.kv_cache_bytes = config_.kv_cache_bytes;
  rc.max_num_seqs = config_.max_num_seqs;
  rc.max_num_batched_tokens = config_.max_num_batched_tokens;
  rc.max_model_len = config_.max_model_len;
  rc.max_pages_per_seq = scheduler_config_.max_pages_per_seq;
  rc.page_table_rows = config_.max_num_seqs + 1;  // row 0 is the padding row
  rc.use_graphs = config_.use_graphs;
  rc.graph_buckets = config_.graph_buckets;
  rc.persistent_page_table = config_.persistent_page_table;
  runner_ = std::make_unique<ModelRunner>(std::move(backend), std::move(model), rc);
  kv_cache_ = std::make_unique<KvCacheManager>(static_cast<int32_t>(runner_->num_pages()),
                                               config_.page_size, rc.page_table_rows,
                                               rc.max_pages_per_seq,
                                               config_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(scheduler_config_, *kv_cache_);
}

void Engine::resolve_config(const Qwen3Config& mc) {
  PAGELLM_CHECK(config_.page_size > 0 && config_.page_size <= 1024)
      << "page size must be in [1, 1024], got " << config_.page_size;
  PAGELLM_CHECK(config_.max_num_seqs > 0) << "max_num_seqs must be positive";
  PAGELLM_CHECK(config_.max_num_batched_tokens >= config_.max_num_seqs)
      << "max_num_batched_tokens (" << config_.max_num_batched_tokens
      << ") must be at least max_num_seqs (" << config_.max_num_seqs << ")";
  if (config_.max_model_len <= 0) {
    config_.max_model_len = static_cast<int32_t>(std::min<int64_t>(mc.max_position_embeddings,
                                                                   1 << 20));
  }
  PAGELLM_CHECK(config_.max_model_len >= 2) << "max_model_len must be at least 2";

  scheduler_config_.max_num_seqs = config_.max_num_seqs;
  scheduler_config_.max_num_batched_tokens = config_.max_num_batched_tokens;
  scheduler_config_.page_size = config_.page_size;
  scheduler_config_.max_model_len = config_.max_model_len;
  scheduler_config_.max_pages_per_seq =
      (config_.max_model_len + config_.page_size - 1) / config_.page_size;
  for (int64_t id : mc.eos_token_ids) scheduler_config_.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (scheduler_config_.eos_token_ids.empty() && mc.eos_token_id >= 0) {
    scheduler_config_.eos_token_ids.push_back(static_cast<int32_t>(mc.eos_token_id));
  }
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(const std::string& model_dir, const EngineConfig& config,
                                       const ProgressFn& progress) {
  std::unique_ptr<Backend> backend = create_backend(config.backend);
  std::unique_ptr<Qwen3Model> model = Qwen3Model::load(*backend, model_dir, progress);
  return std::make_unique<Engine>(std::move(backend), std::move(model), config);
}

int64_t Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
  auto seq = std::make_unique<Sequence>();
  const int64_t id = next_id_++;
  seq->id = id;
  seq->prompt = std::move(prompt);
  seq->params = params;
  // Without a seed, the first output of a SplitMix64 generator seeded with the id.
  seq->seed = params.seed ? *params.seed : splitmix64_at(static_cast<uint64_t>(id), 0);
  Sequence* raw = seq.get();
  requests_[id] = std::move(seq);

  std::string error;
  try {
    validate_sampling_params(params);
  } catch (const Error& e) {
    error = e.what();
  }
  const int64_t vocab = runner_->model().config().vocab_size;
  for (size_t i = 0; i < raw->prompt.size() && error.empty(); ++i) {
    if (raw->prompt[i] < 0 || raw->prompt[i] >= vocab) {
      error = "prompt token " + std::to_string(i) + " has id " + std::to_string(raw->prompt[i]) +
              ", outside the vocabulary [0, " + std::to_string(vocab) + ")";
    }
  }
  if (!error.empty()) {
    raw->status = SequenceStatus::kFinished;
    raw->finish_reason = FinishReason::kError;
    raw->error = error;
    return id;
  }
  scheduler_->add(raw);  // rejects (finishes with kError) what can never fit
  return id;
}

void Engine::abort(int64_t id) { scheduler_->abort(id); }

bool Engine::has_unfinished() const { return scheduler_->has_unfinished(); }

const Sequence& Engine::request(int64_t id) const {
  auto it = requests_.find(id);
  PAGELLM_CHECK(it != requests_.end()) << "no request with id " << id;
  return *it->second;
}

void Engine::release(int64_t id) {
  auto it = requests_.find(id);
  PAGELLM_CHECK(it != requests_.end()) << "no request with id " << id;
  PAGELLM_CHECK(it->second->finished()) << "request " << id << " is not finished";
  requests_.erase(it);
}

std::vector<int64_t> Engine::step() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  kv_cache_->set_prefix_salt(weights_version_);  // new chains hash under today's weights
  SchedulerOutput out = scheduler_->schedule();
  stats_.preemptions += static_cast<int64_t>(out.preempted.size());
  std::vector<int64_t> done;
  for (Sequence* s : out.finished) done.push_back(s->id);
  if (out.scheduled.empty()) {
    PAGELLM_ASSERT(!done.empty() || !scheduler_->has_unfinished())
        << "the scheduler made no progress with " << scheduler_->num_waiting()
        << " waiting and " << scheduler_->num_running() << " running requests";
    return done;
  }
  count_tokens(out);

  ModelRunner::StepResult result = runner_->run(out, kv_cache_->page_table());
  stats_.graph_steps += result.replayed_graph ? 1 : 0;
  stats_.page_table_entries_uploaded += result.page_table_entries;

  for (Sequence* s : scheduler_->on_step_done(out, result.sampled)) done.push_back(s->id);
  ++stats_.steps;
  // Host time while the device waits: before the launch, and after the tokens arrived.
  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  stats_.host_gap_seconds +=
      seconds(result.launched - start) + seconds(Clock::now() - result.sampled_at);
  return done;
}

void Engine::count_tokens(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.seq->num_computed + s.num_new_tokens > static_cast<int32_t>(s.seq->prompt.size())) {
      stats_.decode_tokens += s.num_new_tokens;
    } else {
      stats_.prefill_tokens += s.num_new_tokens;
    }
  }
}

std::vector<const Sequence*> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<SamplingParams>& params) {
  PAGELLM_CHECK(params.size() == prompts.size() || params.size() == 1)
      << "generate: " << params.size() << " sampling parameter sets for " << prompts.size()
      << " prompts (give one or one per prompt)";
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(add_request(prompts[i], params.size() == 1 ? params[0] : params[i]));
  }
  while (has_unfinished()) step();
  std::vector<const Sequence*> result;
  for (int64_t id : ids) result.push_back(&request(id));
  return result;
}

void Engine::check_invariants() const { scheduler_->check_invariants(); }

}  // namespace pagellm
