// The narrow interface between the model and a compute backend (CPU, CUDA).
//
// The model code calls only these operations; a backend owns memory, element types and
// kernels. All tensors are contiguous row-major. Activations use activation_dtype(),
// weights weight_dtype(), the KV pools kv_dtype(); logits are always float32.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/attention/provider.h"
#include "pagellm/kv/forward_batch.h"
#include "pagellm/common/kernel_timeline.h"
#include "pagellm/common/tensor.h"
#include "pagellm/sampling/sampler.h"
#include "pagellm/weight_update.h"

namespace pagellm {

/// One layer's paged KV cache: K and V pools of shape
/// [num_pages, num_kv_heads, page_size, head_dim] (the layout cuDNN's paged SDPA reads).
struct LayerKv {
  Tensor k;
  Tensor v;
};

/// Rotary embedding parameters (Qwen3: rotate-half, full head_dim, base rope_theta).
struct RopeParams {
  double theta = 1000000.0;
  int64_t head_dim = 0;
};

/// Per-layer attention shape.
struct AttentionShape {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;
  float scale = 0.0f;  // softmax scale, 1/sqrt(head_dim)
};

struct AttentionPlan;

/// One adapter slot's factors for one layer and LoRA group, as Backend::lora_add reads them
/// (docs/design.md "LoRA"). Tables of these live in backend memory (the model writes them
/// with copy_to_device), so that a captured graph reads whatever adapter a slot holds when
/// it replays. `a == nullptr`: the slot holds no adapter for this group.
struct LoraSlotFactors {
  /// [modules · rank, in], weight dtype: module 0's A rows, then module 1's, ...
  const void* a = nullptr;
  /// [rank, width_total], weight dtype: row i holds column i of each module's B side by
  /// side (Bᵀ of module 0, then module 1, ...), so that an expand reads rows i < rank.
  const void* bt = nullptr;
  int32_t rank = 0;
  float scale = 0.0f;
  /// The same A in the layout Backend::pack_lora_a wrote (a backend whose fused products
  /// stream A like their weights); null where lora_packed_a_bytes is 0.
  const void* a_packed = nullptr;
  /// B in the layout Backend::pack_lora_b wrote (the fused products multiply it with the
  /// tensor cores, tiled like their weights); set wherever a_packed is.
  const void* b_packed = nullptr;
};

/// A layer's LoRA modules that read the same input and write side by side into one output
/// (q/k/v into the fused qkv, gate/up into gate_up; o and down alone), for
/// Backend::lora_add. Module m's delta goes to columns [col_offset + Σ_{m'<m} width[m'],
/// + width[m]) of the output.
struct LoraGroup {
  static constexpr int kMaxModules = 3;
  /// The largest rank the kernels take (model/lora.h's kMaxLoraRank).
  static constexpr int kMaxRank = 64;
  /// Backend memory: LoraSlotFactors[num_slots], indexed by slot (entry 0 is never read).
  const LoraSlotFactors* slots = nullptr;
  int32_t num_slots = 0;
  int32_t num_modules = 0;
  int64_t in = 0;  // the input width every module reads
  std::array<int64_t, kMaxModules> width{};
  int64_t col_offset = 0;
  /// Backend memory: two uint32 the fused products (Backend::lora_matmul and its kin) use
  /// to order a launch's shrink before its expand; zero between launches (each launch
  /// leaves them zero). One pair per (layer, group): a launch never shares them. Null: the
  /// fused products are not used for this group.
  uint32_t* counters = nullptr;
  /// No slot's rank exceeds it (1..kMaxRank; the model refuses larger adapters): the fused
  /// products size their grids and staging by it.
  int32_t max_rank = kMaxRank;
  int64_t width_total() const {
    int64_t w = 0;
    for (int m = 0; m < num_modules; ++m) w += width[static_cast<size_t>(m)];
    return w;
  }
};

/// One forward's attention plan (plan/run, as FlashInfer splits it): made once per forward
/// by Backend::plan_attention from the batch's host metadata, before the first layer, and
/// passed unchanged to every layer's Backend::attention. It is valid until the backend's
/// next upload_batch or begin_capture; a backend rejects a plan of another forward. A
/// graph captured over a forward keeps the plan it was captured with for every replay.
struct AttentionPlanRef {
  /// Which plan_attention call of the backend made it (0: none; attention throws).
  uint64_t serial = 0;
  /// The attention dispatcher's decision (provider, the rule that decided) where the
  /// backend has a dispatcher (CUDA); null on a backend with one kernel (CPU).
  const AttentionPlan* plan = nullptr;
};

/// What an allocation holds, for Backend::sleep: the model's weights (kept on the device,
/// or copied to host memory, released and restored bit-exact), the KV pools (released,
/// contents discarded, zeros after wake), or anything else (workspaces, batch metadata,
/// logits: always resident).
enum class MemoryRole { kOther, kWeights, kKvCache };

/// What one Backend::sleep released on the device, in bytes.
struct BackendSleepResult {
  /// KV-pool memory given back (contents discarded).
  size_t kv_bytes = 0;
  /// Weight memory copied to host memory and given back (offload_weights only).
  size_t weight_bytes = 0;
  /// The backend's own copies of weights (prepare_matrix's) given back; rebuilt by wake().
  size_t prepared_bytes = 0;
};

/// A recorded sequence of backend operations, replayed on the same buffers (a CUDA graph).
class RecordedGraph {
 public:
  virtual ~RecordedGraph() = default;
  virtual void replay() = 0;
};

class Communicator;

/// A handle on one sampling call's tokens (Backend::sample_async).
struct SampleTicket {
  uint64_t id = 0;   // 0: no sampling
  int32_t rows = 0;  // sampled rows
  /// The tokens, for backends that sample before sample_async() returns (the default).
  std::vector<SampledToken> tokens;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual DType weight_dtype() const = 0;
  virtual DType activation_dtype() const = 0;
  virtual DType kv_dtype() const = 0;
  /// Bytes of memory free for weights and KV pages.
  virtual size_t free_memory() const = 0;
  /// The chunked-prefill budget (tokens per step) the engine uses when none is configured
  /// (EngineOptions::max_num_batched_tokens 0): the size from which a step's products run
  /// close to their best rate here, without holding activations for more. `offline`
  /// (EngineOptions::offline): no running request waits on its next token, so a longer
  /// step costs nothing but activations.
  virtual int32_t preferred_batched_tokens(bool offline) const {
    (void)offline;
    return 2048;
  }

  // ---- memory -------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  /// Device to host; waits for pending work.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  /// Writes n elements of host data of type src_dtype into dst (a weight, activation or
  /// KV tensor) starting at element dst_offset, converting to dst.dtype. `src` has been
  /// read when it returns (the caller may reuse it).
  virtual void upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                      int64_t n) = 0;
  /// Reads a whole tensor back as float32 (tests, debugging).
  virtual std::vector<float> download_f32(const Tensor& src) = 0;
  /// Sets every element to value (tests poison outputs with NaN).
  virtual void fill(Tensor& t, float value) = 0;
  /// Copy-on-write of KV pages (n-sample fan-out): for each (src, dst) in order, page dst
  /// of every layer's K and V pool becomes a copy of page src ([num_kv_heads, page_size,
  /// head_dim] each). A later pair may read a page an earlier one wrote, so pairs run in
  /// order. Runs on the backend's stream before the step's forward; never inside a graph
  /// capture. Pages outside the pools throw Error. The default throws (a backend without
  /// it cannot run n > 1 fan-out).
  virtual void copy_kv_pages(std::vector<LayerKv>& kv,
                             const std::vector<std::pair<int32_t, int32_t>>& src_dst);

  /// Copies the batch metadata to the device; the result stays valid until the next call.
  /// A backend that supports_persistent_page_table() accepts both page-table forms of
  /// ForwardBatch: for a persistent one it applies page_table_updates in order to its own
  /// table of page_table_rows x max_pages_per_seq entries (zero-filled when first made,
  /// kept across calls) and returns in BatchTensors::page_table the rows seq_slots[b],
  /// [B, max_pages_per_seq], so that operations read it as they read a dense table.
  virtual BatchTensors upload_batch(const ForwardBatch& batch) = 0;
  /// Whether upload_batch() takes persistent page tables (ForwardBatch::seq_slots). The
  /// engine sends only the changed entries to a backend that does, and dense rows to one
  /// that does not.
  virtual bool supports_persistent_page_table() const { return false; }
  /// The fewest sequences of a decode-only step whose upload_batch() reads
  /// ForwardBatch::shared_prefix_group / _tokens (an attention that reads a prefix shared by
  /// a group once for all of it); 0: it never does, and the engine leaves them empty. May
  /// change with the backend's modes (batch invariance turns the shared reads off).
  virtual int32_t shared_prefix_min_seqs() const { return 0; }

  // ---- operations ---------------------------------------------------------------------
  // Weights (matrices, norm vectors) passed to an operation must not be written by work
  // still in flight on the backend: a backend may read them before the operation's other
  // inputs are ready (the CUDA backend streams weights ahead with programmatic dependent
  // launch). Upload them, then run the forward.
  /// out[t, :] = table[ids[t], :]
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  /// out = x / rms(x) * weight, per row.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  /// residual += delta; out = rms_norm(residual) * weight.
  virtual void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight,
                            float eps, Tensor& out) = 0;
  /// out[M, N] = x[M, K] · w[N, K]ᵀ (out may be float32 while x and w are not).
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& out) = 0;
  /// From qkv [T, (Hq + 2·Hkv)·D]: applies per-head RMSNorm (q_norm, k_norm, eps) and RoPE
  /// at batch positions to q and k, writes q to q_out [T, Hq, D] and k, v into the layer's
  /// pools at the batch's slots.
  virtual void qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& q_norm,
                                     const Tensor& k_norm, float eps, const RopeParams& rope,
                                     const AttentionShape& shape, const BatchTensors& batch,
                                     Tensor& q_out, LayerKv& kv) = 0;
  /// The attention block's first half: qkv = x · w_qkvᵀ into `qkv` (scratch the backend may
  /// skip), then qk_norm_rope_store_kv on it. The default runs the two operations; the
  /// CUDA backend fuses them into one kernel for decode batches.
  virtual void matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv, Tensor& qkv,
                                            const Tensor& q_norm, const Tensor& k_norm,
                                            float eps, const RopeParams& rope,
                                            const AttentionShape& shape,
                                            const BatchTensors& batch, Tensor& q_out,
                                            LayerKv& kv);
  /// Plans this forward's attention from the batch's host metadata (BatchTensors::host):
  /// call once per forward, after upload_batch and before the first layer's attention,
  /// with the layers' shape and one layer's KV pools (every layer's have the same extent).
  /// Host work plus, at most, an upload of per-forward arrays the plan's kernels read; part
  /// of a captured forward. The default (one kernel, nothing to decide) returns a plan with
  /// a serial of 1.
  virtual AttentionPlanRef plan_attention(const BatchTensors& batch,
                                          const AttentionShape& shape, const LayerKv& kv);
  /// Causal (bottom-right aligned) grouped-query attention of q [T, Hq, D] over the paged
  /// cache, reading only positions < kv_lens[b]; out is [T, Hq·D]. `plan` is this
  /// forward's plan_attention result (throws Error for a missing or stale one).
  virtual void attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                         const BatchTensors& batch, const AttentionPlanRef& plan,
                         Tensor& out) = 0;
  /// out[t, i] = silu(gate_up[t, i]) · gate_up[t, I + i]
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  /// The MLP's first half: out[t, i] = silu(g) · u with [g | u] = x · w_gate_upᵀ, where
  /// w_gate_up is [2 I, H] (gate rows, then up rows). `gate_up` [T, 2 I] is scratch the
  /// backend may use for the intermediate product. The default is matmul into gate_up, then
  /// silu_mul; a backend may fuse the two (the CUDA one does for decode batches).
  virtual void matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up,
                               Tensor& out);
  /// A residual sublayer's product and the norm after it: residual += x · wᵀ, then
  /// out = rms_norm(residual) * weight (eps). `proj` [T, N] is scratch the backend may use
  /// for the product. The default is matmul into proj, then add_rms_norm (the product
  /// rounded to the activation dtype before the add); a backend may add the product's
  /// float32 sum straight into the residual, rounding once (the CUDA one does where the
  /// product runs on cuBLASLt: prefill chunks and batches over 32).
  virtual void matmul_add_rms_norm(const Tensor& x, const Tensor& w, Tensor& proj,
                                   Tensor& residual, const Tensor& weight, float eps,
                                   Tensor& out);
  /// LoRA for one group of modules (docs/design.md "LoRA"): for every token row t whose
  /// slot q = batch.lora_slots[t] is not 0 and whose group.slots[q].a is set, with
  /// f = group.slots[q], r = f.rank and module m's A rows A_m = f.a[m·r, (m+1)·r):
  ///   s_m[t, i] = Σ_k x[t, k] · A_m[i, k]                              (shrink, float32)
  ///   out[t, col_offset + off_m + j] += f.scale · Σ_i s_m[t, i] · f.bt[i, off_m + j]  (expand)
  /// x [T, in] and out [T, N] in the activation dtype; other rows and columns are left
  /// alone. Each row's sums run in an order that depends only on the group's shapes, so a
  /// row's result does not depend on the batch around it. Reads the slot tables and
  /// batch.lora_slots from backend memory at run time (works inside a captured graph).
  /// The default throws Error (a backend without LoRA kernels).
  virtual void lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                        Tensor& out);
  /// Whether lora_add works on this backend (the engine refuses to load adapters otherwise).
  virtual bool supports_lora() const { return false; }
  /// The products of a layer with a LoRA group's delta added to their output before what
  /// follows them (docs/design.md "LoRA"): out = x · wᵀ, then lora_add(x, group, batch),
  /// then (for the fused kin) the same epilogue as matmul_qk_norm_rope_store_kv /
  /// matmul_silu_mul. The group's columns start at the product's first column
  /// (col_offset 0). The defaults run exactly those operations in turn (`gate_up`/`qkv`
  /// hold the product); the CUDA backend computes the shrink inside the product's weight
  /// stream and the expand in its epilogue for decode batches (one kernel).
  virtual void lora_matmul(const Tensor& x, const Tensor& w, const LoraGroup& group,
                           const BatchTensors& batch, Tensor& out);
  virtual void lora_matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv,
                                                 const LoraGroup& group, Tensor& qkv,
                                                 const Tensor& q_norm, const Tensor& k_norm,
                                                 float eps, const RopeParams& rope,
                                                 const AttentionShape& shape,
                                                 const BatchTensors& batch, Tensor& q_out,
                                                 LayerKv& kv);
  virtual void lora_matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up,
                                    const LoraGroup& group, const BatchTensors& batch,
                                    Tensor& gate_up, Tensor& out);
  /// Bytes of the layout the backend's fused LoRA products stream a group's A [rows, in]
  /// in (weight dtype); 0 (the default): they read LoraSlotFactors::a and need no copy.
  virtual size_t lora_packed_a_bytes(int64_t rows, int64_t in) const {
    (void)rows;
    (void)in;
    return 0;
  }
  /// Writes A [rows, in] (backend memory, weight dtype) into `packed`
  /// (lora_packed_a_bytes(rows, in) bytes), in stream order. Default: throws Error.
  virtual void pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed);
  /// Bytes of the layout the backend's fused LoRA products read a group's B in, from its
  /// Bᵀ [rank, width_total] (weight dtype). 0 (the default) wherever lora_packed_a_bytes
  /// is 0.
  virtual size_t lora_packed_b_bytes(int32_t rank, int64_t width_total) const {
    (void)rank;
    (void)width_total;
    return 0;
  }
  /// Writes the group's B from its Bᵀ [rank, width_total] (backend memory, weight dtype)
  /// into `packed` (lora_packed_b_bytes bytes), in stream order; `paired`: the group is
  /// gate/up, whose fused product pairs gate column i with up column i. Default: throws
  /// Error.
  virtual void pack_lora_b(const void* bt, int32_t rank, int64_t width_total, bool paired,
                           void* packed);
  /// out[r, :] = x[indices[r], :]
  virtual void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) = 0;
  /// The float32 head (EngineOptions::float32_head): out[R, N] = rms_norm(x[R, H]) *
  /// norm_weight · w[N, H]ᵀ with x in the activation dtype and norm_weight [H], w [N, H],
  /// normed [R, H] (scratch) and out all float32: the norm is computed and kept in float32
  /// and the product multiplies float32 by float32 with float32 accumulation (no TF32, no
  /// rounding to a narrower type anywhere). The default, rms_norm into `normed` then
  /// matmul, is right for a backend whose activations are float32 (the CPU's).
  virtual void float32_head(const Tensor& x, const Tensor& norm_weight, float eps,
                            const Tensor& w, Tensor& normed, Tensor& out);

  /// Called by the model for each weight matrix w [N, K] that its products read, once
  /// after w is uploaded and again after every rewrite of w (a weight update). The backend
  /// may keep a copy of w in a layout its decode products stream faster: made on the first
  /// call, rewritten in place on later ones (same address, so captured graphs stay valid),
  /// freed with w's buffer. `gated_inter` > 0 marks w as [gate; up] ([2 I, K] with I =
  /// gated_inter), the matrix matmul_silu_mul reads. Returns the bytes newly allocated for
  /// the copy (0 when none is kept or the copy already existed). Not while capturing.
  virtual size_t prepare_matrix(const Tensor& w, int64_t gated_inter = 0) {
    (void)w;
    (void)gated_inter;
    return 0;
  }

  // ---- weight updates -----------------------------------------------------------------
  /// Returns "" when the `bytes` at `src` are memory of the kind `memory` claims (host
  /// pageable, host pinned, or this backend's device memory), else what is wrong with it
  /// ("is device memory of GPU 0, not pinned host memory"). The default (a backend whose
  /// device is the host) accepts every kind.
  virtual std::string check_weight_source(const void* src, size_t bytes,
                                          TensorMemory memory) const {
    (void)src;
    (void)bytes;
    (void)memory;
    return "";
  }
  /// Writes n elements of src (src_dtype, a float type, in `memory` of the kind checked by
  /// check_weight_source) into the weight dst from element dst_offset, converting to
  /// dst.dtype. Host sources: pinned memory of dst's dtype is copied directly, other host
  /// memory is staged (and converted) through pinned buffers; device sources are copied on
  /// the device, and converted there when the dtypes differ. Asynchronous: `src` must stay
  /// valid and unchanged until the next synchronize(). Between forwards, never while
  /// capturing; the matrices among the rewritten weights need prepare_matrix afterwards.
  /// The default treats every kind as host memory (upload()).
  virtual void write_weights(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                             int64_t n, TensorMemory memory) {
    (void)memory;
    upload(dst, dst_offset, src, src_dtype, n);
  }
  /// write_weights of a [rows, cols] block whose source rows start src_row_stride
  /// elements apart (a column range of a larger row-major tensor: a tensor-parallel rank's
  /// share of o_proj or down), written contiguously into dst from dst_offset. The same
  /// memory kinds, conversions and asynchrony as write_weights. The default writes it row
  /// by row through write_weights.
  virtual void write_weights_2d(Tensor& dst, int64_t dst_offset, const void* src,
                                DType src_dtype, int64_t rows, int64_t cols,
                                int64_t src_row_stride, TensorMemory memory);

  /// Maps memory that another process shared through CUDA IPC (`handle`: the 64 bytes of
  /// a cudaIpcMemHandle_t) and returns its device address here, for IpcTensor weight
  /// updates; unmap it with close_ipc_memory. The default (no device IPC: the cpu backend)
  /// throws Error saying so.
  virtual void* open_ipc_memory(const std::array<uint8_t, 64>& handle);
  virtual void close_ipc_memory(void* base);

  /// Page-locked host memory (cudaHostAlloc on the cuda backend), which write_weights
  /// copies from directly as TensorMemory::kHostPinned; the default is ordinary host
  /// memory. Throws Error when none is left. Free with free_host_pinned.
  virtual void* allocate_host_pinned(size_t bytes);
  virtual void free_host_pinned(void* ptr);
  /// Whether this backend's allocations are ordinary host memory the host may write
  /// directly between forwards (the cpu backend), so that a loader builds data in place
  /// instead of staging it and calling upload(). The default: no (device memory).
  virtual bool memory_is_host() const { return false; }
  /// Measures host-to-device copy bandwidth from page-locked memory (bytes per second,
  /// median of 5 copies of up to 256 MiB): the limit of weight updates from host memory.
  virtual double measure_host_to_device_bandwidth();

  /// Chooses what runs paged attention (`--attention-backend`): "auto" (the backend
  /// decides per forward and never fails because of an optional library), "native" (the
  /// backend's own kernels) or "cudnn" (NVIDIA cuDNN; the cuda backend only). Throws Error
  /// for an unknown name or a choice this backend cannot honour. Call before the first
  /// forward. This default has only its own kernels, so it accepts auto and native.
  virtual void set_attention_backend(const std::string& choice) {
    PAGELLM_CHECK(parse_attention_backend(choice) != AttentionBackendChoice::kCudnn)
        << "--attention-backend cudnn needs the cuda backend (cuDNN runs on NVIDIA GPUs); the "
        << name() << " backend runs attention with its own kernels: use auto or native";
  }

  /// Batch-invariant mode (EngineOptions::batch_invariant; docs/design.md "Batch-invariant
  /// mode"): when on, every operation computes each row with one code path and one
  /// reduction order that do not depend on the other rows, the row count, the prefill
  /// chunk boundaries or the decode bucket, so a request's logits are the same bits
  /// whatever else runs with it. Call before the first forward (and before any capture).
  /// This default has no such mode: it accepts false and throws Error for true.
  virtual void set_batch_invariant(bool on) {
    PAGELLM_CHECK(!on) << "the " << name()
                       << " backend has no batch-invariant mode (the cpu and cuda backends do)";
  }
  /// Whether set_batch_invariant(true) is in force.
  virtual bool batch_invariant() const { return false; }

  /// Measures device memory bandwidth with a large copy: (bytes read + bytes written) per
  /// second. The limit that bandwidth-bound work (decode) is measured against.
  virtual double measure_copy_bandwidth();
  /// The rate of this backend's own matmul (2·M·N·K FLOP per product, median of 5 after a
  /// warm-up that plans and autotunes the shape) on zero operands of [M, k] activations by
  /// [n, k] weights: the ceiling of the model's products, for a step's FLOP bound. M starts
  /// at `rows` and halves while memory is short (the KV cache may hold most of it), down
  /// to 256 or `rows` if smaller; `rows` says what it ran. {0, 0} when nothing fit.
  struct MatmulRate {
    double flops_per_s = 0;
    int64_t rows = 0;
  };
  virtual MatmulRate measure_matmul_rate(int64_t rows, int64_t n, int64_t k);

  // ---- kernel trace (optional, for benchmarks) ---------------------------------------
  /// Starts recording every kernel and copy the device runs (graphs included) and the
  /// host's calls into the device runtime. Returns an empty string, or why this backend
  /// cannot trace.
  virtual std::string begin_kernel_trace() { return name() + " backend has no kernel trace"; }
  /// Stops recording; the spans since begin_kernel_trace(), in start order.
  virtual std::vector<KernelSpan> end_kernel_trace() { return {}; }

  // ---- graphs (optional) --------------------------------------------------------------
  virtual bool supports_graphs() const { return false; }
  /// From now on upload_batch() keeps fixed device addresses for every batch within these
  /// capacities, so that graphs captured over uploaded batches stay valid.
  virtual void reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                             int32_t max_rows) {}
  /// Records the operations issued until end_capture() instead of running them.
  virtual void begin_capture();
  virtual std::unique_ptr<RecordedGraph> end_capture();

  // ---- collectives between processes (optional) ----------------------------------------
  /// Device collectives between the processes of a tensor-parallel group (NCCL on the
  /// cuda backend). Rank 0's backend makes the group's id (opaque bytes that travel to the
  /// other ranks over the rendezvous); every rank, this one's device included, then joins
  /// with it. Empty: this backend has none, and the caller uses a host communicator
  /// (docs/design.md, "Tensor parallelism").
  virtual std::vector<uint8_t> new_communicator_id() { return {}; }
  /// Joins the group `id` (from rank 0's new_communicator_id()) as `rank` of `size`;
  /// blocks until every rank has joined. The communicator's collectives run on this
  /// backend's stream (so graphs capture them) and it must not outlive the backend.
  /// Throws Error when the backend has no device collectives or the join fails.
  virtual std::unique_ptr<Communicator> join_communicator(const std::vector<uint8_t>& id,
                                                          int rank, int size);

  // ---- sleep and wake (optional) -------------------------------------------------------
  /// allocate(bytes), telling the backend what the memory will hold so that sleep() knows
  /// what it may release. The default ignores the role (the backend cannot sleep).
  virtual void* allocate_as(MemoryRole role, size_t bytes) {
    (void)role;
    return allocate(bytes);
  }
  /// Whether sleep() and wake() work on this backend.
  virtual bool supports_sleep() const { return false; }
  /// Gives back the memory of every kKvCache allocation (contents discarded) and, with
  /// `offload_weights`, of every kWeights allocation after copying it to host memory
  /// (with the backend's prepared copies of those weights). Addresses stay reserved, so
  /// tensors, prepared plans and captured graphs that point at them remain valid; nothing
  /// may read or write the released memory until wake(). kOther allocations stay. Waits
  /// for pending work first. Throws Error when already asleep or unsupported (the
  /// default). Not while capturing.
  virtual BackendSleepResult sleep(bool offload_weights);
  /// Backs the released allocations with memory again at the same addresses: KV pools
  /// read as zeros, offloaded weights (and prepared copies) are as before sleep(), bit for
  /// bit. Throws Error when not asleep or unsupported (the default).
  virtual void wake();

  /// Samples one token per row of logits [R, V] (float32). The default copies the logits
  /// to the host and runs the CPU sampler.
  virtual std::vector<SampledToken> sample(const Tensor& logits,
                                           const std::vector<SamplingRow>& rows);

  // ---- pipelined decode (docs/design.md, "Pipelined decode") ------------------------------
  /// sample() in two halves: sample_async() enqueues the sampling of `rows` after the work
  /// already on the backend's stream and returns a ticket; wait_sampled() waits for that
  /// ticket's tokens and returns them (the errors sample() would throw, it throws). The
  /// rows are read before sample_async() returns. At most two tickets are outstanding, and
  /// each is waited for once, in order. The default samples at once (sample()) and keeps
  /// the tokens in the ticket.
  virtual SampleTicket sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows);
  virtual std::vector<SampledToken> wait_sampled(SampleTicket& ticket);
  /// token_ids[i] = the token that `ticket` (not yet waited for) sampled in its row
  /// src_rows[i], for every i, ordered after the work on the backend's stream: the input
  /// tokens of a step launched before the previous step's tokens reached the host.
  /// `token_ids` is an upload_batch() result's token_ids (int32). The default writes the
  /// ticket's tokens with copy_to_device.
  virtual void feed_sampled_tokens(const SampleTicket& ticket,
                                   const std::vector<int32_t>& src_rows, Tensor& token_ids);
};

/// Owns one allocation of a backend, given back through `kRelease` (moves, never copies).
template <void (Backend::*kRelease)(void*)>
class BackendAllocation {
 public:
  BackendAllocation() = default;
  BackendAllocation(BackendAllocation&& o) noexcept { *this = std::move(o); }
  BackendAllocation& operator=(BackendAllocation&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  BackendAllocation(const BackendAllocation&) = delete;
  BackendAllocation& operator=(const BackendAllocation&) = delete;
  ~BackendAllocation() { reset(); }

  void reset() {
    if (ptr_) (backend_->*kRelease)(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 protected:
  BackendAllocation(Backend* backend, void* ptr, size_t bytes)
      : backend_(backend), ptr_(ptr), bytes_(bytes) {}

  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Owns one allocation of a backend's memory (Backend::allocate_as).
class DeviceBuffer : public BackendAllocation<&Backend::deallocate> {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, size_t bytes)
      : BackendAllocation(backend, bytes ? backend->allocate(bytes) : nullptr, bytes) {}
  /// An allocation whose contents are `role` (Backend::allocate_as).
  DeviceBuffer(Backend* backend, size_t bytes, MemoryRole role)
      : BackendAllocation(backend, bytes ? backend->allocate_as(role, bytes) : nullptr, bytes) {}
  Tensor tensor(DType dtype, std::initializer_list<int64_t> dims) const {
    Tensor t(ptr_, dtype, dims);
    PAGELLM_ASSERT(t.nbytes() <= bytes_) << "tensor larger than its buffer";
    return t;
  }
};

/// Owns one page-locked host allocation of a backend (Backend::allocate_host_pinned), the
/// source of single-copy uploads (Backend::write_weights with TensorMemory::kHostPinned).
class PinnedHostBuffer : public BackendAllocation<&Backend::free_host_pinned> {
 public:
  PinnedHostBuffer() = default;
  PinnedHostBuffer(Backend* backend, size_t bytes)
      : BackendAllocation(backend, backend->allocate_host_pinned(bytes), bytes) {}
};

/// Checks copy_kv_pages' arguments for a backend named `backend`: pools of one shape
/// [num_pages, num_kv_heads, page_size, head_dim] and dtype in every layer's K and V, and
/// each pair two different pages in 1 .. num_pages-1. Throws Error naming the first
/// violation. Returns the bytes of one page of one pool.
size_t check_kv_page_copies(const std::vector<LayerKv>& kv,
                            const std::vector<std::pair<int32_t, int32_t>>& src_dst,
                            const std::string& backend);

/// Creates a backend by name: "cpu" or "cuda" (when built), on device `device` (the GPU's
/// index; the cpu backend has one device, and ignores it). Throws Error with the list of
/// available backends otherwise, or when the device cannot be used.
std::unique_ptr<Backend> create_backend(const std::string& name, int device = 0);
/// Names of the backends this build has.
std::vector<std::string> available_backends();

}  // namespace pagellm
