// Default implementations of the Backend interface.
#include "pagellm/backend/backend.h"

#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/engine/sampler.h"

namespace pagellm {

std::vector<SampledToken> Backend::sample(const Tensor& logits,
                                          const std::vector<SamplingRow>& rows) {
  PAGELLM_CHECK(logits.dtype == DType::F32 && logits.ndim == 2)
      << "Backend::sample: logits must be a float32 [rows, vocab] tensor, got "
      << dtype_name(logits.dtype) << " " << logits.shape_string();
  const int64_t num_rows = logits.size(0);
  const int64_t vocab_size = logits.size(1);
  PAGELLM_CHECK(static_cast<size_t>(num_rows) == rows.size())
      << "Backend::sample: " << num_rows << " rows of logits but " << rows.size()
      << " sampling rows";
  if (num_rows == 0) return {};
  // [R, V] float32 on the host; copy_to_host waits for the forward pass that wrote it.
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  copy_to_host(host.data(), logits.data, logits.nbytes());
  return sample_rows(host.data(), num_rows, vocab_size, rows);
}

}  // namespace pagellm
