#include "pagellm/engine/model_runner.h"

#include <algorithm>

#include "pagellm/engine/batch_builder.h"

namespace pagellm {

ModelRunner::ModelRunner(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
                         const ModelRunnerConfig& config, RunnerGroup group)
    : config_(config),
      backend_(std::move(backend)),
      comm_(std::move(group.comm)),
      mirror_(group.mirror),
      model_(std::move(model)) {
  persistent_ = config_.persistent_page_table && backend_->supports_persistent_page_table();
  model_->reserve(config_.max_num_batched_tokens, config_.max_num_seqs);
  const int64_t pages = size_kv_cache();
  allocate_kv(group.agree_num_pages ? group.agree_num_pages(pages) : pages);
  if (config_.use_graphs && backend_->supports_graphs()) capture_graphs();
}

ModelRunner::~ModelRunner() = default;

int64_t ModelRunner::size_kv_cache() const {
  const Qwen3Config& mc = model_->config();
  // KV pages: all layers' K and V for one page, of this rank's KV heads (tensor parallel:
  // model_->shard().kv_heads; all of them for one rank).
  const size_t page_bytes = 2 * static_cast<size_t>(mc.num_hidden_layers) *
                            model_->shard().kv_heads * config_.page_size * mc.head_dim *
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
    const int64_t most = 1 + int64_t{config_.max_num_seqs} * config_.max_pages_per_seq;
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
  return pages;
}

void ModelRunner::allocate_kv(int64_t num_pages) {
  const Qwen3Config& mc = model_->config();
  num_pages_ = num_pages;
  const DType dt = backend_->kv_dtype();
  const int64_t Hkv = model_->shard().kv_heads, P = config_.page_size, D = mc.head_dim;
  const size_t bytes = static_cast<size_t>(num_pages * Hkv * P * D) * dtype_size(dt);
  kv_.resize(static_cast<size_t>(mc.num_hidden_layers));
  for (LayerKv& layer : kv_) {
    // kKvCache: Backend::sleep may release them (their contents are zeros after wake).
    kv_storage_.emplace_back(backend_.get(), bytes, MemoryRole::kKvCache);
    layer.k = kv_storage_.back().tensor(dt, {num_pages, Hkv, P, D});
    kv_storage_.emplace_back(backend_.get(), bytes, MemoryRole::kKvCache);
    layer.v = kv_storage_.back().tensor(dt, {num_pages, Hkv, P, D});
    // Defined contents everywhere: page 0 is read by padding lanes.
    backend_->fill(layer.k, 0.0f);
    backend_->fill(layer.v, 0.0f);
  }
}

std::vector<int32_t> ModelRunner::graph_buckets() const {
  std::vector<int32_t> b;
  for (const auto& [size, g] : graphs_) b.push_back(size);
  return b;
}

size_t ModelRunner::recapture_graphs() {
  if (graphs_.empty()) return 0;
  graphs_.clear();
  lora_graphs_.clear();
  capture_graphs();
  return graphs_.size();
}

void ModelRunner::append_padding_rows(ForwardBatch& b, int32_t rows) const {
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t t = static_cast<int32_t>(b.token_ids.size());
    b.token_ids.push_back(0);
    b.positions.push_back(0);
    b.slot_mapping.push_back(0);
    b.query_start.push_back(t + 1);
    b.kv_lens.push_back(1);
    if (persistent_) {
      b.seq_slots.push_back(0);
    } else {
      b.page_table.insert(b.page_table.end(), static_cast<size_t>(b.max_pages_per_seq), 0);
    }
    b.logits_indices.push_back(t);
    if (!b.lora_slots.empty()) b.lora_slots.push_back(0);
    if (!b.shared_prefix_group.empty()) {
      b.shared_prefix_group.push_back(static_cast<int32_t>(b.shared_prefix_group.size()));
      b.shared_prefix_tokens.push_back(0);
    }
  }
}

void ModelRunner::capture_graphs() {
  std::vector<int32_t> buckets = config_.graph_buckets;
  if (buckets.empty()) {
    for (int32_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64}) buckets.push_back(b);
    for (int32_t b = 96; b <= config_.max_num_seqs + 31; b += 32) buckets.push_back(b);
  }
  backend_->reserve_batch(config_.max_num_batched_tokens, config_.max_num_seqs,
                          config_.max_pages_per_seq, config_.max_num_seqs);
  for (int32_t bucket : buckets) {
    if (bucket > config_.max_num_seqs) bucket = config_.max_num_seqs;
    if (bucket <= 0 || graphs_.count(bucket)) continue;
    capture_graph(bucket, /*lora=*/false);
  }
  backend_->synchronize();
}

void ModelRunner::capture_graph(int32_t bucket, bool lora) {
  // Padding rows only: on the persistent path the first upload also makes the backend's
  // table (all zeros, like the engine's), before any capture.
  ForwardBatch batch;
  batch.page_size = config_.page_size;
  batch.max_pages_per_seq = config_.max_pages_per_seq;
  if (persistent_) batch.page_table_rows = config_.page_table_rows;
  batch.query_start.push_back(0);
  append_padding_rows(batch, bucket);
  if (lora) batch.lora_slots.assign(static_cast<size_t>(bucket), 0);
  batch.kv_len_capacity = config_.max_model_len;
  BatchTensors tensors = backend_->upload_batch(batch);
  model_->forward(tensors, kv_);  // warm-up: plans, workspaces, library handles
  backend_->synchronize();
  backend_->begin_capture();
  DecodeGraph g;
  g.logits = model_->forward(tensors, kv_);
  g.graph = backend_->end_capture();
  (lora ? lora_graphs_ : graphs_)[bucket] = std::move(g);
}

Tensor ModelRunner::forward(ForwardBatch& batch, bool pure_decode, StepResult* result,
                            const Feed* feed) {
  const int32_t rows = batch.num_seqs();
  // Steps with an adapter replay the LoRA graph of their bucket (the same buckets),
  // captured here the first time one is needed.
  const bool lora = !batch.lora_slots.empty();
  std::map<int32_t, DecodeGraph>& graphs = lora ? lora_graphs_ : graphs_;
  auto graph = graphs.end();
  if (pure_decode) {
    const auto bucket = graphs_.lower_bound(rows);
    if (bucket != graphs_.end()) {
      if (lora && !lora_graphs_.count(bucket->first)) capture_graph(bucket->first, true);
      graph = graphs.find(bucket->first);
    }
  }
  int32_t bucket = 0;
  if (graph != graphs.end()) {
    bucket = graph->first;
    append_padding_rows(batch, bucket - rows);
    batch.kv_len_capacity = config_.max_model_len;
  }
  result->page_table_entries = static_cast<int64_t>(
      persistent_ ? batch.page_table_values.size() : batch.page_table.size());
  if (mirror_ != nullptr) mirror_->forward(batch, bucket);
  return run_forward(batch, bucket, rows, result, feed);
}

Tensor ModelRunner::run_forward(const ForwardBatch& batch, int32_t graph_bucket, int32_t rows,
                                StepResult* result, const Feed* feed) {
  try {
    BatchTensors tensors = backend_->upload_batch(batch);
    if (feed != nullptr) {
      backend_->feed_sampled_tokens(*feed->from, feed->src_rows, tensors.token_ids);
    }
    if (result != nullptr) result->launched = std::chrono::steady_clock::now();
    if (graph_bucket == 0) return model_->forward(tensors, kv_);
    std::map<int32_t, DecodeGraph>& graphs = batch.lora_slots.empty() ? graphs_ : lora_graphs_;
    const auto graph = graphs.find(graph_bucket);
    PAGELLM_CHECK(graph != graphs.end())
        << "no decode graph of " << graph_bucket << " rows was captured on this rank "
        << "(the tensor-parallel ranks were built with different settings)";
    graph->second.graph->replay();
    if (result != nullptr) result->replayed_graph = true;
    return graph->second.logits.rows(0, rows);
  } catch (const std::exception& e) {
    if (comm_ != nullptr) comm_->abort(std::string("its forward failed: ") + e.what());
    throw;
  }
}

void ModelRunner::follow_copy_kv_pages(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  backend_->copy_kv_pages(kv_, src_dst);
}

void ModelRunner::follow_forward(const ForwardBatch& batch, int32_t graph_bucket) {
  run_forward(batch, graph_bucket, batch.num_seqs(), nullptr);
}

ModelRunner::StepResult ModelRunner::run(const SchedulerOutput& out, PageTable& page_table) {
  PAGELLM_CHECK(!out.scheduled.empty()) << "ModelRunner::run() needs a non-empty step";
  StepResult result;
  ForwardBatch batch = build_batch(out, page_table);
  const bool pure_decode = out.pure_decode();
  // Copy-on-write of pages shared after a fan-out, before the forward writes into them.
  if (!out.page_copies.empty()) {
    if (mirror_ != nullptr) mirror_->copy_kv_pages(out.page_copies);
    backend_->copy_kv_pages(kv_, out.page_copies);
  }
  Tensor logits = forward(batch, pure_decode, &result);
  if (logits_hook_) {
    const std::vector<float> host = backend_->download_f32(logits);
    const int64_t vocab = model_->config().vocab_size;
    size_t r = 0;
    for (const ScheduledSeq& s : out.scheduled) {
      if (!s.samples) continue;
      logits_hook_(s.seq->id, static_cast<int64_t>(s.seq->output.size()),
                   host.data() + r * vocab, vocab);
      ++r;
      for (const Sequence* sample : s.fan_out) {
        logits_hook_(sample->id, 0, host.data() + r * vocab, vocab);
        ++r;
      }
    }
  }
  const std::vector<SamplingRow> rows = build_sampling_rows(out);
  result.sampled = backend_->sample(logits, rows);
  add_top_logprobs_rows(logits, rows, result.sampled);
  result.sampled_at = std::chrono::steady_clock::now();
  return result;
}

ForwardBatch ModelRunner::build_batch(const SchedulerOutput& out, PageTable& page_table) const {
  const int32_t shared_min = backend_->shared_prefix_min_seqs();
  return persistent_
             ? build_persistent_forward_batch(out, page_table, config_.page_size, shared_min)
             : build_forward_batch(out, page_table, config_.page_size, shared_min);
}

ModelRunner::InFlight ModelRunner::launch(SchedulerOutput out, PageTable& page_table,
                                          const InFlight* previous) {
  PAGELLM_CHECK(!out.scheduled.empty()) << "ModelRunner::launch() needs a non-empty step";
  PAGELLM_CHECK(mirror_ == nullptr && !logits_hook_)
      << "ModelRunner::launch(): a step whose logits leave the device (a logits hook, a "
         "tensor-parallel group) runs with run()";
  const std::vector<SamplingRow> rows = build_sampling_rows(out);
  for (const SamplingRow& row : rows) {
    PAGELLM_CHECK(row.params->logprobs <= 0)
        << "ModelRunner::launch(): top-k log-probabilities need the logits on the host; "
           "the step runs with run()";
  }
  InFlight step;
  ForwardBatch batch = build_batch(out, page_table);
  const bool pure_decode = out.pure_decode();
  Feed feed;
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.ahead == 0) continue;
    // Fed tokens are the batch's first ones: every entry of a step planned ahead is fed.
    PAGELLM_CHECK(previous != nullptr && s.ahead == 1 && s.num_new_tokens == 1 &&
                  s.fed_from >= 0 && s.fed_from < previous->ticket.rows &&
                  feed.src_rows.size() == static_cast<size_t>(&s - out.scheduled.data()))
        << "ModelRunner::launch(): request " << s.seq->id
        << " is planned ahead without the step in flight that samples its input";
    feed.src_rows.push_back(s.fed_from);
  }
  feed.from = previous != nullptr ? &previous->ticket : nullptr;
  if (!out.page_copies.empty()) backend_->copy_kv_pages(kv_, out.page_copies);
  Tensor logits =
      forward(batch, pure_decode, &step.result, feed.src_rows.empty() ? nullptr : &feed);
  step.ticket = backend_->sample_async(logits, rows);
  step.out = std::move(out);
  return step;
}

ModelRunner::StepResult ModelRunner::finish(InFlight& step) {
  StepResult result = step.result;
  result.sampled = backend_->wait_sampled(step.ticket);
  result.sampled_at = std::chrono::steady_clock::now();
  return result;
}

Tensor ModelRunner::forward_rows(const SchedulerOutput& out, PageTable& page_table,
                                 const std::vector<int32_t>& logits_indices) {
  PAGELLM_CHECK(!out.scheduled.empty()) << "ModelRunner::forward_rows() needs a non-empty step";
  PAGELLM_CHECK(static_cast<int64_t>(logits_indices.size()) <= max_logits_rows())
      << "forward_rows: " << logits_indices.size() << " logits rows, more than the reserved "
      << max_logits_rows();
  ForwardBatch batch = build_batch(out, page_table);
  for (int32_t i : logits_indices)
    PAGELLM_CHECK(i >= 0 && i < batch.num_tokens())
        << "forward_rows: logits index " << i << " outside the batch's " << batch.num_tokens()
        << " tokens";
  batch.logits_indices = logits_indices;
  StepResult unused;
  return forward(batch, /*pure_decode=*/false, &unused);
}

void ModelRunner::add_top_logprobs_rows(const Tensor& logits, const std::vector<SamplingRow>& rows,
                                        std::vector<SampledToken>& sampled) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<float> host;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].params->logprobs <= 0) continue;
    // Only the rows that ask: V floats each (600 KB at V = 151,936) over the device link.
    host.resize(static_cast<size_t>(vocab));
    backend_->copy_to_host(host.data(), logits.rows(static_cast<int64_t>(r), 1).data,
                           host.size() * sizeof(float));
    add_top_logprobs(host.data(), vocab, rows[r], top_logprobs_workspace_, sampled[r]);
  }
}

}  // namespace pagellm
