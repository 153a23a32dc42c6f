// Kernel trace: the start and end of every kernel the device runs (CUDA graphs and
// programmatic dependent launches included), through CUPTI's activity API. For
// benchmarks: it answers "where does a decode step's time go" with the kernels as they
// really overlap, which timing kernels one by one cannot.
//
// CUPTI is loaded at run time (libcupti.so.13, then libcupti.so): nothing links it, and
// a machine without it gets an error message instead of a binary that does not start.
// The trace records kernels (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, the kind that does
// not serialise them), copies, and the host's CUDA runtime calls.
#pragma once

#include <string>
#include <vector>

#include "pagellm/common/kernel_timeline.h"

namespace pagellm::cuda {

/// Starts recording. Returns "" on success, else why not (CUPTI missing, already
/// tracing, a CUPTI error). One trace at a time per process.
std::string begin_kernel_trace();

/// Flushes and stops recording; the kernels since begin_kernel_trace(), by start time.
std::vector<KernelSpan> end_kernel_trace();

}  // namespace pagellm::cuda
