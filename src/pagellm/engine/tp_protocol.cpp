#include "pagellm/engine/tp_protocol.h"

#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"

namespace pagellm::tp {

Qwen3Config ModelSource::config() const {
  return model_dir.empty() ? preset_config(preset) : load_qwen3_config(model_dir);
}

std::unique_ptr<Qwen3Model> ModelSource::load(Backend& backend, const TensorParallel* parallel,
                                              const ProgressFn& progress) const {
  if (!model_dir.empty()) return Qwen3Model::load(backend, model_dir, progress, parallel);
  const Qwen3Config c = preset_config(preset);
  return std::make_unique<Qwen3Model>(backend, c, random_weight_lookup(c, seed, dtype), progress,
                                      parallel);
}

namespace {

void put_source(WireWriter& w, const ModelSource& s) {
  w.put_string(s.model_dir).put_string(s.preset).put<uint64_t>(s.seed);
  w.put<int32_t>(static_cast<int32_t>(s.dtype));
}

ModelSource get_source(WireReader& r) {
  ModelSource s;
  s.model_dir = r.get_string();
  s.preset = r.get_string();
  s.seed = r.get<uint64_t>();
  s.dtype = static_cast<DType>(r.get<int32_t>());
  return s;
}

}  // namespace

std::vector<uint8_t> encode(const WorkerSetup& s) {
  WireWriter w;
  put_source(w, s.source);
  w.put_string(s.backend).put<int32_t>(s.device).put_string(s.attention_backend);
  w.put<uint8_t>(s.batch_invariant ? 1 : 0).put_vector(s.communicator_id);
  w.put<int64_t>(s.timeout_ms);
  return w.bytes();
}

WorkerSetup decode_worker_setup(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "setup");
  WorkerSetup s;
  s.source = get_source(r);
  s.backend = r.get_string();
  s.device = r.get<int32_t>();
  s.attention_backend = r.get_string();
  s.batch_invariant = r.get<uint8_t>() != 0;
  s.communicator_id = r.get_vector<uint8_t>();
  s.timeout_ms = r.get<int64_t>();
  r.expect_end();
  return s;
}

std::vector<uint8_t> encode(const ModelRunnerConfig& c) {
  WireWriter w;
  w.put<int32_t>(c.page_size).put<int64_t>(c.num_pages).put<uint64_t>(c.kv_cache_bytes);
  w.put<int32_t>(c.max_num_seqs).put<int32_t>(c.max_num_batched_tokens);
  w.put<int32_t>(c.max_model_len).put<int32_t>(c.max_pages_per_seq);
  w.put<int32_t>(c.page_table_rows).put<uint8_t>(c.use_graphs ? 1 : 0);
  w.put_vector(c.graph_buckets).put<uint8_t>(c.persistent_page_table ? 1 : 0);
  return w.bytes();
}

ModelRunnerConfig decode_runner_config(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "runner config");
  ModelRunnerConfig c;
  c.page_size = r.get<int32_t>();
  c.num_pages = r.get<int64_t>();
  c.kv_cache_bytes = static_cast<size_t>(r.get<uint64_t>());
  c.max_num_seqs = r.get<int32_t>();
  c.max_num_batched_tokens = r.get<int32_t>();
  c.max_model_len = r.get<int32_t>();
  c.max_pages_per_seq = r.get<int32_t>();
  c.page_table_rows = r.get<int32_t>();
  c.use_graphs = r.get<uint8_t>() != 0;
  c.graph_buckets = r.get_vector<int32_t>();
  c.persistent_page_table = r.get<uint8_t>() != 0;
  r.expect_end();
  return c;
}

std::vector<uint8_t> encode_forward(const ForwardBatch& b, int32_t graph_bucket) {
  static_assert(sizeof(PageTableUpdate) == 3 * sizeof(int32_t), "PageTableUpdate is 3 int32");
  WireWriter w;
  w.put<int32_t>(graph_bucket).put<int32_t>(b.page_size).put<int32_t>(b.max_pages_per_seq);
  w.put_vector(b.token_ids).put_vector(b.positions).put_vector(b.slot_mapping);
  w.put_vector(b.query_start).put_vector(b.kv_lens).put_vector(b.page_table);
  w.put_vector(b.seq_slots).put<int32_t>(b.page_table_rows).put_vector(b.page_table_updates);
  w.put_vector(b.page_table_values).put_vector(b.logits_indices).put_vector(b.lora_slots);
  w.put<int32_t>(b.kv_len_capacity);
  w.put_vector(b.shared_prefix_group).put_vector(b.shared_prefix_tokens);
  return w.bytes();
}

ForwardBatch decode_forward(const std::vector<uint8_t>& bytes, int32_t* graph_bucket) {
  WireReader r(bytes, "forward");
  ForwardBatch b;
  *graph_bucket = r.get<int32_t>();
  b.page_size = r.get<int32_t>();
  b.max_pages_per_seq = r.get<int32_t>();
  b.token_ids = r.get_vector<int32_t>();
  b.positions = r.get_vector<int32_t>();
  b.slot_mapping = r.get_vector<int32_t>();
  b.query_start = r.get_vector<int32_t>();
  b.kv_lens = r.get_vector<int32_t>();
  b.page_table = r.get_vector<int32_t>();
  b.seq_slots = r.get_vector<int32_t>();
  b.page_table_rows = r.get<int32_t>();
  b.page_table_updates = r.get_vector<PageTableUpdate>();
  b.page_table_values = r.get_vector<int32_t>();
  b.logits_indices = r.get_vector<int32_t>();
  b.lora_slots = r.get_vector<int32_t>();
  b.kv_len_capacity = r.get<int32_t>();
  b.shared_prefix_group = r.get_vector<int32_t>();
  b.shared_prefix_tokens = r.get_vector<int32_t>();
  r.expect_end();
  return b;
}

std::vector<uint8_t> encode_page_copies(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  std::vector<int32_t> flat;
  for (const auto& [src, dst] : pairs) {
    flat.push_back(src);
    flat.push_back(dst);
  }
  WireWriter w;
  w.put_vector(flat);
  return w.bytes();
}

std::vector<std::pair<int32_t, int32_t>> decode_page_copies(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "copy pages");
  const std::vector<int32_t> flat = r.get_vector<int32_t>();
  r.expect_end();
  PAGELLM_CHECK(flat.size() % 2 == 0)
      << "malformed copy pages message: " << flat.size() << " page numbers, not pairs";
  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (size_t i = 0; i < flat.size(); i += 2) pairs.emplace_back(flat[i], flat[i + 1]);
  return pairs;
}

std::vector<uint8_t> encode_load_weights(const std::string& path) {
  WireWriter w;
  w.put_string(path);
  return w.bytes();
}

std::string decode_load_weights(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "load weights");
  std::string path = r.get_string();
  r.expect_end();
  return path;
}

std::vector<uint8_t> encode(const WeightGroupSpec& spec) {
  WireWriter w;
  w.put_string(spec.transport).put_vector(spec.nccl_unique_id).put_string(spec.address);
  w.put<int32_t>(spec.rank).put<int32_t>(spec.world_size).put_string(spec.name);
  w.put<double>(spec.timeout_seconds);
  return w.bytes();
}

WeightGroupSpec decode_weight_group_spec(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "weight group spec");
  WeightGroupSpec spec;
  spec.transport = r.get_string();
  spec.nccl_unique_id = r.get_vector<uint8_t>();
  spec.address = r.get_string();
  spec.rank = r.get<int32_t>();
  spec.world_size = r.get<int32_t>();
  spec.name = r.get_string();
  spec.timeout_seconds = r.get<double>();
  r.expect_end();
  return spec;
}

std::vector<uint8_t> encode(const BroadcastOp& op) {
  WireWriter w;
  w.put<uint64_t>(op.update).put<uint8_t>(op.drain ? 1 : 0).put<uint64_t>(op.bucket_bytes);
  w.put<uint64_t>(op.tensors.size());
  for (const BroadcastTensor& t : op.tensors) {
    w.put_string(t.name).put<uint8_t>(static_cast<uint8_t>(t.dtype)).put_vector(t.shape);
  }
  return w.bytes();
}

BroadcastOp decode_broadcast_op(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "broadcast weights");
  BroadcastOp op;
  op.update = r.get<uint64_t>();
  op.drain = r.get<uint8_t>() != 0;
  op.bucket_bytes = r.get<uint64_t>();
  const uint64_t n = r.get<uint64_t>();
  PAGELLM_CHECK(n <= bytes.size()) << "broadcast weights: " << n << " tensors in "
                                   << bytes.size() << " bytes";
  op.tensors.resize(static_cast<size_t>(n));
  for (BroadcastTensor& t : op.tensors) {
    t.name = r.get_string();
    t.dtype = static_cast<TensorDType>(r.get<uint8_t>());
    t.shape = r.get_vector<int64_t>();
  }
  r.expect_end();
  return op;
}

std::vector<uint8_t> encode(const WeightsDone& done) {
  WireWriter w;
  w.put_string(done.error).put<uint8_t>(done.changed ? 1 : 0).put<int64_t>(done.tensors);
  w.put<uint64_t>(done.bytes).put<uint64_t>(done.buckets);
  return w.bytes();
}

WeightsDone decode_weights_done(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "weights done");
  WeightsDone done;
  done.error = r.get_string();
  done.changed = r.get<uint8_t>() != 0;
  done.tensors = r.get<int64_t>();
  done.bytes = r.get<uint64_t>();
  done.buckets = r.get<uint64_t>();
  r.expect_end();
  return done;
}

std::string message_name(uint32_t type) {
  switch (type) {
    case kHello: return "hello";
    case kWelcome: return "welcome";
    case kSetup: return "setup";
    case kBackendUp: return "backend up";
    case kRunnerConfig: return "runner config";
    case kPages: return "pages";
    case kPagesAgreed: return "pages agreed";
    case kReady: return "ready";
    case kCopyPages: return "copy pages";
    case kForward: return "forward";
    case kShutdown: return "shutdown";
    case kJoinWeightGroup: return "join weight group";
    case kLeaveWeightGroup: return "leave weight group";
    case kLoadWeights: return "load weights";
    case kBroadcastWeights: return "broadcast weights";
    case kWeightsDone: return "weights done";
    case kFrameAbort: return "abort";
    default: return "message " + std::to_string(type);
  }
}

}  // namespace pagellm::tp
