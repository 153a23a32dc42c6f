// Names shared by the attention planner, its tables and its explain output: which provider
// runs a call, what the user asked for, how the call is launched, what kind of batch it is.
//
// Host-only: no CUDA header, so that the planner compiles and is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace pagellm {

/// The implementation that runs one paged-attention call.
enum class AttentionProvider : uint8_t {
  kNative,  // pagellm's own kernels (src/pagellm/cuda/attention/attention.h)
  kCudnn,   // cuDNN's SDPA forward over the same paged pools (src/pagellm/cuda/attention/cudnn_attention.h)
};

/// What `--attention-backend` asked for.
enum class AttentionBackendChoice : uint8_t {
  kAuto,    // cuDNN where the admission rules say it pays, native otherwise; never fails
            // because of cuDNN
  kNative,  // always the native kernels
  kCudnn,   // always cuDNN; a call cuDNN cannot serve is an Error that says why
};

/// How the call is launched. cuDNN's host submission cost (tens of microseconds per call)
/// is paid on every eager call but hidden under CUDA-graph replay, so the two modes have
/// separate measured crossovers.
enum class LaunchMode : uint8_t { kEager, kGraph };

/// Decode: every sequence has exactly one query token (cuDNN gets a dense, non-ragged Q).
/// Prefill: anything else (prefill, chunked prefill, mixed batches; cuDNN gets ragged Q).
enum class AttentionPhase : uint8_t { kPrefill, kDecode };

const char* provider_name(AttentionProvider p);   // "native", "cudnn"
const char* choice_name(AttentionBackendChoice c);  // "auto", "native", "cudnn"
const char* mode_name(LaunchMode m);              // "eager", "graph"
const char* phase_name(AttentionPhase p);         // "prefill", "decode"

/// Parses "auto", "native" or "cudnn"; throws Error naming the accepted values otherwise.
AttentionBackendChoice parse_attention_backend(const std::string& text);
/// Parses "eager" or "graph"; throws Error otherwise.
LaunchMode parse_launch_mode(const std::string& text);
/// Parses "prefill" or "decode"; throws Error otherwise.
AttentionPhase parse_attention_phase(const std::string& text);

}  // namespace pagellm
