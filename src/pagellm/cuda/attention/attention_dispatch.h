// The CUDA backend's attention room: the dispatcher's state (planner, crossover tables,
// cuDNN plan cache), plan_attention's plan for the forward, and the run of each layer's
// call on cuDNN or the native kernels as that plan says (docs/design.md, "Attention
// dispatch" and "The attention dispatcher").
//
// CUDA-free header (cuda_backend.h holds one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pagellm/backend/backend.h"
#include "pagellm/cuda/cuda_settings.h"

struct CUstream_st;

namespace pagellm {

struct AttentionPlan;

namespace cuda {

class DeviceMemory;
struct PagedAttentionParams;

/// What the attention dispatcher did since the backend was made (for tests and logs).
/// Calls are counted when launched or captured, not when a graph replays them.
struct AttentionRouteStats {
  int64_t forwards_planned = 0;  // plan_attention() calls (one per forward)
  int64_t native_calls = 0;      // layer calls run on the native kernels
  int64_t cudnn_calls = 0;       // layer calls run through cuDNN
  int64_t plans_built = 0;       // cuDNN plans built off the hot path (requested by auto)
  int64_t plans_refused = 0;     // requested shapes cuDNN refused to build
  int64_t warmups = 0;           // freshly built plans run once before a capture
  int64_t prefix_pass_calls = 0;  // decode calls run or captured with the shared-prefix pass
  int64_t prefix_item_batches = 0;  // uploaded batches with shared-prefix items (CudaBackend)
};

/// Plans and runs paged attention for one backend. Not thread-safe.
class AttentionDispatch {
 public:
  /// Allocates the decode split-KV workspace from `memory` (zero-filled once); the
  /// dispatcher itself (device profile, tables, cuDNN) is made on first use, so a
  /// native-only backend never loads cuDNN. `settings` give the decode kernel and the
  /// extra crossover tables.
  AttentionDispatch(DeviceMemory& memory, int device, const CudaSettings& settings,
                    CUstream_st* stream);
  ~AttentionDispatch();
  AttentionDispatch(const AttentionDispatch&) = delete;
  AttentionDispatch& operator=(const AttentionDispatch&) = delete;

  /// Backend::plan_attention (CudaBackend documents it).
  AttentionPlanRef plan(const BatchTensors& batch, const AttentionShape& shape,
                        const LayerKv& kv);
  /// Backend::attention (CudaBackend documents it).
  void run(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
           const BatchTensors& batch, const AttentionPlanRef& plan, Tensor& out);
  /// Backend::set_attention_backend without its capture check.
  void set_choice(AttentionBackendChoice choice);
  /// Between forwards (upload_batch, begin_capture): builds the cuDNN plans `auto`
  /// requested (before a capture, also runs each new one once on the last forward's
  /// buffers) and ends the forward's plan.
  void between_forwards(bool before_capture);

  /// Batch-invariant mode (CudaBackend::set_batch_invariant): every call, prefill chunks
  /// included, runs the decode kernel (settings' variant) with one KV split, whose work for
  /// a query token (its keys from 0 in 16-key tiles dealt to the warps in turn, one merge
  /// in warp order) does not depend on the other tokens of its row, its chunk or the
  /// batch. Multi-token rows run one token after another: prefill gets slow, decode keeps
  /// its kernel. The caller sets the choice to native.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  std::string choice() const;
  AttentionRouteStats stats() const;
  /// The plan of the last forward that ran attention (nullptr before the first).
  const AttentionPlan* last_plan() const;
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Route;
  Route& route();
  // Gives a decode call `p` the shared-prefix pass (PagedAttentionParams::prefix_tokens)
  // when the batch's items can use it: settings allow, the TMA kernel, at least
  // settings.decode_cascade_min_seqs sequences, a shape decode_cascade_supported accepts.
  void add_prefix_pass(const BatchTensors& batch, PagedAttentionParams& p);
  void configure(AttentionBackendChoice choice);

  DeviceMemory& memory_;
  int device_;
  CudaSettings settings_;
  CUstream_st* stream_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unique_ptr<Route> route_;
  bool batch_invariant_ = false;
};

}  // namespace cuda
}  // namespace pagellm
