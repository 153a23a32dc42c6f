// Timing paged-attention calls on one GPU, native kernels against cuDNN, for attention
// calibration (attention_calibration.h) and bench/attention_route_bench.
//
// One AttentionTimer holds the device state every call shape shares: bf16 K/V pools large
// enough for the biggest shape (filled with pseudo-random values in [-1, 1)), q and out
// buffers, the native decode workspace and a cuDNN plan cache. load() puts a shape's
// metadata on the device (random distinct pages per sequence); time() gives the mean
// microseconds of one call, eager (back-to-back launches between two events: host
// submission is included whenever it exceeds the kernel's time) or under graph replay (one
// graph of `layers` calls).
//
// Needs the cuDNN route (PAGELLM_HAVE_CUDNN). Only code under src/pagellm/cuda, tests/cuda
// and bench/ may include this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

#include "pagellm/attention/calibration.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/cudnn_attention.h"
#include "pagellm/kv/forward_batch.h"

namespace pagellm::cuda {

class AttentionTimer {
 public:
  /// Pools of `pool_tokens` tokens of `max_kv_heads` x `head_dim`; q and out of
  /// `max_q_elems` elements. Throws Error when `device` is not a usable CUDA device.
  AttentionTimer(int device, int64_t pool_tokens, int64_t max_q_elems, int32_t max_kv_heads,
                 int32_t head_dim);
  ~AttentionTimer();
  AttentionTimer(const AttentionTimer&) = delete;
  AttentionTimer& operator=(const AttentionTimer&) = delete;

  /// The device (with the loaded cuDNN version): what a crossover table is keyed by.
  const DeviceProfile& profile() const { return profile_; }
  CudnnPlanCache& cache() { return cache_; }
  cudaStream_t stream() const { return stream_; }

  /// Loads a shape's metadata; pages drawn from `rng`.
  void load(const AttentionCallShape& shape, std::mt19937& rng);
  /// The loaded shape's attention domain, host batch and kernel arguments.
  AttentionDomain domain() const;
  ForwardBatch& batch() { return host_; }
  PagedAttentionParams params() const;
  /// One native call of the loaded shape as the dispatcher makes it (plan_native_attention:
  /// decode kernel, prefill kernel, or both on a mixed batch's decode rows and chunks;
  /// `replayable`: as in a captured graph, never split).
  void run_native(const PagedAttentionParams& p, bool replayable = false);

  /// Mean microseconds per call of `call`: eager, `iters` back-to-back calls after three
  /// warm-up calls; graph, one graph of `layers` calls replayed max(2, iters / 4) times.
  template <class Call>
  double time(Call&& call, LaunchMode mode, int iters, int layers);

  /// The loaded shape on the native kernels.
  double time_native(LaunchMode mode, int iters, int layers);
  /// The loaded shape on cuDNN (plan built outside the timing). Returns -1 and sets
  /// *error (when given) to cuDNN's reason when cuDNN cannot run it.
  double time_cudnn(LaunchMode mode, int iters, int layers, std::string* error = nullptr);

 private:
  void start_timing();
  double stop_timing_ms();
  void begin_graph();
  void end_graph_and_time(int replays, float* ms);
  void abandon_graph();
  void upload(void*& dst, const void* host, size_t bytes);

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaGraph_t graph_ = nullptr;  // while time() captures or replays
  DeviceProfile profile_;
  CudnnPlanCache cache_;
  void *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *out_ = nullptr, *ws_ = nullptr;
  void *query_start_ = nullptr, *kv_lens_ = nullptr, *page_table_ = nullptr;
  size_t ws_bytes_ = 0;
  int64_t pool_elems_ = 0, pool_tokens_ = 0, num_pages_ = 0;
  AttentionCallShape shape_;
  ForwardBatch host_;
  MixedDecodeRun mixed_run_;  // of host_, found at load()
};

template <class Call>
double AttentionTimer::time(Call&& call, LaunchMode mode, int iters, int layers) {
  for (int i = 0; i < 3; ++i) call();
  if (mode == LaunchMode::kEager) {
    start_timing();
    for (int i = 0; i < iters; ++i) call();
    return stop_timing_ms() * 1000.0 / iters;
  }
  begin_graph();
  try {
    for (int i = 0; i < layers; ++i) call();
  } catch (...) {
    abandon_graph();
    throw;
  }
  const int replays = iters / 4 > 2 ? iters / 4 : 2;
  float ms = 0;
  end_graph_and_time(replays, &ms);
  return ms * 1000.0 / (static_cast<double>(replays) * layers);
}

}  // namespace pagellm::cuda
