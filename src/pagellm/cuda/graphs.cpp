// Graph capture and the bandwidth measurement (graphs.h).
#include "pagellm/cuda/graphs.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

cudaStream_t as_stream(CUstream_st* s) { return s; }

/// A captured CUDA graph, replayed on the backend's stream.
class CudaGraph final : public RecordedGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

void begin_stream_capture(CUstream_st* stream) {
  PAGELLM_CHECK(!stream_capturing(stream)) << "cuda backend: begin_capture while already capturing";
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
}

std::unique_ptr<RecordedGraph> end_stream_capture(CUstream_st* stream) {
  PAGELLM_CHECK(stream_capturing(stream)) << "cuda backend: end_capture without begin_capture";
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(as_stream(stream), &graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    PAGELLM_FAIL() << "cuda backend: graph capture failed (" << cudaGetErrorName(err) << ": "
                   << cudaGetErrorString(err)
                   << "); an operation during capture synchronised, allocated or copied";
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PAGELLM_CUDA_CHECK(inst);
  return std::make_unique<CudaGraph>(exec, as_stream(stream));
}

void abandon_stream_capture(CUstream_st* stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
}

double measure_copy_bandwidth(CUstream_st* stream) {
  PAGELLM_CHECK(!stream_capturing(stream)) << "cuda backend: cannot measure bandwidth during graph capture";
  // Large enough that launch latency is noise; halve while memory is short (the KV cache
  // may already hold most of it).
  for (size_t bytes = size_t{1} << 30; bytes >= (size_t{16} << 20); bytes /= 2) {
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (a) cudaFree(a);
      continue;
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    std::vector<float> ms;
    try {
      PAGELLM_CUDA_CHECK(cudaEventCreate(&start));
      PAGELLM_CUDA_CHECK(cudaEventCreate(&stop));
      cudaStream_t s = as_stream(stream);
      PAGELLM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
      for (int i = 0; i < 5; ++i) {
        PAGELLM_CUDA_CHECK(cudaEventRecord(start, s));
        PAGELLM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        PAGELLM_CUDA_CHECK(cudaEventRecord(stop, s));
        PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0.0f;
        PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        ms.push_back(elapsed);
      }
    } catch (...) {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
      cudaFree(a);
      cudaFree(b);
      throw;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    std::sort(ms.begin(), ms.end());
    return 2.0 * static_cast<double>(bytes) / (static_cast<double>(ms[ms.size() / 2]) * 1e-3);
  }
  PAGELLM_FAIL() << "cuda backend: not even 32 MiB of GPU memory free to measure bandwidth";
}

}  // namespace pagellm::cuda
