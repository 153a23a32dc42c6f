// The GPU sampler's host side: validates the rows, builds the per-row parameter blocks and
// penalty lists (sampling/rules.h, shared with the host sampler), launches the kernel
// (sampling.h) and reads the tokens back with one synchronisation.
//
// CUDA-free header (cuda_backend.h holds one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagellm/common/tensor.h"
#include "pagellm/sampling/rules.h"
#include "pagellm/sampling/sampler.h"

struct CUstream_st;

namespace pagellm::cuda {

class DeviceMemory;

/// Backend::sample on the GPU. Not thread-safe (one per backend).
class GpuSampler {
 public:
  /// Uploads the race's pruning table; grows its buffers from `memory` on demand.
  GpuSampler(DeviceMemory& memory, CUstream_st* stream);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  /// CudaBackend::sample. `capturing`: whether the stream is being captured (an Error).
  std::vector<SampledToken> sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
                                   bool capturing);

 private:
  void ensure_capacity(size_t bytes, size_t scratch_floats);
  void free_buffers() noexcept;

  DeviceMemory& memory_;
  CUstream_st* stream_;
  uint64_t* prune_table_ = nullptr;      // device, kPruneTableSize entries
  void* device_ = nullptr;               // rows | penalties | results
  void* host_ = nullptr;                 // pinned mirror of the same layout
  size_t bytes_ = 0;
  float* scratch_ = nullptr;             // [rows with penalties, V]
  size_t scratch_floats_ = 0;
  PenaltyCounter penalty_counter_;       // the rows' penalty lists (sampling/rules.h)
};

}  // namespace pagellm::cuda
