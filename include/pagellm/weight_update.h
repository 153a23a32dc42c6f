// In-place weight updates: the named tensors a trainer pushes, how running requests are
// treated while the weights change, and what an update reports. A vocabulary header (no
// other pagellm header), so the model and engine layers use the same definitions as the
// public API.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace pagellm {

/// Element type of a tensor given to an update. Weights accept the float types; the
/// integer types exist so that a wrong tensor is named in the error instead of misread.
enum class TensorDType : uint8_t { kFloat32, kBFloat16, kFloat16, kInt32, kInt64 };

/// Where a tensor's bytes live.
///   kHost:       ordinary (pageable) host memory; staged through pinned buffers.
///   kHostPinned: page-locked host memory (cudaHostAlloc / cudaHostRegister); copied
///                directly at PCIe speed.
///   kDevice:     memory of the engine's device (a CUDA pointer on the cuda backend, host
///                memory on the cpu backend); copied, and converted, on the device.
enum class TensorMemory : uint8_t { kHost, kHostPinned, kDevice };

/// One tensor of a weight update, by its Hugging Face parameter name (for example
/// "model.layers.3.self_attn.q_proj.weight"). Contiguous, row-major; not owned: the data
/// must stay valid until the update call returns.
struct NamedTensor {
  std::string name;
  const void* data = nullptr;
  TensorDType dtype = TensorDType::kBFloat16;
  std::vector<int64_t> shape;
  TensorMemory memory = TensorMemory::kHost;
};

/// One tensor of a weight update that lives in the CUDA memory of another process on the
/// same machine and GPU (a colocated trainer), shared through CUDA IPC: the process called
/// cudaIpcGetMemHandle on the allocation holding the tensor (torch:
/// `tensor.untyped_storage()._share_cuda_()` gives the handle of the caching allocator's
/// block and the storage's byte offset in it). The engine maps each distinct handle once
/// (cudaIpcOpenMemHandle), copies the tensors as TensorMemory::kDevice and unmaps it before
/// the update returns; the trainer must keep the memory unchanged until then.
struct IpcTensor {
  std::string name;
  /// The cudaIpcMemHandle_t's 64 bytes.
  std::array<uint8_t, 64> handle{};
  /// Bytes from the start of the shared allocation to the tensor's first element.
  uint64_t offset = 0;
  TensorDType dtype = TensorDType::kBFloat16;
  std::vector<int64_t> shape;
};

/// What happens to running requests during an update (vLLM's pause modes).
///   kWait:  stop admitting new requests, let the running ones finish, then update.
///   kAbort: finish the running and waiting requests with FinishReason::kAborted (their
///           pages are freed), then update.
///   kKeep:  update between two steps; running requests continue with the new weights, but
///           the KV they computed before was made with the old ones (reported per token
///           by CompletionOutput::weights_versions and in WeightUpdateResult).
enum class PauseMode : uint8_t { kWait, kAbort, kKeep };

/// "wait", "abort", "keep".
inline const char* pause_mode_name(PauseMode mode) {
  switch (mode) {
    case PauseMode::kWait: return "wait";
    case PauseMode::kAbort: return "abort";
    case PauseMode::kKeep: return "keep";
  }
  return "unknown";
}

/// The outcome of one weight update.
struct WeightUpdateResult {
  /// The weights version after the update (the one new tokens are sampled under).
  uint64_t weights_version = 0;
  /// Tensors written (by name; a tied model's lm_head.weight is not written, see
  /// Qwen3Model::update_weights) and their bytes as given.
  int64_t tensors_updated = 0;
  uint64_t bytes = 0;
  /// Wall time of the write (checks, copies, packed-copy refresh, one synchronisation).
  double seconds = 0.0;
  /// Wall time spent waiting for running requests to finish (PauseMode::kWait).
  double wait_seconds = 0.0;
  PauseMode mode = PauseMode::kWait;
  /// Requests aborted by PauseMode::kAbort.
  int64_t requests_aborted = 0;
  /// Requests that continue under the new weights with KV cached from older ones
  /// (PauseMode::kKeep); their tokens so far carry the older version.
  int64_t requests_kept = 0;
  /// Requests that finished while the update waited for them (PauseMode::kWait).
  int64_t requests_waited = 0;
};

}  // namespace pagellm
