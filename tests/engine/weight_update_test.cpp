// In-place weight updates on the CPU backend: an engine updated to weights B produces
// exactly (bitwise) what a fresh engine loaded with B produces, for full and partial
// updates from every memory kind and dtype, from named tensors and from a safetensors
// folder; fused q/k/v and gate/up and tied embeddings land where they belong; a bad update
// changes nothing; the pause modes treat running requests as documented, and every token
// reports the weights version it was sampled under.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "common/broadcast_update.h"
#include "common/expect_error.h"
#include "common/reference_qwen3.h"
#include "pagellm/common/dtype.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"
#include "pagellm/engine/weight_group.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/safetensors.h"

namespace pagellm {
namespace {

using testing::HostWeights;

EngineConfig small_engine_config() {
  EngineConfig ec;
  ec.page_size = 4;
  ec.num_pages = 64;
  ec.max_num_seqs = 4;
  ec.max_num_batched_tokens = 32;
  ec.max_model_len = 96;
  ec.use_graphs = false;
  return ec;
}

std::unique_ptr<Engine> make_engine(const Qwen3Config& c, const WeightLookup& lookup) {
  auto backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, lookup);
  return std::make_unique<Engine>(std::move(backend), std::move(model), small_engine_config());
}

// Weights A with the named tensors taken from B.
HostWeights mix(const HostWeights& a, const HostWeights& b, const std::set<std::string>& from_b) {
  HostWeights m = a;
  for (const std::string& name : from_b) m.data[name] = b.data.at(name);
  return m;
}

// Named tensors of `w` (float32 host data), optionally only `names`.
std::vector<NamedTensor> named(const HostWeights& w, TensorMemory memory = TensorMemory::kHost,
                               const std::set<std::string>& names = {}) {
  std::vector<NamedTensor> out;
  for (const auto& [name, data] : w.data) {
    if (!names.empty() && !names.count(name)) continue;
    NamedTensor t;
    t.name = name;
    t.data = data.data();
    t.dtype = TensorDType::kFloat32;
    t.shape = w.shapes.at(name);
    t.memory = memory;
    out.push_back(t);
  }
  return out;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // every sampled row, in order
};

// Seeded sampling over a few prompts; records tokens and every row of logits.
Outputs generate(Engine& engine) {
  Outputs r;
  engine.set_logits_hook([&](int64_t, int64_t, const float* l, int64_t v) {
    r.logits.emplace_back(l, l + v);
  });
  std::vector<std::vector<int32_t>> prompts = {{3, 14, 15, 92}, {6, 5, 35}, {8, 9, 7, 9, 3, 2}};
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.seed = 11;
  sp.max_tokens = 7;
  sp.ignore_eos = true;
  std::vector<int64_t> ids;
  for (const Sequence* s : engine.generate(prompts, {sp})) {
    r.tokens.push_back(s->output);
    ids.push_back(s->id);
  }
  for (int64_t id : ids) engine.release(id);
  engine.set_logits_hook(nullptr);
  return r;
}

void expect_same(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i], want.logits[i]) << "logits row " << i << " differ";
  }
}

void expect_all_pages_free(const Engine& engine) {
  engine.check_invariants();
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable());
}

class WeightUpdate : public ::testing::Test {
 protected:
  Qwen3Config c = testing::small_config();
  HostWeights a = testing::random_weights(c, 1);
  HostWeights b = testing::random_weights(c, 2);
};

TEST_F(WeightUpdate, FullUpdateFromEveryMemoryKindEqualsAFreshEngine) {
  auto fresh = make_engine(c, b.lookup());
  const Outputs want = generate(*fresh);
  for (TensorMemory memory :
       {TensorMemory::kHost, TensorMemory::kHostPinned, TensorMemory::kDevice}) {
    auto engine = make_engine(c, a.lookup());
    const Outputs before = generate(*engine);
    ASSERT_NE(before.tokens, want.tokens) << "weights A and B must differ in output";
    const WeightUpdateResult r = engine->update_weights(named(b, memory));
    EXPECT_EQ(r.weights_version, 1u);
    EXPECT_EQ(engine->weights_version(), 1u);
    EXPECT_EQ(r.tensors_updated, static_cast<int64_t>(b.data.size()));
    EXPECT_GT(r.seconds, 0.0);
    expect_same(generate(*engine), want);
    expect_all_pages_free(*engine);
  }
}

TEST_F(WeightUpdate, Bf16SourcesConvertLikeALoad) {
  // B rounded to bf16: the update converts as the loader does, so the results are bitwise
  // those of a fresh engine loaded from the same bf16 data.
  std::map<std::string, std::vector<uint16_t>> half;
  std::vector<NamedTensor> tensors;
  for (const auto& [name, data] : b.data) {
    auto& h = half[name];
    for (float x : data) h.push_back(f32_to_bf16(x));
    NamedTensor t;
    t.name = name;
    t.data = h.data();
    t.dtype = TensorDType::kBFloat16;
    t.shape = b.shapes.at(name);
    tensors.push_back(t);
  }
  WeightLookup bf16_lookup = [&](const std::string& name) {
    return WeightView{half.at(name).data(), DType::BF16, b.shapes.at(name)};
  };
  auto fresh = make_engine(c, bf16_lookup);
  auto engine = make_engine(c, a.lookup());
  engine->update_weights(tensors);
  expect_same(generate(*engine), generate(*fresh));
}

TEST_F(WeightUpdate, SubsetLandsInTheFusedRows) {
  // q and v of layer 0 (rows of the fused qkv matrix around k, which stays A), up of
  // layer 1 (the second half of gate_up), a norm and the output projection.
  const std::set<std::string> subset = {
      "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
      "model.layers.1.mlp.up_proj.weight", "model.layers.1.self_attn.k_norm.weight",
      "lm_head.weight"};
  const HostWeights mixed = mix(a, b, subset);
  auto fresh = make_engine(c, mixed.lookup());
  auto engine = make_engine(c, a.lookup());
  const WeightUpdateResult r = engine->update_weights(named(b, TensorMemory::kHost, subset));
  EXPECT_EQ(r.tensors_updated, 5);
  expect_same(generate(*engine), generate(*fresh));

  // Then the rest of the fused matrices, in a second update: all of B.
  engine->update_weights(named(b));
  EXPECT_EQ(engine->weights_version(), 2u);
  auto all_b = make_engine(c, b.lookup());
  expect_same(generate(*engine), generate(*all_b));
}

TEST_F(WeightUpdate, TiedEmbeddingsUpdateTheOutputProjection) {
  const Qwen3Config tied = testing::small_config(/*tied=*/true);
  const HostWeights ta = testing::random_weights(tied, 3);
  const HostWeights tb = testing::random_weights(tied, 4);
  const std::set<std::string> embed = {"model.embed_tokens.weight"};
  auto fresh = make_engine(tied, mix(ta, tb, embed).lookup());
  auto engine = make_engine(tied, ta.lookup());
  // A state_dict of a tied model also carries lm_head.weight (the same tensor): checked,
  // not written twice.
  std::vector<NamedTensor> tensors = named(tb, TensorMemory::kHost, embed);
  NamedTensor head = tensors[0];
  head.name = "lm_head.weight";
  tensors.push_back(head);
  const WeightUpdateResult r = engine->update_weights(tensors);
  EXPECT_EQ(r.tensors_updated, 1);
  expect_same(generate(*engine), generate(*fresh));
}

TEST_F(WeightUpdate, FromAFolderAndFromOneFile) {
  // A sharded folder as save_pretrained writes it (make_model with a small shard size).
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pagellm-wu-" + std::to_string(::getpid()));
  MakeModelOptions opt;
  opt.out_dir = dir.string();
  opt.seed = 9;
  opt.dtype = DType::F32;
  opt.shard_bytes = 40'000;
  write_random_model(c, opt);
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  auto fresh = std::unique_ptr<Engine>();
  {
    auto backend = std::make_unique<CpuBackend>();
    auto model = Qwen3Model::load(*backend, dir.string());
    fresh = std::make_unique<Engine>(std::move(backend), std::move(model), small_engine_config());
  }
  const Outputs want = generate(*fresh);
  auto engine = make_engine(c, a.lookup());
  const WeightUpdateResult r = engine->load_weights(dir.string());
  EXPECT_EQ(r.weights_version, 1u);
  expect_same(generate(*engine), want);

  // One file holding a subset.
  const std::string file = (dir / "part.safetensors").string();
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  write_safetensors(file, {TensorToWrite::from_memory(q, DType::F32, b.shapes.at(q), b.at(q).data()),
                           TensorToWrite::from_memory(gate, DType::F32, b.shapes.at(gate),
                                                      b.at(gate).data())});
  auto engine2 = make_engine(c, a.lookup());
  EXPECT_EQ(engine2->load_weights(file).tensors_updated, 2);
  auto fresh2 = make_engine(c, mix(a, b, {q, gate}).lookup());
  expect_same(generate(*engine2), generate(*fresh2));
  std::filesystem::remove_all(dir);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a pagellm::Error";
  return "";
}

TEST_F(WeightUpdate, BadUpdateIsRejectedWholeAndNamesEveryProblem) {
  auto engine = make_engine(c, a.lookup());
  const Outputs before = generate(*engine);
  // A request in flight when the update is refused keeps running on the old weights.
  SamplingParams sp;
  sp.max_tokens = 3;
  sp.ignore_eos = true;
  const int64_t running = engine->add_request({1, 2, 3}, sp);
  engine->step();

  std::vector<NamedTensor> tensors = named(b);  // all good ones first: none may be written
  NamedTensor unknown = tensors[0];
  unknown.name = "model.layers.7.mlp.up_proj.weight";
  NamedTensor bad_shape = tensors[1];
  bad_shape.shape = {bad_shape.shape[0] + 1};
  std::vector<int32_t> ints(4096, 1);
  NamedTensor bad_dtype;
  bad_dtype.name = "model.norm.weight";
  bad_dtype.data = ints.data();
  bad_dtype.dtype = TensorDType::kInt32;
  bad_dtype.shape = {c.hidden_size};
  NamedTensor bad_kind = named(b, TensorMemory::kHost, {"model.layers.0.mlp.down_proj.weight"})[0];
  bad_kind.memory = static_cast<TensorMemory>(7);
  NamedTensor null_data = named(b, TensorMemory::kHost, {"model.layers.1.mlp.down_proj.weight"})[0];
  null_data.data = nullptr;
  // Names already among `tensors`: "given more than once" for these two.
  tensors.push_back(bad_dtype);
  tensors.push_back(bad_kind);
  tensors.push_back(null_data);
  tensors.push_back(unknown);
  tensors.push_back(bad_shape);

  const std::string msg = error_of([&] { engine->update_weights(tensors, PauseMode::kKeep); });
  EXPECT_NE(msg.find("no weight was changed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.7.mlp.up_proj.weight': not a parameter"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("given more than once"), std::string::npos) << msg;

  // Each problem alone, so that each is named with what is accepted.
  const std::string shape_msg = error_of([&] { engine->update_weights({bad_shape}); });
  EXPECT_NE(shape_msg.find("shape [" + std::to_string(bad_shape.shape[0]) + "], expected ["),
            std::string::npos)
      << shape_msg;
  const std::string dtype_msg = error_of([&] { engine->update_weights({bad_dtype}); });
  EXPECT_NE(dtype_msg.find("dtype int32; weights must be float32, bfloat16 or float16"),
            std::string::npos)
      << dtype_msg;
  const std::string kind_msg = error_of([&] { engine->update_weights({bad_kind}); });
  EXPECT_NE(kind_msg.find("unknown memory kind 7 (expected host, pinned host or device)"),
            std::string::npos)
      << kind_msg;
  const std::string null_msg = error_of([&] { engine->update_weights({null_data}); });
  EXPECT_NE(null_msg.find("no data (null pointer)"), std::string::npos) << null_msg;
  const std::string folder_msg = error_of([&] { engine->load_weights("/no/such/folder"); });
  EXPECT_NE(folder_msg.find("/no/such/folder"), std::string::npos) << folder_msg;

  // Nothing changed: same version, the request finishes, same outputs as before.
  EXPECT_EQ(engine->weights_version(), 0u);
  EXPECT_FALSE(engine->paused());
  while (engine->has_unfinished()) engine->step();
  EXPECT_EQ(engine->request(running).finish_reason, FinishReason::kLength);
  engine->release(running);
  // A refused update leaves the prefix cache as it was, so the prompts would now skip
  // their cached pages: a different batch than `before`'s, whose float sums the CPU's BLAS
  // may order differently (seen on AVX-512 OpenBLAS). Compare the same computation.
  engine->reset_prefix_cache();
  expect_same(generate(*engine), before);
  expect_all_pages_free(*engine);
}

class PauseModes : public WeightUpdate {
 protected:
  // Three requests of 12 tokens, run for `steps` steps.
  std::vector<int64_t> start(Engine& engine, int steps) {
    SamplingParams sp;
    sp.temperature = 0.7f;
    sp.seed = 5;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    std::vector<int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(engine.add_request({4, 5, 6, int32_t(7 + i)}, sp));
    for (int s = 0; s < steps; ++s) engine.step();
    return ids;
  }
};

TEST_F(PauseModes, WaitLetsRunningRequestsFinishOnTheOldWeights) {
  auto engine = make_engine(c, a.lookup());
  auto reference = make_engine(c, a.lookup());
  const std::vector<int64_t> ids = start(*engine, 3);
  const std::vector<int64_t> ref_ids = start(*reference, 3);
  while (reference->has_unfinished()) reference->step();

  const WeightUpdateResult r = engine->update_weights(named(b), PauseMode::kWait);
  EXPECT_EQ(r.mode, PauseMode::kWait);
  EXPECT_EQ(r.requests_waited, 3);
  EXPECT_EQ(r.requests_aborted, 0);
  EXPECT_EQ(r.requests_kept, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = engine->request(ids[i]);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
    EXPECT_EQ(s.output, reference->request(ref_ids[i]).output) << "finished on weights A";
    for (const SampledToken& t : s.sampled) EXPECT_EQ(t.weights_version, 0u);
    engine->release(ids[i]);
  }
  expect_all_pages_free(*engine);
  // New requests run on B and say so.
  SamplingParams sp;
  sp.max_tokens = 2;
  sp.ignore_eos = true;
  const int64_t id = engine->add_request({1, 2}, sp);
  while (engine->has_unfinished()) engine->step();
  for (const SampledToken& t : engine->request(id).sampled) EXPECT_EQ(t.weights_version, 1u);
}

TEST_F(PauseModes, AbortEndsRunningRequestsAndFreesTheirPages) {
  auto engine = make_engine(c, a.lookup());
  const std::vector<int64_t> ids = start(*engine, 3);
  EXPECT_LT(engine->allocator().num_free(), engine->allocator().num_usable());
  const WeightUpdateResult r = engine->update_weights(named(b), PauseMode::kAbort);
  EXPECT_EQ(r.requests_aborted, 3);
  for (int64_t id : ids) EXPECT_EQ(engine->request(id).finish_reason, FinishReason::kAborted);
  EXPECT_FALSE(engine->has_unfinished());
  expect_all_pages_free(*engine);
  auto fresh = make_engine(c, b.lookup());
  for (int64_t id : ids) engine->release(id);
  expect_same(generate(*engine), generate(*fresh));
}

TEST_F(PauseModes, KeepContinuesWithNewWeightsAndVersionsPerToken) {
  auto engine = make_engine(c, a.lookup());
  const std::vector<int64_t> ids = start(*engine, 4);  // one prefill step, then 3 decodes
  std::vector<size_t> before;
  for (int64_t id : ids) before.push_back(engine->request(id).output.size());
  const WeightUpdateResult r = engine->update_weights(named(b), PauseMode::kKeep);
  EXPECT_EQ(r.requests_kept, 3);
  EXPECT_EQ(r.weights_version, 1u);
  while (engine->has_unfinished()) engine->step();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = engine->request(ids[i]);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
    ASSERT_EQ(s.sampled.size(), 12u);
    ASSERT_GT(before[i], 0u);
    for (size_t k = 0; k < s.sampled.size(); ++k)
      EXPECT_EQ(s.sampled[k].weights_version, k < before[i] ? 0u : 1u) << "token " << k;
    engine->release(ids[i]);
  }
  expect_all_pages_free(*engine);
}

TEST_F(PauseModes, RequestsAddedWhilePausedRunAfterResume) {
  auto engine = make_engine(c, a.lookup());
  const std::vector<int64_t> ids = start(*engine, 2);
  engine->pause(PauseMode::kKeep);
  EXPECT_THROW(engine->pause(PauseMode::kWait), Error);
  const int32_t computed = engine->request(ids[0]).num_computed;
  SamplingParams sp;
  sp.max_tokens = 3;
  sp.ignore_eos = true;
  const int64_t late = engine->add_request({9, 9, 9}, sp);
  const int64_t late_aborted = engine->add_request({8, 8}, sp);
  EXPECT_FALSE(engine->has_runnable());
  EXPECT_TRUE(engine->step().empty());  // frozen
  EXPECT_EQ(engine->request(ids[0]).num_computed, computed);
  engine->abort(late_aborted);  // a held request can be aborted
  EXPECT_EQ(engine->request(late_aborted).finish_reason, FinishReason::kAborted);
  // Paused already: the update uses the pause (keep) and leaves the engine paused.
  const WeightUpdateResult r = engine->update_weights(named(b), PauseMode::kWait);
  EXPECT_EQ(r.mode, PauseMode::kKeep);
  EXPECT_TRUE(engine->paused());
  engine->resume();
  while (engine->has_unfinished()) engine->step();
  EXPECT_EQ(engine->request(late).finish_reason, FinishReason::kLength);
  for (const SampledToken& t : engine->request(late).sampled) EXPECT_EQ(t.weights_version, 1u);
  for (int64_t id : ids) engine->release(id);
  engine->release(late);
  engine->release(late_aborted);
  expect_all_pages_free(*engine);
}

// ---- weights broadcast from a trainer ("tcp" transport; NCCL's runs on two GPUs) ---------

TEST(BroadcastBuckets, PackInOrderAlignedAndSplitWhereTheBucketIsFull) {
  auto t = [](const char* name, TensorDType d, std::vector<int64_t> shape) {
    return BroadcastTensor{name, d, std::move(shape)};
  };
  // 600 + 10 bytes, then 1000 bytes, then 5000 bytes (alone, over the bucket), then 2.
  const std::vector<BroadcastTensor> tensors = {
      t("a", TensorDType::kBFloat16, {300}), t("b", TensorDType::kFloat32, {2, 5, 0, 1}),
      t("c", TensorDType::kFloat16, {10}), t("d", TensorDType::kFloat32, {250}),
      t("e", TensorDType::kBFloat16, {2500}), t("f", TensorDType::kInt64, {1})};
  const std::vector<BroadcastBucket> b = plan_broadcast_buckets(tensors, 1024);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].first, 0u);
  EXPECT_EQ(b[0].offsets, (std::vector<uint64_t>{0, 768, 768}));  // 600 -> 768; b is empty
  EXPECT_EQ(b[0].bytes, 768u + 20u);
  EXPECT_EQ(b[1].first, 3u);  // 1024 + 1000 would pass 1024
  EXPECT_EQ(b[1].offsets, (std::vector<uint64_t>{0}));
  EXPECT_EQ(b[1].bytes, 1000u);
  EXPECT_EQ(b[2].first, 4u);
  EXPECT_EQ(b[2].bytes, 5000u);
  EXPECT_EQ(b[3].first, 5u);
  EXPECT_EQ(b[3].bytes, 8u);
  // One bucket when everything fits.
  EXPECT_EQ(plan_broadcast_buckets(tensors, uint64_t{1} << 20).size(), 1u);

  testing::expect_error([&] { plan_broadcast_buckets({}, 1024); }, "at least one tensor");
  testing::expect_error([&] { plan_broadcast_buckets(tensors, 0); }, "bucket_bytes");
  testing::expect_error([&] { plan_broadcast_buckets({t("x", TensorDType::kFloat32, {-1})}, 64); },
                        "negative size");
  testing::expect_error([&] { plan_broadcast_buckets({t("", TensorDType::kFloat32, {1})}, 64); },
                        "name is empty");
  testing::expect_error(
      [&] { plan_broadcast_buckets({t("x", TensorDType::kFloat32, {1 << 20, 1 << 20})}, 64); },
      "2^40");
}

// A trainer (TcpWeightSender on the loopback) and an engine that joined its group.
class WeightBroadcast : public WeightUpdate {
 protected:
  void join(Engine& engine, const std::string& name = "") {
    sender = std::make_unique<TcpWeightSender>("127.0.0.1", 0, 2, name);
    WeightGroupSpec spec;
    spec.transport = "tcp";
    spec.address = sender->address();
    spec.name = name;
    spec.timeout_seconds = 20;
    std::thread trainer([&] { sender->accept(20'000); });
    engine.join_weight_group(spec);
    trainer.join();
  }
  // B's tensors as the trainer names them (float32 host data).
  void tensors_of(const HostWeights& w, std::vector<BroadcastTensor>& list,
                  std::vector<const void*>& data) {
    for (const auto& [name, values] : w.data) {
      list.push_back({name, TensorDType::kFloat32, w.shapes.at(name)});
      data.push_back(values.data());
    }
  }
  // The trainer sends while the engine updates, as over HTTP.
  WeightUpdateResult update(Engine& engine, const std::vector<BroadcastTensor>& list,
                            const std::vector<const void*>& data, uint64_t bucket_bytes,
                            const std::vector<BroadcastTensor>* engine_list = nullptr) {
    return testing::broadcast_update(engine, *sender, list, data, engine_list ? *engine_list : list,
                                     bucket_bytes);
  }
  std::unique_ptr<TcpWeightSender> sender;
};

TEST_F(WeightBroadcast, UpdateInManyBucketsEqualsAFreshEngine) {
  auto fresh = make_engine(c, b.lookup());
  const Outputs want = generate(*fresh);
  auto engine = make_engine(c, a.lookup());
  ASSERT_NE(generate(*engine).tokens, want.tokens);
  join(*engine, "rl");
  ASSERT_NE(engine->weight_group(), nullptr);
  EXPECT_EQ(engine->weight_group()->name, "rl");
  std::vector<BroadcastTensor> list;
  std::vector<const void*> data;
  tensors_of(b, list, data);
  // Small buckets: many tensors split across buckets, fused q/k/v in different ones.
  const uint64_t bucket = 3000;
  ASSERT_GT(plan_broadcast_buckets(list, bucket).size(), 10u);
  const WeightUpdateResult r = update(*engine, list, data, bucket);
  EXPECT_EQ(r.weights_version, 1u);
  EXPECT_EQ(r.tensors_updated, static_cast<int64_t>(b.data.size()));
  expect_same(generate(*engine), want);
  expect_all_pages_free(*engine);
  // The bucket memory stays for the next update: the largest bucket's size.
  uint64_t largest = 0;
  for (const BroadcastBucket& k : plan_broadcast_buckets(list, bucket)) largest = std::max(largest, k.bytes);
  EXPECT_EQ(engine->weight_group_staging_bytes(), largest);

  // A second update over the same group (back to A, bf16-exact values are not needed:
  // float32 copies), in one bucket.
  list.clear();
  data.clear();
  tensors_of(a, list, data);
  EXPECT_EQ(update(*engine, list, data, uint64_t{1} << 30).weights_version, 2u);
  auto fresh_a = make_engine(c, a.lookup());
  expect_same(generate(*engine), generate(*fresh_a));
  // Grown to the one bucket of the whole model; freed with the group.
  EXPECT_EQ(engine->weight_group_staging_bytes(),
            plan_broadcast_buckets(list, uint64_t{1} << 30).at(0).bytes);
  engine->leave_weight_group();
  EXPECT_EQ(engine->weight_group_staging_bytes(), 0u);
}

TEST_F(WeightBroadcast, RejectedUpdateDrainsTheBucketsAndTheGroupStaysUsable) {
  auto engine = make_engine(c, a.lookup());
  const Outputs before = generate(*engine);
  join(*engine);
  std::vector<BroadcastTensor> list;
  std::vector<const void*> data;
  tensors_of(b, list, data);
  // The engine is told of a name the model lacks (same byte size, so the trainer's buckets
  // still pack alike): nothing is written, the buckets are drained.
  std::vector<BroadcastTensor> wrong = list;
  wrong[3].name = "model.layers.99.mlp.up_proj.weight";
  const std::string error = testing::error_of([&] { update(*engine, list, data, 4096, &wrong); });
  EXPECT_NE(error.find("model.layers.99.mlp.up_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("received and dropped"), std::string::npos) << error;
  EXPECT_EQ(engine->weights_version(), 0u);
  engine->reset_prefix_cache();  // the first run's prompts would hit it (other chunking)
  expect_same(generate(*engine), before);

  // The group is in step: the next update works.
  EXPECT_EQ(update(*engine, list, data, 4096).weights_version, 1u);
  auto fresh = make_engine(c, b.lookup());
  expect_same(generate(*engine), generate(*fresh));
  expect_all_pages_free(*engine);
}

TEST_F(WeightBroadcast, TrainerLeavingMidwayAdvancesTheVersionAndLeavesTheGroup) {
  auto engine = make_engine(c, a.lookup());
  join(*engine);
  std::vector<BroadcastTensor> list;
  std::vector<const void*> data;
  tensors_of(b, list, data);
  // The trainer sends the first three tensors' buckets, then goes away.
  const std::vector<BroadcastTensor> head(list.begin(), list.begin() + 3);
  const std::vector<const void*> head_data(data.begin(), data.begin() + 3);
  std::thread trainer([&] {
    sender->send(head, head_data, 1);  // bucket_bytes 1: one tensor per bucket
    sender->close();
  });
  const std::string error =
      testing::error_of([&] { engine->update_weights_from_broadcast(list, 1); });
  trainer.join();
  EXPECT_NE(error.find("after 3 of " + std::to_string(list.size()) + " buckets"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("closed the connection"), std::string::npos) << error;
  EXPECT_EQ(engine->weights_version(), 1u);  // part of the weights changed
  EXPECT_EQ(engine->weight_group(), nullptr);
  testing::expect_error([&] { engine->update_weights_from_broadcast(list, 1); },
                        "no weight group is joined");
  expect_all_pages_free(*engine);
}

TEST_F(WeightBroadcast, BadGroupsAndUpdatesAreRefusedNamingTheProblem) {
  auto engine = make_engine(c, a.lookup());
  std::vector<BroadcastTensor> list = {{"model.norm.weight", TensorDType::kFloat32, {c.hidden_size}}};
  testing::expect_error([&] { engine->update_weights_from_broadcast(list, 64); },
                        "no weight group is joined");
  WeightGroupSpec spec;
  spec.nccl_unique_id.assign(128, 1);
  testing::expect_error([&] { engine->join_weight_group(spec); }, "\"tcp\" transport");
  spec.nccl_unique_id.assign(5, 1);
  testing::expect_error([&] { engine->join_weight_group(spec); }, "128 bytes, got 5");
  spec.transport = "smoke";
  testing::expect_error([&] { engine->join_weight_group(spec); }, "unknown transport 'smoke'");
  spec.transport = "tcp";
  spec.address = "localhost";
  testing::expect_error([&] { engine->join_weight_group(spec); }, "is not host:port");
  spec.rank = 0;
  testing::expect_error([&] { engine->join_weight_group(spec); }, "the trainer is rank 0");
  // A trainer that is not listening: the join gives up after the timeout, naming the place.
  spec.rank = 1;
  {
    TcpWeightSender closed("127.0.0.1", 0, 2);
    spec.address = closed.address();
  }
  spec.timeout_seconds = 0.3;
  testing::expect_error([&] { engine->join_weight_group(spec); }, "cannot connect to the trainer");
  // The trainer's group is of another size: it refuses the engine, which says why.
  TcpWeightSender three("127.0.0.1", 0, 3);
  spec.address = three.address();
  spec.timeout_seconds = 20;
  std::thread trainer([&] {
    try {
      three.accept(1500);
    } catch (const Error&) {
    }
  });
  testing::expect_error([&] { engine->join_weight_group(spec); }, "world size 2, the trainer's group has 3");
  trainer.join();
  EXPECT_EQ(engine->weight_group(), nullptr);

  join(*engine, "g");
  testing::expect_error([&] { engine->join_weight_group(spec); }, "joined already");
  // Another group's name: refused, the trainer's bucket drained.
  const std::vector<float> norm(static_cast<size_t>(c.hidden_size), 1.0f);
  std::thread send([&] { sender->send(list, {norm.data()}, 64); });
  testing::expect_error([&] { engine->update_weights_from_broadcast(list, 64, PauseMode::kWait, "h"); },
                        "names weight group 'h'");
  send.join();
  engine->leave_weight_group();
  EXPECT_EQ(engine->weight_group(), nullptr);
  EXPECT_EQ(engine->weights_version(), 0u);
}

}  // namespace
}  // namespace pagellm
