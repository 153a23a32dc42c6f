// Attention calibration on the GPU: times the native kernels and cuDNN over
// calibration_grid() (attention/calibration.h), eager and, for decode, under graph
// replay, and derives the crossover table `--attention-backend auto` reads.
//
// Declared without CUDA headers, so that the engine layer's calibrate_attention (the entry
// point front ends use, engine/attention_calibration.h) can call it.
#pragma once

#include "pagellm/attention/calibration.h"
#include "pagellm/attention/crossover_table.h"

namespace pagellm::cuda {

/// Measures options.device over the grid and returns the table (device profile with the
/// loaded cuDNN version, today's date, options.source(), margin, the measurements and the
/// entries derive_crossover_entries makes of them). Nothing is written. Throws Error when
/// the options are invalid, there is no such CUDA device, cuDNN cannot be loaded (the
/// loader's reason), or this build has no cuDNN route.
CrossoverTable calibrate_attention(const CalibrationOptions& options,
                                   const CalibrationObserver& observer = {});

}  // namespace pagellm::cuda
