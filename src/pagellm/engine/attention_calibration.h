// Attention calibration for front ends: the engine layer links the CUDA backend when it is
// built, so this is where `pagellm calibrate-attention` (and any other caller) reaches the
// GPU measurement without including CUDA headers. In a build without CUDA it fails with a
// message saying so.
#pragma once

#include <string>

#include "pagellm/attention/calibration.h"
#include "pagellm/attention/crossover_table.h"

namespace pagellm {

/// Whether this build can calibrate attention (the CUDA backend with its cuDNN route). On
/// false, *why (when given) says what is missing. A true answer does not promise a GPU or
/// a loadable cuDNN at run time: calibrate_attention reports those.
bool attention_calibration_available(std::string* why = nullptr);

/// Times native and cuDNN paged attention on options.device over calibration_grid(options)
/// and returns the crossover table (cuda/attention_calibration.h); write it with
/// write_crossover_table. Throws Error when the build cannot calibrate (the reason from
/// attention_calibration_available), when the options are invalid, or when the GPU or
/// cuDNN is missing at run time.
CrossoverTable calibrate_attention(const CalibrationOptions& options,
                                   const CalibrationObserver& observer = {});

}  // namespace pagellm
