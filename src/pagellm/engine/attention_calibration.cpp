#include "pagellm/engine/attention_calibration.h"

#include "pagellm/common/check.h"
#ifdef PAGELLM_HAVE_CUDA
#include "pagellm/cuda/attention/attention_calibration.h"
#endif

namespace pagellm {

bool attention_calibration_available(std::string* why) {
#if defined(PAGELLM_HAVE_CUDA) && PAGELLM_HAVE_CUDNN
  if (why) why->clear();
  return true;
#elif defined(PAGELLM_HAVE_CUDA)
  if (why) {
    *why = "this build's CUDA backend has no cuDNN route (cudnn-frontend or cudnn.h was not "
           "found at configure time)";
  }
  return false;
#else
  if (why) {
    *why = "this build has no CUDA backend (configure with -DPAGELLM_CUDA=ON and a CUDA "
           "toolkit)";
  }
  return false;
#endif
}

CrossoverTable calibrate_attention(const CalibrationOptions& options,
                                   const CalibrationObserver& observer) {
  options.validate();
  std::string why;
  PAGELLM_CHECK(attention_calibration_available(&why))
      << "attention calibration needs a GPU build: " << why;
#ifdef PAGELLM_HAVE_CUDA
  return cuda::calibrate_attention(options, observer);
#else
  PAGELLM_FAIL() << "unreachable: no CUDA backend";
#endif
}

}  // namespace pagellm
