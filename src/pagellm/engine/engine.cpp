#include "pagellm/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "pagellm/backend/host_communicator.h"
#include "pagellm/common/random.h"
#include "pagellm/sampling/rules.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {

namespace {

/// A steady-clock duration in seconds (the host-gap counters).
double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The tokens min_tokens keeps a sample from sampling until it has min_tokens outputs:
// whatever would end it (EOS unless ignored, its stop token ids), each once. A stop id
// outside the vocabulary can never be sampled, so it needs no ban.
std::vector<int32_t> min_tokens_banned(const SamplingParams& params,
                                       const std::vector<int32_t>& eos_token_ids,
                                       int64_t vocab_size) {
  std::vector<int32_t> banned;
  if (params.min_tokens <= 0) return banned;
  if (!params.ignore_eos) banned = eos_token_ids;
  banned.insert(banned.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  banned.erase(std::remove_if(banned.begin(), banned.end(),
                              [vocab_size](int32_t t) { return t < 0 || t >= vocab_size; }),
               banned.end());
  std::sort(banned.begin(), banned.end());
  banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
  return banned;
}

/// The ranks' errors of one weights operation, a "\n  rank i: error" line each (rank 0's
/// own first, then the workers' answers in rank order); empty when every rank finished.
std::string rank_errors(const std::string& own, const std::vector<tp::WeightsDone>& done) {
  std::string errors;
  if (!own.empty()) errors += "\n  rank 0: " + own;
  for (size_t i = 0; i < done.size(); ++i) {
    if (!done[i].error.empty()) {
      errors += "\n  rank " + std::to_string(i + 1) + ": " + done[i].error;
    }
  }
  return errors;
}

}  // namespace

Engine::Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
               const EngineConfig& config, std::unique_ptr<TpLeader> leader,
               std::unique_ptr<Communicator> comm)
    : config_(config), tp_leader_(std::move(leader)) {
  const int ranks = tp_leader_ ? tp_leader_->size() : 1;
  try {
    PAGELLM_CHECK((comm != nullptr) == (tp_leader_ != nullptr) &&
                  model->shard().size == ranks && config_.tensor_parallel_size == ranks)
        << "Engine: tensor_parallel_size " << config_.tensor_parallel_size << " with a model of "
        << model->shard().size << " rank(s) and " << (tp_leader_ ? "a" : "no") << " group of "
        << ranks
        << " (Engine::create_tensor_parallel makes the three together)";
    backend->set_attention_backend(config_.attention_backend);
    backend->set_batch_invariant(config_.batch_invariant);
    resolve_config(model->config(), *backend);
    // Before the runner reserves activations and captures graphs over the forward.
    const bool float32_throughout =
        backend->activation_dtype() == DType::F32 && backend->weight_dtype() == DType::F32;
    PAGELLM_CHECK(!(config_.float32_head && config_.batch_invariant) || float32_throughout)
        << "float32_head and batch_invariant cannot be combined on the " << backend->name()
        << " backend: its float32 head runs on cuBLASLt, whose per-row results depend on the "
           "row count; choose one (on the float32 cpu backend both work)";
    if (config_.float32_head) model->enable_float32_head();
    // LoRA's slot tables, before graphs that read them are captured (one rank only:
    // load_lora_adapter refuses at TP > 1).
    if (config_.max_loras > 0 && backend->supports_lora() && ranks == 1) {
      model->enable_lora(config_.max_loras, config_.max_lora_rank);
    }
  } catch (...) {
    model.reset();  // its buffers belong to the backend: free them while it exists
    comm.reset();
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
  RunnerGroup group;
  // Rank 0's device communicator (NCCL), which the watchdog aborts when a worker goes.
  Communicator* device_comm = nullptr;
  if (tp_leader_) {
    // Host collectives (HostCommunicator) read and write host memory between kernels: a
    // captured graph cannot hold them.
    if (dynamic_cast<HostCommunicator*>(comm.get()) != nullptr) {
      rc.use_graphs = false;
    } else {
      device_comm = comm.get();
    }
    tp_leader_->send_runner_config(rc);
    group.comm = std::move(comm);
    group.mirror = tp_leader_.get();
    group.agree_num_pages = [leader = tp_leader_.get()](int64_t own) {
      return leader->agree_num_pages(own);
    };
  }
  runner_ = std::make_unique<ModelRunner>(std::move(backend), std::move(model), rc,
                                          std::move(group));
  if (tp_leader_) tp_leader_->wait_ready();
  kv_cache_ = std::make_unique<KvCacheManager>(static_cast<int32_t>(runner_->num_pages()),
                                               config_.page_size, rc.page_table_rows,
                                               rc.max_pages_per_seq,
                                               config_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(scheduler_config_, *kv_cache_);
  // Last: nothing after it throws, so the communicator outlives the watchdog (~Engine
  // stops it first).
  if (device_comm != nullptr) tp_leader_->start_watchdog(device_comm);
}

void Engine::resolve_config(const Qwen3Config& mc, const Backend& backend) {
  PAGELLM_CHECK(config_.page_size > 0 && config_.page_size <= 1024)
      << "page size must be in [1, 1024], got " << config_.page_size;
  PAGELLM_CHECK(config_.max_num_seqs > 0) << "max_num_seqs must be positive";
  PAGELLM_CHECK(config_.max_loras >= 0) << "max_loras must be >= 0, got " << config_.max_loras;
  PAGELLM_CHECK(config_.max_lora_rank >= 1 && config_.max_lora_rank <= kMaxLoraRank)
      << "max_lora_rank must be in [1, " << kMaxLoraRank << "], got " << config_.max_lora_rank;
  PAGELLM_CHECK(config_.pipelined_decode_steps >= 1)
      << "pipelined_decode_steps must be >= 1 (1: off), got " << config_.pipelined_decode_steps;
  PAGELLM_CHECK(config_.max_num_batched_tokens >= 0)
      << "max_num_batched_tokens must be >= 0 (0: the backend's preferred chunk), got "
      << config_.max_num_batched_tokens;
  // The backend's chunk; where its offline chunk is longer, steps that begin with many
  // decodes keep the online one (SchedulerConfig::busy_batched_tokens).
  int32_t busy_batched_tokens = 0;
  if (config_.max_num_batched_tokens == 0) {
    const int32_t chunk = backend.preferred_batched_tokens(config_.offline);
    const int32_t online = backend.preferred_batched_tokens(false);
    config_.max_num_batched_tokens = std::max(chunk, config_.max_num_seqs);
    if (online < chunk && config_.max_num_seqs < config_.max_num_batched_tokens) {
      busy_batched_tokens = std::max(online, config_.max_num_seqs);
    }
  }
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
  scheduler_config_.busy_batched_tokens = busy_batched_tokens;
  scheduler_config_.page_size = config_.page_size;
  scheduler_config_.max_model_len = config_.max_model_len;
  scheduler_config_.max_pages_per_seq =
      (config_.max_model_len + config_.page_size - 1) / config_.page_size;
  for (int64_t id : mc.eos_token_ids) scheduler_config_.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (scheduler_config_.eos_token_ids.empty() && mc.eos_token_id >= 0) {
    scheduler_config_.eos_token_ids.push_back(static_cast<int32_t>(mc.eos_token_id));
  }
}

Engine::~Engine() {
  // The workers leave first (their runners and communicators go in parallel with ours);
  // tp_leader_'s destructor, after the runner's, reaps them.
  if (tp_leader_) tp_leader_->request_shutdown();
}

void Engine::refuse_tensor_parallel(const char* what) const {
  PAGELLM_CHECK(tensor_parallel_size() == 1)
      << what << " is not available with tensor parallelism yet (this engine runs "
      << tensor_parallel_size() << " ranks; use tensor_parallel_size 1)";
}

std::unique_ptr<Engine> Engine::create_tensor_parallel(const tp::ModelSource& source,
                                                       const EngineConfig& config,
                                                       const ProgressFn& progress) {
  const int size = config.tensor_parallel_size;
  PAGELLM_CHECK(size >= 1 && size <= 64)
      << "tensor_parallel_size must be in [1, 64], got " << size;
  PAGELLM_CHECK(!(size > 1 && config.float32_head))
      << "the float32 head is not available with tensor parallelism yet "
      << "(tensor_parallel_size " << size << "); drop float32_head or use one rank";
  // Everything that can be refused is, before any process starts.
  const Qwen3Config model_config = source.config();
  for (int r = 0; r < size; ++r) plan_tensor_parallel(model_config, size, r);
  std::unique_ptr<Backend> backend = create_backend(config.backend, 0);
  if (size == 1) {
    std::unique_ptr<Qwen3Model> model = source.load(*backend, nullptr, progress);
    return std::make_unique<Engine>(std::move(backend), std::move(model), config);
  }
  TpLeader::Options options;
  options.size = size;
  options.join_timeout_ms = config.tensor_parallel_join_timeout_ms;
  options.timeout_ms = config.tensor_parallel_timeout_ms;
  if (config.backend == "cpu") {
    // The ranks share the host's cores: a worker takes its share of them, and its OpenMP
    // threads sleep rather than spin while it waits for the others (spinning threads of
    // one process starve the others' forward; 12 tok/s instead of 500 on 2 cores).
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    options.default_env = {"OMP_NUM_THREADS=" + std::to_string(std::max(1u, cores / size)),
                           "OMP_WAIT_POLICY=PASSIVE"};
  }
  std::unique_ptr<TpLeader> leader = TpLeader::launch(options);
  tp::WorkerSetup setup;
  setup.source = source;
  setup.backend = config.backend;
  setup.attention_backend = config.attention_backend;
  setup.batch_invariant = config.batch_invariant;
  setup.communicator_id = backend->new_communicator_id();
  setup.timeout_ms = config.tensor_parallel_timeout_ms;
  leader->send_setup(setup);
  leader->wait_backends_up();
  std::unique_ptr<Communicator> comm =
      setup.communicator_id.empty()
          ? leader->host_communicator()
          : backend->join_communicator(setup.communicator_id, 0, size);
  const TensorParallel parallel{plan_tensor_parallel(model_config, size, 0), comm.get()};
  std::unique_ptr<Qwen3Model> model;
  try {
    model = source.load(*backend, &parallel, progress);
  } catch (...) {
    comm.reset();  // before the backend (a device communicator uses its stream)
    throw;
  }
  return std::make_unique<Engine>(std::move(backend), std::move(model), config, std::move(leader),
                                  std::move(comm));
}

std::unique_ptr<Engine> Engine::create(const std::string& model_dir, const EngineConfig& config,
                                       const ProgressFn& progress) {
  if (config.tensor_parallel_size != 1) {
    tp::ModelSource source;
    source.model_dir = model_dir;
    return create_tensor_parallel(source, config, progress);
  }
  std::unique_ptr<Backend> backend = create_backend(config.backend);
  std::unique_ptr<Qwen3Model> model = Qwen3Model::load(*backend, model_dir, progress);
  return std::make_unique<Engine>(std::move(backend), std::move(model), config);
}

int64_t Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                            const std::string& lora) {
  auto seq = std::make_unique<Sequence>();
  const int64_t id = next_id_++;
  seq->id = id;
  seq->prompt = std::move(prompt);
  seq->params = params;
  seq->min_tokens_banned = min_tokens_banned(params, scheduler_config_.eos_token_ids,
                                             runner_->model().config().vocab_size);
  // Without a seed, the first output of a SplitMix64 generator seeded with the id.
  seq->seed = params.seed ? *params.seed : splitmix64_at(static_cast<uint64_t>(id), 0);
  Sequence* raw = seq.get();
  requests_[id] = std::move(seq);

  std::string error = attach_lora(*raw, lora);
  try {
    if (error.empty()) validate_sampling_params(params);
  } catch (const Error& e) {
    error = e.what();
  }
  if (asleep_) {
    error = "the engine is asleep (sleep() released its KV cache): call wake_up() before "
            "adding requests";
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
  if (paused_) {
    held_.push_back({raw});  // scheduled after resume()
    return id;
  }
  scheduler_->add(raw);  // rejects (finishes with kError) what can never fit
  return id;
}

std::vector<int64_t> Engine::add_request_group(std::vector<int32_t> prompt,
                                               const SamplingParams& params,
                                               const std::vector<int32_t>& max_tokens,
                                               const std::string& lora) {
  std::string error;
  if (!max_tokens.empty()) {
    if (static_cast<int64_t>(max_tokens.size()) != params.n) {
      error = "add_request_group: " + std::to_string(max_tokens.size()) +
              " per-sample max_tokens for n = " + std::to_string(params.n) + " samples";
    }
    for (size_t j = 0; j < max_tokens.size() && error.empty(); ++j) {
      if (max_tokens[j] < 1) {
        error = "add_request_group: sample " + std::to_string(j) + "'s max_tokens is " +
                std::to_string(max_tokens[j]) + "; it must be >= 1";
      }
    }
  }
  if (params.n == 1 && error.empty()) {
    SamplingParams one = params;
    if (!max_tokens.empty()) one.max_tokens = max_tokens[0];
    return {add_request(std::move(prompt), one, lora)};
  }
  try {
    if (error.empty()) validate_sampling_params(params);
  } catch (const Error& e) {
    error = e.what();
  }
  if (asleep_) {
    error = "the engine is asleep (sleep() released its KV cache): call wake_up() before "
            "adding requests";
  }
  const int64_t vocab = runner_->model().config().vocab_size;
  for (size_t i = 0; i < prompt.size() && error.empty(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      error = "prompt token " + std::to_string(i) + " has id " + std::to_string(prompt[i]) +
              ", outside the vocabulary [0, " + std::to_string(vocab) + ")";
    }
  }
  if (error.empty() && params.n > config_.max_num_seqs) {
    error = "request asks for n = " + std::to_string(params.n) + " samples but max_num_seqs is " +
            std::to_string(config_.max_num_seqs) +
            ": the n samples of a request run together, sharing the prompt's KV pages; use n "
            "<= " + std::to_string(config_.max_num_seqs) + " or raise max_num_seqs";
  }
  // A rejected request gets one id to report its error on (n may be huge or below 1).
  if (error.empty() && !lora.empty() && !loras_.count(lora)) {
    Sequence probe;
    error = attach_lora(probe, lora);
  }
  const int n = error.empty() ? params.n : 1;
  std::vector<int64_t> ids;
  std::vector<Sequence*> samples;
  for (int j = 0; j < n; ++j) {
    auto seq = std::make_unique<Sequence>();
    const int64_t id = next_id_++;
    seq->id = id;
    seq->prompt = prompt;
    seq->params = params;
    seq->params.n = 1;
    seq->min_tokens_banned = min_tokens_banned(params, scheduler_config_.eos_token_ids,
                                             runner_->model().config().vocab_size);
    if (!max_tokens.empty()) seq->params.max_tokens = max_tokens[static_cast<size_t>(j)];
    if (params.seed) seq->params.seed = *params.seed + static_cast<uint64_t>(j);
    // The rule of add_request: the seed, or the first SplitMix64 output seeded with the id.
    seq->seed = seq->params.seed ? *seq->params.seed
                                 : splitmix64_at(static_cast<uint64_t>(id), 0);
    if (error.empty()) attach_lora(*seq, lora);
    if (!error.empty()) {
      seq->status = SequenceStatus::kFinished;
      seq->finish_reason = FinishReason::kError;
      seq->error = error;
    }
    samples.push_back(seq.get());
    ids.push_back(id);
    requests_[id] = std::move(seq);
  }
  if (error.empty()) {
    if (paused_) {
      held_.push_back(samples);  // scheduled after resume()
    } else {
      scheduler_->add_group(samples);  // rejects what can never run
    }
  }
  return ids;
}

std::string Engine::attach_lora(Sequence& seq, const std::string& lora) const {
  if (lora.empty()) return "";
  const auto it = loras_.find(lora);
  if (it == loras_.end()) {
    std::string known;
    for (const auto& [name, info] : loras_) known += (known.empty() ? "" : ", ") + name;
    return "LoRA adapter '" + lora + "' is not loaded (loaded: " +
           (known.empty() ? "none" : known) + "); load it first";
  }
  seq.lora_slot = it->second.slot;
  seq.adapter_key = lora_keys_.at(it->second.slot);
  return "";
}

LoraAdapterInfo Engine::load_lora_adapter(const LoraRequest& request) {
  refuse_tensor_parallel("load_lora_adapter: LoRA");
  PAGELLM_CHECK(!request.name.empty())
      << "load_lora_adapter: the adapter needs a name (the name requests select it by)";
  PAGELLM_CHECK(!asleep_) << "load_lora_adapter: the engine is asleep; call wake_up() first";
  PAGELLM_CHECK(runner_->backend().supports_lora())
      << "load_lora_adapter: the " << runner_->backend().name()
      << " backend has no LoRA kernels (the cpu and cuda backends have)";
  Qwen3Model& model = runner_->model();
  // Read and check everything before a slot changes.
  const LoraAdapter adapter =
      read_lora_adapter(request.path, model.config(), config_.max_lora_rank);
  const auto existing = loras_.find(request.name);
  int32_t slot = 0;
  if (existing != loras_.end()) {
    slot = existing->second.slot;
  } else {
    for (int32_t s = 1; s <= config_.max_loras && slot == 0; ++s) {
      if (!model.has_lora(s)) slot = s;
    }
    PAGELLM_CHECK(slot != 0) << "load_lora_adapter '" << request.name << "': all "
                             << config_.max_loras
                             << " adapter slots are in use (max_loras); unload one first";
  }
  model.set_lora(slot, adapter);
  LoraAdapterInfo& info = loras_[request.name];
  info.name = request.name;
  info.id = request.id;
  info.path = request.path;
  info.rank = adapter.config.rank;
  info.scale = adapter.config.scale();
  info.slot = slot;
  ++info.version;
  // A new prefix-cache identity: pages of the old weights never match again. Requests
  // running with the adapter move to it (their started chains stop registering pages).
  const uint64_t key = next_lora_key_++;
  lora_keys_[slot] = key;
  for (auto& [id, seq] : requests_) {
    if (seq->lora_slot == slot) seq->adapter_key = key;
  }
  return info;
}

void Engine::unload_lora_adapter(const std::string& name) {
  const auto it = loras_.find(name);
  PAGELLM_CHECK(it != loras_.end()) << "unload_lora_adapter: no adapter named '" << name
                                    << "' is loaded";
  const int32_t slot = it->second.slot;
  int64_t users = 0;
  for (const auto& [id, seq] : requests_) {
    if (seq->lora_slot == slot && !seq->finished()) ++users;
  }
  PAGELLM_CHECK(users == 0) << "unload_lora_adapter '" << name << "': " << users
                            << " unfinished request(s) use it; abort or finish them first";
  for (auto& [id, seq] : requests_) {
    if (seq->lora_slot == slot) seq->lora_slot = 0;  // finished ones: the slot may be reused
  }
  runner_->model().clear_lora(slot);
  lora_keys_.erase(slot);
  loras_.erase(it);
}

std::vector<LoraAdapterInfo> Engine::lora_adapters() const {
  std::vector<LoraAdapterInfo> out;
  for (const auto& [name, info] : loras_) out.push_back(info);
  return out;
}

void Engine::abort(int64_t id) {
  for (auto group = held_.begin(); group != held_.end(); ++group) {
    auto held = std::find_if(group->begin(), group->end(),
                             [id](Sequence* s) { return s->id == id; });
    if (held == group->end()) continue;
    (*held)->status = SequenceStatus::kFinished;
    (*held)->finish_reason = FinishReason::kAborted;
    group->erase(held);
    if (group->empty()) held_.erase(group);
    return;
  }
  scheduler_->abort(id);
}

bool Engine::has_unfinished() const { return scheduler_->has_unfinished() || !held_.empty(); }

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
  if (paused_ && pause_mode_ == PauseMode::kKeep) return {};  // frozen until resume()
  if (asleep_) return {};  // nothing can run: add_request rejects while asleep
  // A tensor-parallel group that failed stays failed: the same Error, before the
  // scheduler (whose failed step was never completed) is asked anything.
  if (tp_leader_) tp_leader_->throw_if_failed();
  kv_cache_->set_prefix_salt(weights_version_);  // new chains hash under today's weights
  SchedulerOutput out = scheduler_->schedule();
  const auto scheduled = Clock::now();
  stats_.preemptions += static_cast<int64_t>(out.preempted.size());
  stats_.cow_page_copies += static_cast<int64_t>(out.page_copies.size());
  std::vector<int64_t> done;
  for (Sequence* s : out.finished) done.push_back(s->id);
  if (out.scheduled.empty()) {
    PAGELLM_ASSERT(!done.empty() || !scheduler_->has_unfinished())
        << "the scheduler made no progress with " << scheduler_->num_waiting()
        << " waiting and " << scheduler_->num_running() << " running requests";
    return done;
  }
  count_tokens(out);
  if (can_pipeline(out)) {
    stats_.host_gap.schedule += seconds(scheduled - start);
    for (int64_t id : run_pipelined(std::move(out))) done.push_back(id);
    return done;
  }

  ModelRunner::StepResult result;
  try {
    result = runner_->run(out, kv_cache_->page_table());
    // A worker lost during the step (the watchdog aborted the collectives it waited in):
    // the step's results are not to be trusted.
    if (tp_leader_) tp_leader_->throw_if_failed();
  } catch (const std::exception& e) {
    if (tp_leader_) tp_leader_->mark_failed(e.what());
    throw;
  }
  complete_step(out, result, done);
  // Host time while the device waits: before the launch, and after the tokens arrived.
  stats_.host_gap.schedule += seconds(scheduled - start);
  stats_.host_gap.launch += seconds(result.launched - scheduled);
  stats_.host_gap.finish += seconds(Clock::now() - result.sampled_at);
  return done;
}

void Engine::complete_step(const SchedulerOutput& out, ModelRunner::StepResult& result,
                           std::vector<int64_t>& done) {
  for (SampledToken& t : result.sampled) t.weights_version = weights_version_;
  stats_.graph_steps += result.replayed_graph ? 1 : 0;
  stats_.page_table_entries_uploaded += result.page_table_entries;
  if (step_observer_) step_observer_(out);
  for (Sequence* s : scheduler_->on_step_done(out, result.sampled)) done.push_back(s->id);
  stats_.forked_samples = scheduler_->forked_samples();
  ++stats_.steps;
}

bool Engine::can_pipeline(const SchedulerOutput& out) const {
  if (config_.pipelined_decode_steps <= 1 || tp_leader_ || runner_->has_logits_hook()) {
    return false;
  }
  for (const ScheduledSeq& s : out.scheduled) {
    const SamplingParams& p = s.seq->params;
    if (!s.is_decode() || p.logprobs > 0 ||
        penalties_enabled(p.repetition_penalty, p.presence_penalty, p.frequency_penalty)) {
      return false;
    }
  }
  return true;
}

std::vector<int64_t> Engine::run_pipelined(SchedulerOutput out) {
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> done;
  PageTable& table = kv_cache_->page_table();
  const auto launch_begin = Clock::now();
  std::optional<ModelRunner::InFlight> current = runner_->launch(std::move(out), table, nullptr);
  stats_.host_gap.launch += seconds(current->result.launched - launch_begin);
  for (int32_t n = 1;; ++n) {
    // The next step is planned and launched while `current` runs on the device; its
    // tokens are read only afterwards (docs/design.md, "Pipelined decode").
    std::optional<ModelRunner::InFlight> next;
    if (n < config_.pipelined_decode_steps && !(run_interrupt_ && run_interrupt_())) {
      SchedulerOutput ahead = scheduler_->schedule_ahead(current->out);
      if (!ahead.scheduled.empty()) {
        stats_.cow_page_copies += static_cast<int64_t>(ahead.page_copies.size());
        count_tokens(ahead);
        next = runner_->launch(std::move(ahead), table, &*current);
        ++stats_.pipelined_steps;
      }
    }
    ModelRunner::StepResult result = runner_->finish(*current);
    complete_step(current->out, result, done);
    if (!next) {
      stats_.host_gap.finish += seconds(Clock::now() - result.sampled_at);
      return done;
    }
    current = std::move(next);
  }
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
  PAGELLM_CHECK(!paused_) << "generate: the engine is paused (resume() first)";
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

// ---- weight updates and pause / resume ------------------------------------------------------

void Engine::pause(PauseMode mode) {
  PAGELLM_CHECK(!paused_) << "pause: the engine is already paused (mode "
                          << pause_mode_name(pause_mode_) << "); resume() first";
  PAGELLM_CHECK(mode == PauseMode::kWait || mode == PauseMode::kAbort ||
                mode == PauseMode::kKeep)
      << "pause: unknown mode " << static_cast<int>(mode) << " (expected wait, abort or keep)";
  paused_ = true;
  pause_mode_ = mode;
  paused_at_ = std::chrono::steady_clock::now();
  std::vector<int64_t> ids;
  for (const Sequence* s : scheduler_->running()) ids.push_back(s->id);
  for (const Sequence* s : scheduler_->waiting()) ids.push_back(s->id);
  paused_unfinished_ = static_cast<int64_t>(ids.size());
  paused_aborted_ = 0;
  if (mode == PauseMode::kAbort) {
    for (int64_t id : ids) paused_aborted_ += scheduler_->abort(id) ? 1 : 0;
  }
}

void Engine::resume() {
  if (!paused_) return;
  paused_ = false;
  std::vector<std::vector<Sequence*>> held;
  held.swap(held_);
  for (const std::vector<Sequence*>& group : held) {
    if (group.size() == 1) {
      scheduler_->add(group[0]);
    } else {
      scheduler_->add_group(group);
    }
  }
}

void Engine::check_writable(const std::vector<NamedTensor>& tensors) const {
  PAGELLM_CHECK(!asleep_) << "a weight update while the engine is asleep (sleep() may have "
                             "released the weights' memory): call wake_up() first";
  runner_->model().check_weights_update(tensors);
}

void Engine::check_weights_update(const std::vector<NamedTensor>& tensors) const {
  // The tensors are this process's memory, which the other ranks' processes cannot read.
  PAGELLM_CHECK(tensor_parallel_size() == 1)
      << "a weight update from tensors in this process's memory is not available with "
         "tensor parallelism (this engine runs "
      << tensor_parallel_size()
      << " ranks, each in its own process): load them from a safetensors folder "
         "(load_weights) or broadcast them from the trainer (join_weight_group, "
         "update_weights_from_broadcast)";
  check_writable(tensors);
}

WeightUpdateResult Engine::update_weights(const std::vector<NamedTensor>& tensors,
                                          PauseMode mode) {
  check_weights_update(tensors);  // before pausing: a bad update waits for nothing
  return run_update(mode, [&] { return runner_->model().update_weights(tensors); });
}

void Engine::agree_weights(const tp::WeightsDone& own, const std::string& what) {
  const std::vector<tp::WeightsDone> done = tp_leader_->weights_done();
  const std::string errors = rank_errors(own.error, done);
  if (errors.empty()) return;
  bool changed = own.changed;
  for (const tp::WeightsDone& d : done) changed = changed || d.changed;
  if (changed) {
    tp_leader_->mark_failed(what + " failed on some ranks after weights were written, so the "
                            "tensor-parallel ranks now hold different weights; make a new "
                            "engine:" + errors);
    tp_leader_->throw_if_failed();
  }
  PAGELLM_FAIL() << what << " failed; no rank's weights were changed:" << errors;
}

WeightUpdateResult Engine::load_weights(const std::string& path, PauseMode mode) {
  return load_weights(WeightStore::open(path), mode);
}

std::vector<NamedTensor> Engine::check_load_weights(const WeightStore& store) const {
  std::vector<NamedTensor> tensors;
  try {
    tensors = named_tensors_of(store);
    check_writable(tensors);
  } catch (const Error& e) {
    PAGELLM_FAIL() << store.source() << ": " << e.what();
  }
  return tensors;
}

WeightUpdateResult Engine::load_weights(const WeightStore& store, PauseMode mode) {
  const std::vector<NamedTensor> tensors = check_load_weights(store);
  const std::string& path = store.source();
  return run_update(mode, [&] {
    if (!tp_leader_) return runner_->model().update_weights(tensors);
    // Every rank reads the folder and writes its share; rank 0 has checked it for all.
    tp_leader_->send_weights_op(tp::kLoadWeights, tp::encode_load_weights(path));
    tp::WeightsDone own;
    WeightWriteStats stats;
    try {
      stats = runner_->model().update_weights(tensors);
    } catch (const Error& e) {
      own.error = e.what();
    }
    own.changed = true;  // checked already: a failure here came while writing
    agree_weights(own, "loading weights from " + store.source());
    return stats;
  });
}

void Engine::join_weight_group(const WeightGroupSpec& spec) {
  if (weight_group_ && weight_group_->broken()) leave_weight_group();
  PAGELLM_CHECK(weight_group_ == nullptr)
      << "a weight group is joined already (transport " << weight_group_->spec().transport
      << ", name '" << weight_group_->spec().name << "'): leave it first";
  check_weight_group_spec(spec, tensor_parallel_size());
  if (!tp_leader_) {
    weight_group_ = pagellm::join_weight_group(backend(), spec, &weight_interrupt_);
    weight_group_updates_ = 0;
    return;
  }
  // Every rank joins at once (an NCCL join returns when the whole world has joined).
  tp_leader_->send_weights_op(tp::kJoinWeightGroup, tp::encode(spec));
  std::unique_ptr<WeightReceiver> own;
  std::string own_error;
  try {
    own = pagellm::join_weight_group(backend(), spec, &weight_interrupt_);
  } catch (const Error& e) {
    own_error = e.what();
  }
  // A worker's join ends within the group's timeout ("tcp"); an NCCL join whose world
  // cannot complete (rank 0 failed) does not end, and the group is then marked failed.
  const int64_t wait_ms =
      own_error.empty() ? -1 : static_cast<int64_t>(std::min(spec.timeout_seconds, 3600.0) * 1000) + 30'000;
  const std::string errors = rank_errors(own_error, tp_leader_->weights_done(wait_ms));
  if (!errors.empty()) {
    own.reset();
    tp_leader_->send_weights_op(tp::kLeaveWeightGroup, {});
    tp_leader_->weights_done();
    PAGELLM_FAIL() << "weight group: joining failed (the ranks that had joined left again):"
                   << errors;
  }
  weight_group_ = std::move(own);
  weight_group_updates_ = 0;
}

void Engine::leave_weight_group() {
  weight_group_.reset();
  broadcast_staging_.release();
  if (tp_leader_) {
    tp_leader_->send_weights_op(tp::kLeaveWeightGroup, {});
    tp_leader_->weights_done();
  }
}

std::vector<BroadcastBucket> Engine::check_broadcast_update(
    const std::vector<BroadcastTensor>& tensors, uint64_t bucket_bytes, const std::string& group) {
  const std::vector<BroadcastBucket> buckets = plan_broadcast_buckets(tensors, bucket_bytes);
  PAGELLM_CHECK(weight_group_ != nullptr)
      << "no weight group is joined: the trainer makes one and the engine joins it first "
         "(init_weights_group)";
  PAGELLM_CHECK(!weight_group_->broken())
      << "the weight group broke in an earlier update; leave it and join a new one";
  // From here the trainer's buckets are on their way: a rejected update drains them, so
  // that the trainer's broadcast completes and the next update finds the group in step.
  try {
    PAGELLM_CHECK(group.empty() || group == weight_group_->spec().name)
        << "the update names weight group '" << group << "', the engine has joined '"
        << weight_group_->spec().name << "'";
    // The staging buffer's pointers go through the model's memory checks as the update's.
    broadcast_staging_.ensure(backend(), weight_group_->memory(), buckets);
    std::vector<NamedTensor> all;
    for (const BroadcastBucket& b : buckets) {
      for (NamedTensor& n : broadcast_staging_.tensors(tensors, b)) all.push_back(std::move(n));
    }
    check_writable(all);
  } catch (const Error& e) {
    const uint64_t update = weight_group_updates_++;
    if (tp_leader_) {
      tp::BroadcastOp drain;
      drain.update = update;
      drain.drain = true;
      drain.bucket_bytes = bucket_bytes;
      drain.tensors = tensors;
      tp_leader_->send_weights_op(tp::kBroadcastWeights, tp::encode(drain));
    }
    tp::WeightsDone own;
    try {
      drain_broadcast(*weight_group_, backend(), broadcast_staging_, buckets, update);
    } catch (const Error& d) {
      own.error = d.what();
    }
    if (tp_leader_) agree_weights(own, "draining the rejected broadcast");
    PAGELLM_CHECK(own.error.empty()) << e.what() << "\n(receiving the trainer's buckets to drop "
                                     << "them failed too: " << own.error << ")";
    PAGELLM_FAIL() << e.what() << "\n(the trainer's " << buckets.size()
                   << " bucket(s) were received and dropped; the weight group stays usable)";
  }
  return buckets;
}

WeightUpdateResult Engine::update_weights_from_broadcast(const std::vector<BroadcastTensor>& tensors,
                                                         uint64_t bucket_bytes, PauseMode mode,
                                                         const std::string& group) {
  const std::vector<BroadcastBucket> buckets = check_broadcast_update(tensors, bucket_bytes, group);
  return run_update(mode, [&] {
    const uint64_t number = weight_group_updates_++;
    if (tp_leader_) {
      tp::BroadcastOp op;
      op.update = number;
      op.bucket_bytes = bucket_bytes;
      op.tensors = tensors;
      tp_leader_->send_weights_op(tp::kBroadcastWeights, tp::encode(op));
    }
    const BroadcastWrite own =
        receive_broadcast_update(*weight_group_, backend(), broadcast_staging_, runner_->model(),
                                 tensors, buckets, number);
    std::string error = own.error;
    if (tp_leader_) {
      // Every rank received the same buckets, or the ranks' weights now differ.
      const std::vector<tp::WeightsDone> done = tp_leader_->weights_done();
      bool same = true;
      std::string counts = "rank 0 wrote " + std::to_string(own.written);
      for (size_t i = 0; i < done.size(); ++i) {
        same = same && done[i].buckets == own.written;
        counts += ", rank " + std::to_string(i + 1) + " " + std::to_string(done[i].buckets);
      }
      error = rank_errors(own.error, done);
      if (!same) {
        tp_leader_->mark_failed("weight broadcast failed with the tensor-parallel ranks at "
                                "different buckets (" + counts + " of " +
                                std::to_string(buckets.size()) + "), so they now hold "
                                "different weights; make a new engine: " + error);
        tp_leader_->throw_if_failed();
      }
    }
    if (error.empty()) return own.stats;
    leave_weight_group();
    if (own.written == 0) {
      PAGELLM_FAIL() << "weight broadcast failed before any weight was written: " << error
                     << "; the weight group was left (join again)";
    }
    // Part of the model holds the new weights: nothing computed before may match again.
    ++weights_version_;
    kv_cache_->reset_prefix_cache();
    PAGELLM_FAIL() << "weight broadcast failed after " << own.written << " of " << buckets.size()
                   << " buckets were written: " << error
                   << "; the weights are partly updated (weights version now "
                   << weights_version_
                   << "), and the weight group was left: join again and send the whole update";
  });
}

WeightUpdateResult Engine::run_update(PauseMode mode,
                                      const std::function<WeightWriteStats()>& write) {
  using Clock = std::chrono::steady_clock;
  const bool pause_here = !paused_;
  if (pause_here) pause(mode);
  WeightUpdateResult result;
  result.mode = pause_mode_;
  try {
    if (pause_mode_ == PauseMode::kWait) {
      while (scheduler_->has_unfinished()) step();
      result.wait_seconds = std::chrono::duration<double>(Clock::now() - paused_at_).count();
      result.requests_waited = paused_unfinished_;
    }
    result.requests_aborted = paused_aborted_;
    if (pause_mode_ == PauseMode::kKeep) {
      result.requests_kept =
          static_cast<int64_t>(scheduler_->num_running() + scheduler_->num_waiting());
    }
    const auto start = Clock::now();
    const WeightWriteStats written = write();
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.tensors_updated = written.tensors;
    result.bytes = written.bytes;
  } catch (...) {
    if (pause_here) resume();
    throw;
  }
  ++weights_version_;
  // Cached pages hold K/V of the old weights: the salt already keeps them from matching;
  // resetting also frees them at once.
  kv_cache_->reset_prefix_cache();
  result.weights_version = weights_version_;
  if (pause_here) resume();
  return result;
}

std::vector<ScoreOutput> Engine::score(const std::vector<std::vector<int32_t>>& sequences,
                                       const std::vector<int32_t>& prompt_lengths, int top_k,
                                       const std::string& lora) {
  PAGELLM_CHECK(!asleep_) << "score: the engine is asleep (sleep() released its KV cache): "
                             "call wake_up() first";
  PAGELLM_CHECK(prompt_lengths.empty() || prompt_lengths.size() == sequences.size())
      << "score: " << prompt_lengths.size() << " prompt lengths for " << sequences.size()
      << " sequences (give none, meaning 1 each, or one per sequence)";
  PAGELLM_CHECK(top_k >= 0 && top_k <= SamplingParams::kMaxLogprobs)
      << "score: top_k must be in [0, " << SamplingParams::kMaxLogprobs << "] (0: none), got "
      << top_k;
  {
    Sequence probe;
    const std::string error = attach_lora(probe, lora);
    PAGELLM_CHECK(error.empty()) << "score: " << error;
  }
  const int64_t vocab = runner_->model().config().vocab_size;
  const size_t n = sequences.size();
  std::vector<ScoreOutput> results(n);
  // Every sequence is checked before any work.
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& t = sequences[i];
    const int64_t size = static_cast<int64_t>(t.size());
    const int32_t prompt_length = prompt_lengths.empty() ? 1 : prompt_lengths[i];
    PAGELLM_CHECK(size >= 2) << "score: sequence " << i << " has " << size
                             << " tokens; a scored sequence needs at least 2 (the first token "
                                "has no log-probability)";
    PAGELLM_CHECK(size <= config_.max_model_len)
        << "score: sequence " << i << " has " << size << " tokens, longer than the context "
        << "(max_model_len " << config_.max_model_len << ")";
    PAGELLM_CHECK(prompt_length >= 1 && prompt_length < size)
        << "score: prompt length " << prompt_length << " of sequence " << i
        << " is outside [1, " << size - 1 << "] (its " << size << " tokens)";
    for (int64_t k = 0; k < size; ++k) {
      PAGELLM_CHECK(t[k] >= 0 && t[k] < vocab)
          << "score: token " << k << " of sequence " << i << " has id " << t[k]
          << ", outside the vocabulary [0, " << vocab << ")";
    }
    const int32_t pages = kv_cache_->pages_for(static_cast<int32_t>(size - 1));
    PAGELLM_CHECK(pages <= kv_cache_->num_usable_pages())
        << "score: sequence " << i << " needs " << pages << " KV pages, more than the cache's "
        << kv_cache_->num_usable_pages();
    ScoreOutput& r = results[i];
    r.token_ids = t;
    r.prompt_length = prompt_length;
    const size_t scored = static_cast<size_t>(size - prompt_length);
    r.logprobs.resize(scored);
    r.ranks.resize(scored);
    if (top_k > 0) r.top_logprobs.resize(scored);
  }

  // Groups of consecutive sequences that fit the free pages and rows at once; each group's
  // sequences advance together, a chunk each per forward, until all are computed.
  size_t next = 0;
  while (next < n) {
    std::vector<std::unique_ptr<Sequence>> group;
    std::vector<size_t> group_index;
    struct FreeOnExit {
      KvCacheManager& kv;
      std::vector<std::unique_ptr<Sequence>>& seqs;
      ~FreeOnExit() {
        for (auto& s : seqs) kv.free(*s);
      }
    } free_on_exit{*kv_cache_, group};
    while (next < n) {
      auto seq = std::make_unique<Sequence>();
      seq->id = -1 - static_cast<int64_t>(next);  // never an engine request id
      seq->prompt = sequences[next];
      seq->status = SequenceStatus::kRunning;
      attach_lora(*seq, lora);  // checked above; the adapter's slot and prefix-cache key
      // The last token is only scored, never fed: the K/V of size - 1 tokens.
      if (!kv_cache_->allocate(*seq, seq->num_tokens() - 1)) break;
      group.push_back(std::move(seq));
      group_index.push_back(next++);
    }
    PAGELLM_CHECK(!group.empty())
        << "score: sequence " << next << " needs "
        << kv_cache_->pages_for(static_cast<int32_t>(sequences[next].size() - 1))
        << " free KV pages and a free page-table row, but " << kv_cache_->num_free_pages()
        << " pages and " << kv_cache_->num_free_rows() << " rows are free while "
        << scheduler_->num_running() << " requests run; score when fewer run";

    for (;;) {
      SchedulerOutput out;
      std::vector<int32_t> indices;
      // Per logits row: (sequence of the group, position whose logits it holds).
      std::vector<std::pair<size_t, int32_t>> targets;
      int32_t tokens_left = runner_->max_forward_tokens();
      int32_t rows_left = runner_->max_logits_rows();
      for (size_t g = 0; g < group.size() && tokens_left > 0; ++g) {
        Sequence& seq = *group[g];
        const int32_t begin = seq.num_computed, end = seq.num_tokens() - 1;
        const int32_t first_row = results[group_index[g]].prompt_length - 1;
        if (begin >= end) continue;
        // Positions before first_row need no row; the others one each.
        const int32_t free_positions = std::max(0, first_row - begin);
        const int32_t count =
            std::min({end - begin, tokens_left, free_positions + rows_left});
        if (count <= 0) continue;
        const int32_t offset = out.num_tokens;
        for (int32_t p = std::max(begin, first_row); p < begin + count; ++p) {
          indices.push_back(offset + p - begin);
          targets.emplace_back(g, p);
        }
        out.scheduled.push_back(ScheduledSeq{&seq, count, false, {}});
        out.num_tokens += count;
        tokens_left -= count;
        rows_left -= std::max(0, begin + count - std::max(begin, first_row));
      }
      if (out.scheduled.empty()) break;
      if (tp_leader_) tp_leader_->throw_if_failed();
      Tensor logits;
      try {
        logits = runner_->forward_rows(out, kv_cache_->page_table(), indices);
      } catch (const std::exception& e) {
        if (tp_leader_) tp_leader_->mark_failed(e.what());
        throw;
      }
      for (const ScheduledSeq& s : out.scheduled) s.seq->num_computed += s.num_new_tokens;
      if (indices.empty()) continue;
      const std::vector<float> host = backend().download_f32(logits);
      const int64_t rows = static_cast<int64_t>(targets.size());
      std::vector<std::string> errors(targets.size());
#pragma omp parallel for schedule(dynamic, 4) if (rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const auto [g, position] = targets[static_cast<size_t>(r)];
        ScoreOutput& result = results[group_index[g]];
        try {
          const TokenScore s = score_token(host.data() + r * vocab, vocab,
                                           result.token_ids[static_cast<size_t>(position) + 1],
                                           top_k);
          const size_t k = static_cast<size_t>(position - (result.prompt_length - 1));
          result.logprobs[k] = s.logprob;
          result.ranks[k] = s.rank;
          if (top_k > 0) result.top_logprobs[k] = s.top;
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      }
      for (size_t r = 0; r < errors.size(); ++r) {
        PAGELLM_CHECK(errors[r].empty())
            << "score: sequence " << group_index[targets[r].first] << ", position "
            << targets[r].second << ": " << errors[r];
      }
    }
  }
  return results;
}

SleepReport Engine::sleep(const SleepOptions& options) {
  using Clock = std::chrono::steady_clock;
  refuse_tensor_parallel("sleep");
  PAGELLM_CHECK(!asleep_) << "sleep: the engine is already asleep (call wake_up() first)";
  PAGELLM_CHECK(!scheduler_->has_unfinished())
      << "sleep: " << scheduler_->num_waiting() << " waiting and " << scheduler_->num_running()
      << " running requests still need the KV cache; let them finish or abort them, then "
         "sleep";
  Backend& backend = runner_->backend();
  PAGELLM_CHECK(backend.supports_sleep())
      << "sleep: the " << backend.name() << " backend cannot release its memory";
  broadcast_staging_.release();  // a weight group's bucket memory (device memory for NCCL)
  // The pools' contents are discarded: no cached page may match after wake.
  kv_cache_->reset_prefix_cache();
  // Every page is free now (no request holds any), so discarding the pools loses nothing
  // that a sequence still needs.
  PAGELLM_ASSERT(kv_cache_->allocator().num_free() == kv_cache_->allocator().num_usable())
      << "pages still referenced with no unfinished request";
  const auto start = Clock::now();
  SleepReport report;
  report.free_memory_before = backend.free_memory();
  const BackendSleepResult released = backend.sleep(options.offload_weights);
  report.free_memory_after = backend.free_memory();
  report.kv_bytes_released = released.kv_bytes;
  report.weight_bytes_offloaded = released.weight_bytes;
  report.prepared_bytes_released = released.prepared_bytes;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  asleep_ = true;
  return report;
}

size_t Engine::recapture_graphs() {
  refuse_tensor_parallel("recapture_graphs");
  PAGELLM_CHECK(!asleep_) << "recapture_graphs: the engine is asleep (wake_up() first)";
  PAGELLM_CHECK(!scheduler_->has_unfinished())
      << "recapture_graphs: requests are running; call it between generations";
  return runner_->recapture_graphs();
}

WakeReport Engine::wake_up() {
  using Clock = std::chrono::steady_clock;
  PAGELLM_CHECK(asleep_) << "wake_up: the engine is awake (wake_up() only follows sleep())";
  const auto start = Clock::now();
  Backend& backend = runner_->backend();
  backend.wake();
  asleep_ = false;
  WakeReport report;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.free_memory_after = backend.free_memory();
  return report;
}

}  // namespace pagellm
