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
  for (Slot& slot : slots_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.done) cudaEventDestroy(slot.done);
    memory_.deallocate(slot.results);
    slot = Slot{};
  }
  prune_table_ = nullptr;
  device_ = nullptr;
  scratch_ = nullptr;
}

void GpuSampler::ensure_capacity(size_t bytes, size_t scratch_floats) {
  if (bytes > bytes_) {
    memory_.synchronize();
    memory_.deallocate(device_);
    device_ = nullptr;
    bytes_ = 0;
    const size_t grown = std::max(bytes, size_t{64} << 10);
    device_ = memory_.allocate(grown);
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
  SampleTicket ticket = sample_async(logits, rows, capturing);
  return wait(ticket);
}

GpuSampler::Slot& GpuSampler::slot_of(const SampleTicket& ticket, const char* what) {
  Slot* found = nullptr;
  for (Slot& slot : slots_) {
    if (ticket.id != 0 && slot.ticket == ticket.id) found = &slot;
  }
  PAGELLM_CHECK(found != nullptr) << "cuda backend: " << what << ": ticket " << ticket.id
                                  << " is not outstanding (waited for already, or not this "
                                     "sampler's)";
  return *found;
}

SampleTicket GpuSampler::sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows,
                                      bool capturing) {
  PAGELLM_CHECK(logits.dtype == DType::F32 && logits.ndim == 2)
      << "cuda backend: sample: logits must be a float32 [rows, vocab] tensor, got "
      << dtype_name(logits.dtype) << " " << logits.shape_string();
  const int64_t R = logits.size(0), V = logits.size(1);
  PAGELLM_CHECK(static_cast<size_t>(R) == rows.size())
      << "cuda backend: sample: " << R << " rows of logits but " << rows.size()
      << " sampling rows";
  if (R == 0) return SampleTicket{next_ticket_++, 0, {}};
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

  // The device buffer: rows | penalty entries, each 256-byte aligned; the pinned slot
  // mirrors it and then holds the results, which have a device buffer of their own per
  // slot (an outstanding ticket's tokens stay there for feed() while the next samples).
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t rows_bytes = aligned(params.size() * sizeof(GpuSamplingRow));
  const size_t entries_bytes =
      aligned(std::max<size_t>(entries.size(), 1) * sizeof(GpuPenaltyEntry));
  const size_t results_bytes = aligned(params.size() * sizeof(GpuSampledToken));
  const size_t bytes = rows_bytes + entries_bytes + results_bytes;
  ensure_capacity(rows_bytes + entries_bytes,
                  static_cast<size_t>(penalised_rows) * static_cast<size_t>(V));
  // The pinned slot: free of any outstanding ticket, and its last copies done.
  Slot& slot = slots_[next_slot_];
  PAGELLM_CHECK(slot.ticket == 0)
      << "cuda backend: sample_async: two sampled steps are outstanding already (wait for "
         "the older one first)";
  next_slot_ ^= 1;
  if (slot.done == nullptr) {
    cudaEvent_t e = nullptr;
    PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    slot.done = e;
  }
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(slot.done));
  if (slot.bytes < bytes) {
    if (slot.host) cudaFreeHost(slot.host);
    slot.host = nullptr;
    slot.bytes = 0;
    const size_t grown = std::max(bytes, size_t{64} << 10);
    PAGELLM_CUDA_CHECK(cudaHostAlloc(&slot.host, grown, cudaHostAllocDefault));
    slot.bytes = grown;
  }
  if (slot.results_bytes < results_bytes) {
    // A feed from the slot's last ticket may still be queued: let it run first.
    memory_.synchronize();
    memory_.deallocate(slot.results);
    slot.results = nullptr;
    slot.results_bytes = 0;
    const size_t grown = std::max(results_bytes, size_t{16} << 10);
    slot.results = memory_.allocate(grown);
    slot.results_bytes = grown;
  }
  auto* host = static_cast<char*>(slot.host);
  auto* dev = static_cast<char*>(device_);
  std::memcpy(host, params.data(), params.size() * sizeof(GpuSamplingRow));
  if (!entries.empty()) {
    std::memcpy(host + rows_bytes, entries.data(), entries.size() * sizeof(GpuPenaltyEntry));
  }
  cudaStream_t s = as_stream(stream_);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dev, host, rows_bytes + entries_bytes,
                                     cudaMemcpyHostToDevice, s));
  slot.results_offset = rows_bytes + entries_bytes;
  auto* results_dev = static_cast<GpuSampledToken*>(slot.results);
  launch_sample_rows(logits.ptr<float>(), static_cast<int32_t>(R), static_cast<int32_t>(V),
                     reinterpret_cast<const GpuSamplingRow*>(dev),
                     reinterpret_cast<const GpuPenaltyEntry*>(dev + rows_bytes),
                     scratch_, prune_table_, results_dev, s);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host + slot.results_offset, results_dev,
                                     params.size() * sizeof(GpuSampledToken),
                                     cudaMemcpyDeviceToHost, s));
  PAGELLM_CUDA_CHECK(cudaEventRecord(slot.done, s));
  slot.rows = static_cast<int32_t>(R);
  slot.vocab = static_cast<int32_t>(V);
  slot.ticket = next_ticket_++;
  return SampleTicket{slot.ticket, slot.rows, {}};
}

std::vector<SampledToken> GpuSampler::wait(SampleTicket& ticket) {
  if (ticket.id != 0 && ticket.rows == 0) {  // nothing was sampled
    ticket.id = 0;
    return {};
  }
  Slot& slot = slot_of(ticket, "wait_sampled");
  ticket.id = 0;
  slot.ticket = 0;  // free for reuse whatever follows
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(slot.done));
  const auto* results_host =
      reinterpret_cast<const GpuSampledToken*>(static_cast<char*>(slot.host) + slot.results_offset);
  std::vector<SampledToken> out(static_cast<size_t>(slot.rows));
  for (int32_t r = 0; r < slot.rows; ++r) {
    const GpuSampledToken& g = results_host[r];
    PAGELLM_CHECK(g.status != kSampleNoFiniteLogit)
        << "row " << r << ": sampling: the row of logits has no finite value (all " << slot.vocab
        << " are NaN or -inf)";
    PAGELLM_CHECK(g.status != kSampleNoFiniteAfterPenalties)
        << "row " << r << ": sampling: no finite logit is left after the penalties";
    PAGELLM_ASSERT(g.status == kSampleOk && g.token >= 0 && g.token < slot.vocab)
        << "GPU sampler returned status " << g.status << ", token " << g.token;
    SampledToken& t = out[static_cast<size_t>(r)];
    t.token = g.token;
    t.logprob = g.logprob;
    t.processed_logprob = g.processed_logprob;
  }
  return out;
}

void GpuSampler::feed(const SampleTicket& ticket, const std::vector<int32_t>& src_rows,
                      Tensor& token_ids) {
  const Slot& slot = slot_of(ticket, "feed_sampled_tokens");
  PAGELLM_CHECK(token_ids.dtype == DType::I32 &&
                static_cast<int64_t>(src_rows.size()) <= token_ids.numel())
      << "cuda backend: feed_sampled_tokens: " << src_rows.size()
      << " tokens into an int32 tensor of " << token_ids.numel();
  for (int32_t r : src_rows) {
    PAGELLM_CHECK(r >= 0 && r < slot.rows)
        << "cuda backend: feed_sampled_tokens: row " << r << " of a ticket of " << slot.rows
        << " rows";
  }
  if (src_rows.empty()) return;
  const auto* results = static_cast<const GpuSampledToken*>(slot.results);
  launch_feed_sampled_tokens(results, src_rows.data(), static_cast<int32_t>(src_rows.size()),
                             token_ids.ptr<int32_t>(), as_stream(stream_));
}

}  // namespace pagellm::cuda
