// Weights shared by another process through CUDA IPC, mapped for one update.
#pragma once

#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/weight_update.h"

namespace pagellm {

/// The IpcTensors of one weight update mapped into this process: each distinct handle is
/// opened once (Backend::open_ipc_memory) and every tensor becomes a kDevice NamedTensor at
/// its offset; the destructor closes the handles. Construct and destroy on the thread that
/// drives the engine. Throws Error for an empty name or a backend without device IPC (the
/// handles opened before are closed).
class IpcWeights {
 public:
  IpcWeights(Backend& backend, const std::vector<IpcTensor>& tensors);
  ~IpcWeights();
  IpcWeights(const IpcWeights&) = delete;
  IpcWeights& operator=(const IpcWeights&) = delete;

  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  size_t num_handles() const { return bases_.size(); }

 private:
  void close_all();
  Backend& backend_;
  std::vector<void*> bases_;
  std::vector<NamedTensor> tensors_;
};

}  // namespace pagellm
