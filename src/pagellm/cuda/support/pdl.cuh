// Programmatic dependent launch (PDL, sm_90) and the one launch helper every kernel of the
// decode step goes through.
//
// Why. A decode step is ~250-300 kernels; between two of them the GPU drains one grid, then
// launches and ramps up the next (~2-4 µs each on the H200, measured as ~0.8 ms of a 4 ms
// W1 step). With PDL a kernel launched with the programmatic-serialization attribute may
// start while its predecessor is still running: it does the work that does not depend on the
// predecessor (a matrix product streams its weights), then waits in pdl_wait() until the
// predecessor grid has finished and its memory is visible.
//
// The contract every kernel launched through launch_kernel() keeps:
//   1. Before pdl_wait() it reads only data no kernel of the step writes (weights, page
//      tables built on the host, its own arguments) and writes nothing to global memory.
//   2. It calls pdl_wait() on every path, also a CTA that has nothing to do, before it
//      returns. So when a kernel passes its wait, every earlier kernel in the stream has
//      finished (by induction), not just the one right before it.
//   3. pdl_launch_dependents() only lets the next kernel be scheduled early; it never makes
//      this kernel's writes visible early. The next grid launches once every CTA of this one
//      has called it or exited (later calls are no-ops). Call it after pdl_wait(), so that
//      only one kernel at a time waits ahead of the running one. Kernels with more than one
//      wave of CTAs call it only once their main work is done, so that waiting dependents
//      do not take the SM slots the later waves need. One exception: the RMSNorm kernels
//      (one CTA per row, no shared memory) call it first thing for batches of 17 rows or
//      more. The product after a norm then launches while the product before it still
//      drains and prefetches its weights into the slots that one frees: W1 +0.6 to +1 %
//      (H200, sessions (f) and (g)), batch 24 +2 % (H100, 2026-12-06). Below 17 rows it
//      costs more than it gains (batch 4 -6 %, batch 8 -4.5 %, batch 16 -1.5 %, session
//      (g)), so there the norms keep the rule. That cannot starve the product before: the
//      norm itself launched only once every CTA of that product had started. And rule 2
//      still holds, because the norm waits before it finishes.
// Rule 1 makes a launcher that reads an argument before its wait (the norm kernels' weight
// vectors) require that no kernel still in flight on the stream writes that argument; model
// weights, uploaded by copies, qualify.
// A kernel launched without the attribute (PAGELLM_DISABLE_PDL=1, or a cuBLASLt / cuDNN
// kernel in between) is fully serialised as usual, and pdl_wait() is then a no-op. CUDA
// graph capture records the attribute as a programmatic edge, so replays keep the overlap.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {

/// Lets the next kernel in the stream (if launched with the attribute) be scheduled now.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Waits until the previous grid in the stream has finished and its writes are visible.
/// A no-op for a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// CudaSettings::process().pdl: false when PAGELLM_DISABLE_PDL is set to anything but ""
/// or "0" (read once per process).
inline bool pdl_enabled() {
  static const bool enabled = CudaSettings::process().pdl;
  return enabled;
}

/// Launches `kernel` on `stream` with programmatic stream serialisation (unless disabled)
/// and, when cluster_y > 1, a thread-block cluster of (1, cluster_y, 1). Throws Error if
/// the launch fails. Graph-capture safe.
template <class... KernelArgs, class... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, int cluster_y, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_y > 1) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n].val.clusterDim.x = 1;
    attributes[n].val.clusterDim.y = static_cast<unsigned>(cluster_y);
    attributes[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attributes;
  config.numAttrs = n;
  PAGELLM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace pagellm::cuda
