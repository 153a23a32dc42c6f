// A deliberately naive Qwen3 forward for tests: one sequence at a time, a contiguous
// KV cache, plain loops, double accumulators. It shares no code with the backends, so
// agreement with it means something.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "pagellm/model/config.h"
#include "pagellm/model/qwen3.h"

namespace pagellm::testing {

/// Weights as float32 host vectors keyed by transformers' names.
struct HostWeights {
  std::map<std::string, std::vector<float>> data;
  std::map<std::string, std::vector<int64_t>> shapes;

  WeightLookup lookup() const {
    return [this](const std::string& name) {
      auto it = data.find(name);
      PAGELLM_CHECK(it != data.end()) << "test weights lack " << name;
      return WeightView{it->second.data(), DType::F32, shapes.at(name)};
    };
  }
  const std::vector<float>& at(const std::string& name) const { return data.at(name); }
};

/// Random Qwen3 weights: N(0, std) matrices, N(1, 0.1) norms.
inline HostWeights random_weights(const Qwen3Config& c, uint64_t seed, float std = 0.08f) {
  HostWeights w;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = norm ? 1.0f + 0.1f * normal(rng) : std * normal(rng);
    w.data[name] = std::move(v);
    w.shapes[name] = shape;
  };
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  add("model.embed_tokens.weight", {V, H}, false);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, true);
    add(p + "self_attn.q_proj.weight", {c.q_size(), H}, false);
    add(p + "self_attn.k_proj.weight", {c.kv_size(), H}, false);
    add(p + "self_attn.v_proj.weight", {c.kv_size(), H}, false);
    add(p + "self_attn.q_norm.weight", {D}, true);
    add(p + "self_attn.k_norm.weight", {D}, true);
    add(p + "self_attn.o_proj.weight", {H, c.q_size()}, false);
    add(p + "post_attention_layernorm.weight", {H}, true);
    add(p + "mlp.gate_proj.weight", {I, H}, false);
    add(p + "mlp.up_proj.weight", {I, H}, false);
    add(p + "mlp.down_proj.weight", {H, I}, false);
  }
  add("model.norm.weight", {H}, true);
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, false);
  return w;
}

/// A small config for fast tests.
inline Qwen3Config small_config(bool tied = false) {
  Qwen3Config c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = 512;
  c.torch_dtype = DType::F32;
  return c;
}

/// A small config with the shapes the CUDA kernels' fast paths and cuDNN take: head_dim
/// 128 (the fused qkv kernel's tile height), GQA 4, two layers, EOS id 0.
inline Qwen3Config small_gpu_config() {
  Qwen3Config c = small_config(false);
  c.vocab_size = 384;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 128;
  c.max_position_embeddings = 4096;
  c.eos_token_id = 0;
  c.eos_token_ids = {0};
  return c;
}

/// The naive model: feed tokens one by one, get each token's next-token logits.
class ReferenceQwen3 {
 public:
  ReferenceQwen3(const Qwen3Config& c, const HostWeights& w)
      : c_(c), w_(w), k_(c.num_hidden_layers), v_(c.num_hidden_layers) {}

  /// Appends `token` at the next position; returns logits [V] for the following token.
  std::vector<double> step(int32_t token) {
    const int64_t H = c_.hidden_size, D = c_.head_dim, Hq = c_.num_attention_heads;
    const int64_t Hkv = c_.num_key_value_heads, I = c_.intermediate_size;
    const int64_t pos = length_++;
    std::vector<double> x(H);
    const auto& emb = w_.at("model.embed_tokens.weight");
    for (int64_t i = 0; i < H; ++i) x[i] = emb[token * H + i];
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<double> h = norm(x, w_.at(p + "input_layernorm.weight"));
      std::vector<double> q = linear(h, w_.at(p + "self_attn.q_proj.weight"), Hq * D);
      std::vector<double> k = linear(h, w_.at(p + "self_attn.k_proj.weight"), Hkv * D);
      std::vector<double> v = linear(h, w_.at(p + "self_attn.v_proj.weight"), Hkv * D);
      for (int64_t hh = 0; hh < Hq; ++hh) head_norm_rope(&q[hh * D], w_.at(p + "self_attn.q_norm.weight"), pos);
      for (int64_t hh = 0; hh < Hkv; ++hh) head_norm_rope(&k[hh * D], w_.at(p + "self_attn.k_norm.weight"), pos);
      k_[l].push_back(k);
      v_[l].push_back(v);
      std::vector<double> attn(Hq * D, 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kvh = hh / (Hq / Hkv);
        std::vector<double> s(pos + 1);
        double m = -1e300;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[hh * D + d] * k_[l][j][kvh * D + d];
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double den = 0;
        for (auto& e : s) den += (e = std::exp(e - m));
        for (int64_t j = 0; j <= pos; ++j)
          for (int64_t d = 0; d < D; ++d) attn[hh * D + d] += s[j] / den * v_[l][j][kvh * D + d];
      }
      std::vector<double> o = linear(attn, w_.at(p + "self_attn.o_proj.weight"), H);
      for (int64_t i = 0; i < H; ++i) x[i] += o[i];
      h = norm(x, w_.at(p + "post_attention_layernorm.weight"));
      std::vector<double> g = linear(h, w_.at(p + "mlp.gate_proj.weight"), I);
      std::vector<double> u = linear(h, w_.at(p + "mlp.up_proj.weight"), I);
      for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      std::vector<double> down = linear(g, w_.at(p + "mlp.down_proj.weight"), H);
      for (int64_t i = 0; i < H; ++i) x[i] += down[i];
    }
    std::vector<double> h = norm(x, w_.at("model.norm.weight"));
    const auto& head = w_.at(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    return linear(h, head, c_.vocab_size);
  }

 private:
  std::vector<double> norm(const std::vector<double>& x, const std::vector<float>& w) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    double inv = 1.0 / std::sqrt(ss / x.size() + c_.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  static std::vector<double> linear(const std::vector<double>& x, const std::vector<float>& w,
                                    int64_t out) {
    std::vector<double> y(out, 0.0);
    const int64_t in = static_cast<int64_t>(x.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[o] += x[i] * w[o * in + i];
    return y;
  }
  void head_norm_rope(double* x, const std::vector<float>& w, int64_t pos) const {
    const int64_t D = c_.head_dim, half = D / 2;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
    double inv = 1.0 / std::sqrt(ss / D + c_.rms_norm_eps);
    for (int64_t d = 0; d < D; ++d) x[d] = x[d] * inv * w[d];
    for (int64_t i = 0; i < half; ++i) {
      double freq = std::pow(c_.rope_theta, -2.0 * i / D);
      double a = x[i], b = x[i + half], cs = std::cos(pos * freq), sn = std::sin(pos * freq);
      x[i] = a * cs - b * sn;
      x[i + half] = b * cs + a * sn;
    }
  }

  Qwen3Config c_;
  const HostWeights& w_;
  std::vector<std::vector<std::vector<double>>> k_, v_;
  int64_t length_ = 0;
};

}  // namespace pagellm::testing
