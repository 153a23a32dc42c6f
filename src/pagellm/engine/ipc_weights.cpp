#include "pagellm/engine/ipc_weights.h"

#include <map>

#include "pagellm/common/check.h"

namespace pagellm {

IpcWeights::IpcWeights(Backend& backend, const std::vector<IpcTensor>& tensors)
    : backend_(backend) {
  std::map<std::array<uint8_t, 64>, char*> opened;  // one mapping per shared allocation
  try {
    for (const IpcTensor& t : tensors) {
      PAGELLM_CHECK(!t.name.empty()) << "an IPC tensor has an empty name";
      auto it = opened.find(t.handle);
      if (it == opened.end()) {
        char* base = static_cast<char*>(backend_.open_ipc_memory(t.handle));
        bases_.push_back(base);
        it = opened.emplace(t.handle, base).first;
      }
      NamedTensor n;
      n.name = t.name;
      n.data = it->second + t.offset;
      n.dtype = t.dtype;
      n.shape = t.shape;
      n.memory = TensorMemory::kDevice;
      tensors_.push_back(std::move(n));
    }
  } catch (...) {
    close_all();
    throw;
  }
}

IpcWeights::~IpcWeights() { close_all(); }

void IpcWeights::close_all() {
  for (void* base : bases_) {
    try {
      backend_.close_ipc_memory(base);
    } catch (const std::exception&) {
      // A handle that will not close leaves a mapping behind, nothing worse; the update's
      // own outcome is what the caller needs to see.
    }
  }
  bases_.clear();
}

}  // namespace pagellm
