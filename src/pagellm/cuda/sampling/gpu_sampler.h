// The GPU sampler's host side: validates the rows, builds the per-row parameter blocks and
// penalty lists (sampling/rules.h, shared with the host sampler), launches the kernel
// (sampling.h) and reads the tokens back when they are asked for (one event's wait).
//
// CUDA-free header (cuda_backend.h holds one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/common/tensor.h"
#include "pagellm/sampling/rules.h"
#include "pagellm/sampling/sampler.h"

struct CUstream_st;
struct CUevent_st;

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

  /// CudaBackend::sample: sample_async() then wait(). `capturing`: whether the stream is
  /// being captured (an Error).
  std::vector<SampledToken> sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
                                   bool capturing);
  /// Backend::sample_async / wait_sampled / feed_sampled_tokens. The rows' parameters and
  /// results use one of two pinned slots in turn, so that one ticket may be outstanding
  /// while the next step's rows are written; a third throws.
  SampleTicket sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows,
                            bool capturing);
  std::vector<SampledToken> wait(SampleTicket& ticket);
  void feed(const SampleTicket& ticket, const std::vector<int32_t>& src_rows,
            Tensor& token_ids);

 private:
  /// One call's pinned memory (rows | penalties as uploaded, then its results), its
  /// results on the device (kept for feed() while the next call samples), and the event
  /// after the results' copy.
  struct Slot {
    void* host = nullptr;
    size_t bytes = 0;
    void* results = nullptr;  // device, GpuSampledToken[rows]
    size_t results_bytes = 0;
    CUevent_st* done = nullptr;
    uint64_t ticket = 0;  // the outstanding ticket that uses it; 0: none
    int32_t rows = 0;
    int32_t vocab = 0;
    size_t results_offset = 0;  // of the results in `host`, bytes
  };
  void ensure_capacity(size_t bytes, size_t scratch_floats);
  Slot& slot_of(const SampleTicket& ticket, const char* what);
  void free_buffers() noexcept;

  DeviceMemory& memory_;
  CUstream_st* stream_;
  uint64_t* prune_table_ = nullptr;      // device, kPruneTableSize entries
  void* device_ = nullptr;               // rows | penalties
  size_t bytes_ = 0;
  Slot slots_[2];
  int next_slot_ = 0;
  uint64_t next_ticket_ = 1;
  float* scratch_ = nullptr;             // [rows with penalties, V]
  size_t scratch_floats_ = 0;
  PenaltyCounter penalty_counter_;       // the rows' penalty lists (sampling/rules.h)
};

}  // namespace pagellm::cuda
