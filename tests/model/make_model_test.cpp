// make_model: presets, the random weights, determinism, sharding and progress.
#include <gtest/gtest.h>
#include <omp.h>
#include <time.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "model/model_test_util.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/qwen3_weights.h"

namespace pagellm {
namespace {

using testing::error_of;
using testing::read_file;
using testing::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

std::vector<float> to_f32(const HostTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, out.data(), out.size());
  return out;
}

struct Moments {
  double mean = 0, stddev = 0, beyond2 = 0, beyond3 = 0, kurtosis = 0;
};
Moments moments(const std::vector<float>& v, double center_for_tails = 0) {
  Moments m;
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  m.mean = s / v.size();
  double s4 = 0;
  for (float x : v) {
    const double d = x - m.mean;
    s2 += d * d;
    s4 += d * d * d * d;
  }
  m.stddev = std::sqrt(s2 / v.size());
  m.kurtosis = s4 / v.size() / (m.stddev * m.stddev * m.stddev * m.stddev);
  for (float x : v) {
    const double z = std::abs(x - m.mean) / m.stddev;
    m.beyond2 += z > 2;
    m.beyond3 += z > 3;
  }
  m.beyond2 /= v.size();
  m.beyond3 /= v.size();
  return m;
}

TEST(Presets, RealArchitectures) {
  struct Expect {
    const char* name;
    int64_t H, I, L, heads, params;
    bool tied;
  };
  // Parameter counts as published (0.6B, 1.7B, 4.0B, 8.2B), embedding counted once if tied.
  for (const Expect& e : {Expect{"qwen3-0.6b", 1024, 3072, 28, 16, 596049920, true},
                          Expect{"qwen3-1.7b", 2048, 6144, 28, 16, 1720574976, true},
                          Expect{"qwen3-4b", 2560, 9728, 36, 32, 4022468096, true},
                          Expect{"qwen3-8b", 4096, 12288, 36, 32, 8190735360, false}}) {
    const Qwen3Config c = preset_config(e.name);
    EXPECT_EQ(c.vocab_size, 151936) << e.name;
    EXPECT_EQ(c.hidden_size, e.H) << e.name;
    EXPECT_EQ(c.intermediate_size, e.I) << e.name;
    EXPECT_EQ(c.num_hidden_layers, e.L) << e.name;
    EXPECT_EQ(c.num_attention_heads, e.heads) << e.name;
    EXPECT_EQ(c.num_key_value_heads, 8) << e.name;
    EXPECT_EQ(c.head_dim, 128) << e.name;
    EXPECT_EQ(c.tie_word_embeddings, e.tied) << e.name;
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6) << e.name;
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6) << e.name;
    EXPECT_EQ(c.max_position_embeddings, 40960) << e.name;
    EXPECT_EQ(c.num_parameters(), e.params) << e.name;
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643})) << e.name;
    EXPECT_NO_THROW(validate_qwen3_config(c, e.name));
  }
  const Qwen3Config tiny = preset_config("tiny");
  EXPECT_EQ(tiny.vocab_size, 1024);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.intermediate_size, 192);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.head_dim, 32);
  EXPECT_FALSE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.max_position_embeddings, 2048);
  std::string err = error_of([] { preset_config("qwen3-70b"); });
  EXPECT_NE(err.find("'qwen3-70b'"), std::string::npos) << err;
  EXPECT_NE(err.find("tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b"), std::string::npos)
      << err;
}

TEST(RandomNormal, LooksNormal) {
  const int64_t n = 1 << 21;
  std::vector<float> v(n);
  fill_random_normal(random_tensor_key(1, "w"), 0, n, 0.0f, 1.0f, DType::F32, v.data());
  const Moments m = moments(v);
  EXPECT_NEAR(m.mean, 0.0, 0.005);
  EXPECT_NEAR(m.stddev, 1.0, 0.005);
  EXPECT_NEAR(m.beyond2, 0.0455, 0.002);   // P(|z| > 2)
  EXPECT_NEAR(m.beyond3, 0.0027, 0.0004);  // P(|z| > 3)
  EXPECT_NEAR(m.kurtosis, 3.0, 0.05);
  // Neighbouring values are uncorrelated (the two halves of a Box–Muller pair too).
  double even_odd = 0, odd_even = 0;
  for (int64_t i = 0; i + 2 < n; i += 2) {
    even_odd += v[i] * v[i + 1];
    odd_even += v[i + 1] * v[i + 2];
  }
  EXPECT_NEAR(even_odd / (n / 2), 0.0, 0.01);
  EXPECT_NEAR(odd_even / (n / 2), 0.0, 0.01);
  // Mean and scale are applied.
  fill_random_normal(random_tensor_key(1, "w"), 0, n, 1.0f, 0.1f, DType::F32, v.data());
  const Moments shifted = moments(v);
  EXPECT_NEAR(shifted.mean, 1.0, 0.001);
  EXPECT_NEAR(shifted.stddev, 0.1, 0.001);
}

TEST(RandomNormal, ElementsArePureFunctionsOfKeyAndIndex) {
  const uint64_t key = random_tensor_key(42, "model.layers.0.mlp.up_proj.weight");
  const int64_t n = 100'003;  // several parallel blocks and an odd length
  std::vector<float> whole(n), part(n);
  fill_random_normal(key, 0, n, 0, 1, DType::F32, whole.data());
  // Any sub-range, from an odd start too, gives the same values.
  fill_random_normal(key, 17, 5000, 0, 1, DType::F32, part.data());
  EXPECT_EQ(std::memcmp(part.data(), whole.data() + 17, 5000 * sizeof(float)), 0);
  fill_random_normal(key, 9000, n - 9000, 0, 1, DType::F32, part.data());
  EXPECT_EQ(std::memcmp(part.data(), whole.data() + 9000, (n - 9000) * sizeof(float)), 0);
  // Thread count does not matter.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  fill_random_normal(key, 0, n, 0, 1, DType::F32, part.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(part.data(), whole.data(), n * sizeof(float)), 0);
  // bf16 and f16 are the rounded float32 values.
  std::vector<uint16_t> half(n);
  fill_random_normal(key, 0, n, 0, 1, DType::BF16, half.data());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += half[i] != f32_to_bf16(whole[i]);
  EXPECT_EQ(wrong, 0);
  fill_random_normal(key, 0, n, 0, 1, DType::F16, half.data());
  for (int64_t i = 0; i < n; ++i) wrong += half[i] != f32_to_f16(whole[i]);
  EXPECT_EQ(wrong, 0);
  // Other keys give other streams.
  fill_random_normal(random_tensor_key(43, "model.layers.0.mlp.up_proj.weight"), 0, n, 0, 1,
                     DType::F32, part.data());
  EXPECT_NE(part[0], whole[0]);
  EXPECT_NE(random_tensor_key(42, "a"), random_tensor_key(42, "b"));
  EXPECT_THROW(fill_random_normal(key, 0, 4, 0, 1, DType::I32, part.data()), Error);
}

TEST(RandomNormal, IsFastEnoughForBigModels) {
  // qwen3-4b is 4e9 values; at the rate asserted here (>= 50M values/s on one core, the
  // dev machine is shared) that is under 80 core-seconds, and a few on the GPU host.
  const int64_t n = 1 << 24;
  std::vector<uint16_t> v(n);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  // CPU time of this thread (one OpenMP thread runs the region here), which other
  // processes competing for the cores do not inflate.
  auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double start = cpu_seconds();
  fill_random_normal(7, 0, n, 0, 0.02f, DType::BF16, v.data());
  const double seconds = cpu_seconds() - start;
  omp_set_num_threads(threads);
  std::printf("fill_random_normal: %.0f M values per CPU second\n", n / seconds / 1e6);
  EXPECT_LT(seconds, n / 50e6);
}

TEST(MakeModel, TinyFolderLoadsAndValidates) {
  TempDir dir;
  MakeModelOptions opt;
  opt.preset = "tiny";
  opt.out_dir = dir.file("tiny");  // created
  opt.seed = 5;
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  opt.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
  make_model(opt);

  EXPECT_TRUE(fs::exists(opt.out_dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(opt.out_dir + "/model.safetensors.index.json"));
  const Qwen3Config c = load_qwen3_config(opt.out_dir);
  const Qwen3Config preset = preset_config("tiny");
  EXPECT_EQ(c.hidden_size, preset.hidden_size);
  EXPECT_EQ(c.head_dim, preset.head_dim);
  EXPECT_EQ(c.torch_dtype, DType::BF16);
  EXPECT_EQ(c.bos_token_id, preset.bos_token_id);
  EXPECT_EQ(c.eos_token_ids, preset.eos_token_ids);
  // config.json has one eos id, like Qwen3's; generation_config.json has the list.
  EXPECT_EQ(json::parse(read_file(opt.out_dir + "/config.json"))["eos_token_id"], 1023);
  const json gen = json::parse(read_file(opt.out_dir + "/generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], json::array({1023, 1021}));
  EXPECT_EQ(gen["bos_token_id"], 1021);
  EXPECT_EQ(gen["pad_token_id"], 1021);

  WeightStore store = WeightStore::open(opt.out_dir);
  EXPECT_NO_THROW(validate_qwen3_weights(store, c));
  EXPECT_EQ(store.size(), expected_qwen3_weights(c).size());
  EXPECT_EQ(store.get("model.norm.weight").dtype, DType::BF16);
  auto file = SafetensorsFile::open(opt.out_dir + "/model.safetensors");
  EXPECT_EQ(file->metadata().at("format"), "pt");

  // Progress: starts at 0, never goes back, ends at the bytes on disk.
  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress.front().first, 0u);
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
  EXPECT_EQ(progress.back().first, progress.back().second);
  EXPECT_EQ(progress.back().second, fs::file_size(opt.out_dir + "/model.safetensors"));

  // Linear/embedding weights ~ N(0, 0.02), norms ~ N(1, 0.1), lm_head its own matrix.
  const Moments embed = moments(to_f32(store.get("model.embed_tokens.weight")));
  EXPECT_NEAR(embed.mean, 0.0, 0.001);
  EXPECT_NEAR(embed.stddev, 0.02, 0.0005);
  const Moments q = moments(to_f32(store.get("model.layers.1.self_attn.q_proj.weight")));
  EXPECT_NEAR(q.stddev, 0.02, 0.001);
  std::vector<float> norms;
  for (const auto& w : expected_qwen3_weights(c))
    if (w.kind == WeightKind::kNorm) {
      auto v = to_f32(store.get(w.name));
      norms.insert(norms.end(), v.begin(), v.end());
    }
  const Moments nm = moments(norms);
  EXPECT_NEAR(nm.mean, 1.0, 0.02);
  EXPECT_NEAR(nm.stddev, 0.1, 0.01);
  EXPECT_NE(std::memcmp(store.get("lm_head.weight").data,
                        store.get("model.embed_tokens.weight").data,
                        store.get("lm_head.weight").nbytes),
            0);
}

TEST(MakeModel, DeterministicPerSeedAndDtype) {
  TempDir dir;
  auto make = [&](const std::string& name, uint64_t seed, DType dtype) {
    MakeModelOptions opt;
    opt.out_dir = dir.file(name);
    opt.seed = seed;
    opt.dtype = dtype;
    make_model(opt);
    return opt.out_dir;
  };
  const std::string a = make("a", 1, DType::BF16);
  const std::string b = make("b", 1, DType::BF16);
  const std::string c = make("c", 2, DType::BF16);
  const std::string f = make("f", 1, DType::F32);
  EXPECT_EQ(read_file(a + "/model.safetensors"), read_file(b + "/model.safetensors"));
  EXPECT_NE(read_file(a + "/model.safetensors"), read_file(c + "/model.safetensors"));
  EXPECT_EQ(load_qwen3_config(f).torch_dtype, DType::F32);

  // The float32 folder of the same seed holds the same model before rounding.
  WeightStore bf16 = WeightStore::open(a), f32 = WeightStore::open(f);
  EXPECT_EQ(f32.get("model.norm.weight").dtype, DType::F32);
  for (const std::string& name : bf16.names()) {
    const HostTensor& h = bf16.get(name);
    const auto* wide = static_cast<const float*>(f32.get(name).data);
    const auto* narrow = static_cast<const uint16_t*>(h.data);
    int64_t wrong = 0;
    for (int64_t i = 0; i < h.numel(); ++i) wrong += narrow[i] != f32_to_bf16(wide[i]);
    EXPECT_EQ(wrong, 0) << name;
  }
}

TEST(MakeModel, ShardsLikeSavePretrained) {
  TempDir dir;
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  opt.seed = 3;
  make_model(opt);  // single file first, to check that re-running replaces it
  WeightStore single = WeightStore::open(dir.path());
  std::map<std::string, std::string> single_bytes;
  for (const std::string& name : single.names()) {
    const HostTensor& t = single.get(name);
    single_bytes[name] = std::string(static_cast<const char*>(t.data), t.nbytes);
  }

  // tiny in bf16: embed and lm_head are 128 KiB each, layers ~100 KiB. With a 100 KB limit
  // embed and lm_head exceed it and get shards of their own.
  opt.shard_bytes = 100'000;
  uint64_t last_total = 0, last_done = 0;
  opt.progress = [&](uint64_t done, uint64_t total) { last_done = done, last_total = total; };
  make_model(opt);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  const json index = json::parse(read_file(dir.file("model.safetensors.index.json")));
  const Qwen3Config c = load_qwen3_config(dir.path());
  std::set<std::string> shard_files;
  uint64_t shard_bytes_on_disk = 0;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it)
    shard_files.insert(it->get<std::string>());
  for (const std::string& f : shard_files) shard_bytes_on_disk += fs::file_size(dir.file(f));
  const size_t n = shard_files.size();
  EXPECT_GE(n, 4u);
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05zu.safetensors", n);
  EXPECT_TRUE(shard_files.count(first)) << first;
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], first);
  EXPECT_EQ(index["weight_map"].size(), expected_qwen3_weights(c).size());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 2 * c.num_parameters());
  EXPECT_EQ(index["metadata"]["total_parameters"].get<int64_t>(), c.num_parameters());
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, shard_bytes_on_disk);

  WeightStore sharded = WeightStore::open(dir.path());
  EXPECT_EQ(sharded.files().size(), n);
  EXPECT_NO_THROW(validate_qwen3_weights(sharded, c));
  // The embedding is alone in its shard (bigger than the limit); every shard but such
  // single-tensor ones stays within the limit.
  auto shard = SafetensorsFile::open(sharded.get("model.embed_tokens.weight").file);
  EXPECT_EQ(shard->tensors().size(), 1u);
  for (const std::string& f : shard_files) {
    auto s = SafetensorsFile::open(dir.file(f));
    uint64_t bytes = 0;
    for (const auto& t : s->tensors()) bytes += t.nbytes;
    EXPECT_TRUE(s->tensors().size() == 1 || bytes <= opt.shard_bytes) << f;
  }
  // Same seed, same values, whatever the sharding.
  for (const auto& [name, bytes] : single_bytes) {
    const HostTensor& t = sharded.get(name);
    EXPECT_EQ(std::string(static_cast<const char*>(t.data), t.nbytes), bytes) << name;
  }

  // Back to one file: the shards and the index go away.
  opt.shard_bytes = 4ull << 30;
  make_model(opt);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.file(first)));
  EXPECT_EQ(WeightStore::open(dir.path()).files().size(), 1u);
}

TEST(MakeModel, RejectsBadOptions) {
  TempDir dir;
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  opt.preset = "nope";
  EXPECT_NE(error_of([&] { make_model(opt); }).find("unknown model preset"), std::string::npos);
  opt.preset = "tiny";
  opt.dtype = DType::I64;
  EXPECT_NE(error_of([&] { make_model(opt); }).find("dtype"), std::string::npos);
  opt.dtype = DType::BF16;
  testing::write_file(dir.file("a-file"), "x");
  opt.out_dir = dir.file("a-file");
  EXPECT_NE(error_of([&] { make_model(opt); }).find("cannot create folder"), std::string::npos);
  opt.out_dir = "";
  EXPECT_NE(error_of([&] { make_model(opt); }).find("no output folder"), std::string::npos);
  Qwen3Config bad = preset_config("tiny");
  bad.num_key_value_heads = 3;
  opt.out_dir = dir.path();
  EXPECT_NE(error_of([&] { write_random_model(bad, opt); }).find("num_key_value_heads"),
            std::string::npos);
}

}  // namespace
}  // namespace pagellm
