// The CUDA backend outside its kernels: opening (and failing to open) a device, memory,
// transfers and dtype conversion, batch metadata upload, and CUDA-graph capture.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"

namespace pagellm {
namespace {

using test::CudaOpTest;
using test::cuda_device_count;
using test::relative_close;

using testing::error_of;

// ---- opening the device ---------------------------------------------------------------------

TEST(CudaBackendOpen, NoGpuGivesAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const std::string message = error_of([] { create_backend("cuda"); });
  EXPECT_NE(message.find("cuda backend unavailable"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu backend"), std::string::npos) << message;
}

TEST(CudaBackendOpen, DeviceIndexOutOfRangeGivesAClearError) {
  const int count = cuda_device_count();
  const std::string message = error_of([count] { make_cuda_backend(count + 3); });
  EXPECT_NE(message.find("cuda backend unavailable"), std::string::npos) << message;
  if (count > 0) {
    EXPECT_NE(message.find("requested"), std::string::npos) << message;
  }
  const std::string negative = error_of([] { make_cuda_backend(-1); });
  EXPECT_NE(negative.find("cuda backend unavailable"), std::string::npos) << negative;
}

TEST(CudaBackendOpen, OpensAndDescribesTheDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  auto backend = create_backend("cuda");
  ASSERT_EQ(backend->name(), "cuda");
  EXPECT_EQ(backend->weight_dtype(), DType::BF16);
  EXPECT_EQ(backend->activation_dtype(), DType::BF16);
  EXPECT_EQ(backend->kv_dtype(), DType::BF16);
  EXPECT_TRUE(backend->supports_graphs());
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend.get());
  ASSERT_NE(cuda, nullptr);
  EXPECT_NE(cuda->stream(), nullptr);
  EXPECT_NE(cuda->device_description().find("compute capability"), std::string::npos);
  std::printf("device: %s\n", cuda->device_description().c_str());
}

// ---- memory --------------------------------------------------------------------------------

TEST_F(CudaOpTest, FreeMemoryTracksAllocations) {
  const size_t before = gpu().free_memory();
  ASSERT_GT(before, size_t{1} << 30) << "less than 1 GiB free on the GPU";
  const size_t bytes = size_t{512} << 20;
  void* p = gpu().allocate(bytes);
  ASSERT_NE(p, nullptr);
  const size_t during = gpu().free_memory();
  gpu().deallocate(p);
  const size_t after = gpu().free_memory();
  EXPECT_LE(during + bytes / 2, before) << "512 MiB allocation not visible in free_memory()";
  EXPECT_GE(after, during + bytes / 2) << "free_memory() did not recover after deallocate";
}

TEST_F(CudaOpTest, AllocatingMoreThanExistsGivesAClearErrorAndTheBackendKeepsWorking) {
  const size_t huge = gpu().free_memory() + (size_t{1} << 40);  // 1 TiB beyond what is free
  const std::string message = error_of([&] { gpu().allocate(huge); });
  EXPECT_NE(message.find("out of GPU memory"), std::string::npos) << message;
  EXPECT_NE(message.find("GiB"), std::string::npos) << message;
  // The failed allocation must not leave an error behind for the next kernel check.
  Tensor t = alloc(gpu(), DType::BF16, {1000});
  gpu().fill(t, 2.5f);
  const std::vector<float> back = gpu().download_f32(t);
  for (float v : back) ASSERT_EQ(v, 2.5f);
}

TEST_F(CudaOpTest, UploadConvertsEveryHostTypeAndDownloadReadsItBack) {
  const int64_t n = 3 * (int64_t{16} << 20) / 2 + 77;  // > one 16 MiB staging chunk in bf16
  std::vector<float> values = randn_bf16(static_cast<size_t>(n), 3.0f);
  values[0] = 0.0f;
  values[1] = -0.0f;
  values[2] = 65504.0f;
  values[3] = 1e-30f;
  struct Case {
    DType host, device;
  };
  for (Case c : {Case{DType::F32, DType::BF16}, Case{DType::BF16, DType::BF16},
                 Case{DType::F16, DType::BF16}, Case{DType::F32, DType::F32},
                 Case{DType::BF16, DType::F32}, Case{DType::F16, DType::F16}}) {
    SCOPED_TRACE(std::string("host ") + dtype_name(c.host) + " -> device " +
                 dtype_name(c.device));
    std::vector<uint16_t> half(values.size());
    const void* src = values.data();
    if (c.host != DType::F32) {
      convert_from_f32(values.data(), half.data(), c.host, values.size());
      src = half.data();
    }
    // What the device should hold: host value -> f32 -> device dtype -> f32.
    std::vector<float> expected(values.size());
    convert_to_f32(src, c.host, expected.data(), values.size());
    if (c.device != DType::F32) {
      std::vector<uint16_t> tmp(values.size());
      convert_from_f32(expected.data(), tmp.data(), c.device, values.size());
      convert_to_f32(tmp.data(), c.device, expected.data(), values.size());
    }
    Tensor t = alloc(gpu(), c.device, {n});
    poison(gpu(), t);
    gpu().upload(t, 0, src, c.host, n);
    const std::vector<float> back = gpu().download_f32(t);
    ASSERT_EQ(back.size(), expected.size());
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < back.size(); ++i) {
      if (std::memcmp(&back[i], &expected[i], 4) != 0 && !(back[i] == expected[i])) {
        if (mismatches++ == 0) first = i;
      }
    }
    EXPECT_EQ(mismatches, 0u) << "first at " << first << ": " << back[first] << " vs "
                              << expected[first] << "; " << seed_note();
  }
}

TEST_F(CudaOpTest, UploadAtAnOffsetWritesOnlyThatRange) {
  Tensor t = alloc(gpu(), DType::BF16, {10, 64});
  poison(gpu(), t);
  const std::vector<float> rows = randn_bf16(3 * 64);
  gpu().upload(t, 4 * 64, rows.data(), DType::F32, 3 * 64);
  const std::vector<float> back = gpu().download_f32(t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i >= 4 * 64 && i < 7 * 64) {
      ASSERT_EQ(back[static_cast<size_t>(i)], rows[static_cast<size_t>(i - 4 * 64)]) << i;
    } else {
      ASSERT_TRUE(std::isnan(back[static_cast<size_t>(i)])) << "element " << i << " was written";
    }
  }
  EXPECT_THROW(gpu().upload(t, 9 * 64, rows.data(), DType::F32, 3 * 64), Error);
  std::vector<int32_t> ints(64, 1);
  EXPECT_THROW(gpu().upload(t, 0, ints.data(), DType::I32, 64), Error);
}

TEST_F(CudaOpTest, FillWritesEveryDtype) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    Tensor t = alloc(gpu(), d, {1237});
    gpu().fill(t, 7.0f);
    for (float v : gpu().download_f32(t)) ASSERT_EQ(v, 7.0f) << dtype_name(d);
    if (d != DType::I32) {
      gpu().fill(t, NAN);
      for (float v : gpu().download_f32(t)) ASSERT_TRUE(std::isnan(v)) << dtype_name(d);
    }
  }
}

TEST_F(CudaOpTest, MeasuresAPlausibleCopyBandwidth) {
  const double bytes_per_s = gpu().measure_copy_bandwidth();
  std::printf("device copy bandwidth: %.0f GB/s\n", bytes_per_s / 1e9);
  EXPECT_GT(bytes_per_s, 100e9) << "below any GPU the backend supports";
  EXPECT_LT(bytes_per_s, 20e12) << "above any HBM in existence: a timing bug";
}

TEST_F(CudaOpTest, CopiesRoundTrip) {
  std::vector<int32_t> src(100000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i * 7 - 3);
  void* d = gpu().allocate(src.size() * 4);
  gpu().copy_to_device(d, src.data(), src.size() * 4);
  std::vector<int32_t> back(src.size());
  gpu().copy_to_host(back.data(), d, back.size() * 4);
  gpu().deallocate(d);
  EXPECT_EQ(back, src);
}

// ---- batch metadata ---------------------------------------------------------------------------

ForwardBatch small_batch(int32_t num_seqs, int32_t pages_per_seq, int32_t salt) {
  ForwardBatch b;
  b.page_size = 16;
  b.max_pages_per_seq = pages_per_seq;
  b.query_start.push_back(0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t q = 1 + (s + salt) % 3, kv = q + 5 * s;
    for (int32_t i = 0; i < q; ++i) {
      b.token_ids.push_back(100 * s + i + salt);
      b.positions.push_back(kv - q + i);
      b.slot_mapping.push_back(1000 * s + i);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.kv_lens.push_back(kv);
    for (int32_t j = 0; j < pages_per_seq; ++j) b.page_table.push_back(s * pages_per_seq + j + salt);
    b.logits_indices.push_back(b.query_start.back() - 1);
  }
  return b;
}

void expect_tensor_equals(Backend& gpu, const Tensor& t, const std::vector<int32_t>& want,
                          const char* what) {
  ASSERT_EQ(t.dtype, DType::I32) << what;
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  const std::vector<float> got = gpu.download_f32(t);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<float>(want[i])) << what << "[" << i << "]";
  }
}

TEST_F(CudaOpTest, UploadBatchCopiesEveryArray) {
  for (int32_t seqs : {1, 5, 64, 300}) {  // 300 forces the buffers to grow
    const ForwardBatch b = small_batch(seqs, 7, seqs);
    const BatchTensors t = gpu().upload_batch(b);
    EXPECT_EQ(t.host, &b);
    expect_tensor_equals(gpu(), t.token_ids, b.token_ids, "token_ids");
    expect_tensor_equals(gpu(), t.positions, b.positions, "positions");
    expect_tensor_equals(gpu(), t.slot_mapping, b.slot_mapping, "slot_mapping");
    expect_tensor_equals(gpu(), t.query_start, b.query_start, "query_start");
    expect_tensor_equals(gpu(), t.kv_lens, b.kv_lens, "kv_lens");
    expect_tensor_equals(gpu(), t.page_table, b.page_table, "page_table");
    expect_tensor_equals(gpu(), t.logits_indices, b.logits_indices, "logits_indices");
    EXPECT_EQ(t.page_table.ndim, 2);
    EXPECT_EQ(t.page_table.size(1), 7);
  }
  ForwardBatch bad = small_batch(3, 2, 0);
  bad.query_start.pop_back();
  EXPECT_THROW(gpu().upload_batch(bad), Error);
}

TEST_F(CudaOpTest, UploadBatchKeepsAddressesWithinReservedCapacity) {
  gpu().reserve_batch(512, 64, 32, 64);
  const ForwardBatch a = small_batch(4, 8, 1);
  const BatchTensors ta = gpu().upload_batch(a);
  const ForwardBatch b = small_batch(60, 32, 2);
  const BatchTensors tb = gpu().upload_batch(b);
  EXPECT_EQ(ta.token_ids.data, tb.token_ids.data);
  EXPECT_EQ(ta.positions.data, tb.positions.data);
  EXPECT_EQ(ta.slot_mapping.data, tb.slot_mapping.data);
  EXPECT_EQ(ta.query_start.data, tb.query_start.data);
  EXPECT_EQ(ta.kv_lens.data, tb.kv_lens.data);
  EXPECT_EQ(ta.page_table.data, tb.page_table.data);
  EXPECT_EQ(ta.logits_indices.data, tb.logits_indices.data);
  expect_tensor_equals(gpu(), tb.page_table, b.page_table, "page_table");
}

// ---- graphs --------------------------------------------------------------------------------------

TEST_F(CudaOpTest, CapturedGraphReplaysOnNewInputs) {
  const int64_t rows = 5, inter = 256, hidden = 128;
  Tensor gate_up = alloc(gpu(), DType::BF16, {rows, 2 * inter});
  Tensor act = alloc(gpu(), DType::BF16, {rows, inter});
  Tensor w = alloc(gpu(), DType::BF16, {hidden, inter});
  Tensor out = alloc(gpu(), DType::F32, {rows, hidden});
  gpu().upload(w, 0, randn_bf16(static_cast<size_t>(hidden * inter), 0.05f).data(), DType::F32,
               w.numel());
  gpu().upload(gate_up, 0, randn_bf16(static_cast<size_t>(rows * 2 * inter)).data(), DType::F32,
               gate_up.numel());
  // Warm up once outside the capture (the matmul plan is created then).
  gpu().silu_mul(gate_up, act);
  gpu().matmul(act, w, out);
  gpu().synchronize();

  gpu().begin_capture();
  gpu().silu_mul(gate_up, act);
  gpu().matmul(act, w, out);
  std::unique_ptr<RecordedGraph> graph = gpu().end_capture();
  ASSERT_NE(graph, nullptr);

  for (int round = 0; round < 3; ++round) {
    const std::vector<float> g = randn_bf16(static_cast<size_t>(rows * 2 * inter));
    gpu().upload(gate_up, 0, g.data(), DType::F32, gate_up.numel());
    poison(gpu(), out);
    graph->replay();
    const std::vector<float> via_graph = gpu().download_f32(out);
    gpu().silu_mul(gate_up, act);
    gpu().matmul(act, w, out);
    const std::vector<float> direct = gpu().download_f32(out);
    EXPECT_TRUE(relative_close(via_graph, direct, 1e-6, "graph replay vs direct", seed_note()));
  }
}

TEST_F(CudaOpTest, KernelTraceRecordsKernelsInLaunchOrder) {
  // The GPU suite's bundle carries CUPTI; elsewhere a missing library is a skip, any other
  // failure to start a trace is a failure.
  const std::string why = gpu().begin_kernel_trace();
  if (why.find("cannot load CUPTI") != std::string::npos) GTEST_SKIP() << why;
  ASSERT_EQ(why, "");
  EXPECT_NE(gpu().begin_kernel_trace(), "") << "a second trace started while one runs";
  const int64_t rows = 4, inter = 256;
  Tensor gate_up = alloc(gpu(), DType::BF16, {rows, 2 * inter});
  Tensor act = alloc(gpu(), DType::BF16, {rows, inter});
  gpu().fill(gate_up, 0.5f);
  gpu().silu_mul(gate_up, act);
  gpu().fill(gate_up, 0.25f);
  const std::vector<KernelSpan> spans = gpu().end_kernel_trace();
  std::vector<std::string> kernels;
  for (const KernelSpan& s : spans) {
    EXPECT_LE(s.start_ns, s.end_ns) << s.name;
    if (s.kind == KernelSpan::Kind::kKernel) kernels.push_back(s.name);
  }
  ASSERT_EQ(kernels.size(), 3u) << "kernels recorded: " << kernels.size();
  EXPECT_NE(kernels[0].find("fill_kernel"), std::string::npos) << kernels[0];
  EXPECT_NE(kernels[1].find("silu_mul_kernel"), std::string::npos) << kernels[1];
  EXPECT_NE(kernels[2].find("fill_kernel"), std::string::npos) << kernels[2];
  const KernelTimeline t = summarize_kernel_timeline(spans);
  EXPECT_EQ(t.kernels, 3);
  EXPECT_GT(t.wall_ns, 0.0);
  // Stopped: nothing more is recorded, and a new trace starts afresh.
  gpu().fill(gate_up, 1.0f);
  EXPECT_TRUE(gpu().end_kernel_trace().empty());
  ASSERT_EQ(gpu().begin_kernel_trace(), "");
  gpu().fill(act, 1.0f);
  size_t fills = 0;
  for (const KernelSpan& s : gpu().end_kernel_trace()) fills += s.kind == KernelSpan::Kind::kKernel;
  EXPECT_EQ(fills, 1u);
}

TEST_F(CudaOpTest, UploadBatchDuringCaptureIsRefusedClearly) {
  const ForwardBatch b = small_batch(2, 2, 0);
  gpu().begin_capture();
  const std::string message = error_of([&] { gpu().upload_batch(b); });
  EXPECT_NO_THROW(gpu().end_capture());
  EXPECT_NE(message.find("capture"), std::string::npos) << message;
}

// ---- attention backend choice ------------------------------------------------------------

TEST(CudaBackendAttention, ChoiceIsValidatedAndCudnnNeedsTheLibrary) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  cuda::CudaBackend backend(0);
  EXPECT_EQ(backend.attention_backend(), "auto");
  const std::string bogus = error_of([&] { backend.set_attention_backend("flash"); });
  EXPECT_NE(bogus.find("unknown attention backend 'flash'"), std::string::npos) << bogus;
  EXPECT_NE(bogus.find("auto, native or cudnn"), std::string::npos) << bogus;
  backend.set_attention_backend("native");
  EXPECT_EQ(backend.attention_backend(), "native");
  EXPECT_EQ(backend.last_attention_plan(), nullptr);
  // cudnn is accepted where a cuDNN 9 loads, and refused with the loader's reasons elsewhere.
  const std::string cudnn = error_of([&] { backend.set_attention_backend("cudnn"); });
  if (!cudnn.empty()) {
    EXPECT_NE(cudnn.find("--attention-backend cudnn"), std::string::npos) << cudnn;
    EXPECT_NE(cudnn.find("auto"), std::string::npos) << cudnn;
    EXPECT_EQ(backend.attention_backend(), "native") << "a refused choice must not stick";
  } else {
    EXPECT_EQ(backend.attention_backend(), "cudnn");
  }
}

}  // namespace
}  // namespace pagellm
