// LoRA on the CPU backend: PEFT folders (good and broken), every target-module combination
// against the adapter merged into the base weights (W + scale·B·A run without LoRA),
// mixed-adapter batches against each request alone, replace in place with the prefix cache,
// the staged upload a device backend takes (pinned halves, run by run, copies that land only
// at the next synchronize) against the in-place one, bf16 / f16 files with rsLoRA, and the engine's load / unload errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "common/expect_error.h"
#include "common/reference_qwen3.h"
#include "model/model_test_util.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/make_model.h"

namespace pagellm {
namespace {

using testing::expect_error;
using testing::HostWeights;
using testing::TempDir;

const std::vector<LoraModule> kAll = {LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,
                                      LoraModule::kO,    LoraModule::kGate, LoraModule::kUp,
                                      LoraModule::kDown};

LoraConfig lora_config(int64_t rank, double alpha, std::vector<LoraModule> targets,
                       bool rslora = false) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.use_rslora = rslora;
  c.target_modules = std::move(targets);
  return c;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// adapter_config.json of `config` with `edit` applied.
std::string edited_config(const LoraConfig& config, const nlohmann::json& edit) {
  nlohmann::json j = nlohmann::json::parse(lora_config_to_json(config));
  j.merge_patch(edit);
  return j.dump();
}

// ---- PEFT folders ---------------------------------------------------------------------

TEST(LoraFolder, ReadsFactorsAndScales) {
  const Qwen3Config mc = testing::small_config();
  TempDir dir;
  const LoraConfig cfg = lora_config(4, 16.0, {LoraModule::kV, LoraModule::kQ});
  make_lora_adapter(dir.path(), mc, cfg, /*seed=*/3, DType::BF16);
  const LoraAdapter a = read_lora_adapter(dir.path(), mc);
  EXPECT_EQ(a.config.rank, 4);
  EXPECT_FLOAT_EQ(a.config.scale(), 4.0f);  // alpha / r
  ASSERT_EQ(a.layers.size(), 2u);
  EXPECT_TRUE(a.layers[1][static_cast<int>(LoraModule::kO)].empty());
  const LoraFactors& q = a.layers[1][static_cast<int>(LoraModule::kQ)];
  EXPECT_EQ(q.a.rows, 4);
  EXPECT_EQ(q.a.cols, mc.hidden_size);
  EXPECT_EQ(q.b.rows, mc.q_size());
  EXPECT_EQ(q.b.cols, 4);
  EXPECT_EQ(q.b.dtype, DType::BF16);  // a view of the file's bfloat16, not a copy
  // The values are the maker's stream, widened from bfloat16.
  std::vector<uint16_t> expect(static_cast<size_t>(q.b.numel()));
  fill_random_normal(random_tensor_key(3, lora_tensor_name(1, LoraModule::kQ, 'B')), 0,
                     static_cast<int64_t>(expect.size()), 0.0f, 0.05f, DType::BF16,
                     expect.data());
  const std::vector<float> b = q.b.to_f32();
  ASSERT_EQ(b.size(), expect.size());
  for (size_t i = 0; i < expect.size(); ++i) ASSERT_EQ(b[i], bf16_to_f32(expect[i])) << i;
  EXPECT_EQ(q.b.at(7), bf16_to_f32(expect[7]));
  expect_error([&] { q.b.at(q.b.numel()); }, "outside the factor's");

  write_text(dir.file("adapter_config.json"),
             edited_config(cfg, {{"use_rslora", true}}));
  EXPECT_FLOAT_EQ(read_lora_adapter(dir.path(), mc).config.scale(), 8.0f);  // 16 / sqrt(4)
}

TEST(LoraFolder, AllLinearTargetsTheSevenModules) {
  const LoraConfig c = parse_lora_config(
      R"({"r": 8, "lora_alpha": 8, "target_modules": "all-linear"})", "cfg");
  EXPECT_EQ(c.target_modules, kAll);
}

TEST(LoraFolder, ConfigErrorsNameTheField) {
  const LoraConfig good = lora_config(4, 8.0, {LoraModule::kQ});
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"use_dora", true}}, "DoRA"},
      {{{"bias", "all"}}, "bias \"all\""},
      {{{"bias", "lora_only"}}, "only bias \"none\""},
      {{{"target_modules", {"q_proj", "lm_head"}}}, "\"lm_head\" is not one"},
      {{{"target_modules", {"embed_tokens"}}}, "q_proj, k_proj, v_proj, o_proj"},
      {{{"target_modules", ".*attn.*"}}, "regex"},
      {{{"target_modules", nlohmann::json::array()}}, "non-empty list"},
      {{{"r", 65}}, "rank r = 65 is outside the supported 1..64"},
      {{{"r", 0}}, "outside the supported"},
      {{{"r", nullptr}}, "\"r\" (the rank) must be an integer"},
      {{{"lora_alpha", "x"}}, "lora_alpha"},
      {{{"peft_type", "IA3"}}, "peft_type"},
      {{{"modules_to_save", {"lm_head"}}}, "modules_to_save"},
      {{{"layers_to_transform", {0}}}, "layers_to_transform"},
      {{{"rank_pattern", {{"q_proj", 8}}}}, "rank_pattern"},
      {{{"fan_in_fan_out", true}}, "fan_in_fan_out"},
  };
  for (const auto& [edit, needle] : cases) {
    SCOPED_TRACE(edit.dump());
    expect_error([&] { parse_lora_config(edited_config(good, edit), "adapter_config.json"); },
                 needle);
  }
  expect_error([] { parse_lora_config("{not json", "x/adapter_config.json"); },
               "x/adapter_config.json is not valid JSON");
}

// Writes a folder whose tensors are `edit`ed from the maker's.
void write_broken(const std::string& dir, const Qwen3Config& mc, const LoraConfig& cfg,
                  const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  write_text(dir + "/adapter_config.json", lora_config_to_json(cfg));
  std::vector<TensorToWrite> tensors = random_lora_tensors(mc, cfg, 1);
  edit(tensors);
  write_safetensors(dir + "/adapter_model.safetensors", tensors);
}

TEST(LoraFolder, TensorErrorsNameEachTensor) {
  const Qwen3Config mc = testing::small_config();
  const LoraConfig cfg = lora_config(4, 8.0, {LoraModule::kK, LoraModule::kDown});
  TempDir dir;
  auto zeros = [](int64_t, int64_t count, void* dst) {
    std::memset(dst, 0, static_cast<size_t>(count) * 4);
  };
  // A missing factor.
  write_broken(dir.path(), mc, cfg, [&](std::vector<TensorToWrite>& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const TensorToWrite& x) {
                             return x.name == lora_tensor_name(1, LoraModule::kDown, 'A');
                           }),
            t.end());
  });
  expect_error([&] { read_lora_adapter(dir.path(), mc); },
               "missing tensor " + lora_tensor_name(1, LoraModule::kDown, 'A') + " [4, 48]");
  // A factor of the wrong shape (rank 5 where the config says 4).
  write_broken(dir.path(), mc, cfg, [&](std::vector<TensorToWrite>& t) {
    for (TensorToWrite& x : t) {
      if (x.name == lora_tensor_name(0, LoraModule::kK, 'B')) {
        x.shape = {mc.kv_size(), 5};
        x.fill = zeros;
      }
    }
  });
  expect_error([&] { read_lora_adapter(dir.path(), mc); },
               lora_tensor_name(0, LoraModule::kK, 'B') + " has shape [32, 5], expected [32, 4]");
  // A layer the model lacks, and a DoRA magnitude.
  write_broken(dir.path(), mc, cfg, [&](std::vector<TensorToWrite>& t) {
    t.push_back({lora_tensor_name(2, LoraModule::kK, 'A'), DType::F32, {4, 32}, zeros});
    t.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_magnitude_vector",
                 DType::F32, {32}, zeros});
  });
  try {
    read_lora_adapter(dir.path(), mc);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unexpected tensor " + lora_tensor_name(2, LoraModule::kK, 'A')),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("layers 0..1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("DoRA is not supported"), std::string::npos) << msg;
  }
  // A model whose module is another shape: an adapter for a wider model.
  Qwen3Config wider = mc;
  wider.intermediate_size = 64;
  make_lora_adapter(dir.path(), wider, cfg, 1);
  expect_error([&] { read_lora_adapter(dir.path(), mc); },
               lora_tensor_name(0, LoraModule::kDown, 'A') + " has shape [4, 64], expected [4, 48]");
  // Missing files.
  std::filesystem::remove(dir.file("adapter_model.safetensors"));
  expect_error([&] { read_lora_adapter(dir.path(), mc); }, "has no adapter_model.safetensors");
  std::filesystem::remove(dir.file("adapter_config.json"));
  expect_error([&] { read_lora_adapter(dir.path(), mc); }, "has no adapter_config.json");
  expect_error([&] { read_lora_adapter(dir.file("nope"), mc); }, "is not a folder");
}

// ---- Engine against the merged dense model -------------------------------------------

EngineConfig engine_config(bool prefix_caching = false) {
  EngineConfig ec;
  ec.page_size = 4;
  ec.num_pages = 96;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 64;
  ec.max_model_len = 96;
  ec.use_graphs = false;
  ec.enable_prefix_caching = prefix_caching;
  ec.max_loras = 4;
  return ec;
}

std::unique_ptr<Engine> make_engine(const Qwen3Config& c, const HostWeights& w,
                                    EngineConfig ec = engine_config()) {
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

const char* hf_weight_name(LoraModule m) {
  switch (m) {
    case LoraModule::kQ: return "self_attn.q_proj.weight";
    case LoraModule::kK: return "self_attn.k_proj.weight";
    case LoraModule::kV: return "self_attn.v_proj.weight";
    case LoraModule::kO: return "self_attn.o_proj.weight";
    case LoraModule::kGate: return "mlp.gate_proj.weight";
    case LoraModule::kUp: return "mlp.up_proj.weight";
    case LoraModule::kDown: return "mlp.down_proj.weight";
  }
  return "";
}

// W + scale·B·A for every targeted module, in double.
HostWeights merge(const Qwen3Config& mc, const HostWeights& base, const LoraAdapter& a) {
  HostWeights m = base;
  const double s = a.config.scale();
  const int64_t r = a.config.rank;
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    for (LoraModule mod : a.config.target_modules) {
      const auto [out, in] = lora_module_shape(mc, mod);
      const LoraFactors& f = a.layers[static_cast<size_t>(l)][static_cast<int>(mod)];
      const std::vector<float> fa = f.a.to_f32(), fb = f.b.to_f32();
      std::vector<float>& w =
          m.data.at("model.layers." + std::to_string(l) + "." + hf_weight_name(mod));
      for (int64_t j = 0; j < out; ++j) {
        for (int64_t k = 0; k < in; ++k) {
          double d = 0.0;
          for (int64_t i = 0; i < r; ++i) d += double(fb[j * r + i]) * fa[i * in + k];
          w[j * in + k] = static_cast<float>(w[j * in + k] + s * d);
        }
      }
    }
  }
  return m;
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {3, 14, 15, 92, 65, 35, 89, 79, 32}, {27, 18, 28}, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};

SamplingParams greedy(int32_t max_tokens = 6) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Generates every prompt with `lora` ("" for none), all in one batch.
std::vector<Generated> run_all(Engine& e, const std::vector<std::string>& loras,
                         const std::vector<std::vector<int32_t>>& prompts = kPrompts) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(e.add_request(prompts[i], greedy(), loras[i % loras.size()]));
  }
  while (e.has_unfinished()) e.step();
  std::vector<Generated> out;
  for (int64_t id : ids) {
    const Sequence& s = e.request(id);
    EXPECT_NE(s.finish_reason, FinishReason::kError) << s.error;
    Generated r;
    r.tokens = s.output;
    for (const SampledToken& t : s.sampled) r.logprobs.push_back(t.logprob);
    out.push_back(std::move(r));
    e.release(id);
  }
  return out;
}

TEST(LoraEngine, EveryTargetCombinationMatchesTheMergedModel) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 11);
  std::unique_ptr<Engine> lora_engine = make_engine(mc, base);
  const std::vector<Generated> base_runs = run_all(*lora_engine, {""});
  TempDir dir;
  int changed = 0;
  for (int mask = 1; mask < (1 << kNumLoraModules); ++mask) {
    std::vector<LoraModule> targets;
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (mask & (1 << m)) targets.push_back(static_cast<LoraModule>(m));
    }
    SCOPED_TRACE("target mask " + std::to_string(mask));
    const bool rslora = mask % 3 == 0;
    const LoraConfig cfg = lora_config(mask % 2 ? 8 : 3, 12.0, targets, rslora);
    make_lora_adapter(dir.path(), mc, cfg, 100 + mask, DType::F32, 0.2f);
    const LoraAdapter adapter = read_lora_adapter(dir.path(), mc);
    // Loading under one name replaces the adapter in place each time.
    lora_engine->load_lora_adapter({"a", mask, dir.path()});
    const std::vector<Generated> lora = run_all(*lora_engine, {"a"});
    std::unique_ptr<Engine> dense = make_engine(mc, merge(mc, base, adapter));
    const std::vector<Generated> want = run_all(*dense, {""});
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      ASSERT_EQ(lora[i].tokens, want[i].tokens) << "prompt " << i;
      for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
        EXPECT_NEAR(lora[i].logprobs[t], want[i].logprobs[t], 2e-4f) << "prompt " << i;
      }
      changed += lora[i].tokens != base_runs[i].tokens;
    }
  }
  // The adapters are strong enough that most runs differ from the base model.
  EXPECT_GT(changed, 127 * 3 / 2);
  EXPECT_EQ(lora_engine->lora_adapters().at(0).version, 127u);
}

// A CPU backend that the model must treat like a device: set_lora builds the image in its
// pinned staging and sends it with write_weights, as on the cuda backend. Copies from pinned
// memory are asynchronous as there: made only at the next synchronize(), from whatever the
// source holds then, so that a staging half rewritten before its copy was waited for sends
// the wrong bytes (and the outputs differ from the in-place load's).
class StagedCpuBackend : public CpuBackend {
 public:
  bool memory_is_host() const override { return false; }
  void* allocate_host_pinned(size_t bytes) override {
    void* p = CpuBackend::allocate_host_pinned(bytes);
    pinned_[p] = bytes;
    ++pinned_allocations;
    return p;
  }
  void free_host_pinned(void* ptr) override {
    const auto it = pinned_.find(ptr);
    for (const Copy& c : pending_) {
      const auto* base = static_cast<const char*>(ptr);
      const auto* src = static_cast<const char*>(c.src);
      if (it != pinned_.end() && src >= base && src < base + it->second) {
        ADD_FAILURE() << "pinned memory freed while a copy from it is in flight";
      }
    }
    if (it != pinned_.end()) pinned_.erase(it);
    CpuBackend::free_host_pinned(ptr);
  }
  void write_weights(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                     int64_t n, TensorMemory memory) override {
    if (memory != TensorMemory::kHostPinned) {
      CpuBackend::write_weights(dst, dst_offset, src, src_dtype, n, memory);
      return;
    }
    EXPECT_TRUE(in_pinned(src, n * static_cast<int64_t>(dtype_size(src_dtype))))
        << "a kHostPinned copy from outside every pinned allocation";
    pending_.push_back({dst, dst_offset, src, src_dtype, n});
    pinned_copies.push_back({dst_offset, dst_offset + n});
  }
  void synchronize() override {
    for (Copy& c : pending_) CpuBackend::upload(c.dst, c.dst_offset, c.src, c.src_dtype, c.n);
    pending_.clear();
    CpuBackend::synchronize();
  }
  bool idle() const { return pending_.empty(); }

  int pinned_allocations = 0;
  /// The element ranges of the slot allocation each pinned copy wrote, in issue order.
  std::vector<std::pair<int64_t, int64_t>> pinned_copies;

 private:
  struct Copy {
    Tensor dst;
    int64_t dst_offset;
    const void* src;
    DType src_dtype;
    int64_t n;
  };
  bool in_pinned(const void* src, int64_t bytes) const {
    for (const auto& [p, size] : pinned_) {
      const auto* base = static_cast<const char*>(p);
      const auto* s = static_cast<const char*>(src);
      if (s >= base && s + bytes <= base + size) return true;
    }
    return false;
  }
  std::map<void*, size_t> pinned_;
  std::vector<Copy> pending_;
};

// One staged engine: its backend stays reachable for the checks.
struct StagedEngine {
  StagedCpuBackend* backend = nullptr;
  std::unique_ptr<Engine> engine;
};

StagedEngine make_staged_engine(const Qwen3Config& mc, const HostWeights& base,
                                size_t staging_chunk_bytes) {
  auto backend = std::make_unique<StagedCpuBackend>();
  StagedEngine e;
  e.backend = backend.get();
  auto model = std::make_unique<Qwen3Model>(*backend, mc, base.lookup());
  if (staging_chunk_bytes > 0) model->set_lora_staging_chunk_bytes(staging_chunk_bytes);
  e.engine = std::make_unique<Engine>(std::move(backend), std::move(model), engine_config());
  return e;
}

TEST(LoraEngine, HalfPrecisionFilesAndTheStagedUploadMatchTheMergedModel) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 16);
  // The default 16 MiB halves (each image goes up in one run) and 8 KiB halves (2048 f32
  // elements: several runs per image, the halves used alternately; the r = 16 adapter's
  // gate/up blocks of 2560 elements grow them).
  {
    CpuBackend cpu;
    Qwen3Model model(cpu, mc, base.lookup());
    expect_error([&] { model.set_lora_staging_chunk_bytes(0); },
                 "a staging half needs at least 1 byte, got 0");
  }
  StagedEngine whole = make_staged_engine(mc, base, 0);
  StagedEngine chunked = make_staged_engine(mc, base, 8 << 10);
  std::unique_ptr<Engine> in_place = make_engine(mc, base);
  struct Case {
    LoraConfig config;
    DType file_dtype;
    int chunked_pinned_allocations_after;  // the halves grow only for a larger block
  };
  const std::vector<Case> cases = {
      {lora_config(8, 12.0, {LoraModule::kK, LoraModule::kGate, LoraModule::kDown}, true),
       DType::BF16, 1},
      {lora_config(4, 6.0, {LoraModule::kQ, LoraModule::kO}), DType::F16, 1},
      {lora_config(16, 20.0, kAll, true), DType::BF16, 2},
  };
  TempDir dir;
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    const Case& c = cases[k];
    make_lora_adapter(dir.path(), mc, c.config, 40 + k, c.file_dtype, 0.2f);
    const LoraAdapter adapter = read_lora_adapter(dir.path(), mc);
    whole.backend->pinned_copies.clear();
    chunked.backend->pinned_copies.clear();
    whole.engine->load_lora_adapter({"a", 1, dir.path()});
    chunked.engine->load_lora_adapter({"a", 1, dir.path()});
    in_place->load_lora_adapter({"a", 1, dir.path()});
    // Every copy waited for before the load returned.
    EXPECT_TRUE(whole.backend->idle());
    EXPECT_TRUE(chunked.backend->idle());
    EXPECT_EQ(whole.backend->pinned_allocations, 1);  // pinned once, on the first load
    EXPECT_EQ(chunked.backend->pinned_allocations, c.chunked_pinned_allocations_after);
    ASSERT_EQ(whole.backend->pinned_copies.size(), 1u);
    // The runs' copies cover the image from element 0, back to back, once each.
    const auto& runs = chunked.backend->pinned_copies;
    if (k != 1) {  // case 1's image is smaller than one half
      EXPECT_GE(runs.size(), 3u);
    }
    ASSERT_FALSE(runs.empty());
    EXPECT_EQ(runs.front().first, 0);
    for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i].first, runs[i - 1].second);
    EXPECT_EQ(runs.back().second, whole.backend->pinned_copies[0].second);
    const std::vector<Generated> same = run_all(*in_place, {"a"});
    std::unique_ptr<Engine> dense = make_engine(mc, merge(mc, base, adapter));
    const std::vector<Generated> want = run_all(*dense, {""});
    for (StagedEngine* staged : {&whole, &chunked}) {
      const std::vector<Generated> got = run_all(*staged->engine, {"a"});
      SCOPED_TRACE(staged == &whole ? "one run" : "several runs");
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        // One image, other ways to the slot: the same bits, so the same logprobs exactly.
        EXPECT_EQ(got[i].tokens, same[i].tokens) << "prompt " << i;
        EXPECT_EQ(got[i].logprobs, same[i].logprobs) << "prompt " << i;
        ASSERT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
        for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
          EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 2e-4f) << "prompt " << i;
        }
      }
    }
  }
}

TEST(LoraEngine, MixedBatchEqualsEachRequestAlone) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 12);
  EngineConfig ec = engine_config();
  ec.batch_invariant = true;  // a row's bits do not depend on the batch: compare exactly
  std::unique_ptr<Engine> e = make_engine(mc, base, ec);
  TempDir d1, d2, d3;
  make_lora_adapter(d1.path(), mc, lora_config(8, 16, kAll), 1, DType::F32, 0.2f);
  make_lora_adapter(d2.path(), mc, lora_config(4, 8, {LoraModule::kQ, LoraModule::kUp}), 2,
                    DType::BF16, 0.2f);
  make_lora_adapter(d3.path(), mc, lora_config(16, 16, {LoraModule::kV, LoraModule::kDown}, true),
                    3, DType::F16, 0.2f);
  e->load_lora_adapter({"one", 1, d1.path()});
  e->load_lora_adapter({"two", 2, d2.path()});
  e->load_lora_adapter({"three", 3, d3.path()});
  // Eight requests, adapters interleaved (runs of one adapter and single rows, some none).
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<std::string> loras = {"one", "", "two", "two", "three", "", "one", "three"};
  for (int i = 0; i < 8; ++i) prompts.push_back(kPrompts[static_cast<size_t>(i) % 3]);
  const std::vector<Generated> together = run_all(*e, loras, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<Generated> alone = run_all(*e, {loras[i]}, {prompts[i]});
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "request " << i;
    EXPECT_EQ(together[i].logprobs, alone[0].logprobs) << "request " << i;
  }
  // Same prompt, different adapters: different outputs.
  EXPECT_NE(together[0].tokens, together[3].tokens);  // one / two, prompt 0
  EXPECT_NE(together[1].tokens, together[4].tokens);  // none / three, prompt 1
  e->check_invariants();
  EXPECT_EQ(e->allocator().num_free(), e->num_pages() - 1);
}

// Engine::score with an adapter gives the numbers generate reported for the same tokens
// with it (batch-invariant mode: the same bits), not the base model's; a name not loaded is
// refused before any work, holding no page.
TEST(LoraEngine, ScoreWithAnAdapterEqualsGenerate) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 16);
  EngineConfig ec = engine_config();
  ec.batch_invariant = true;
  std::unique_ptr<Engine> e = make_engine(mc, base, ec);
  TempDir d;
  make_lora_adapter(d.path(), mc, lora_config(8, 16, kAll), 7, DType::F32, 0.2f);
  e->load_lora_adapter({"a", 1, d.path()});
  const std::vector<Generated> with = run_all(*e, {"a"});
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    std::vector<int32_t> all = kPrompts[i];
    all.insert(all.end(), with[i].tokens.begin(), with[i].tokens.end());
    const int32_t plen = static_cast<int32_t>(kPrompts[i].size());
    const ScoreOutput scored = e->score({all}, {plen}, 0, "a")[0];
    EXPECT_EQ(scored.logprobs, with[i].logprobs) << "prompt " << i;
    const ScoreOutput plain = e->score({all}, {plen})[0];
    EXPECT_NE(plain.logprobs, with[i].logprobs) << "prompt " << i << ": the adapter was ignored";
  }
  expect_error([&] { e->score({{1, 2, 3}}, {}, 0, "b"); }, "score: LoRA adapter 'b' is not loaded");
  EXPECT_EQ(e->allocator().num_free(), e->allocator().num_usable());
  e->check_invariants();
}

TEST(LoraEngine, ReplaceInPlaceChangesOutputsAndMissesTheOldPrefix) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 13);
  std::unique_ptr<Engine> e = make_engine(mc, base, engine_config(/*prefix_caching=*/true));
  TempDir v1, v2;
  const LoraConfig cfg = lora_config(8, 16, kAll);
  make_lora_adapter(v1.path(), mc, cfg, 21, DType::F32, 0.2f);
  make_lora_adapter(v2.path(), mc, cfg, 22, DType::F32, 0.2f);
  const std::vector<std::vector<int32_t>> prompt = {kPrompts[2]};  // 11 tokens: 2 full pages

  e->load_lora_adapter({"rl", 1, v1.path()});
  const Generated first = run_all(*e, {"rl"}, prompt)[0];
  const int64_t hits_before = e->prefix_cache_stats().hit_tokens;
  EXPECT_EQ(run_all(*e, {"rl"}, prompt)[0].tokens, first.tokens);
  const int64_t hits_v1 = e->prefix_cache_stats().hit_tokens;
  EXPECT_GT(hits_v1, hits_before);  // the same adapter reuses its pages
  // The base model does not reuse the adapter's pages.
  run_all(*e, {""}, prompt);
  EXPECT_EQ(e->prefix_cache_stats().hit_tokens, hits_v1);

  const LoraAdapterInfo info = e->load_lora_adapter({"rl", 1, v2.path()});
  EXPECT_EQ(info.version, 2u);
  EXPECT_EQ(info.slot, 1);
  const Generated replaced = run_all(*e, {"rl"}, prompt)[0];
  EXPECT_EQ(e->prefix_cache_stats().hit_tokens, hits_v1);  // v1's pages were not matched
  EXPECT_NE(replaced.tokens, first.tokens);
  // What a fresh engine with v2 alone gives.
  std::unique_ptr<Engine> fresh = make_engine(mc, base, engine_config(true));
  fresh->load_lora_adapter({"rl", 1, v2.path()});
  const Generated want = run_all(*fresh, {"rl"}, prompt)[0];
  EXPECT_EQ(replaced.tokens, want.tokens);
  EXPECT_EQ(replaced.logprobs, want.logprobs);
  e->check_invariants();
}

TEST(LoraEngine, LoadAndUnloadErrors) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 14);
  EngineConfig ec = engine_config();
  ec.max_loras = 2;
  std::unique_ptr<Engine> e = make_engine(mc, base, ec);
  TempDir d1, bad;
  make_lora_adapter(d1.path(), mc, lora_config(4, 8, {LoraModule::kO}), 1, DType::F32, 0.2f);
  write_broken(bad.path(), mc, lora_config(4, 8, {LoraModule::kO}),
               [](std::vector<TensorToWrite>& t) { t.pop_back(); });

  // Unknown adapter on a request: finished at once with a message.
  const int64_t id = e->add_request(kPrompts[0], greedy(), "nope");
  EXPECT_EQ(e->request(id).finish_reason, FinishReason::kError);
  EXPECT_NE(e->request(id).error.find("'nope' is not loaded (loaded: none)"), std::string::npos)
      << e->request(id).error;
  e->release(id);
  const std::vector<int64_t> group = [&] {
    SamplingParams p = greedy();
    p.n = 3;
    return e->add_request_group(kPrompts[0], p, {}, "nope");
  }();
  ASSERT_EQ(group.size(), 1u);
  EXPECT_EQ(e->request(group[0]).finish_reason, FinishReason::kError);
  e->release(group[0]);

  expect_error([&] { e->load_lora_adapter({"", 0, d1.path()}); }, "needs a name");
  expect_error([&] { e->load_lora_adapter({"x", 0, bad.path()}); }, "missing tensor");
  EXPECT_TRUE(e->lora_adapters().empty());
  e->load_lora_adapter({"a", 7, d1.path()});
  const Generated a = run_all(*e, {"a"}, {kPrompts[0]})[0];
  // A failed replace keeps the old adapter serving.
  expect_error([&] { e->load_lora_adapter({"a", 7, bad.path()}); }, "missing tensor");
  EXPECT_EQ(e->lora_adapters().at(0).version, 1u);
  EXPECT_EQ(run_all(*e, {"a"}, {kPrompts[0]})[0].tokens, a.tokens);
  e->load_lora_adapter({"b", 8, d1.path()});
  expect_error([&] { e->load_lora_adapter({"c", 9, d1.path()}); },
               "all 2 adapter slots are in use");

  // Unload: not while a request uses it; unknown names.
  const int64_t running = e->add_request(kPrompts[1], greedy(20), "a");
  e->step();
  expect_error([&] { e->unload_lora_adapter("a"); }, "1 unfinished request(s) use it");
  e->abort(running);
  e->release(running);
  e->unload_lora_adapter("a");
  expect_error([&] { e->unload_lora_adapter("a"); }, "no adapter named 'a'");
  ASSERT_EQ(e->lora_adapters().size(), 1u);
  EXPECT_EQ(e->lora_adapters()[0].name, "b");
  EXPECT_EQ(e->lora_adapters()[0].id, 8);
  // The freed slot takes a new adapter; the new one does not see the unloaded one's pages.
  EXPECT_EQ(e->load_lora_adapter({"c", 9, d1.path()}).slot, 1);
  EXPECT_EQ(run_all(*e, {"c"}, {kPrompts[0]})[0].tokens, a.tokens);
  e->check_invariants();
  EXPECT_EQ(e->allocator().num_free(), e->num_pages() - 1);
}

TEST(LoraEngine, MaxLoraRankRefusesLargerAdapters) {
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 15);
  EngineConfig ec = engine_config();
  ec.max_lora_rank = 4;
  std::unique_ptr<Engine> e = make_engine(mc, base, ec);
  TempDir r4, r8;
  make_lora_adapter(r4.path(), mc, lora_config(4, 8, {LoraModule::kQ, LoraModule::kV}), 1);
  make_lora_adapter(r8.path(), mc, lora_config(8, 16, {LoraModule::kQ, LoraModule::kV}), 2);
  expect_error([&] { e->load_lora_adapter({"big", 1, r8.path()}); },
               "rank r = 8 is outside the supported 1..4 (the engine's max_lora_rank)");
  EXPECT_TRUE(e->lora_adapters().empty());
  EXPECT_EQ(e->load_lora_adapter({"small", 2, r4.path()}).slot, 1);
  // A replace by a larger adapter is refused too, keeping the loaded one.
  expect_error([&] { e->load_lora_adapter({"small", 2, r8.path()}); }, "max_lora_rank");
  EXPECT_EQ(e->lora_adapters().at(0).version, 1u);
  for (int32_t bad : {0, 65}) {
    EngineConfig wrong = engine_config();
    wrong.max_lora_rank = bad;
    expect_error([&] { make_engine(mc, base, wrong); },
                 "max_lora_rank must be in [1, 64], got " + std::to_string(bad));
  }
}

TEST(LoraBatch, SlotsAreCheckedByTheBatchAndTheModel) {
  ForwardBatch b;
  b.page_size = 4;
  b.max_pages_per_seq = 2;
  b.token_ids = {5, 6};
  b.positions = {0, 0};
  b.slot_mapping = {4, 8};
  b.query_start = {0, 1, 2};
  b.kv_lens = {1, 1};
  b.page_table = {1, 0, 2, 0};
  b.logits_indices = {0, 1};
  b.validate();
  EXPECT_FALSE(b.has_lora());
  b.lora_slots = {0};
  expect_error([&] { b.validate(); }, "lora_slots has 1 entries for 2 sequences");
  b.lora_slots = {0, -1};
  expect_error([&] { b.validate(); }, "LoRA slot -1 is negative");
  b.lora_slots = {0, 3};
  b.validate();
  EXPECT_TRUE(b.has_lora());

  // A slot without an adapter is refused by the forward, naming the slot.
  const Qwen3Config mc = testing::small_config();
  const HostWeights base = testing::random_weights(mc, 15);
  CpuBackend backend;
  Qwen3Model model(backend, mc, base.lookup());
  model.reserve(8, 8);
  std::vector<DeviceBuffer> storage;
  std::vector<LayerKv> kv(static_cast<size_t>(mc.num_hidden_layers));
  for (LayerKv& layer : kv) {
    for (Tensor* t : {&layer.k, &layer.v}) {
      storage.emplace_back(&backend, size_t{3 * 2 * 4 * 16 * 4});
      *t = storage.back().tensor(DType::F32, {3, 2, 4, 16});
      backend.fill(*t, 0.0f);
    }
  }
  const BatchTensors tensors = backend.upload_batch(b);
  expect_error([&] { model.forward(tensors, kv); }, "LoRA slot 3 holds no adapter");
  expect_error([&] { model.set_lora(0, LoraAdapter{}); }, "slot 0 is not a LoRA slot");
  TempDir dir;
  make_lora_adapter(dir.path(), mc, lora_config(2, 4, {LoraModule::kUp}), 5);
  expect_error([&] { model.set_lora(3, read_lora_adapter(dir.path(), mc)); },
               "outside the model's 0 LoRA slots");
  model.enable_lora(4);
  expect_error([&] { model.enable_lora(5); }, "has 4 LoRA slots already");
  expect_error([&] { model.set_lora(5, read_lora_adapter(dir.path(), mc)); },
               "slot 5 is outside the model's 4 LoRA slots");
  model.set_lora(3, read_lora_adapter(dir.path(), mc));
  EXPECT_TRUE(model.has_lora(3));
  EXPECT_GT(model.lora_bytes(3), 0u);
  model.forward(tensors, kv);
  model.clear_lora(3);
  EXPECT_FALSE(model.has_lora(3));
}

}  // namespace
}  // namespace pagellm
