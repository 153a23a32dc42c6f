// The CUDA backend: bf16 weights, activations and KV pools, float32 logits, on one GPU.
//
// Everything runs on one stream that the backend owns. Operations only enqueue kernels or
// cuBLASLt calls: no allocation, no synchronisation, no host-device copy, so a sequence of
// them (a model forward) can be captured into a CUDA graph on stream(). The calls that do
// copy or allocate are the ones outside a forward: allocate, upload, download_f32,
// copy_to_*, upload_batch (one async copy from pinned memory) and sample (one async copy
// each way and one synchronisation to return the tokens).
//
// The backend is made of rooms with one job each, composed here: DeviceMemory (opening the
// device, allocations, transfers; device_memory.h), PackedWeights (matmul/packed_weights.h),
// BatchStaging (batch metadata and the persistent page table; batch_staging.h),
// AttentionDispatch (plan and run of paged attention; attention/attention_dispatch.h),
// GpuSampler (sampling/gpu_sampler.h) and the graph helpers (graphs.h). The operations
// below check their operands and launch their kernel; the rooms hold the state.
//
// This header includes no CUDA header, so that the backend factory (and anything else
// outside src/pagellm/cuda) can include it in a build without CUDA include paths. The
// stream is exposed as CUstream_st*, which is what cudaStream_t is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/cuda/attention/attention_dispatch.h"
#include "pagellm/cuda/cuda_settings.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"

struct CUstream_st;

namespace pagellm {

struct AttentionPlan;

namespace cuda {

class LtMatmul;
class DeviceMemory;
class PackedWeights;
class BatchStaging;
class GpuSampler;

/// Backend on one CUDA device (compute capability 8.0 or newer, with kernels built for it).
/// Not thread-safe: one host thread drives it.
class CudaBackend final : public Backend {
 public:
  /// Opens `device`; throws Error with a readable reason when there is no usable GPU (no
  /// driver, no device, device index out of range, compute capability below 8.0, a build
  /// without kernels for this GPU) or not enough memory for the backend's workspaces.
  /// `settings` (by default the environment's; from_environment throws Error naming a bad
  /// variable) choose the matmul path, packing, qkv fusion, the decode kernel and the extra
  /// crossover tables of this backend; PDL, the prefill kernel and the cuDNN library are
  /// process-wide and come from CudaSettings::process().
  explicit CudaBackend(int device = 0,
                       const CudaSettings& settings = CudaSettings::from_environment());
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  DType weight_dtype() const override { return DType::BF16; }
  DType activation_dtype() const override { return DType::BF16; }
  DType kv_dtype() const override { return DType::BF16; }
  /// cudaMemGetInfo's free bytes (the backend's own workspaces are already allocated).
  size_t free_memory() const override;
  /// 8,192 tokens: on the H200 a 16 x 2,048-token prefill runs 5 % faster in 8,192-token
  /// steps than in 2,048-token ones (the products' M quadruples; docs/PERFORMANCE.md,
  /// "Prefill chunk size"). Offline on a device of at least kLargeDeviceBytes, 16,384:
  /// 1 % faster again on long prompts (H100, 2026-12-06), for ~1.5 GB more activations
  /// (Qwen3-4B) and steps twice as long, which only streamed tokens feel; the engine
  /// keeps 8,192 in steps busy with decodes (SchedulerConfig::busy_batched_tokens).
  int32_t preferred_batched_tokens(bool offline) const override {
    return offline && total_memory_ >= kLargeDeviceBytes ? 16384 : 8192;
  }
  /// 70 GiB: the H100 and H200 class, where the larger offline chunk was measured.
  static constexpr size_t kLargeDeviceBytes = size_t{70} << 30;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  /// kWeights and kKvCache allocations (and prepare_matrix's packed copies) come from
  /// virtual-memory arenas whose physical memory sleep() gives back at fixed addresses
  /// (vmm_arena.h); kOther ones from cudaMalloc.
  void* allocate_as(MemoryRole role, size_t bytes) override;
  bool supports_sleep() const override { return true; }
  /// Unmaps the KV pools' physical memory and, with offload_weights, copies the weights to
  /// pinned host memory and unmaps them and their packed copies. Captured graphs, tensor
  /// maps and plans keep pointing at the same (reserved) addresses.
  BackendSleepResult sleep(bool offload_weights) override;
  /// Maps new physical memory at the same addresses: KV pools zeroed, weights copied back,
  /// packed copies packed again from them.
  void wake() override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void* open_ipc_memory(const std::array<uint8_t, 64>& handle) override;
  void close_ipc_memory(void* base) override;
  void synchronize() override;
  void upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
              int64_t n) override;
  std::vector<float> download_f32(const Tensor& src) override;
  void fill(Tensor& t, float value) override;
  /// One cudaMemcpyAsync (device to device, on the stream) per layer, pool and run of
  /// pairs whose source and destination pages are both consecutive and do not overlap;
  /// runs in the pairs' order. Not while capturing.
  void copy_kv_pages(std::vector<LayerKv>& kv,
                     const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  /// Packs the batch's int32 arrays into a pinned buffer and copies them with one async
  /// copy into a persistent device buffer. Each array has a fixed region sized by the
  /// current capacities, so every batch within them gets the same device addresses, and a
  /// CUDA graph captured over one replays correctly after upload_batch of another. A batch
  /// beyond the capacities grows them (synchronising, and invalidating graphs captured
  /// before; call reserve_batch first to avoid that). Must not be called while capturing.
  /// `batch` must outlive the returned tensors (BatchTensors::host points at it).
  ///
  /// With seq_slots (the persistent page table), the same single copy carries seq_slots
  /// and the table's changed runs instead of the dense page table; then, on the stream and
  /// outside any graph, one kernel applies the runs to the device-resident table (grown
  /// to page_table_rows x max_pages_per_seq, zero-filled, on demand) and another gathers
  /// the batch's rows into the page-table region, so that attention reads the same
  /// [B, max_pages_per_seq] table at the same address as on the dense path. Throws Error
  /// for slots or runs outside the table, runs that write row 0, or values that do not
  /// match the runs.
  BatchTensors upload_batch(const ForwardBatch& batch) override;
  bool supports_persistent_page_table() const override { return true; }
  int32_t shared_prefix_min_seqs() const override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                    Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override;
  void qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const RopeParams& rope, const AttentionShape& shape,
                             const BatchTensors& batch, Tensor& q_out, LayerKv& kv) override;
  /// Plans the forward's attention through the dispatcher (attention/planner.h) from
  /// BatchTensors::host: graph mode when the batch declares kv_len_capacity or the stream
  /// is capturing, else eager; when cuDNN is chosen for a prefill, uploads its per-forward
  /// arrays. The plan lives until the next upload_batch or begin_capture.
  AttentionPlanRef plan_attention(const BatchTensors& batch, const AttentionShape& shape,
                                  const LayerKv& kv) override;
  /// Paged attention as `plan` says: cuDNN, or the native kernels (decode kernel when every
  /// query length is 1, prefill kernel otherwise, so a graph captured for decode stays
  /// decode). A captured graph keeps the provider it was captured with for every replay.
  /// Throws Error for a plan that is not this forward's or a shape it was not made for.
  void attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                 const BatchTensors& batch, const AttentionPlanRef& plan,
                 Tensor& out) override;
  /// "auto" (the default), "native" or "cudnn"; see Backend::set_attention_backend.
  /// "cudnn" throws Error at once when no usable cuDNN 9 can be loaded (or this build has
  /// no cuDNN route), naming what was tried. Not while capturing.
  void set_attention_backend(const std::string& choice) override;
  /// Batch-invariant mode (Backend::set_batch_invariant; docs/design.md "Batch-invariant
  /// mode"): every product on the skinny kernel with 64-token tiles and a split count fixed
  /// by (N, K) (LtMatmul::set_batch_invariant), the qkv product fused (or not, with
  /// PAGELLM_DISABLE_QKV_FUSION or head_dim != 128) the same way for every M, and every
  /// attention call, prefill included, on the native decode kernel with one KV split (no
  /// cuDNN).
  /// Throws Error off sm_90 (no skinny kernel), with --attention-backend cudnn, or while
  /// capturing. Call before the first forward; graphs captured earlier keep the old mode.
  void set_batch_invariant(bool on) override;
  bool batch_invariant() const override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  /// The shrink and expand kernels of cuda/lora: graph-capturable (row slots and slot
  /// tables are read on the device); scratch of 64 MB made by the first call.
  void lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                Tensor& out) override;
  bool supports_lora() const override { return true; }
  /// Decode batches (products on the skinny kernel): the shrink runs as extra tiles of the
  /// product's kernel and the expand in its epilogue (launch_skinny_gemm's SkinnyLora);
  /// otherwise the product, then lora_add (and the epilogue op).
  void lora_matmul(const Tensor& x, const Tensor& w, const LoraGroup& group,
                   const BatchTensors& batch, Tensor& out) override;
  void lora_matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv,
                                         const LoraGroup& group, Tensor& qkv,
                                         const Tensor& q_norm, const Tensor& k_norm, float eps,
                                         const RopeParams& rope, const AttentionShape& shape,
                                         const BatchTensors& batch, Tensor& q_out,
                                         LayerKv& kv) override;
  void lora_matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, const LoraGroup& group,
                            const BatchTensors& batch, Tensor& gate_up, Tensor& out) override;
  /// pack_lora_a's layout (the fused products stream A as they stream weights).
  size_t lora_packed_a_bytes(int64_t rows, int64_t in) const override;
  void pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed) override;
  /// pack_lora_b's layout (the fused products add B · s with the tensor cores).
  size_t lora_packed_b_bytes(int32_t rank, int64_t width_total) const override;
  void pack_lora_b(const void* bt, int32_t rank, int64_t width_total, bool paired,
                   void* packed) override;
  void matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv, Tensor& qkv,
                                    const Tensor& q_norm, const Tensor& k_norm, float eps,
                                    const RopeParams& rope, const AttentionShape& shape,
                                    const BatchTensors& batch, Tensor& q_out,
                                    LayerKv& kv) override;
  void matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up,
                       Tensor& out) override;
  /// cuBLASLt's epilogue adds the product into the residual (LtMatmul::run_accumulate), then
  /// launch_rms_norm; on the skinny path (decode batches up to 32, batch-invariant mode)
  /// the product and add_rms_norm as the default.
  void matmul_add_rms_norm(const Tensor& x, const Tensor& w, Tensor& proj, Tensor& residual,
                           const Tensor& weight, float eps, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override;
  /// bf16 rows -> float32 norm (launch_rms_norm_f32_out) -> float32 x float32 product
  /// through cuBLASLt with CUBLAS_COMPUTE_32F (LtMatmul::run_f32).
  void float32_head(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                    Tensor& normed, Tensor& out) override;
  /// Packs w for the skinny decode kernel (pack_skinny_weights: each pipeline stage's
  /// 16 KiB as one contiguous block, 2-9 % faster per product on the H200, same bits) when
  /// settings().packed_weights (PAGELLM_PACKED_WEIGHTS) allows: "auto" (the default) packs
  /// bf16 matrices the kernel can read (sm_90) while all packed copies fit in a quarter of
  /// the device's memory and the allocation succeeds; "1" packs every such matrix and fails
  /// when memory runs out; "0" packs none. The copy is keyed by w.data and used by matmul,
  /// matmul_silu_mul (when gated_inter matches) and matmul_qk_norm_rope_store_kv whenever
  /// they run the skinny kernel on a w of that shape; cuBLASLt (prefill, large batches)
  /// reads w. deallocate() of the buffer holding w frees the copy.
  size_t prepare_matrix(const Tensor& w, int64_t gated_inter = 0) override;

  /// cudaPointerGetAttributes: kDevice must be memory of this GPU (device or managed),
  /// kHostPinned page-locked host memory, kHost any host memory.
  std::string check_weight_source(const void* src, size_t bytes,
                                  TensorMemory memory) const override;
  /// Device sources: cudaMemcpyAsync device to device, or the convert kernel when the
  /// dtypes differ. Pinned host sources of the weight dtype: one cudaMemcpyAsync straight
  /// from the caller's memory. Other host sources: upload() (converted into the two pinned
  /// 16 MiB staging buffers, copies overlapping the next chunk's conversion).
  void write_weights(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                     int64_t n, TensorMemory memory) override;
  void write_weights_2d(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                        int64_t rows, int64_t cols, int64_t src_row_stride,
                        TensorMemory memory) override;

  /// ncclGetUniqueId's 128 bytes, from the NCCL that settings().nccl_library names
  /// (PAGELLM_NCCL_LIBRARY; else libnccl.so.2 through the loader's search), loaded at run
  /// time (nccl_communicator.h). Throws Error naming where it looked when NCCL cannot be
  /// loaded or is too old.
  std::vector<uint8_t> new_communicator_id() override;
  /// An NcclCommunicator on this backend's device and stream (ncclCommInitRank; blocks
  /// until every rank has joined). Throws Error for an id that is not 128 bytes, a rank
  /// outside [0, size), a capturing stream, or NCCL failing to load or join.
  std::unique_ptr<Communicator> join_communicator(const std::vector<uint8_t>& id, int rank,
                                                  int size) override;

  /// cudaHostAlloc / cudaFreeHost.
  void* allocate_host_pinned(size_t bytes) override;
  void free_host_pinned(void* ptr) override;

  /// GPU sampling with the host sampler's semantics (sampling/sampler.h); returns after one
  /// synchronisation. Throws Error like the host sampler ("row r: ...") for invalid
  /// parameters, out-of-vocabulary penalty tokens or rows without a finite logit.
  std::vector<SampledToken> sample(const Tensor& logits,
                                   const std::vector<SamplingRow>& rows) override;
  /// The same sampling, enqueued: the tokens are copied to one of two pinned slots and
  /// read by wait_sampled() (one event's wait); feed_sampled_tokens() is one small kernel
  /// that copies them, on the device, into the next batch's token ids.
  SampleTicket sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows) override;
  std::vector<SampledToken> wait_sampled(SampleTicket& ticket) override;
  void feed_sampled_tokens(const SampleTicket& ticket, const std::vector<int32_t>& src_rows,
                           Tensor& token_ids) override;

  /// Device-to-device cudaMemcpyAsync of up to 1 GiB (smaller if memory is short), timed
  /// with events, median of 5: (bytes read + bytes written) per second.
  double measure_copy_bandwidth() override;

  /// Through CUPTI's activity API (libcupti.so.13, loaded at run time; kernel_trace.h).
  std::string begin_kernel_trace() override;
  std::vector<KernelSpan> end_kernel_trace() override;

  // ---- graphs --------------------------------------------------------------------------
  bool supports_graphs() const override { return true; }
  /// Sizes the batch metadata regions so that batches within these capacities never grow
  /// them (synchronises when they grow).
  void reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                     int32_t max_rows) override;
  /// Starts capturing the stream (thread-local mode: a forbidden call such as a
  /// synchronisation on this thread fails the capture instead of corrupting it). First,
  /// outside the capture, builds the cuDNN plans `auto` requested in the forward just run
  /// and runs each new one once on that forward's buffers (loading its kernels), so that
  /// the captured forward can use them.
  void begin_capture() override;
  /// Ends the capture and instantiates the graph; replay() launches it on stream().
  std::unique_ptr<RecordedGraph> end_capture() override;

  // ---- CUDA-specific --------------------------------------------------------------------
  /// The stream every operation runs on (a cudaStream_t).
  CUstream_st* stream() const { return stream_; }
  /// The CUDA device index.
  int device() const { return device_; }
  /// The settings this backend was made with.
  const CudaSettings& settings() const { return settings_; }
  /// For example "NVIDIA H200 (device 0, compute capability 9.0, 139.8 GiB)".
  const std::string& device_description() const { return description_; }
  /// Bytes of the decode-attention split-KV workspace (fixed at construction).
  size_t attention_workspace_bytes() const;
  /// The attention backend choice ("auto", "native" or "cudnn").
  std::string attention_backend() const;
  /// What the attention dispatcher did so far.
  AttentionRouteStats attention_route_stats() const;
  /// The plan of the last forward that ran attention (nullptr before the first).
  const AttentionPlan* last_attention_plan() const;
  /// Bytes held by prepare_matrix's packed copies.
  size_t packed_weight_bytes() const;
  /// Number of matrices with a packed copy.
  size_t packed_matrices() const;
  /// Whether the products read the packed copies (default true). Tests turn it off to run
  /// the same weights through the row-major path; capture graphs after setting it.
  void set_packed_weights_enabled(bool on);
  /// Whether prefill chunks' LoRA runs as cuBLASLt products (default: the settings'
  /// lora_dense). Tests turn it off to compare with the shrink and expand kernels.
  void set_lora_dense(bool on) { settings_.lora_dense = on; }
  /// Bytes of the dense LoRA products' scratch made so far (0 before a prefill chunk with
  /// adapters took that path).
  size_t lora_dense_scratch_bytes() const { return lora_dense_bytes_; }

 private:
  bool capturing() const;
  void release_all() noexcept;

  int device_ = 0;
  CudaSettings settings_;
  std::string description_;
  size_t total_memory_ = 0;  // the device's, bytes (cudaDeviceProp::totalGlobalMem)
  CUstream_st* stream_ = nullptr;

  // The rooms (made in this order at construction, released in reverse).
  std::unique_ptr<DeviceMemory> memory_;
  void* matmul_workspace_ = nullptr;  // cuBLASLt's
  size_t matmul_workspace_bytes_ = 0;
  std::unique_ptr<LtMatmul> matmul_;
  std::unique_ptr<PackedWeights> packed_;
  std::unique_ptr<AttentionDispatch> attention_;
  std::unique_ptr<BatchStaging> batch_;
  int64_t prefix_item_batches_ = 0;  // uploads with shared-prefix items (attention_route_stats)
  std::unique_ptr<GpuSampler> sampler_;
  void* lora_work_ = nullptr;  // lora_add's float32 scratch, lora_work_floats_ floats
  int64_t lora_work_floats_ = 0;
  /// lora_work_, made on first use (never under capture: graphs keep its address).
  float* lora_scratch();
  /// lora_add on a prefill chunk as cuBLASLt products (launch_lora_dense_*), adding the
  /// delta to `out` (`accumulate`) or writing it over the group's columns (rows without
  /// an adapter: zeros); false, having enqueued nothing, where that path does not apply
  /// (docs/design.md, "LoRA").
  bool lora_add_dense(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                      Tensor& out, bool accumulate);
  /// lora_matmul on a prefill chunk whose group fills the output: the delta written by
  /// lora_add_dense, then the product accumulated onto it; false, having enqueued
  /// nothing, where that does not apply.
  bool lora_matmul_dense(const Tensor& x, const Tensor& w, const LoraGroup& group,
                         const BatchTensors& batch, Tensor& out);
  void* lora_dense_ = nullptr;  // lora_add_dense's bf16 scratch: a_all, w, s
  size_t lora_dense_bytes_ = 0;
  size_t lora_dense_refused_ = 0;  // the smallest size an allocation failed for (0: none)
  /// lora_add_dense's scratch of at least `bytes`, grown outside capture (the stream is
  /// drained before the old one is freed); null when the GPU has no room for it (the
  /// caller then runs the shrink and expand kernels).
  void* lora_dense_scratch(size_t bytes);
  /// The fused products' LoRA arguments for `group` on a product of T rows, or nullopt
  /// where the fused path does not apply (the caller then runs the unfused ops).
  std::optional<SkinnyLora> skinny_lora(const LoraGroup& group, const BatchTensors& batch,
                                        int64_t T, int64_t product_cols);
  /// Whether matmul_qk_norm_rope_store_kv's operands take the fused kernel.
  bool qkv_fusable(const Tensor& x, const Tensor& w_qkv, const Tensor& q_norm,
                   const Tensor& k_norm, const RopeParams& rope, const AttentionShape& shape,
                   const BatchTensors& batch, const Tensor& q_out, const LayerKv& kv) const;
};

}  // namespace cuda

/// Creates the CUDA backend on `device`; throws Error (see CudaBackend) when no usable
/// GPU is present. Called by create_backend("cuda").
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

namespace cuda {
using ::pagellm::make_cuda_backend;
}  // namespace cuda

}  // namespace pagellm
