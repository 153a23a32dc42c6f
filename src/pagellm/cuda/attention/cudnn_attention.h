// The cuDNN route of paged attention: cuDNN's SDPA forward (graph API, through the
// cudnn-frontend headers) over the same paged K/V pools and page tables the native kernels
// read, chosen per forward by the attention planner (src/pagellm/attention/planner.h).
//
// Why it exists: on Hopper, cuDNN's fused attention reaches a higher share of the tensor
// cores than a FlashAttention-2-style kernel for long prefills, but pays a larger host
// submission cost per call; the planner sends it only the calls where measurement says the
// kernel time saved exceeds that cost (or under graph replay, where the cost is hidden).
//
// Shapes (one graph per CudnnPlanKey and pool size):
//   Q, O       bf16 [B, Hq, s_q, D] over q/out [T, Hq, D]: head stride D, token stride Hq*D.
//              Prefill: ragged, per-sequence element offsets query_start[b] * Hq * D
//              (uploaded once per forward) and seq_len_q = query lengths; causal,
//              bottom-right aligned. Decode: dense (one token per sequence), seq_len_q = 1
//              from a constant device array, no mask (the one query sees every key).
//   K, V       the pools as paged containers [num_pages, Hkv, page_size, D]
//   tables     the batch's page table [B, 1, max_pages_per_seq, 1], for both K and V
//   seq_len_kv the batch's kv_lens [B]
//   s_kv       max_pages_per_seq * page_size, the row's capacity: cuDNN's paged loads
//              require ceil(s_kv / page_size) == max_pages_per_seq; the padding mask and
//              seq_len_kv stop each sequence at its own length, so one plan serves every
//              KV length (and every replay of a captured decode graph)
//
// cuDNN is loaded at run time (dlopen): a machine without it runs everything natively and
// `auto` never fails because of it; `cudnn` then fails with the loader's reason.
//
// Plans are built outside the hot path (warm-up, between steps, or on an explicit-cudnn
// call outside capture) and cached; run() only enqueues cuDNN's kernels: no allocation, no
// synchronisation, no host-device copy, so it may be captured into a CUDA graph. Buffers a
// captured graph may point at (workspace, the all-ones seq_len_q) are never freed while the
// cache lives; when they must grow, new ones are made and the old kept.
//
// Only code under src/pagellm/cuda and tests/cuda may include this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/attention/planner.h"
#include "pagellm/cuda/attention/attention.h"

namespace pagellm::cuda {

/// The cuDNN library as found at run time.
struct CudnnLibrary {
  CudnnVersion version = 0;  // cudnnGetVersion(); 0 when no cuDNN 9 could be loaded
  std::string path;          // what was loaded
  std::string error;         // why nothing was loaded (every path tried, dlerror's reasons)
};

/// Loads cuDNN once (thread-safe, never throws). Tried in order: $PAGELLM_CUDNN_LIB
/// (CudaSettings::process().cudnn_library: a path to libcudnn.so.9), "libcudnn.so.9"
/// through the loader (LD_LIBRARY_PATH, ld.so cache), /usr/local/cuda/lib64 and
/// /usr/lib/x86_64-linux-gnu. Needs cuDNN 9.
const CudnnLibrary& cudnn_library();

/// The profile of CUDA device `device` (name, SM count, compute capability) with the
/// loaded cuDNN version: what crossover tables are looked up by.
DeviceProfile cuda_device_profile(int device);

/// Whether cuDNN's paged SDPA, as loaded, can serve calls of this shape and phase on
/// `device` (rule 1's static part: version, compute capability, dtype, head dim, GQA,
/// page size). On false, *why (when given) says which.
bool cudnn_attention_supported(const AttentionDomain& domain, AttentionPhase phase, int device,
                               std::string* why = nullptr);

/// Built cuDNN plans by shape, their workspace, and the per-forward device arrays of the
/// ragged route. Implements the planner's CudnnPlanRegistry. One per backend; not
/// thread-safe (one host thread drives it).
class CudnnPlanCache final : public CudnnPlanRegistry {
 public:
  /// Nothing is loaded or allocated until the first build.
  explicit CudnnPlanCache(int device = 0);
  ~CudnnPlanCache() override;
  CudnnPlanCache(const CudnnPlanCache&) = delete;
  CudnnPlanCache& operator=(const CudnnPlanCache&) = delete;

  /// The pool size (pages per layer, page 0 included) plans are built for; set it once the
  /// KV pools exist, before building. Plans for another size are kept but not reported.
  void set_num_pages(int64_t num_pages);
  int64_t num_pages() const;

  // CudnnPlanRegistry
  bool has_plan(const CudnnPlanKey& key) const override;
  void request_plan(const CudnnPlanKey& key) override;

  /// Builds the plan for `key` (and grows the workspace it needs) unless it is built, for
  /// the current pool size. Synchronises the device: call outside any stream capture.
  /// Throws Error with cuDNN's reason when cuDNN cannot build it; the failure is
  /// remembered, so that `auto` never asks for that shape again.
  void build(const CudnnPlanKey& key);
  /// Builds every plan `auto` requested since the last call (off the hot path: at warm-up
  /// or between steps). Returns one message per shape cuDNN refused; never throws for those.
  std::vector<std::string> build_requested();
  /// Keys requested and not yet built.
  size_t num_requested() const;

  /// Copies a prefill plan's per-forward arrays (seq_len_q, ragged offsets) to the device,
  /// ordered on `stream` before the layers' run() calls. Call once per forward after
  /// plan(); nothing to do for decode plans. Not while `stream` is being captured.
  void upload(const AttentionPlan& plan, cudaStream_t stream);

  /// Runs one layer's attention through cuDNN. `p` as for the native kernels (q, pools,
  /// out, kv_lens, page_table, counts, heads, head_dim, page size, max_pages_per_seq,
  /// scale; workspace and query_start are not used); `plan` is this forward's cuDNN plan.
  /// Enqueues only. A missing plan is built first when the stream is not capturing
  /// (explicit cudnn) and is an Error while capturing. Throws Error when `p` disagrees
  /// with the plan's key, when a ragged plan's arrays were not uploaded, or when cuDNN
  /// fails.
  void run(const PagedAttentionParams& p, const AttentionPlan& plan, cudaStream_t stream);

  size_t num_plans() const;
  /// Bytes of device memory the cache holds (workspaces, metadata, retired buffers).
  size_t device_bytes() const;
  /// The largest workspace a built plan needs.
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One layer of paged attention through cuDNN (CudnnPlanCache::run).
void cudnn_paged_attention(const PagedAttentionParams& p, const AttentionPlan& plan,
                           CudnnPlanCache& cache, cudaStream_t stream);

}  // namespace pagellm::cuda
