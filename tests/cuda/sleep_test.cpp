// Sleep and wake on the CUDA backend: weights and KV pools live in virtual-memory arenas
// whose physical memory is given back and made again at the same addresses. Checked here:
// the memory really is freed (cudaMemGetInfo), offloaded weights come back bit for bit, KV
// pools read as zeros, a graph captured before sleep computes after wake what the CPU
// backend computes on fresh inputs (outputs poisoned first; the packed decode copies are
// rebuilt), and the engine's decode graphs give the same seeded tokens after wake.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "cuda/engine_run.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

using test::CudaOpTest;
using test::EngineRun;
using test::run_seeded;

std::vector<unsigned char> raw(Backend& b, const void* ptr, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  b.copy_to_host(out.data(), ptr, bytes);
  return out;
}

class CudaSleepTest : public CudaOpTest {};

TEST_F(CudaSleepTest, ArenaMemoryIsFreedAndComesBackAtTheSameAddresses) {
  Backend& b = gpu();
  ASSERT_TRUE(b.supports_sleep());
  const size_t weight_bytes = size_t{48} << 20, kv_bytes = size_t{256} << 20;
  DeviceBuffer w(&b, weight_bytes, MemoryRole::kWeights);
  DeviceBuffer norm(&b, 5000, MemoryRole::kWeights);  // small: shares a chunk
  DeviceBuffer kv(&b, kv_bytes, MemoryRole::kKvCache);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(norm.get()) % 256, 0u);
  const int64_t n = static_cast<int64_t>(weight_bytes / 2);
  Tensor wt = w.tensor(DType::BF16, {n});
  Tensor nt = norm.tensor(DType::BF16, {2500});
  Tensor kt = kv.tensor(DType::BF16, {static_cast<int64_t>(kv_bytes / 2)});
  const std::vector<float> values = randn_bf16(static_cast<size_t>(n));
  b.upload(wt, 0, values.data(), DType::F32, n);
  const std::vector<float> norm_values = randn_bf16(2500);
  b.upload(nt, 0, norm_values.data(), DType::F32, 2500);
  b.fill(kt, 1.5f);
  b.synchronize();
  const std::vector<unsigned char> w_before = raw(b, w.get(), weight_bytes);
  const std::vector<unsigned char> norm_before = raw(b, norm.get(), 5000);
  void* const w_at = w.get();
  void* const kv_at = kv.get();

  const size_t free_awake = b.free_memory();
  const BackendSleepResult released = b.sleep(/*offload_weights=*/true);
  const size_t free_asleep = b.free_memory();
  EXPECT_GE(released.kv_bytes, kv_bytes);
  EXPECT_GE(released.weight_bytes, weight_bytes + 5000);
  // What was released is free for others now (allow 64 MiB for other activity).
  EXPECT_GE(free_asleep + (size_t{64} << 20), free_awake + kv_bytes + weight_bytes)
      << "free " << free_awake << " -> " << free_asleep;
  EXPECT_THROW(b.sleep(false), Error);
  EXPECT_THROW(DeviceBuffer(&b, 1 << 20, MemoryRole::kKvCache), Error);

  b.wake();
  EXPECT_THROW(b.wake(), Error);
  EXPECT_LE(b.free_memory(), free_asleep - kv_bytes);
  EXPECT_EQ(w.get(), w_at);
  EXPECT_EQ(kv.get(), kv_at);
  EXPECT_TRUE(raw(b, w.get(), weight_bytes) == w_before) << "weights must come back bit-exact";
  EXPECT_TRUE(raw(b, norm.get(), 5000) == norm_before);
  const std::vector<float> kv_after = b.download_f32(kt);
  size_t nonzero = 0;
  for (float x : kv_after) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, 0u) << "KV pools must read as zeros after wake";

  // Without offload the weights stay resident and only the KV pool is released.
  const BackendSleepResult kv_only = b.sleep(/*offload_weights=*/false);
  EXPECT_GE(kv_only.kv_bytes, kv_bytes);
  EXPECT_EQ(kv_only.weight_bytes, 0u);
  b.wake();
  EXPECT_TRUE(raw(b, w.get(), weight_bytes) == w_before);

  // A second offload reuses the pinned host buffer; the weights still come back exact.
  b.upload(wt, 0, values.data() + 1, DType::F32, n - 1);  // new contents to offload
  b.synchronize();
  const std::vector<unsigned char> w_changed = raw(b, w.get(), weight_bytes);
  ASSERT_FALSE(w_changed == w_before);
  b.sleep(/*offload_weights=*/true);
  b.wake();
  EXPECT_TRUE(raw(b, w.get(), weight_bytes) == w_changed);
  EXPECT_TRUE(raw(b, norm.get(), 5000) == norm_before);
}

TEST_F(CudaSleepTest, GraphCapturedBeforeSleepMatchesCpuAfterWake) {
  Backend& g = gpu();
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&g);
  ASSERT_NE(cuda, nullptr);
  const int64_t M = 4, N = 384, K = 512, R = 64;
  DeviceBuffer wbuf(&g, N * K * 2, MemoryRole::kWeights);
  DeviceBuffer kvbuf(&g, R * K * 2, MemoryRole::kKvCache);
  Tensor w = wbuf.tensor(DType::BF16, {N, K});
  Tensor kv = kvbuf.tensor(DType::BF16, {R, K});
  const std::vector<float> w_values = randn_bf16(static_cast<size_t>(N * K), 0.05f);
  g.upload(w, 0, w_values.data(), DType::F32, N * K);
  g.fill(kv, 2.0f);
  g.prepare_matrix(w);
  Tensor x = alloc(g, DType::BF16, {M, K});
  Tensor out = alloc(g, DType::F32, {M, N});
  Tensor rows = alloc(g, DType::BF16, {3, K});
  Tensor idx = alloc_i32(g, {0, 17, R - 1});
  g.synchronize();

  // Captured once: a decode-shaped product (the skinny kernel, reading the packed copy where
  // the GPU has one) and a gather from the KV-role buffer.
  g.matmul(x, w, out);  // warm-up outside the capture (plans, autotuning)
  g.gather_rows(kv, idx, rows);
  g.synchronize();
  g.begin_capture();
  g.matmul(x, w, out);
  g.gather_rows(kv, idx, rows);
  std::unique_ptr<RecordedGraph> graph = g.end_capture();

  Tensor w_cpu = put(cpu(), DType::F32, {N, K}, w_values);
  Tensor x_cpu = alloc(cpu(), DType::F32, {M, K});
  Tensor out_cpu = alloc(cpu(), DType::F32, {M, N});
  auto check = [&](const char* when, float kv_value) {
    const std::vector<float> xs = randn_bf16(static_cast<size_t>(M * K));
    g.upload(x, 0, xs.data(), DType::F32, M * K);
    poison(g, out);
    poison(g, rows);
    graph->replay();
    g.synchronize();
    cpu().upload(x_cpu, 0, xs.data(), DType::F32, M * K);
    cpu().matmul(x_cpu, w_cpu, out_cpu);
    EXPECT_TRUE(test::relative_close(g.download_f32(out), cpu().download_f32(out_cpu), 2e-2,
                                     std::string("graph matmul ") + when, seed_note()));
    for (float v : g.download_f32(rows)) ASSERT_EQ(v, kv_value) << when;
  };
  check("before sleep", 2.0f);
  const size_t packed = cuda->packed_weight_bytes();
  const BackendSleepResult released = g.sleep(/*offload_weights=*/true);
  EXPECT_EQ(released.prepared_bytes > 0, packed > 0);
  g.wake();
  check("after wake", 0.0f);  // KV contents are discarded: zeros
  EXPECT_EQ(cuda->packed_weight_bytes(), packed);
  g.sleep(/*offload_weights=*/false);
  g.wake();
  check("after a second wake", 0.0f);
}

TEST(CudaEngineSleep, DecodeGraphsGiveTheSameTokensAfterWake) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, 31337);
  std::unique_ptr<Engine> owned = test::make_cuda_engine(c, w);
  Engine& engine = *owned;
  ASSERT_FALSE(engine.graph_buckets().empty());

  const EngineRun before = run_seeded(engine);
  for (bool offload : {false, true}) {
    const SleepReport report = engine.sleep(SleepOptions{offload});
    EXPECT_GT(report.kv_bytes_released, 0u);
    EXPECT_EQ(report.weight_bytes_offloaded > 0, offload);
    EXPECT_GT(report.free_memory_after, report.free_memory_before);
    engine.wake_up();
    const int64_t graph_steps = engine.stats().graph_steps;
    const EngineRun after = run_seeded(engine);
    EXPECT_GT(engine.stats().graph_steps, graph_steps) << "decode must replay graphs";
    EXPECT_EQ(after.tokens, before.tokens) << "offload " << offload;
    EXPECT_EQ(after.logprobs, before.logprobs) << "offload " << offload;
    engine.check_invariants();
    EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable());
  }
}

}  // namespace
}  // namespace pagellm
