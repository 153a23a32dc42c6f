// Helpers shared by the CUDA benchmarks: error checks, random fills that are never zero,
// event timing of graphs and streams, and the device copy bandwidth every benchmark
// reports its fractions against (measured in the same run, outside CUDA graphs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace pagellm_bench {

#define CHECK_CUDA(expr)                                                                      \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err_), #expr, \
                   __FILE__, __LINE__);                                                       \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

/// Fills n bf16 values with a hash of their index, uniform in [-1, 1) (never zeros: zeros
/// can run faster than real data).
__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

__global__ void count_nonfinite(const __nv_bfloat16* p, size_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (!isfinite(__bfloat162float(p[i]))) ++local;
  }
  if (local) atomicAdd(count, local);
}

void fill_random(void* p, size_t n, uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CHECK_CUDA(cudaGetLastError());
}

size_t nonfinite(const void* p, size_t n) {
  unsigned long long* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, sizeof(*d)));
  CHECK_CUDA(cudaMemset(d, 0, sizeof(*d)));
  count_nonfinite<<<512, 256>>>(static_cast<const __nv_bfloat16*>(p), n, d);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long h = 0;
  CHECK_CUDA(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  return static_cast<size_t>(h);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Median milliseconds of one replay of `exec` over `reps` replays (after one warm-up).
double time_graph(cudaGraphExec_t exec, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return median(ms);
}

/// `launch(i)`, i < launches, captured into one graph, instantiated; the caller destroys
/// the result. The caller runs anything that must not be captured (plans, kernel
/// attributes, module loads) before.
template <class F>
cudaGraphExec_t capture_launches(F launch, int launches, cudaStream_t stream,
                                 cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, mode));
  for (int i = 0; i < launches; ++i) launch(i);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return exec;
}

/// Median milliseconds per launch of `launch(i)`, i < launches, captured into one graph and
/// replayed `reps` times after one warm-up replay. The caller runs anything that must not be
/// captured (plans, kernel attributes, module loads) before.
template <class F>
double time_launches(F launch, int launches, cudaStream_t stream, int reps,
                     cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  cudaGraphExec_t exec = capture_launches(launch, launches, stream, mode);
  const double ms = time_graph(exec, stream, reps) / launches;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  return ms;
}

/// Median milliseconds of one replay of each of `execs`, timed in rounds: each round replays
/// every graph once, in turn, so that the GPU's drift over the run (clocks falling as it
/// heats and draws more power) reaches every graph alike. Before the rounds, the graphs are
/// replayed in turn for at least `warmup_ms` of wall time, so that the rounds find the GPU
/// as a long run keeps it. Timing one graph's replays and then the next's favoured the
/// first: on an H100 (2026-12-05) the same prefill kernel measured 5 % faster in the first
/// column of attention_bench than in the third.
std::vector<double> time_graphs_interleaved(const std::vector<cudaGraphExec_t>& execs,
                                            cudaStream_t stream, int rounds,
                                            double warmup_ms) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  float elapsed = 0.0f;
  CHECK_CUDA(cudaEventRecord(start, stream));
  do {
    for (cudaGraphExec_t exec : execs) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&elapsed, start, stop));
  } while (elapsed < warmup_ms);
  std::vector<std::vector<double>> ms(execs.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t g = 0; g < execs.size(); ++g) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      CHECK_CUDA(cudaGraphLaunch(execs[g], stream));
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      ms[g].push_back(t);
    }
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::vector<double> medians;
  for (std::vector<double>& m : ms) medians.push_back(median(std::move(m)));
  return medians;
}

/// dst[i] = src[i] over n 16-byte vectors, four loads in flight per thread.
__global__ void copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 v0 = src[i], v1 = src[i + stride], v2 = src[i + 2 * stride],
                v3 = src[i + 3 * stride];
    dst[i] = v0;
    dst[i + stride] = v1;
    dst[i + 2 * stride] = v2;
    dst[i + 3 * stride] = v3;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

/// Median milliseconds of `run` (enqueued on `stream`) over `reps` runs after one warm-up.
template <class F>
double time_stream(F run, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  run();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    run();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return median(ms);
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written) of a plain
/// cudaMemcpyAsync and of copy_kernel over 2 GiB buffers. Neither runs inside a CUDA graph:
/// a captured D2D memcpy becomes a graph memcpy node, which may run on a copy engine at a
/// fraction of the SM copy rate (the first version of this benchmark measured 2775 GB/s
/// that way on an H200 whose plain cudaMemcpy reaches ~4230).
struct CopyBandwidth {
  double memcpy_gbs, kernel_gbs;
  double best() const { return std::max(memcpy_gbs, kernel_gbs); }
};

CopyBandwidth copy_bandwidth(cudaStream_t stream, const cudaDeviceProp& prop) {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  fill_random(a, bytes / 2, 1);
  fill_random(b, bytes / 2, 2);
  CHECK_CUDA(cudaDeviceSynchronize());
  const double to_gbs = 2.0 * bytes / 1e9 * 1e3;  // divided by milliseconds
  CopyBandwidth bw{};
  int flip = 0;
  const double memcpy_ms = time_stream(
      [&] {
        void* dst = flip ? a : b;
        void* src = flip ? b : a;
        flip ^= 1;
        CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      },
      stream, 10);
  bw.memcpy_gbs = to_gbs / memcpy_ms;
  const unsigned blocks = static_cast<unsigned>(prop.multiProcessorCount) * 4;
  const double kernel_ms = time_stream(
      [&] {
        auto* dst = static_cast<uint4*>(flip ? a : b);
        const auto* src = static_cast<const uint4*>(flip ? b : a);
        flip ^= 1;
        copy_kernel<<<blocks, 512, 0, stream>>>(dst, src, bytes / 16);
        CHECK_CUDA(cudaGetLastError());
      },
      stream, 10);
  bw.kernel_gbs = to_gbs / kernel_ms;
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return bw;
}

}  // namespace pagellm_bench
