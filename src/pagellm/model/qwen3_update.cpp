// Qwen3Model::update_weights: in-place weight updates from named tensors or a safetensors
// folder. Check everything, then write: a rejected update leaves every weight as it was.
#include <map>
#include <set>
#include <sstream>

#include "pagellm/common/check.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/model/qwen3_weights.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {
namespace {

// Problems listed in one error before "... and N more".
constexpr size_t kMaxListedProblems = 40;

bool known_dtype(TensorDType t) {
  switch (t) {
    case TensorDType::kFloat32:
    case TensorDType::kBFloat16:
    case TensorDType::kFloat16:
    case TensorDType::kInt32:
    case TensorDType::kInt64: return true;
  }
  return false;
}

DType to_dtype(TensorDType t) {
  switch (t) {
    case TensorDType::kFloat32: return DType::F32;
    case TensorDType::kBFloat16: return DType::BF16;
    case TensorDType::kFloat16: return DType::F16;
    case TensorDType::kInt32: return DType::I32;
    case TensorDType::kInt64: return DType::I64;
  }
  PAGELLM_FAIL() << "unknown tensor dtype " << static_cast<int>(t);
}

TensorDType from_dtype(DType t) {
  switch (t) {
    case DType::F32: return TensorDType::kFloat32;
    case DType::BF16: return TensorDType::kBFloat16;
    case DType::F16: return TensorDType::kFloat16;
    case DType::I32: return TensorDType::kInt32;
    case DType::I64: return TensorDType::kInt64;
  }
  PAGELLM_FAIL() << "unknown dtype " << static_cast<int>(t);
}

bool known_memory(TensorMemory m) {
  return m == TensorMemory::kHost || m == TensorMemory::kHostPinned ||
         m == TensorMemory::kDevice;
}

const char* memory_name(TensorMemory m) {
  switch (m) {
    case TensorMemory::kHost: return "host";
    case TensorMemory::kHostPinned: return "pinned host";
    case TensorMemory::kDevice: return "device";
  }
  return "unknown";
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<std::pair<std::string, Qwen3Model::WeightTarget>> Qwen3Model::weight_targets() const {
  // At tensor-parallel rank r of N each target writes the rank's share of the full tensor
  // (TpShard; the loader's split, tp_shard_lookup): q/k/v and gate/up rows, o_proj and
  // down columns, the head's vocabulary rows. Embeddings and norms are whole.
  const Qwen3Config& c = config_;
  const TpShard& s = shard_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_size = s.q_heads * D, kv_size = s.kv_heads * D;  // the rank's rows of qkv
  std::vector<std::pair<std::string, WeightTarget>> out;
  // The whole of a [rows, cols] (or 1-D) tensor into dst.
  auto whole = [](const Tensor& dst, const std::vector<int64_t>& shape) {
    WeightWrite w;
    w.dst = dst;
    w.rows = shape.size() == 1 ? 1 : shape[0];
    w.cols = shape.back();
    return w;
  };
  auto rows = [](const Tensor& dst, int64_t dst_row, int64_t cols, int64_t begin, int64_t count) {
    WeightWrite w;
    w.dst = dst;
    w.offset = dst_row * cols;
    w.row_begin = begin;
    w.rows = count;
    w.cols = cols;
    return w;
  };
  auto columns = [](const Tensor& dst, int64_t nrows, int64_t begin, int64_t count) {
    WeightWrite w;
    w.dst = dst;
    w.rows = nrows;
    w.col_begin = begin;
    w.cols = count;
    return w;
  };
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<WeightWrite> writes,
                 int32_t matrix) {
    WeightTarget t;
    t.shape = std::move(shape);
    t.writes = std::move(writes);
    t.matrix = matrix;
    out.emplace_back(std::move(name), std::move(t));
  };
  const bool split_head = s.size > 1;  // lm_head_ holds the rank's vocabulary rows
  {
    std::vector<WeightWrite> embed{whole(embed_, {c.vocab_size, H})};
    // Tied and split: the rank's head is a copy of its rows of the embedding.
    if (c.tie_word_embeddings && split_head) embed.push_back(rows(lm_head_, 0, H, s.vocab_begin, s.vocab));
    add("model.embed_tokens.weight", {c.vocab_size, H}, std::move(embed), -1);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Qwen3LayerWeights& w = layers_[static_cast<size_t>(l)];
    // Matrix indices follow prepared_matrices(): qkv, o_proj, gate_up, down per layer.
    const int32_t base = static_cast<int32_t>(4 * l);
    auto name = [&](const char* suffix) { return qwen3_layer_weight(l, suffix); };
    const int64_t Hq = c.num_attention_heads * D, Hkv = c.num_key_value_heads * D;
    add(name("self_attn.q_proj.weight"), {Hq, H},
        {rows(w.qkv, 0, H, s.q_head_begin * D, q_size)}, base);
    add(name("self_attn.k_proj.weight"), {Hkv, H},
        {rows(w.qkv, q_size, H, s.kv_head_begin * D, kv_size)}, base);
    add(name("self_attn.v_proj.weight"), {Hkv, H},
        {rows(w.qkv, q_size + kv_size, H, s.kv_head_begin * D, kv_size)}, base);
    add(name("self_attn.o_proj.weight"), {H, Hq}, {columns(w.o_proj, H, s.q_head_begin * D, q_size)},
        base + 1);
    add(name("self_attn.q_norm.weight"), {D}, {whole(w.q_norm, {D})}, -1);
    add(name("self_attn.k_norm.weight"), {D}, {whole(w.k_norm, {D})}, -1);
    add(name("mlp.gate_proj.weight"), {I, H}, {rows(w.gate_up, 0, H, s.inter_begin, s.inter)},
        base + 2);
    add(name("mlp.up_proj.weight"), {I, H}, {rows(w.gate_up, s.inter, H, s.inter_begin, s.inter)},
        base + 2);
    add(name("mlp.down_proj.weight"), {H, I}, {columns(w.down, H, s.inter_begin, s.inter)},
        base + 3);
    add(name("input_layernorm.weight"), {H}, {whole(w.input_norm, {H})}, -1);
    add(name("post_attention_layernorm.weight"), {H}, {whole(w.post_norm, {H})}, -1);
  }
  add("model.norm.weight", {H}, {whole(final_norm_, {H})}, -1);
  // Tied: the output projection is the embedding (or, split, rewritten with it), so the
  // name is checked and not written.
  std::vector<WeightWrite> head;
  if (!c.tie_word_embeddings) head.push_back(rows(lm_head_, 0, H, s.vocab_begin, s.vocab));
  add("lm_head.weight", {c.vocab_size, H}, std::move(head), -1);
  return out;
}

void Qwen3Model::check_weights_update(const std::vector<NamedTensor>& tensors) const {
  std::map<std::string, WeightTarget> targets;
  for (auto& [name, target] : weight_targets()) targets.emplace(name, std::move(target));
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    const std::string what = "tensor " + std::to_string(i) + " '" + t.name + "'";
    auto it = targets.find(t.name);
    if (it == targets.end()) {
      problems.push_back(what + ": not a parameter of this model (expected a Hugging Face "
                         "Qwen3ForCausalLM name such as model.layers.0.self_attn.q_proj."
                         "weight, layers 0.." + std::to_string(config_.num_hidden_layers - 1) +
                         ")");
      continue;
    }
    if (!seen.insert(t.name).second) {
      problems.push_back(what + ": given more than once in this update");
      continue;
    }
    if (!known_dtype(t.dtype)) {
      problems.push_back(what + ": unknown dtype value " + std::to_string(static_cast<int>(t.dtype)) +
                         " (expected float32, bfloat16 or float16)");
    } else if (to_dtype(t.dtype) == DType::I32 || to_dtype(t.dtype) == DType::I64) {
      problems.push_back(what + ": dtype " + dtype_name(to_dtype(t.dtype)) +
                         "; weights must be float32, bfloat16 or float16");
    }
    if (t.shape != it->second.shape) {
      problems.push_back(what + ": shape " + shape_to_string(t.shape) + ", expected " +
                         shape_to_string(it->second.shape));
    }
    if (!known_memory(t.memory)) {
      problems.push_back(what + ": unknown memory kind " +
                         std::to_string(static_cast<int>(t.memory)) +
                         " (expected host, pinned host or device)");
    } else if (t.data == nullptr) {
      problems.push_back(what + ": no data (null pointer)");
    } else if (known_dtype(t.dtype) && t.shape == it->second.shape) {
      const size_t bytes = static_cast<size_t>(numel_of(t.shape)) * dtype_size(to_dtype(t.dtype));
      const std::string bad = backend_.check_weight_source(t.data, bytes, t.memory);
      if (!bad.empty())
        problems.push_back(what + ": given as " + memory_name(t.memory) + " memory, but it " +
                           bad);
    }
  }
  if (!problems.empty()) {
    std::ostringstream msg;
    msg << "weight update rejected, no weight was changed (" << problems.size()
        << (problems.size() == 1 ? " problem" : " problems") << "):";
    for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i)
      msg << "\n  " << problems[i];
    if (problems.size() > kMaxListedProblems)
      msg << "\n  ... and " << problems.size() - kMaxListedProblems << " more";
    PAGELLM_FAIL() << msg.str();
  }
}

Qwen3Model::PartialUpdate Qwen3Model::begin_weights_update() const {
  PartialUpdate update;
  update.touched.assign(static_cast<size_t>(4 * config_.num_hidden_layers), false);
  return update;
}

void Qwen3Model::write_weights_part(const std::vector<NamedTensor>& part, PartialUpdate& update) {
  write_checked(part, update);
  backend_.synchronize();
}

WeightWriteStats Qwen3Model::finish_weights_update(PartialUpdate& update) {
  const auto matrices = prepared_matrices();
  for (size_t m = 0; m < matrices.size() && m < update.touched.size(); ++m) {
    if (update.touched[m]) {
      prepared_bytes_ += backend_.prepare_matrix(matrices[m].first, matrices[m].second);
    }
  }
  // The float32 head's copies follow the final norm and the output projection.
  if (float32_head_) enable_float32_head();
  backend_.synchronize();
  return update.stats;
}

void Qwen3Model::write_checked(const std::vector<NamedTensor>& tensors, PartialUpdate& update) {
  // Check everything; write nothing until every tensor passed.
  check_weights_update(tensors);
  std::map<std::string, WeightTarget> targets;
  for (auto& [name, target] : weight_targets()) targets.emplace(name, std::move(target));
  for (const NamedTensor& t : tensors) {
    const WeightTarget& target = targets.at(t.name);
    if (target.writes.empty()) continue;
    const DType dtype = to_dtype(t.dtype);
    const size_t element = dtype_size(dtype);
    const int64_t full_cols = t.shape.back();
    for (const WeightWrite& w : target.writes) {
      Tensor dst = w.dst;
      const auto* src = static_cast<const uint8_t*>(t.data) +
                        static_cast<size_t>(w.row_begin * full_cols + w.col_begin) * element;
      if (w.cols == full_cols) {
        // Whole rows: one contiguous run (q/k/v and gate/up are row ranges of their fused
        // matrix; at one rank every write is of this kind).
        backend_.write_weights(dst, w.offset, src, dtype, w.rows * w.cols, t.memory);
      } else {
        backend_.write_weights_2d(dst, w.offset, src, dtype, w.rows, w.cols, full_cols, t.memory);
      }
    }
    if (target.matrix >= 0) update.touched[static_cast<size_t>(target.matrix)] = true;
    ++update.stats.tensors;
    update.stats.bytes += static_cast<uint64_t>(numel_of(t.shape)) * element;
  }
}

WeightWriteStats Qwen3Model::update_weights(const std::vector<NamedTensor>& tensors) {
  // Write every tensor, refresh the decode copies of the rewritten matrices, wait once.
  PartialUpdate update = begin_weights_update();
  write_checked(tensors, update);
  return finish_weights_update(update);
}

std::vector<NamedTensor> named_tensors_of(const WeightStore& store) {
  std::vector<NamedTensor> tensors;
  tensors.reserve(store.size());
  for (const std::string& name : store.names()) {
    const HostTensor& t = store.get(name);
    store.prefetch(t);
    NamedTensor n;
    n.name = name;
    n.data = t.data;
    n.dtype = from_dtype(t.dtype);
    n.shape = t.shape;
    n.memory = TensorMemory::kHost;
    tensors.push_back(std::move(n));
  }
  return tensors;
}

WeightWriteStats Qwen3Model::update_weights_from(const std::string& path) {
  const WeightStore store = WeightStore::open(path);
  const std::vector<NamedTensor> tensors = named_tensors_of(store);
  try {
    return update_weights(tensors);
  } catch (const Error& e) {
    PAGELLM_FAIL() << store.source() << ": " << e.what();
  }
}

}  // namespace pagellm
