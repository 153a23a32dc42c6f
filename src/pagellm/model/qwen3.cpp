#include "pagellm/model/qwen3.h"

#include <cmath>
#include <utility>

namespace pagellm {
namespace {

std::string layer_name(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

}  // namespace

Qwen3Model::Qwen3Model(Backend& backend, const Qwen3Config& config, const WeightLookup& lookup,
                       const ProgressFn& progress)
    : backend_(backend), config_(config) {
  const Qwen3Config& c = config_;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t V = c.vocab_size;
  bytes_total_ = static_cast<size_t>(c.num_parameters()) * dtype_size(backend.weight_dtype());

  embed_ = upload_weight(lookup, "model.embed_tokens.weight", {V, H}, progress);
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Qwen3LayerWeights& w = layers_[static_cast<size_t>(l)];
    w.input_norm = upload_weight(lookup, layer_name(l, "input_layernorm.weight"), {H}, progress);
    w.qkv = alloc(backend.weight_dtype(), {c.qkv_size(), H});
    upload_rows_into(w.qkv, 0, lookup, layer_name(l, "self_attn.q_proj.weight"), c.q_size(), H,
                     progress);
    upload_rows_into(w.qkv, c.q_size(), lookup, layer_name(l, "self_attn.k_proj.weight"),
                     c.kv_size(), H, progress);
    upload_rows_into(w.qkv, c.q_size() + c.kv_size(), lookup,
                     layer_name(l, "self_attn.v_proj.weight"), c.kv_size(), H, progress);
    w.q_norm = upload_weight(lookup, layer_name(l, "self_attn.q_norm.weight"), {D}, progress);
    w.k_norm = upload_weight(lookup, layer_name(l, "self_attn.k_norm.weight"), {D}, progress);
    w.o_proj = upload_weight(lookup, layer_name(l, "self_attn.o_proj.weight"), {H, c.q_size()},
                             progress);
    w.post_norm = upload_weight(lookup, layer_name(l, "post_attention_layernorm.weight"), {H},
                                progress);
    w.gate_up = alloc(backend.weight_dtype(), {2 * I, H});
    upload_rows_into(w.gate_up, 0, lookup, layer_name(l, "mlp.gate_proj.weight"), I, H, progress);
    upload_rows_into(w.gate_up, I, lookup, layer_name(l, "mlp.up_proj.weight"), I, H, progress);
    w.down = upload_weight(lookup, layer_name(l, "mlp.down_proj.weight"), {H, I}, progress);
  }
  final_norm_ = upload_weight(lookup, "model.norm.weight", {H}, progress);
  lm_head_ = c.tie_word_embeddings ? embed_
                                   : upload_weight(lookup, "lm_head.weight", {V, H}, progress);
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
    out.emplace_back(w.gate_up, config_.intermediate_size);
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
  s.num_q_heads = config_.num_attention_heads;
  s.num_kv_heads = config_.num_key_value_heads;
  s.head_dim = config_.head_dim;
  s.page_size = page_size;
  s.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return s;
}

size_t Qwen3Model::enable_float32_head() {
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
  ws_.qkv = make(act, {T, c.qkv_size()});
  ws_.q = make(act, {T, c.num_attention_heads, c.head_dim});
  ws_.attn = make(act, {T, c.q_size()});
  ws_.proj = make(act, {T, c.hidden_size});
  ws_.gate_up = make(act, {T, 2 * c.intermediate_size});
  ws_.act = make(act, {T, c.intermediate_size});
  ws_.rows = make(act, {max_rows, c.hidden_size});
  ws_.logits = make(DType::F32, {max_rows, c.vocab_size});
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
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Qwen3LayerWeights& w = layers_[l];
    if (l == 0) {
      backend_.rms_norm(residual, w.input_norm, eps, hidden);
    } else {
      backend_.add_rms_norm(residual, proj, w.input_norm, eps, hidden);
    }
    backend_.matmul_qk_norm_rope_store_kv(hidden, w.qkv, qkv, w.q_norm, w.k_norm, eps, rope, shape,
                                          batch, q, kv[l]);
    backend_.attention(q, kv[l], shape, batch, attention_plan, attn);
    backend_.matmul(attn, w.o_proj, proj);
    backend_.add_rms_norm(residual, proj, w.post_norm, eps, hidden);
    backend_.matmul_silu_mul(hidden, w.gate_up, gate_up, act);
    backend_.matmul(act, w.down, proj);
  }
  backend_.add_rms_norm(residual, proj, final_norm_, eps, hidden);
  Tensor rows = ws_.rows.rows(0, R), logits = ws_.logits.rows(0, R);
  if (R > 0 && float32_head_) {
    // The residual stream's rows (activation dtype), normalised and projected in float32.
    Tensor normed = ws_.rows_f32.rows(0, R);
    backend_.gather_rows(residual, batch.logits_indices, rows);
    backend_.float32_head(rows, final_norm_f32_, eps, lm_head_f32_, normed, logits);
  } else if (R > 0) {
    backend_.gather_rows(hidden, batch.logits_indices, rows);
    backend_.matmul(rows, lm_head_, logits);
  }
  return logits;
}

}  // namespace pagellm
