// Where a traced stretch of device time went, kernel by kernel.
//
// Kernels launched back to back with programmatic dependent launch overlap: the next one
// starts its prologue (and waits) while the previous one drains. Adding up kernel
// durations therefore double-counts. Here every instant of the stretch is given to exactly
// one kernel, the earliest-started one still running (the one the others wait for), or to
// "idle" when none runs; the attributed times add up to the wall time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagellm {

/// One span of a trace (timestamps in ns, one clock for host and device): a kernel or a
/// copy on the device, or a call into the CUDA runtime on the host.
struct KernelSpan {
  enum class Kind { kKernel, kCopy, kHostCall };
  std::string name;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  Kind kind = Kind::kKernel;
};

struct TimelineRow {
  std::string label;
  int64_t count = 0;          // kernels in this row
  double attributed_ns = 0;   // instants given to these kernels (see above)
  double duration_ns = 0;     // sum of their own start-to-end times (overlaps included)
};

struct KernelTimeline {
  double wall_ns = 0;  // first start to last end
  double idle_ns = 0;  // instants with no kernel running
  int64_t kernels = 0;
  /// Rows by kernel name, most attributed time first.
  std::vector<TimelineRow> by_name;
  /// The repeating unit of the trace (a model layer: the longest stretch in which the kernel
  /// names repeat with one period), one row per position, in launch order; empty if none.
  int period = 0;
  int64_t period_repeats = 0;
  std::vector<TimelineRow> by_position;
  /// The host's runtime calls by name, most time first (duration_ns only: they are not
  /// device time and take no part in the attribution above).
  std::vector<TimelineRow> host_calls;
};

/// A demangled kernel name shortened for tables: "void ns::(anonymous namespace)::k<32,
/// true>(Params)" -> "k<32, true>" (no return type, namespaces or parameters; at most 80
/// characters).
std::string short_kernel_name(const std::string& demangled);

/// Summarises the spans, in any order: the device spans (kernels and copies) into the
/// attribution, the host calls into host_calls. Spans with end < start are an error
/// (throws Error).
KernelTimeline summarize_kernel_timeline(std::vector<KernelSpan> spans);

}  // namespace pagellm
