// In-place weight updates on the CUDA backend (Qwen3Model::update_weights through
// CudaBackend::write_weights): a decode forward captured into a CUDA graph before any
// update, replayed after updates from pinned host memory (bf16, straight DMA), from
// device memory (bf16, device copy) and from device memory of another dtype (float32,
// converted on the device), gives the logits the CPU backend computes with the new weights
// (outputs poisoned with NaN before each replay). The graph is never re-captured: the
// update writes into the same buffers and refreshes the packed decode copies in place.
// Wrong memory kinds are refused with the kind found, and nothing is written. Strided writes
// (Backend::write_weights_2d: a tensor-parallel rank's column range of o_proj or down) write
// what the CPU backend writes, from every memory kind and dtype, and nothing else.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "cuda/engine_run.h"
#include "pagellm/engine/engine.h"
#include "pagellm/engine/weight_group.h"
#include "pagellm/model/qwen3.h"

namespace pagellm {
namespace {

using test::relative_close;

// The logits tolerance of a bf16 forward against the float32 CPU one.
constexpr double kLogitsTol = 3e-2;

testing::HostWeights bf16_rounded(testing::HostWeights w) {
  for (auto& [name, values] : w.data)
    for (float& x : values) x = bf16_to_f32(f32_to_bf16(x));
  return w;
}

class CudaWeightUpdate : public test::CudaOpTest {
 protected:
  static constexpr int32_t kPage = 16, kPages = 24, kMaxPagesPerSeq = 4, kSeqs = 4;

  void SetUp() override {
    test::CudaOpTest::SetUp();
    if (IsSkipped()) return;
    c_ = testing::small_gpu_config();
    // A random decode batch over random KV: sequence b has kv_len in [5, 64] and pages
    // 1 + 4b .. 4 + 4b.
    std::vector<float> kv_values = randn_bf16(
        static_cast<size_t>(kPages) * c_.num_key_value_heads * kPage * c_.head_dim, 0.5f);
    batch_.page_size = kPage;
    batch_.max_pages_per_seq = kMaxPagesPerSeq;
    batch_.query_start.push_back(0);
    for (int32_t b = 0; b < kSeqs; ++b) {
      const int32_t len = uniform_int(5, kPage * kMaxPagesPerSeq);
      for (int32_t j = 0; j < kMaxPagesPerSeq; ++j) batch_.page_table.push_back(1 + 4 * b + j);
      batch_.token_ids.push_back(uniform_int(1, static_cast<int>(c_.vocab_size) - 1));
      batch_.positions.push_back(len - 1);
      batch_.slot_mapping.push_back(batch_.page_table[b * kMaxPagesPerSeq + (len - 1) / kPage] * kPage +
                                    (len - 1) % kPage);
      batch_.query_start.push_back(b + 1);
      batch_.kv_lens.push_back(len);
      batch_.logits_indices.push_back(b);
    }
    batch_.kv_len_capacity = kPage * kMaxPagesPerSeq;
    batch_.validate();
    for (Backend* b : {&gpu(), &cpu()}) {
      std::vector<LayerKv>& kv = b == &gpu() ? gpu_kv_ : cpu_kv_;
      for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
        LayerKv layer;
        layer.k = put(*b, b->kv_dtype(), {kPages, c_.num_key_value_heads, kPage, c_.head_dim},
                      kv_values);
        layer.v = put(*b, b->kv_dtype(), {kPages, c_.num_key_value_heads, kPage, c_.head_dim},
                      kv_values);
        kv.push_back(layer);
      }
    }
  }

  // The CPU backend's logits [kSeqs, V] for the batch with weights w (a fresh model).
  std::vector<float> cpu_logits(const testing::HostWeights& w) {
    Qwen3Model model(cpu(), c_, w.lookup());
    model.reserve(kSeqs, kSeqs);
    const BatchTensors t = cpu().upload_batch(batch_);
    return cpu().download_f32(model.forward(t, cpu_kv_));
  }

  // Named tensors of w (already bf16-representable) as `dtype` in `memory`: the bytes
  // are kept in host_ / device_ until the test ends.
  std::vector<NamedTensor> stage(const testing::HostWeights& w, TensorMemory memory, DType dtype) {
    std::vector<NamedTensor> out;
    for (const auto& [name, values] : w.data) {
      const size_t bytes = values.size() * dtype_size(dtype);
      std::vector<uint8_t> raw(bytes);
      convert_from_f32(values.data(), raw.data(), dtype, values.size());
      void* ptr = nullptr;
      if (memory == TensorMemory::kDevice) {
        buffers_.emplace_back(&gpu(), bytes);
        ptr = buffers_.back().get();
        gpu().copy_to_device(ptr, raw.data(), bytes);
      } else if (memory == TensorMemory::kHostPinned) {
        ptr = gpu().allocate_host_pinned(bytes);
        pinned_.push_back(ptr);
        std::memcpy(ptr, raw.data(), bytes);
      } else {
        pageable_.push_back(std::move(raw));
        ptr = pageable_.back().data();
      }
      out.push_back({name, ptr,
                     dtype == DType::F32 ? TensorDType::kFloat32 : TensorDType::kBFloat16,
                     w.shapes.at(name), memory});
    }
    return out;
  }

  void TearDown() override {
    for (void* p : pinned_) gpu().free_host_pinned(p);
    pinned_.clear();
    test::CudaOpTest::TearDown();
  }

  Qwen3Config c_;
  ForwardBatch batch_;
  std::vector<LayerKv> gpu_kv_, cpu_kv_;
  std::vector<void*> pinned_;
  std::vector<std::vector<uint8_t>> pageable_;
};

TEST_F(CudaWeightUpdate, CapturedDecodeGraphServesTheNewWeightsFromEverySource) {
  const testing::HostWeights a = bf16_rounded(testing::random_weights(c_, seed_));
  const testing::HostWeights b = bf16_rounded(testing::random_weights(c_, seed_ + 1));
  const testing::HostWeights d = bf16_rounded(testing::random_weights(c_, seed_ + 2));
  const testing::HostWeights e = bf16_rounded(testing::random_weights(c_, seed_ + 3));

  Qwen3Model model(gpu(), c_, a.lookup());
  model.reserve(kSeqs, kSeqs);
  gpu().reserve_batch(kSeqs, kSeqs, kMaxPagesPerSeq, kSeqs);
  const BatchTensors tensors = gpu().upload_batch(batch_);
  model.forward(tensors, gpu_kv_);  // warm-up outside the capture (plans, autotuning)
  gpu().synchronize();
  gpu().begin_capture();
  Tensor logits = model.forward(tensors, gpu_kv_);
  std::unique_ptr<RecordedGraph> graph = gpu().end_capture();

  const auto replay = [&] {
    gpu().fill(logits, NAN);
    graph->replay();
    gpu().synchronize();
    return gpu().download_f32(logits);
  };
  const std::vector<float> ref_a = cpu_logits(a);
  ASSERT_TRUE(relative_close(replay(), ref_a, kLogitsTol, "graph, weights A", seed_note()));

  struct Case {
    const testing::HostWeights* w;
    TensorMemory memory;
    DType dtype;
    const char* what;
  };
  for (const Case& k : {Case{&b, TensorMemory::kHostPinned, DType::BF16, "pinned host bf16"},
                        Case{&d, TensorMemory::kDevice, DType::BF16, "device bf16"},
                        Case{&e, TensorMemory::kDevice, DType::F32, "device float32"},
                        Case{&a, TensorMemory::kHost, DType::F32, "pageable host float32"}}) {
    const WeightWriteStats s = model.update_weights(stage(*k.w, k.memory, k.dtype));
    EXPECT_EQ(s.tensors, static_cast<int64_t>(k.w->data.size())) << k.what;
    const std::vector<float> ref = cpu_logits(*k.w);
    EXPECT_TRUE(relative_close(replay(), ref, kLogitsTol, std::string("graph after update from ") +
                                                               k.what,
                               seed_note()));
    if (k.w != &a) {
      EXPECT_FALSE(relative_close(ref, ref_a, kLogitsTol, "", "")) << "the weights must differ";
    }
  }
}

TEST_F(CudaWeightUpdate, WrongMemoryKindsAreRefusedAndNothingIsWritten) {
  const testing::HostWeights a = bf16_rounded(testing::random_weights(c_, seed_));
  const testing::HostWeights b = bf16_rounded(testing::random_weights(c_, seed_ + 1));
  Qwen3Model model(gpu(), c_, a.lookup());
  model.reserve(kSeqs, kSeqs);
  const auto logits_now = [&] {
    const BatchTensors t = gpu().upload_batch(batch_);
    Tensor out = model.forward(t, gpu_kv_);
    return gpu().download_f32(out);
  };
  const std::vector<float> before = logits_now();

  // Good device tensors, then three that lie about where they live.
  std::vector<NamedTensor> tensors = stage(b, TensorMemory::kDevice, DType::BF16);
  const std::vector<NamedTensor> host = stage(b, TensorMemory::kHost, DType::BF16);
  const std::vector<NamedTensor> pinned = stage(b, TensorMemory::kHostPinned, DType::BF16);
  tensors[0].data = host[0].data;  // pageable host memory given as device memory
  tensors[1].data = host[1].data;
  tensors[1].memory = TensorMemory::kHostPinned;  // pageable given as pinned
  tensors[2].memory = TensorMemory::kHost;        // device memory given as host memory
  tensors[3].data = pinned[3].data;               // pinned host given as device memory
  std::string msg;
  try {
    model.update_weights(tensors);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("given as device memory, but it is pageable host memory, not device memory"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("given as pinned host memory, but it is pageable host memory, not pinned"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("given as host memory, but it is device memory of GPU"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("but it is pinned host memory, not device memory"), std::string::npos) << msg;
  const std::vector<float> after = logits_now();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[i]) << "logit " << i;
}

// ---- broadcast from a trainer, on the cuda backend ------------------------------------------
// The "tcp" transport (NCCL's needs a second GPU: NcclTwoRanks): buckets arrive in host
// memory and go through the pinned staging of write_weights. The engine updated by
// broadcast, in small buckets, serves exactly what an engine given the same tensors directly
// serves, captured decode graphs included.

TEST(CudaWeightBroadcast, TcpUpdateServesWhatTheSameDirectUpdateServes) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const uint64_t seed = test::test_seed();
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights a = testing::random_weights(c, seed);
  const testing::HostWeights b = testing::random_weights(c, seed + 1);
  const test::WeightUpdateOf update(b);
  const std::vector<BroadcastTensor>& list = update.list;
  const std::vector<const void*>& data = update.data;
  const std::vector<NamedTensor>& direct = update.direct;
  auto reference = test::make_cuda_engine(c, a);
  const test::EngineRun before = test::run_seeded(*reference);
  reference->update_weights(direct);
  const test::EngineRun want = test::run_seeded(*reference);
  ASSERT_NE(want.tokens, before.tokens);

  auto engine = test::make_cuda_engine(c, a);
  ASSERT_FALSE(engine->graph_buckets().empty());
  EXPECT_EQ(test::run_seeded(*engine).logprobs, before.logprobs);  // graphs captured, in use
  TcpWeightSender sender("127.0.0.1", 0, 2);
  WeightGroupSpec spec;
  spec.transport = "tcp";
  spec.address = sender.address();
  spec.timeout_seconds = 30;
  std::thread accept([&] { sender.accept(30'000); });
  engine->join_weight_group(spec);
  accept.join();
  const uint64_t bucket = 100'000;  // a few tensors per bucket, large ones alone
  ASSERT_GT(plan_broadcast_buckets(list, bucket).size(), 5u);
  std::thread trainer([&] { sender.send(list, data, bucket); });
  const WeightUpdateResult r = engine->update_weights_from_broadcast(list, bucket);
  trainer.join();
  EXPECT_EQ(r.weights_version, 1u);
  EXPECT_EQ(r.tensors_updated, static_cast<int64_t>(list.size()));
  const test::EngineRun got = test::run_seeded(*engine);
  EXPECT_EQ(got.tokens, want.tokens) << "seed " << seed;
  EXPECT_EQ(got.logprobs, want.logprobs) << "seed " << seed;
  engine->check_invariants();
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

// Backend::write_weights_2d, a column range of a larger row-major tensor (a tensor-parallel
// rank's share of o_proj or down): from pageable, pinned and device memory, bf16 (strided
// copy) and float32 (converted), the GPU writes exactly what the CPU backend writes,
// rounded to the weights' bf16, into a NaN-poisoned destination, and nothing outside it.
using CudaStridedWrite = test::CudaOpTest;

TEST_F(CudaStridedWrite, ColumnRangesFromEverySourceEqualTheCpuBackend) {
  const int64_t rows = 37, full = 300, begin = 64, cols = 96, offset = 5;
  const int64_t n = rows * cols + 2 * offset;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const TensorMemory memory :
       {TensorMemory::kHost, TensorMemory::kHostPinned, TensorMemory::kDevice}) {
    for (const DType dtype : {DType::BF16, DType::F32}) {
      const std::string what = std::string(dtype_name(dtype)) + " from memory kind " +
                               std::to_string(static_cast<int>(memory)) + ", " + seed_note();
      std::vector<float> values(static_cast<size_t>(rows * full));
      for (float& x : values) x = dist(rng_);  // float32 values are not bf16-exact
      const size_t element = dtype_size(dtype);
      std::vector<uint8_t> raw(values.size() * element);
      convert_from_f32(values.data(), raw.data(), dtype, values.size());
      const uint8_t* src = raw.data();
      DeviceBuffer device;
      void* pinned = nullptr;
      if (memory == TensorMemory::kDevice) {
        device = DeviceBuffer(&gpu(), raw.size());
        gpu().copy_to_device(device.get(), raw.data(), raw.size());
        src = static_cast<const uint8_t*>(device.get());
      } else if (memory == TensorMemory::kHostPinned) {
        pinned = gpu().allocate_host_pinned(raw.size());
        std::memcpy(pinned, raw.data(), raw.size());
        src = static_cast<const uint8_t*>(pinned);
      }
      Tensor got_t = alloc(gpu(), gpu().weight_dtype(), {n});
      gpu().fill(got_t, std::nanf(""));
      gpu().write_weights_2d(got_t, offset, src + begin * element, dtype, rows, cols, full, memory);
      gpu().synchronize();
      const std::vector<float> got = gpu().download_f32(got_t);
      if (pinned != nullptr) gpu().free_host_pinned(pinned);

      Tensor want_t = alloc(cpu(), DType::F32, {n});
      cpu().fill(want_t, std::nanf(""));
      cpu().write_weights_2d(want_t, offset, raw.data() + begin * element, dtype, rows, cols,
                             full, TensorMemory::kHost);
      const std::vector<float> want = cpu().download_f32(want_t);
      for (int64_t i = 0; i < n; ++i) {
        if (i < offset || i >= offset + rows * cols) {
          ASSERT_TRUE(std::isnan(got[i])) << what << ": element " << i << " outside the block";
          continue;
        }
        const int64_t r = (i - offset) / cols, k = (i - offset) % cols;
        // The CPU backend wrote the source element; the GPU its bf16 rounding.
        ASSERT_EQ(want[i], dtype == DType::BF16
                               ? bf16_to_f32(f32_to_bf16(values[r * full + begin + k]))
                               : values[r * full + begin + k])
            << what << ": row " << r << ", column " << k;
        ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(want[i])))
            << what << ": row " << r << ", column " << k;
      }
    }
  }
}

}  // namespace
}  // namespace pagellm
