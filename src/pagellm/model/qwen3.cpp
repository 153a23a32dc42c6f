#include "pagellm/model/qwen3.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "pagellm/model/lora_image.h"

namespace pagellm {
namespace {

std::string layer_name(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

// The name under which tp_shard_lookup serves a rank's vocabulary rows of the output
// projection (lm_head.weight, or the embedding of a tied model).
constexpr const char* kTpLmHeadShard = "pagellm.tensor_parallel.lm_head_shard";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `lookup` narrowed to `shard`'s share of each tensor (TpShard's split): rows of a row-major
// [rows, cols] tensor are served in place, columns are gathered into one host buffer the
// returned lookup keeps until its next gather (the constructor uploads each tensor, and
// Backend::upload has read its source, before it looks up the next). A tensor whose shape
// is not the config's comes back whole, so that the caller's shape check names it.
WeightLookup tp_shard_lookup(const WeightLookup& lookup, const Qwen3Config& c,
                             const TpShard& shard) {
  if (shard.size == 1) return lookup;
  auto gathered = std::make_shared<std::vector<uint8_t>>();
  return [lookup, c, shard, gathered](const std::string& name) -> WeightView {
    const int64_t D = c.head_dim;
    auto rows = [](WeightView w, int64_t full_rows, int64_t begin, int64_t count) {
      if (w.shape.size() != 2 || w.shape[0] != full_rows) return w;
      const int64_t cols = w.shape[1];
      w.data = static_cast<const uint8_t*>(w.data) +
               static_cast<size_t>(begin * cols) * dtype_size(w.dtype);
      w.shape = {count, cols};
      return w;
    };
    auto columns = [&gathered](WeightView w, int64_t full_cols, int64_t begin, int64_t count) {
      if (w.shape.size() != 2 || w.shape[1] != full_cols) return w;
      const int64_t R = w.shape[0];
      const size_t e = dtype_size(w.dtype);
      std::vector<uint8_t>& out = *gathered;
      out.resize(static_cast<size_t>(R * count) * e);
      const auto* src = static_cast<const uint8_t*>(w.data);
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(out.data() + static_cast<size_t>(r * count) * e,
                    src + static_cast<size_t>(r * full_cols + begin) * e,
                    static_cast<size_t>(count) * e);
      }
      w.data = out.data();
      w.shape = {R, count};
      return w;
    };
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const int64_t I = c.intermediate_size;
    if (name == kTpLmHeadShard) {
      const WeightView full =
          lookup(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
      return rows(full, c.vocab_size, shard.vocab_begin, shard.vocab);
    }
    if (ends_with(name, ".self_attn.q_proj.weight")) {
      return rows(lookup(name), Hq * D, shard.q_head_begin * D, shard.q_heads * D);
    }
    if (ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.v_proj.weight")) {
      return rows(lookup(name), Hkv * D, shard.kv_head_begin * D, shard.kv_heads * D);
    }
    if (ends_with(name, ".self_attn.o_proj.weight")) {
      return columns(lookup(name), Hq * D, shard.q_head_begin * D, shard.q_heads * D);
    }
    if (ends_with(name, ".mlp.gate_proj.weight") || ends_with(name, ".mlp.up_proj.weight")) {
      return rows(lookup(name), I, shard.inter_begin, shard.inter);
    }
    if (ends_with(name, ".mlp.down_proj.weight")) {
      return columns(lookup(name), I, shard.inter_begin, shard.inter);
    }
    return lookup(name);  // embeddings and norms: replicated
  };
}

}  // namespace

void Qwen3Model::check_single_rank(const char* what) const {
  PAGELLM_CHECK(shard_.size == 1) << what << " is not available with tensor parallelism yet "
                                  << "(this model is rank " << shard_.rank << " of "
                                  << shard_.size << ")";
}

Qwen3Model::Qwen3Model(Backend& backend, const Qwen3Config& config,
                       const WeightLookup& full_lookup, const ProgressFn& progress,
                       const TensorParallel* parallel)
    : backend_(backend),
      config_(config),
      shard_(parallel != nullptr ? parallel->shard : plan_tensor_parallel(config, 1, 0)),
      comm_(parallel != nullptr ? parallel->comm : nullptr) {
  const Qwen3Config& c = config_;
  PAGELLM_CHECK(parallel == nullptr ||
                (comm_ != nullptr && comm_->size() == shard_.size && comm_->rank() == shard_.rank))
      << "Qwen3Model: tensor-parallel rank " << shard_.rank << " of " << shard_.size
      << " needs a communicator of that rank and size";
  const int64_t H = c.hidden_size, D = c.head_dim, I = shard_.inter;
  const int64_t V = c.vocab_size;
  const int64_t q_size = shard_.q_heads * D, kv_size = shard_.kv_heads * D;
  bytes_total_ = static_cast<size_t>(c.num_parameters()) * dtype_size(backend.weight_dtype()) /
                 static_cast<size_t>(shard_.size);
  // The rank's share of each tensor (the whole tensor for one rank).
  const WeightLookup lookup = tp_shard_lookup(full_lookup, c, shard_);

  embed_ = upload_weight(lookup, "model.embed_tokens.weight", {V, H}, progress);
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Qwen3LayerWeights& w = layers_[static_cast<size_t>(l)];
    w.input_norm = upload_weight(lookup, layer_name(l, "input_layernorm.weight"), {H}, progress);
    w.qkv = alloc(backend.weight_dtype(), {q_size + 2 * kv_size, H});
    upload_rows_into(w.qkv, 0, lookup, layer_name(l, "self_attn.q_proj.weight"), q_size, H,
                     progress);
    upload_rows_into(w.qkv, q_size, lookup, layer_name(l, "self_attn.k_proj.weight"), kv_size,
                     H, progress);
    upload_rows_into(w.qkv, q_size + kv_size, lookup, layer_name(l, "self_attn.v_proj.weight"),
                     kv_size, H, progress);
    w.q_norm = upload_weight(lookup, layer_name(l, "self_attn.q_norm.weight"), {D}, progress);
    w.k_norm = upload_weight(lookup, layer_name(l, "self_attn.k_norm.weight"), {D}, progress);
    w.o_proj = upload_weight(lookup, layer_name(l, "self_attn.o_proj.weight"), {H, q_size},
                             progress);
    w.post_norm = upload_weight(lookup, layer_name(l, "post_attention_layernorm.weight"), {H},
                                progress);
    w.gate_up = alloc(backend.weight_dtype(), {2 * I, H});
    upload_rows_into(w.gate_up, 0, lookup, layer_name(l, "mlp.gate_proj.weight"), I, H, progress);
    upload_rows_into(w.gate_up, I, lookup, layer_name(l, "mlp.up_proj.weight"), I, H, progress);
    w.down = upload_weight(lookup, layer_name(l, "mlp.down_proj.weight"), {H, I}, progress);
  }
  final_norm_ = upload_weight(lookup, "model.norm.weight", {H}, progress);
  if (shard_.size > 1) {
    // The rank's vocabulary rows of lm_head (of the embedding when tied).
    lm_head_ = upload_weight(lookup, kTpLmHeadShard, {shard_.vocab, H}, progress);
  } else {
    lm_head_ = c.tie_word_embeddings ? embed_
                                     : upload_weight(lookup, "lm_head.weight", {V, H}, progress);
  }
  // The layers' products may get a decode layout from the backend. lm_head is left alone:
  // its one product a step already streams at the copy rate (docs/design.md).
  for (const auto& [w, gated_inter] : prepared_matrices()) {
    prepared_bytes_ += backend_.prepare_matrix(w, gated_inter);
  }
  backend_.synchronize();
}

std::vector<std::pair<Tensor, int64_t>> Qwen3Model::prepared_matrices() const {
  std::vector<std::pair<Tensor, int64_t>> out;
  for (const Qwen3LayerWeights& w : layers_) {
    out.emplace_back(w.qkv, 0);
    out.emplace_back(w.o_proj, 0);
    out.emplace_back(w.gate_up, shard_.inter);
    out.emplace_back(w.down, 0);
  }
  return out;
}

Tensor Qwen3Model::alloc(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor probe(nullptr, dtype, dims);
  // Weights: Backend::sleep may offload them to host memory and restore them.
  storage_.emplace_back(&backend_, probe.nbytes(), MemoryRole::kWeights);
  weight_bytes_ += probe.nbytes();
  return storage_.back().tensor(dtype, dims);
}

void Qwen3Model::upload_rows_into(Tensor& dst, int64_t row_offset, const WeightLookup& lookup,
                                  const std::string& name, int64_t rows, int64_t cols,
                                  const ProgressFn& progress) {
  WeightView w = lookup(name);
  PAGELLM_CHECK(w.shape.size() == (cols == 0 ? 1u : 2u) &&
                w.shape[0] == rows && (cols == 0 || w.shape[1] == cols))
      << "weight " << name << " has the wrong shape for this config";
  const int64_t n = rows * (cols == 0 ? 1 : cols);
  backend_.upload(dst, row_offset * (cols == 0 ? 1 : cols), w.data, w.dtype, n);
  bytes_done_ += static_cast<size_t>(n) * dtype_size(backend_.weight_dtype());
  if (progress) progress(bytes_done_, bytes_total_);
}

Tensor Qwen3Model::upload_weight(const WeightLookup& lookup, const std::string& name,
                                 std::initializer_list<int64_t> dims, const ProgressFn& progress) {
  Tensor t = alloc(backend_.weight_dtype(), dims);
  const int64_t rows = t.shape[0];
  const int64_t cols = t.ndim == 1 ? 0 : t.shape[1];
  upload_rows_into(t, 0, lookup, name, rows, cols, progress);
  return t;
}

AttentionShape Qwen3Model::attention_shape(int64_t page_size) const {
  AttentionShape s;
  s.num_q_heads = shard_.q_heads;
  s.num_kv_heads = shard_.kv_heads;
  s.head_dim = config_.head_dim;
  s.page_size = page_size;
  s.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return s;
}

size_t Qwen3Model::enable_float32_head() {
  check_single_rank("the float32 head");
  if (float32_head_) {
    // Again after a weight update: rewrite the copies in place (same addresses), widening
    // on the device (write_weights converts a device source to the destination's dtype).
    for (auto [src, dst] : {std::pair<const Tensor*, Tensor*>{&final_norm_, &final_norm_f32_},
                            {&lm_head_, &lm_head_f32_}}) {
      backend_.write_weights(*dst, 0, src->data, src->dtype, src->numel(), TensorMemory::kDevice);
    }
    backend_.synchronize();
    return 0;
  }
  if (backend_.activation_dtype() == DType::F32 && backend_.weight_dtype() == DType::F32) {
    return 0;  // float32 throughout already
  }
  PAGELLM_CHECK(max_rows_ == 0) << "enable_float32_head: first call before reserve()";
  size_t bytes = 0;
  auto widen = [&](const Tensor& src) {
    std::vector<float> host = backend_.download_f32(src);
    Tensor probe(nullptr, DType::F32, {src.numel()});
    head_storage_.emplace_back(&backend_, probe.nbytes());
    bytes += probe.nbytes();
    Tensor dst = src.ndim == 1
                     ? head_storage_.back().tensor(DType::F32, {src.size(0)})
                     : head_storage_.back().tensor(DType::F32, {src.size(0), src.size(1)});
    backend_.upload(dst, 0, host.data(), DType::F32, src.numel());
    return dst;
  };
  final_norm_f32_ = widen(final_norm_);
  lm_head_f32_ = widen(lm_head_);
  backend_.synchronize();
  float32_head_ = true;
  return bytes;
}

void Qwen3Model::reserve(int32_t max_tokens, int32_t max_rows) {
  if (max_tokens <= max_tokens_ && max_rows <= max_rows_) return;
  max_tokens = std::max(max_tokens, max_tokens_);
  max_rows = std::max(max_rows, max_rows_);
  workspace_storage_.clear();
  const Qwen3Config& c = config_;
  const DType act = backend_.activation_dtype();
  auto make = [&](DType dtype, std::initializer_list<int64_t> dims) {
    Tensor probe(nullptr, dtype, dims);
    workspace_storage_.emplace_back(&backend_, probe.nbytes());
    return workspace_storage_.back().tensor(dtype, dims);
  };
  const int64_t T = max_tokens;
  ws_.residual = make(act, {T, c.hidden_size});
  ws_.hidden = make(act, {T, c.hidden_size});
  const int64_t q_size = shard_.q_heads * c.head_dim, kv_size = shard_.kv_heads * c.head_dim;
  ws_.qkv = make(act, {T, q_size + 2 * kv_size});
  ws_.q = make(act, {T, shard_.q_heads, c.head_dim});
  ws_.attn = make(act, {T, q_size});
  ws_.proj = make(act, {T, c.hidden_size});
  ws_.gate_up = make(act, {T, 2 * shard_.inter});
  ws_.act = make(act, {T, shard_.inter});
  ws_.rows = make(act, {max_rows, c.hidden_size});
  ws_.logits = make(DType::F32, {max_rows, c.vocab_size});
  if (comm_ != nullptr) ws_.logits_part = make(DType::F32, {max_rows, shard_.vocab});
  if (float32_head_) ws_.rows_f32 = make(DType::F32, {max_rows, c.hidden_size});
  max_tokens_ = max_tokens;
  max_rows_ = max_rows;
}

Tensor Qwen3Model::forward(const BatchTensors& batch, std::vector<LayerKv>& kv) {
  const Qwen3Config& c = config_;
  const int64_t T = batch.token_ids.numel();
  const int64_t R = batch.logits_indices.numel();
  PAGELLM_CHECK(T > 0 && T <= max_tokens_ && R <= max_rows_)
      << "forward: step of " << T << " tokens / " << R << " logits rows exceeds the reserved "
      << max_tokens_ << " / " << max_rows_;
  PAGELLM_CHECK(kv.size() == layers_.size()) << "forward: " << kv.size() << " KV layers for "
                                             << layers_.size() << " model layers";
  const float eps = static_cast<float>(c.rms_norm_eps);
  const AttentionShape shape = attention_shape(kv[0].k.size(2));
  const RopeParams rope{c.rope_theta, c.head_dim};

  Tensor residual = ws_.residual.rows(0, T), hidden = ws_.hidden.rows(0, T);
  Tensor qkv = ws_.qkv.rows(0, T), q = ws_.q.rows(0, T), attn = ws_.attn.rows(0, T);
  Tensor proj = ws_.proj.rows(0, T), gate_up = ws_.gate_up.rows(0, T);
  Tensor act = ws_.act.rows(0, T);

  backend_.embedding(embed_, batch.token_ids, residual);
  // One attention plan for the forward (every layer has the same shape and pool extent).
  const AttentionPlanRef attention_plan = backend_.plan_attention(batch, shape, kv[0]);
  // LoRA (a batch with lora_slots, even all zeros: a graph captured for LoRA steps): each
  // product adds its group's delta before what follows it reads the output
  // (Backend::lora_matmul and kin). Which rows use which adapter is read on the device.
  const bool lora = batch.host != nullptr && !batch.host->lora_slots.empty();
  if (lora) {
    for (int32_t slot : batch.host->lora_slots) {
      PAGELLM_CHECK(slot == 0 || has_lora(slot))
          << "forward: LoRA slot " << slot << " holds no adapter";
    }
  }
  // Each residual sublayer's product adds itself and normalises into `hidden` for what
  // follows it (Backend::matmul_add_rms_norm), so a layer starts from `hidden`, except on
  // the LoRA and tensor-parallel paths: there `proj` holds the down product, which the next
  // norm adds (LoRA's delta and the ranks' all-reduce come between product and add).
  const bool lora_forward = lora && lora_num_slots_ > 0;
  const bool norm_adds_proj = lora_forward || comm_ != nullptr;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Qwen3LayerWeights& w = layers_[l];
    if (l == 0) {
      backend_.rms_norm(residual, w.input_norm, eps, hidden);
    } else if (norm_adds_proj) {
      backend_.add_rms_norm(residual, proj, w.input_norm, eps, hidden);
    }
    if (lora_forward) {
      backend_.lora_matmul_qk_norm_rope_store_kv(hidden, w.qkv, lora_group(l, kLoraQkv), qkv,
                                                 w.q_norm, w.k_norm, eps, rope, shape, batch, q,
                                                 kv[l]);
      backend_.attention(q, kv[l], shape, batch, attention_plan, attn);
      backend_.lora_matmul(attn, w.o_proj, lora_group(l, kLoraO), batch, proj);
      backend_.add_rms_norm(residual, proj, w.post_norm, eps, hidden);
      backend_.lora_matmul_silu_mul(hidden, w.gate_up, lora_group(l, kLoraGateUp), batch,
                                    gate_up, act);
      backend_.lora_matmul(act, w.down, lora_group(l, kLoraDown), batch, proj);
      continue;
    }
    backend_.matmul_qk_norm_rope_store_kv(hidden, w.qkv, qkv, w.q_norm, w.k_norm, eps, rope, shape,
                                          batch, q, kv[l]);
    backend_.attention(q, kv[l], shape, batch, attention_plan, attn);
    if (comm_ != nullptr) {
      // Each rank holds its heads' (and its intermediate columns') partial sums: the sum
      // over ranks comes before the residual takes it.
      backend_.matmul(attn, w.o_proj, proj);
      comm_->all_reduce_sum(backend_, proj);
      backend_.add_rms_norm(residual, proj, w.post_norm, eps, hidden);
      backend_.matmul_silu_mul(hidden, w.gate_up, gate_up, act);
      backend_.matmul(act, w.down, proj);
      comm_->all_reduce_sum(backend_, proj);
      continue;
    }
    const Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
    backend_.matmul_add_rms_norm(attn, w.o_proj, proj, residual, w.post_norm, eps, hidden);
    backend_.matmul_silu_mul(hidden, w.gate_up, gate_up, act);
    backend_.matmul_add_rms_norm(act, w.down, proj, residual, next_norm, eps, hidden);
  }
  if (norm_adds_proj) backend_.add_rms_norm(residual, proj, final_norm_, eps, hidden);
  Tensor rows = ws_.rows.rows(0, R), logits = ws_.logits.rows(0, R);
  if (R > 0 && float32_head_) {
    // The residual stream's rows (activation dtype), normalised and projected in float32.
    Tensor normed = ws_.rows_f32.rows(0, R);
    backend_.gather_rows(residual, batch.logits_indices, rows);
    backend_.float32_head(rows, final_norm_f32_, eps, lm_head_f32_, normed, logits);
  } else if (R > 0 && comm_ != nullptr) {
    // This rank's vocabulary columns, then every rank's side by side: full rows everywhere.
    backend_.gather_rows(hidden, batch.logits_indices, rows);
    Tensor part = ws_.logits_part.rows(0, R);
    backend_.matmul(rows, lm_head_, part);
    comm_->all_gather_columns(backend_, part, logits);
  } else if (R > 0) {
    backend_.gather_rows(hidden, batch.logits_indices, rows);
    backend_.matmul(rows, lm_head_, logits);
  }
  return logits;
}

namespace {

// The modules of each LoRA group, in the order their outputs sit side by side.
const std::vector<LoraModule>& lora_group_modules(int group) {
  static const std::vector<LoraModule> groups[4] = {
      {LoraModule::kQ, LoraModule::kK, LoraModule::kV},
      {LoraModule::kO},
      {LoraModule::kGate, LoraModule::kUp},
      {LoraModule::kDown}};
  return groups[group];
}

// Elements of padding that keep every factor block 256-byte aligned in either dtype.
int64_t lora_align(int64_t elements) { return (elements + 127) / 128 * 128; }

}  // namespace

void Qwen3Model::enable_lora(int32_t max_slots, int32_t max_rank) {
  check_single_rank("LoRA");
  PAGELLM_CHECK(max_slots >= 1) << "enable_lora: max_slots must be >= 1, got " << max_slots;
  PAGELLM_CHECK(max_rank >= 1 && max_rank <= kMaxLoraRank)
      << "enable_lora: max_rank must be in [1, " << kMaxLoraRank << "], got " << max_rank;
  PAGELLM_CHECK(backend_.supports_lora())
      << "enable_lora: the " << backend_.name() << " backend has no LoRA kernels";
  if (lora_num_slots_ != 0) {
    PAGELLM_CHECK(lora_num_slots_ == max_slots + 1)
        << "enable_lora: the model has " << lora_num_slots_ - 1 << " LoRA slots already; "
        << max_slots << " asked";
    return;
  }
  const size_t entries = layers_.size() * kNumLoraGroups * static_cast<size_t>(max_slots + 1);
  lora_table_host_.assign(entries, LoraSlotFactors{});
  lora_table_ = DeviceBuffer(&backend_, entries * sizeof(LoraSlotFactors));
  upload_lora_table();
  const std::vector<uint32_t> zeros(layers_.size() * kNumLoraGroups * 2, 0u);
  lora_counters_ = DeviceBuffer(&backend_, zeros.size() * sizeof(uint32_t));
  backend_.copy_to_device(lora_counters_.get(), zeros.data(), zeros.size() * sizeof(uint32_t));
  lora_slots_.clear();
  lora_slots_.resize(static_cast<size_t>(max_slots + 1));
  lora_num_slots_ = max_slots + 1;
  lora_max_rank_ = max_rank;
}

size_t Qwen3Model::lora_entry(size_t layer, int group, int32_t slot) const {
  return (layer * kNumLoraGroups + static_cast<size_t>(group)) * lora_num_slots_ +
         static_cast<size_t>(slot);
}

void Qwen3Model::upload_lora_table() {
  backend_.copy_to_device(lora_table_.get(), lora_table_host_.data(),
                          lora_table_host_.size() * sizeof(LoraSlotFactors));
}

LoraGroup Qwen3Model::lora_group(size_t layer, int group) const {
  const Qwen3Config& c = config_;
  LoraGroup g;
  g.slots = static_cast<const LoraSlotFactors*>(lora_table_.get()) + lora_entry(layer, group, 0);
  g.num_slots = lora_num_slots_;
  const std::vector<LoraModule>& modules = lora_group_modules(group);
  g.num_modules = static_cast<int32_t>(modules.size());
  g.in = lora_module_shape(c, modules[0])[1];
  for (size_t m = 0; m < modules.size(); ++m) g.width[m] = lora_module_shape(c, modules[m])[0];
  g.col_offset = 0;  // every group's modules fill their output from its first column
  g.max_rank = lora_max_rank_;
  g.counters = static_cast<uint32_t*>(lora_counters_.get()) +
               (layer * kNumLoraGroups + static_cast<size_t>(group)) * 2;
  return g;
}

void Qwen3Model::set_lora(int32_t slot, const LoraAdapter& adapter) {
  const Qwen3Config& c = config_;
  PAGELLM_CHECK(slot >= 1) << "set_lora: slot " << slot
                           << " is not a LoRA slot (slots are 1, 2, ...; 0 means no adapter)";
  PAGELLM_CHECK(slot <= max_lora_slots())
      << "set_lora: slot " << slot << " is outside the model's " << max_lora_slots()
      << " LoRA slots (enable_lora makes them)";
  PAGELLM_CHECK(adapter.layers.size() == layers_.size())
      << "LoRA adapter " << adapter.path << " has " << adapter.layers.size()
      << " layers; the model has " << layers_.size();
  const int64_t r = adapter.config.rank;
  static_assert(kMaxLoraRank == LoraGroup::kMaxRank, "the kernels' rank limit is the reader's");
  PAGELLM_CHECK(r >= 1 && r <= lora_max_rank_)
      << "LoRA adapter " << adapter.path << ": rank " << r << " is outside 1.." << lora_max_rank_
      << " (the engine's max_lora_rank)";
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      const LoraFactors& f = adapter.layers[l][m];
      if (f.empty()) continue;
      const auto [out, in] = lora_module_shape(c, static_cast<LoraModule>(m));
      PAGELLM_CHECK(f.a.rows == r && f.a.cols == in && f.b.rows == out && f.b.cols == r)
          << "LoRA adapter " << adapter.path << ": layer " << l << " "
          << lora_module_name(static_cast<LoraModule>(m)) << " factors [" << f.a.rows << ", "
          << f.a.cols << "] and [" << f.b.rows << ", " << f.b.cols << "] do not match [" << r
          << ", " << in << "] and [" << out << ", " << r << "]";
    }
  }
  // Where each (layer, group) block goes in the slot's one allocation: A [M·r, in], then
  // Bᵀ [r, width]; a group none of whose modules the adapter targets takes no room.
  struct Block {
    int64_t a = -1, bt = -1;  // element offsets; -1: not targeted
    int64_t packed = -1;      // element offset of A as the backend streams it; -1: none
    int64_t packed_b = -1;    // element offset of B as the backend's products read it
  };
  std::vector<std::array<Block, kNumLoraGroups>> blocks(layers_.size());
  std::vector<LoraImageBlock> image_blocks;  // the same blocks, for write_lora_image
  int64_t total = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      bool targeted = false;
      for (LoraModule m : lora_group_modules(g)) {
        targeted = targeted || !adapter.layers[l][static_cast<int>(m)].empty();
      }
      if (!targeted) continue;
      const LoraGroup group = lora_group(l, g);
      LoraImageBlock image_block;
      image_block.layer = l;
      image_block.num_modules = group.num_modules;
      image_block.in = group.in;
      for (size_t mi = 0; mi < lora_group_modules(g).size(); ++mi) {
        image_block.modules[mi] = lora_group_modules(g)[mi];
        image_block.width[mi] = group.width[mi];
      }
      blocks[l][g].a = image_block.a_offset = total;
      total += lora_align(group.num_modules * r * group.in);
      blocks[l][g].bt = image_block.bt_offset = total;
      total += lora_align(r * group.width_total());
      image_block.end = total;
      image_blocks.push_back(image_block);
    }
  }
  // After the image (never uploaded: made on the device from the uploaded A and Bᵀ), each
  // block's A and B as the backend's fused products read them, where the backend has such
  // layouts.
  const int64_t image_total = total;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      if (blocks[l][g].a < 0) continue;
      const LoraGroup group = lora_group(l, g);
      const size_t packed = backend_.lora_packed_a_bytes(group.num_modules * r, group.in);
      if (packed == 0) continue;
      const size_t packed_b =
          backend_.lora_packed_b_bytes(static_cast<int32_t>(r), group.width_total());
      const int64_t elem = static_cast<int64_t>(dtype_size(backend_.weight_dtype()));
      blocks[l][g].packed = total;
      total += lora_align((static_cast<int64_t>(packed) + elem - 1) / elem);
      blocks[l][g].packed_b = total;
      total += lora_align((static_cast<int64_t>(packed_b) + elem - 1) / elem);
    }
  }
  // The image in the weight dtype, written once by write_lora_image (no zero-fill first):
  // in place where backend memory is host memory, else run by run into the two halves of
  // the pinned staging buffer, each run uploaded with one copy (no conversion on the way).
  const DType dt = backend_.weight_dtype();
  const size_t elem_size = dtype_size(dt);
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  LoraLoadTimes times;
  LoraSlot fresh;
  fresh.storage = DeviceBuffer(&backend_, static_cast<size_t>(total) * elem_size,
                               MemoryRole::kWeights);
  if (backend_.memory_is_host()) {
    const auto t0 = Clock::now();
    write_lora_image(adapter, image_blocks, dt, fresh.storage.get(), image_total);
    times.image_seconds = seconds_since(t0);
  } else {
    // A half holds the default chunk or, for a model with a larger block, that block;
    // whole 256-byte lines, so that the second half is as aligned as the first.
    const size_t half_bytes =
        (std::max(lora_staging_chunk_bytes_,
                  static_cast<size_t>(lora_image_largest_block(image_blocks)) * elem_size) +
         255) / 256 * 256;
    if (lora_staging_.size() / 2 < half_bytes) {
      const auto t0 = Clock::now();
      lora_staging_.reset();
      lora_staging_ = PinnedHostBuffer(&backend_, 2 * half_bytes);
      times.staging_seconds = seconds_since(t0);
    }
    const size_t staging_half = lora_staging_.size() / 2;
    const std::vector<LoraImageRun> runs = lora_image_runs(
        image_blocks, static_cast<int64_t>(staging_half / elem_size));
    Tensor flat = fresh.storage.tensor(dt, {total});
    // Both halves are free here: the previous set_lora waited for its copies. Run i is built
    // into half i % 2 while run i-1's copy reads the other half; the wait before issuing
    // run i's copy also covers run i-1's, so that half is free again when run i+1 is built.
    try {
      for (size_t i = 0; i < runs.size(); ++i) {
        char* half =
            static_cast<char*>(lora_staging_.get()) + (i % 2) * staging_half;
        const auto t1 = Clock::now();
        write_lora_image(adapter, lora_image_run_blocks(image_blocks, runs[i]), dt, half,
                         runs[i].elements());
        times.image_seconds += seconds_since(t1);
        const auto t2 = Clock::now();
        backend_.synchronize();
        times.upload_seconds += seconds_since(t2);
        backend_.write_weights(flat, runs[i].begin, half, dt, runs[i].elements(),
                               TensorMemory::kHostPinned);
      }
    } catch (...) {
      // A run refused after earlier ones went up: their copies must finish before `fresh`
      // (their destination) is freed and the staging is written again.
      backend_.synchronize();
      throw;
    }
    const auto t3 = Clock::now();
    backend_.synchronize();
    times.upload_seconds += seconds_since(t3);
  }
  // The packed copies of A and B, made from the image's A and Bᵀ on the backend (in stream
  // order; the wait below covers them), wherever the image was written.
  char* packed_base = static_cast<char*>(fresh.storage.get());
  const auto elem_bytes = static_cast<int64_t>(elem_size);
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      if (blocks[l][g].packed < 0) continue;
      const LoraGroup group = lora_group(l, g);
      backend_.pack_lora_a(packed_base + blocks[l][g].a * elem_bytes, group.num_modules * r,
                           group.in, packed_base + blocks[l][g].packed * elem_bytes);
      backend_.pack_lora_b(packed_base + blocks[l][g].bt * elem_bytes, static_cast<int32_t>(r),
                           group.width_total(), g == kLoraGateUp,
                           packed_base + blocks[l][g].packed_b * elem_bytes);
    }
  }
  fresh.loaded = true;
  // No forward in flight may read the old factors or table; then the table points at the
  // new ones (a copy that completes before it returns), and only then the old ones go.
  backend_.synchronize();
  const char* base = static_cast<const char*>(fresh.storage.get());
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      LoraSlotFactors& e = lora_table_host_[lora_entry(l, g, slot)];
      e = LoraSlotFactors{};
      if (blocks[l][g].a < 0) continue;
      e.a = base + blocks[l][g].a * elem_bytes;
      e.bt = base + blocks[l][g].bt * elem_bytes;
      if (blocks[l][g].packed >= 0) {
        e.a_packed = base + blocks[l][g].packed * elem_bytes;
        e.b_packed = base + blocks[l][g].packed_b * elem_bytes;
      }
      e.rank = static_cast<int32_t>(r);
      e.scale = adapter.config.scale();
    }
  }
  upload_lora_table();
  lora_slots_[static_cast<size_t>(slot)] = std::move(fresh);
  last_lora_load_ = times;
}

void Qwen3Model::set_lora_staging_chunk_bytes(size_t bytes) {
  PAGELLM_CHECK(bytes >= 1) << "set_lora_staging_chunk_bytes: a staging half needs at least 1 "
                               "byte, got 0";
  lora_staging_.reset();
  lora_staging_chunk_bytes_ = bytes;
}

void Qwen3Model::clear_lora(int32_t slot) {
  if (!has_lora(slot)) return;
  backend_.synchronize();  // no forward in flight may still read the factors
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      lora_table_host_[lora_entry(l, g, slot)] = LoraSlotFactors{};
    }
  }
  upload_lora_table();
  lora_slots_[static_cast<size_t>(slot)] = LoraSlot{};
}

bool Qwen3Model::has_lora(int32_t slot) const {
  return slot >= 1 && static_cast<size_t>(slot) < lora_slots_.size() &&
         lora_slots_[static_cast<size_t>(slot)].loaded;
}

size_t Qwen3Model::lora_bytes(int32_t slot) const {
  return has_lora(slot) ? lora_slots_[static_cast<size_t>(slot)].storage.size() : 0;
}

}  // namespace pagellm
