// The GPU sampler's host side (gpu_sampler.h).
#include "pagellm/cuda/sampling/gpu_sampler.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "pagellm/common/check.h"
#include "pagellm/common/random.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/sampling/sampling.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

cudaStream_t as_stream(CUstream_st* s) { return s; }

}  // namespace

GpuSampler::GpuSampler(DeviceMemory& memory, CUstream_st* stream)
    : memory_(memory), stream_(stream) {
  uint64_t table[kPruneTableSize];
  fill_prune_table(table);
  prune_table_ = static_cast<uint64_t*>(memory_.allocate(sizeof(table)));
  try {
    PAGELLM_CUDA_CHECK(cudaMemcpy(prune_table_, table, sizeof(table), cudaMemcpyHostToDevice));
  } catch (...) {
    free_buffers();
    throw;
  }
}

GpuSampler::~GpuSampler() { free_buffers(); }

void GpuSampler::free_buffers() noexcept {
  memory_.deallocate(prune_table_);
  memory_.deallocate(device_);
  memory_.deallocate(scratch_);
  if (host_) cudaFreeHost(host_);
  prune_table_ = nullptr;
  device_ = host_ = nullptr;
  scratch_ = nullptr;
}

void GpuSampler::ensure_capacity(size_t bytes, size_t scratch_floats) {
  if (bytes > bytes_) {
    memory_.synchronize();
    memory_.deallocate(device_);
    if (host_) cudaFreeHost(host_);
    device_ = host_ = nullptr;
    bytes_ = 0;
    const size_t grown = std::max(bytes, size_t{64} << 10);
    device_ = memory_.allocate(grown);
    PAGELLM_CUDA_CHECK(cudaHostAlloc(&host_, grown, cudaHostAllocDefault));
    bytes_ = grown;
  }
  if (scratch_floats > scratch_floats_) {
    memory_.synchronize();
    memory_.deallocate(scratch_);
    scratch_ = nullptr;
    scratch_floats_ = 0;
    scratch_ = static_cast<float*>(memory_.allocate(scratch_floats * sizeof(float)));
    scratch_floats_ = scratch_floats;
  }
}

std::vector<SampledToken> GpuSampler::sample(const Tensor& logits,
                                             const std::vector<SamplingRow>& rows, bool capturing) {
  PAGELLM_CHECK(logits.dtype == DType::F32 && logits.ndim == 2)
      << "cuda backend: sample: logits must be a float32 [rows, vocab] tensor, got "
      << dtype_name(logits.dtype) << " " << logits.shape_string();
  const int64_t R = logits.size(0), V = logits.size(1);
  PAGELLM_CHECK(static_cast<size_t>(R) == rows.size())
      << "cuda backend: sample: " << R << " rows of logits but " << rows.size()
      << " sampling rows";
  if (R == 0) return {};
  PAGELLM_CHECK(V > 0 && V <= INT32_MAX && R <= INT32_MAX)
      << "cuda backend: sample: unsupported logits shape " << logits.shape_string();
  PAGELLM_CHECK(!capturing) << "cuda backend: sample synchronises and cannot be captured";

  // Per-row parameters and the penalty lists, built on the host.
  std::vector<GpuSamplingRow> params(static_cast<size_t>(R));
  std::vector<GpuPenaltyEntry> entries;
  int32_t penalised_rows = 0;
  for (int64_t r = 0; r < R; ++r) {
    const SamplingRow& row = rows[static_cast<size_t>(r)];
    try {
      PAGELLM_CHECK(row.params != nullptr) << "sampling: the row has no SamplingParams";
      const SamplingParams& sp = *row.params;
      validate_sampling_params(sp);
      GpuSamplingRow& g = params[static_cast<size_t>(r)];
      g.temperature = sp.temperature;
      g.top_p = sp.top_p;
      g.min_p = sp.min_p;
      g.repetition_penalty = sp.repetition_penalty;
      g.presence_penalty = sp.presence_penalty;
      g.frequency_penalty = sp.frequency_penalty;
      g.top_k = sp.top_k;
      g.flags = (sp.greedy() ? kSampleGreedy : 0u) |
                (sp.processed_logprobs ? kSampleProcessedLogprobs : 0u);
      g.stream_key = sampling_stream_key(row.seed, static_cast<uint64_t>(row.output_index));
      const bool banned = row.banned_tokens != nullptr && !row.banned_tokens->empty();
      if (banned ||
          penalties_enabled(sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty)) {
        // The host sampler's counting (sampling/rules.h); the kernel applies the same rule
        // (banned tokens, min_tokens, are entries with kBannedToken: -inf).
        g.flags |= kSamplePenalties;
        g.scratch_row = penalised_rows++;
        g.penalty_begin = static_cast<int32_t>(entries.size());
        penalty_counter_.count(row.prompt_tokens, row.output_tokens,
                               sp.repetition_penalty != 1.0f, V, entries, row.banned_tokens);
        g.penalty_count = static_cast<int32_t>(entries.size()) - g.penalty_begin;
      }
    } catch (const Error& e) {
      PAGELLM_FAIL() << "row " << r << ": " << e.what();
    }
  }

  // One buffer: rows | penalty entries | results, each 256-byte aligned.
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t rows_bytes = aligned(params.size() * sizeof(GpuSamplingRow));
  const size_t entries_bytes = aligned(std::max<size_t>(entries.size(), 1) * sizeof(GpuPenaltyEntry));
  const size_t results_bytes = aligned(params.size() * sizeof(GpuSampledToken));
  ensure_capacity(rows_bytes + entries_bytes + results_bytes,
                           static_cast<size_t>(penalised_rows) * static_cast<size_t>(V));
  auto* host = static_cast<char*>(host_);
  auto* dev = static_cast<char*>(device_);
  std::memcpy(host, params.data(), params.size() * sizeof(GpuSamplingRow));
  if (!entries.empty()) {
    std::memcpy(host + rows_bytes, entries.data(), entries.size() * sizeof(GpuPenaltyEntry));
  }
  cudaStream_t s = as_stream(stream_);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dev, host, rows_bytes + entries_bytes,
                                     cudaMemcpyHostToDevice, s));
  auto* results_dev = reinterpret_cast<GpuSampledToken*>(dev + rows_bytes + entries_bytes);
  launch_sample_rows(logits.ptr<float>(), static_cast<int32_t>(R), static_cast<int32_t>(V),
                     reinterpret_cast<const GpuSamplingRow*>(dev),
                     reinterpret_cast<const GpuPenaltyEntry*>(dev + rows_bytes),
                     scratch_, prune_table_, results_dev, s);
  auto* results_host = reinterpret_cast<GpuSampledToken*>(host + rows_bytes + entries_bytes);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(results_host, results_dev,
                                     params.size() * sizeof(GpuSampledToken),
                                     cudaMemcpyDeviceToHost, s));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(s));

  std::vector<SampledToken> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const GpuSampledToken& g = results_host[r];
    PAGELLM_CHECK(g.status != kSampleNoFiniteLogit)
        << "row " << r << ": sampling: the row of logits has no finite value (all " << V
        << " are NaN or -inf)";
    PAGELLM_CHECK(g.status != kSampleNoFiniteAfterPenalties)
        << "row " << r << ": sampling: no finite logit is left after the penalties";
    PAGELLM_ASSERT(g.status == kSampleOk && g.token >= 0 && g.token < V)
        << "GPU sampler returned status " << g.status << ", token " << g.token;
    SampledToken& t = out[static_cast<size_t>(r)];
    t.token = g.token;
    t.logprob = g.logprob;
    t.processed_logprob = g.processed_logprob;
  }
  return out;
}

}  // namespace pagellm::cuda
