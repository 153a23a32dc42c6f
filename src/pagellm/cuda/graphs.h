// The CUDA backend's graphs room: capturing the stream into a CUDA graph and replaying it,
// and the timed device copy that measures the bandwidth decode is judged against.
//
// CUDA-free header.
#pragma once

#include <memory>

#include "pagellm/backend/backend.h"

struct CUstream_st;

namespace pagellm::cuda {

/// Starts a thread-local-mode capture of `stream` (a forbidden call on this thread, such
/// as a synchronisation, fails the capture instead of corrupting it). Throws Error when
/// the stream is already capturing.
void begin_stream_capture(CUstream_st* stream);

/// Ends the capture and instantiates the graph, which replays on `stream`. Throws Error
/// naming why when the capture failed (an operation synchronised, allocated or copied).
std::unique_ptr<RecordedGraph> end_stream_capture(CUstream_st* stream);

/// Ends a capture left open (the backend's destructor) and drops what was captured.
void abandon_stream_capture(CUstream_st* stream) noexcept;

/// Device-to-device cudaMemcpyAsync of up to 1 GiB (halved while memory is short) timed
/// with events, median of 5: (bytes read + bytes written) per second.
double measure_copy_bandwidth(CUstream_st* stream);

}  // namespace pagellm::cuda
