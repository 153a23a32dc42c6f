// The CPU backend: every operation in float32, the reference that other backends match.
//
// Matrix products go through OpenBLAS (sgemm), or in batch-invariant mode through a
// fixed-order dot product per output; the rest is plain loops parallelised with OpenMP. Weights, activations and the KV pools are float32, so the CPU backend's
// results differ from a float64 reference only by float32 rounding.
#pragma once

#include <unordered_map>

#include "pagellm/backend/backend.h"

namespace pagellm {

class CpuBackend : public Backend {
 public:
  CpuBackend();

  std::string name() const override { return "cpu"; }
  DType weight_dtype() const override { return DType::F32; }
  bool memory_is_host() const override { return true; }
  DType activation_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return DType::F32; }
  size_t free_memory() const override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  /// kKvCache allocations are anonymous mappings of their own (so that sleep() can give
  /// their pages back to the system); the rest come from the heap.
  void* allocate_as(MemoryRole role, size_t bytes) override;
  bool supports_sleep() const override { return true; }
  /// Gives the KV pools' pages back to the system (madvise MADV_DONTNEED: same addresses,
  /// zero-filled when next touched). Weights are host memory already and stay where they
  /// are, offload_weights or not (the result's weight_bytes is 0).
  BackendSleepResult sleep(bool offload_weights) override;
  void wake() override;
  /// Fault injection for tests: after `successes` more allocations (allocate() and the KV
  /// pools' allocate_as), every one fails as running out of host memory does (Error "cpu
  /// backend: out of host memory ..."); -1, the default, never fails.
  void fail_allocations_after_for_testing(int64_t successes) { allocations_left_ = successes; }
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  void upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
              int64_t n) override;
  std::vector<float> download_f32(const Tensor& src) override;
  void fill(Tensor& t, float value) override;
  void copy_kv_pages(std::vector<LayerKv>& kv,
                     const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  BatchTensors upload_batch(const ForwardBatch& batch) override;
  bool supports_persistent_page_table() const override { return true; }
  void reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                     int32_t max_rows) override;
  /// On: matmul computes out[m, n] as one fixed-order dot product of x[m] and w[n]
  /// (matmul_fixed_order) instead of sgemm, whose blocking and kernels depend on M. Every
  /// other operation already computes each row alone.
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }
  bool batch_invariant() const override { return batch_invariant_; }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                    Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override;
  void qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const RopeParams& rope, const AttentionShape& shape,
                             const BatchTensors& batch, Tensor& q_out, LayerKv& kv) override;
  /// `plan` is plan_attention's (the default's: one kernel, nothing to decide).
  void attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                 const BatchTensors& batch, const AttentionPlanRef& plan,
                 Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override;
  /// Each row's shrink and expand are fixed-order dot products (the reference: a row's
  /// result does not depend on the other rows or the segment sizes).
  void lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                Tensor& out) override;
  bool supports_lora() const override { return true; }

 private:
  /// Applies a persistent batch's updates to table_ (made zero-filled on first use) and
  /// gathers its rows into batch_rows_.
  void update_persistent_table(const ForwardBatch& batch);

  // allocate() calls left before injected failures; -1: unlimited (tests only).
  int64_t allocations_left_ = -1;
  // The persistent page table, [table_rows_, table_width_], kept across batches.
  std::vector<int32_t> table_;
  int32_t table_rows_ = 0;
  int32_t table_width_ = 0;
  // Rows seq_slots[b] of table_ for the current batch, [B, table_width_]. Its capacity is
  // reserved by reserve_batch() so that its address stays fixed for recorded graphs.
  std::vector<int32_t> batch_rows_;
  // Each token row's LoRA slot for the current batch (BatchTensors::lora_slots).
  std::vector<int32_t> lora_rows_;
  // kKvCache mappings: address -> mapped bytes (a multiple of the page size).
  std::unordered_map<void*, size_t> kv_mappings_;
  bool asleep_ = false;
  bool batch_invariant_ = false;
};

/// out[M, N] = x[M, K] · w[N, K]ᵀ in float32 with a summation order that depends on K
/// alone: per output, 8 interleaved partial sums (k mod 8) combined pairwise, then the
/// K mod 8 tail in order. So out[m, :] is the same bits for any M and any other rows.
/// Rows and columns are spread over OpenMP threads, which changes no sum.
void matmul_fixed_order(const float* x, const float* w, int64_t M, int64_t N, int64_t K,
                        float* out);

/// RoPE inverse frequencies as transformers computes them for Qwen3 (float32):
/// inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim / 2.
std::vector<float> rope_inv_freq(double theta, int64_t head_dim);

/// Applies rotate-half RoPE in place to one head vector x[head_dim] at `position`.
void apply_rope(float* x, int64_t head_dim, const float* inv_freq, int32_t position);

}  // namespace pagellm
