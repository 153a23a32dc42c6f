// Launchers of the CUDA backend's own kernels (everything except attention and matmul).
//
// The launchers take raw device pointers and sizes, never engine types, so that each
// kernel can be tested and benchmarked alone. None of them allocates, synchronises or
// copies between host and device: they only enqueue work on `stream`, so every one of them
// may be captured into a CUDA graph. Each launches through launch_kernel (pdl.cuh), which
// throws pagellm::Error if the launch fails, with programmatic dependent launch: a kernel
// may start while the one before it still runs, and waits for it before touching anything
// but its weights. So the norm weights given to launch_rms_norm, launch_add_rms_norm and
// launch_qk_norm_rope_store_kv must not be written by a kernel that may still be running
// on the stream (model weights, uploaded by copies, never are).
//
// Element types: "bf16" pointers point at __nv_bfloat16 data; they are typed void* here so
// that host-only translation units need not see cuda_bf16.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "pagellm/common/dtype.h"

namespace pagellm::cuda {

/// Sets n elements of `data` (F32, BF16, F16 or I32; I32 gets the value truncated) to value.
void launch_fill(void* data, DType dtype, int64_t n, float value, cudaStream_t stream);

/// dst[i] = src[i] converted (float32, bfloat16, float16 to any of them; one rounding to
/// nearest even) for i < n: weight updates from device memory of another dtype. Streams
/// both arrays once (HBM-bound).
void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                    cudaStream_t stream);

/// dst[r, :] = src[indices[r], :] for r < num_rows, each row row_bytes long; used for the
/// embedding lookup and for gathering the rows whose logits are wanted. An index outside
/// [0, src_rows) yields a row of zero bytes (the host validates ids; the kernel only
/// guarantees that it never reads out of bounds).
void launch_gather_rows(const void* src, int64_t src_rows, const int32_t* indices, void* dst,
                        int64_t num_rows, int64_t row_bytes, cudaStream_t stream);

/// out[r, :] = x[r, :] / rms(x[r, :]) * weight, rows x hidden, all bf16, f32 arithmetic.
/// out may equal x.
void launch_rms_norm(const void* x, const void* weight, void* out, int64_t rows, int64_t hidden,
                     float eps, cudaStream_t stream);

/// The float32 head's norm: out[r, :] = (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)) * weight
/// with x bf16 and weight and out float32, nothing rounded below float32 (the order of the
/// products is transformers' Qwen3RMSNorm in float32). Rows x hidden; out must not alias x.
/// A plain launch (no programmatic dependent launch): it is one small kernel a forward.
void launch_rms_norm_f32_out(const void* x, const float* weight, float* out, int64_t rows,
                             int64_t hidden, float eps, cudaStream_t stream);

/// residual[r, :] = bf16(residual[r, :] + delta[r, :]);
/// out[r, :] = residual[r, :] / rms(residual[r, :]) * weight (from the rounded residual, so
/// that the fused op equals an add followed by rms_norm). All bf16.
void launch_add_rms_norm(void* residual, const void* delta, const void* weight, void* out,
                         int64_t rows, int64_t hidden, float eps, cudaStream_t stream);

/// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]; gate_up [rows, 2 * inter],
/// out [rows, inter], bf16, f32 arithmetic with one rounding.
void launch_silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter,
                     cudaStream_t stream);

/// Arguments of the fused q/k RMSNorm + RoPE + KV-store kernel (all device pointers).
struct QkNormRopeArgs {
  const void* qkv = nullptr;     // bf16 [T, (Hq + 2 Hkv) * D]: q heads, then k, then v
  const void* q_norm = nullptr;  // bf16 [D]
  const void* k_norm = nullptr;  // bf16 [D]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* slot_mapping = nullptr;  // [T]; a negative slot skips the K/V write
  void* q_out = nullptr;   // bf16 [T, Hq, D]
  void* k_pool = nullptr;  // bf16 [num_pages, Hkv, page_size, D]
  void* v_pool = nullptr;  // bf16 [num_pages, Hkv, page_size, D]
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  int64_t num_pages = 0;  // slots at or past num_pages * page_size are skipped, not written
  float eps = 1e-6f;
  float rope_theta = 1e6f;
};

/// Head dims the fused q/k-norm-RoPE kernel is compiled for.
bool qk_norm_rope_supports_head_dim(int32_t head_dim);

/// For every token t: q heads get RMSNorm(q_norm) and RoPE at positions[t] and go to q_out;
/// k heads get RMSNorm(k_norm) and RoPE and go to k_pool at slot_mapping[t]; v heads are
/// copied to v_pool at the same slot. RoPE is rotate-half over the full head dim with
/// inv_freq[i] = 1 / theta^(2i / D) in float32, as transformers computes it for Qwen3.
void launch_qk_norm_rope_store_kv(const QkNormRopeArgs& args, cudaStream_t stream);

/// Returns cudaSuccess when this binary carries kernel code that the current device can run
/// (cudaErrorNoKernelImageForDevice or similar otherwise). Used at backend start-up to turn
/// "built for the wrong architecture" into a clear message.
cudaError_t probe_kernel_image();

}  // namespace pagellm::cuda
