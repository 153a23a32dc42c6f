#include <memory>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/cpu/cpu_backend.h"
#ifdef PAGELLM_HAVE_CUDA
#include "pagellm/cuda/cuda_backend.h"
#endif

namespace pagellm {

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"cpu"};
#ifdef PAGELLM_HAVE_CUDA
  names.push_back("cuda");
#endif
  return names;
}

std::unique_ptr<Backend> create_backend(const std::string& name, int device) {
  PAGELLM_CHECK(device >= 0) << "create_backend: device " << device << " (needs >= 0)";
  if (name == "cpu") return std::make_unique<CpuBackend>();
#ifdef PAGELLM_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend(device);
#endif
  std::string list;
  for (const auto& n : available_backends()) list += (list.empty() ? "" : ", ") + n;
  PAGELLM_FAIL() << "unknown backend '" << name << "'; this build has: " << list
                 << (name == "cuda" ? " (rebuild with -DPAGELLM_CUDA=ON and a CUDA toolkit)"
                                    : "");
}

}  // namespace pagellm
