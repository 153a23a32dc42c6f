#include "pagellm/engine/engine.h"

#include <algorithm>
#include <chrono>

#include "pagellm/common/random.h"
#include "pagellm/engine/batch_builder.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {
Engine::Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
               const EngineConfig& config)
    : config_(config), backend_(std::move(backend)), model_(std::move(model)) {
  const Qwen3Config& mc = model_->config();
  backend_->set_attention_backend(config_.attention_backend);
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

  model_->reserve(config_.max_num_batched_tokens, config_.max_num_seqs);

  // KV pages: all layers' K and V for one page.
  const size_t page_bytes = 2 * static_cast<size_t>(mc.num_hidden_layers) *
                            mc.num_key_value_heads * config_.page_size * mc.head_dim *
                            dtype_size(backend_->kv_dtype());
  int64_t pages = config_.num_pages;
  if (pages <= 0) {
    size_t budget = config_.kv_cache_bytes;
    if (budget == 0) {
      const size_t free = backend_->free_memory();
      budget = backend_->name() == "cpu" ? std::min<size_t>(free / 4, size_t{4} << 30)
                                         : static_cast<size_t>(free * 0.9);
    }
    pages = static_cast<int64_t>(budget / page_bytes);
    // More than every sequence at full length is never useful.
    const int64_t most = 1 + int64_t{config_.max_num_seqs} * scheduler_config_.max_pages_per_seq;
    pages = std::min(pages, most);
  }
  if (config_.num_pages > 0) {
    PAGELLM_CHECK(pages >= 2) << "num_pages must be at least 2 (page 0 is reserved), got "
                              << pages;
  } else {
    PAGELLM_CHECK(pages >= 2) << "not enough memory for a KV cache: " << pages
                              << " pages of " << page_bytes << " bytes fit (need at least 2; "
                              << "lower the page size or free memory)";
  }
  PAGELLM_CHECK(pages <= (int64_t{1} << 31) / config_.page_size)
      << "too many KV pages (" << pages << ") for 32-bit slot numbers";
  allocate_kv(pages);

  allocator_ = std::make_unique<PageAllocator>(static_cast<int32_t>(num_pages_));
  page_table_ = std::make_unique<PageTable>(config_.max_num_seqs + 1,
                                            scheduler_config_.max_pages_per_seq);
  scheduler_ = std::make_unique<Scheduler>(scheduler_config_, *allocator_, *page_table_);
  if (config_.use_graphs && backend_->supports_graphs()) capture_graphs();
}

std::vector<int32_t> Engine::graph_buckets() const {
  std::vector<int32_t> b;
  for (const auto& [size, g] : graphs_) b.push_back(size);
  return b;
}

namespace {

// A decode batch of `rows` rows, each a padding row: token 0 at position 0, KV length 1,
// its slot in the reserved page 0 and the reserved page-table row (all zeros).
void append_padding_rows(ForwardBatch& b, int32_t rows) {
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t t = static_cast<int32_t>(b.token_ids.size());
    b.token_ids.push_back(0);
    b.positions.push_back(0);
    b.slot_mapping.push_back(0);
    b.query_start.push_back(t + 1);
    b.kv_lens.push_back(1);
    b.page_table.insert(b.page_table.end(), static_cast<size_t>(b.max_pages_per_seq), 0);
    b.logits_indices.push_back(t);
  }
}

}  // namespace

void Engine::capture_graphs() {
  std::vector<int32_t> buckets = config_.graph_buckets;
  if (buckets.empty()) {
    for (int32_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64}) buckets.push_back(b);
    for (int32_t b = 96; b <= config_.max_num_seqs + 31; b += 32) buckets.push_back(b);
  }
  const int32_t max_pages = scheduler_config_.max_pages_per_seq;
  backend_->reserve_batch(config_.max_num_batched_tokens, config_.max_num_seqs, max_pages,
                          config_.max_num_seqs);
  for (int32_t bucket : buckets) {
    if (bucket > config_.max_num_seqs) bucket = config_.max_num_seqs;
    if (bucket <= 0 || graphs_.count(bucket)) continue;
    ForwardBatch batch;
    batch.page_size = config_.page_size;
    batch.max_pages_per_seq = max_pages;
    batch.query_start.push_back(0);
    append_padding_rows(batch, bucket);
    batch.kv_len_capacity = config_.max_model_len;
    BatchTensors tensors = backend_->upload_batch(batch);
    model_->forward(tensors, kv_);  // warm-up: plans, workspaces, library handles
    backend_->synchronize();
    backend_->begin_capture();
    DecodeGraph g;
    g.logits = model_->forward(tensors, kv_);
    g.graph = backend_->end_capture();
    graphs_[bucket] = std::move(g);
  }
  backend_->synchronize();
}

Tensor Engine::run_forward(ForwardBatch& batch, bool pure_decode,
                           std::chrono::steady_clock::time_point step_start) {
  auto launched = [&] {
    stats_.host_gap_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
  };
  const int32_t rows = batch.num_seqs();
  if (pure_decode && !graphs_.empty()) {
    auto it = graphs_.lower_bound(rows);
    if (it != graphs_.end()) {
      append_padding_rows(batch, it->first - rows);
      batch.kv_len_capacity = config_.max_model_len;
      backend_->upload_batch(batch);
      launched();
      it->second.graph->replay();
      ++stats_.graph_steps;
      return it->second.logits.rows(0, rows);
    }
  }
  BatchTensors tensors = backend_->upload_batch(batch);
  launched();
  return model_->forward(tensors, kv_);
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(const std::string& model_dir, const EngineConfig& config,
                                       const ProgressFn& progress) {
  std::unique_ptr<Backend> backend = create_backend(config.backend);
  std::unique_ptr<Qwen3Model> model = Qwen3Model::load(*backend, model_dir, progress);
  return std::make_unique<Engine>(std::move(backend), std::move(model), config);
}

void Engine::allocate_kv(int64_t num_pages) {
  const Qwen3Config& mc = model_->config();
  num_pages_ = num_pages;
  const DType dt = backend_->kv_dtype();
  const int64_t Hkv = mc.num_key_value_heads, P = config_.page_size, D = mc.head_dim;
  const size_t bytes = static_cast<size_t>(num_pages * Hkv * P * D) * dtype_size(dt);
  kv_.resize(static_cast<size_t>(mc.num_hidden_layers));
  for (LayerKv& layer : kv_) {
    kv_storage_.emplace_back(backend_.get(), bytes);
    layer.k = kv_storage_.back().tensor(dt, {num_pages, Hkv, P, D});
    kv_storage_.emplace_back(backend_.get(), bytes);
    layer.v = kv_storage_.back().tensor(dt, {num_pages, Hkv, P, D});
    // Defined contents everywhere: page 0 is read by padding lanes.
    backend_->fill(layer.k, 0.0f);
    backend_->fill(layer.v, 0.0f);
  }
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
  const int64_t vocab = model_->config().vocab_size;
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
  const auto t_start = Clock::now();
  std::vector<int64_t> done;
  SchedulerOutput out = scheduler_->schedule();
  stats_.preemptions += static_cast<int64_t>(out.preempted.size());
  for (Sequence* s : out.finished) done.push_back(s->id);
  if (out.scheduled.empty()) {
    PAGELLM_ASSERT(!done.empty() || !scheduler_->has_unfinished())
        << "the scheduler made no progress with " << scheduler_->num_waiting()
        << " waiting and " << scheduler_->num_running() << " running requests";
    return done;
  }
  ForwardBatch batch = build_forward_batch(out, *page_table_, config_.page_size);
  bool pure_decode = true;
  for (const ScheduledSeq& s : out.scheduled) {
    pure_decode = pure_decode && s.num_new_tokens == 1 && s.samples;
    if (s.seq->num_computed + s.num_new_tokens > static_cast<int32_t>(s.seq->prompt.size())) {
      stats_.decode_tokens += s.num_new_tokens;
    } else {
      stats_.prefill_tokens += s.num_new_tokens;
    }
  }
  Tensor logits = run_forward(batch, pure_decode, t_start);
  std::vector<SamplingRow> rows = build_sampling_rows(out);
  if (logits_hook_) {
    const std::vector<float> host = backend_->download_f32(logits);
    const int64_t vocab = model_->config().vocab_size;
    size_t r = 0;
    for (const ScheduledSeq& s : out.scheduled) {
      if (!s.samples) continue;
      logits_hook_(s.seq->id, static_cast<int64_t>(s.seq->output.size()),
                   host.data() + r * vocab, vocab);
      ++r;
    }
  }
  std::vector<SampledToken> sampled = backend_->sample(logits, rows);
  const auto t_sampled = Clock::now();
  for (Sequence* s : scheduler_->on_step_done(out, sampled)) done.push_back(s->id);
  ++stats_.steps;
  stats_.host_gap_seconds += std::chrono::duration<double>(Clock::now() - t_sampled).count();
  return done;
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
