// Packed copies of the decode matrices (packed_weights.h).
#include "pagellm/cuda/matmul/packed_weights.h"

#include <cuda_runtime.h>

#include <iterator>

#include "pagellm/common/check.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"

namespace pagellm::cuda {

PackedWeights::PackedWeights(DeviceMemory& memory, PackPolicy policy, size_t total_memory)
    : memory_(memory), policy_(policy), total_memory_(total_memory) {}

PackedWeights::~PackedWeights() {
  for (auto& entry : copies_) memory_.deallocate(entry.second.data);
  copies_.clear();
  bytes_ = 0;
}

size_t PackedWeights::prepare(const Tensor& w, int64_t gated_inter, CUstream_st* stream,
                              bool capturing) {
  if (policy_ == PackPolicy::kNever || w.dtype != DType::BF16 || w.ndim != 2) return 0;
  const int64_t N = w.size(0), K = w.size(1);
  // Only matrices the skinny kernel can stream (sm_90, K % 8, 16-byte aligned).
  if (!skinny_gemm_supported(w.data, w.data, w.data, 1, N, K)) return 0;
  if (gated_inter < 0 || (gated_inter > 0 && N != 2 * gated_inter)) return 0;
  PAGELLM_CHECK(!capturing)
      << "cuda backend: prepare_matrix allocates and cannot run while a graph is captured";
  const size_t bytes = skinny_packed_bytes(N, K);
  auto it = copies_.find(w.data);
  if (it != copies_.end() && (it->second.rows != N || it->second.cols != K ||
                              it->second.gated_inter != gated_inter)) {
    // Another matrix now lives at this address: drop the stale copy.
    drop(it);
    it = copies_.end();
  }
  size_t allocated = 0;
  if (it == copies_.end()) {
    if (policy_ == PackPolicy::kAuto && bytes_ + bytes > total_memory_ / 4) return 0;
    void* copy = nullptr;
    try {
      // Released with the weights when sleep offloads them; repack_all rebuilds it.
      copy = memory_.allocate(bytes, Residency::kPrepared);
    } catch (const Error&) {
      if (policy_ == PackPolicy::kAlways) throw;
      // Packing is an optimisation: without memory for it, the products read w.
      cudaGetLastError();
      return 0;
    }
    it = copies_.emplace(w.data, PackedMatrix{copy, bytes, N, K, gated_inter}).first;
    bytes_ += bytes;
    allocated = bytes;
  }
  pack_skinny_weights(w.data, N, K, gated_inter, it->second.data, stream);
  return allocated;
}

void PackedWeights::repack_all(CUstream_st* stream) {
  for (const auto& [matrix, p] : copies_) {
    pack_skinny_weights(matrix, p.rows, p.cols, p.gated_inter, p.data, stream);
  }
}

const void* PackedWeights::find(const Tensor& w, int64_t gated_inter) const {
  if (!enabled_ || copies_.empty() || w.ndim != 2) return nullptr;
  const auto it = copies_.find(w.data);
  if (it == copies_.end()) return nullptr;
  const PackedMatrix& p = it->second;
  return p.rows == w.size(0) && p.cols == w.size(1) && p.gated_inter == gated_inter ? p.data
                                                                                    : nullptr;
}

void PackedWeights::drop_within(const void* begin, size_t bytes) {
  const auto* first = static_cast<const char*>(begin);
  const char* end = first + bytes;
  for (auto it = copies_.begin(); it != copies_.end();) {
    const auto* key = static_cast<const char*>(it->first);
    it = key >= first && key < end ? drop(it) : std::next(it);
  }
}

PackedWeights::Map::iterator PackedWeights::drop(Map::iterator it) {
  void* copy = it->second.data;
  bytes_ -= it->second.bytes;
  it = copies_.erase(it);
  memory_.deallocate(copy);
  return it;
}

}  // namespace pagellm::cuda
