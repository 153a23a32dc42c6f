// The CUDA backend: the rooms it is made of (device memory, packed weights, batch staging,
// attention dispatch, the GPU sampler, graphs) put together, and each Backend operation as
// a thin check of its operands followed by its kernel (kernels.h, skinny_gemm.h) or
// cuBLASLt (matmul.h).
#include "pagellm/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <utility>

#include "pagellm/backend/communicator.h"
#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_dispatch.h"
#include "pagellm/cuda/batch_staging.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/graphs.h"
#include "pagellm/cuda/kv/page_copy.h"
#include "pagellm/cuda/lora/lora.h"
#include "pagellm/cuda/matmul/matmul.h"
#include "pagellm/cuda/matmul/packed_weights.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"
#if PAGELLM_HAVE_NCCL
#include "pagellm/cuda/nccl_communicator.h"
#endif
#include "pagellm/cuda/sampling/gpu_sampler.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/device_info.h"
#include "pagellm/cuda/support/kernel_trace.h"

namespace pagellm {
namespace cuda {
namespace {

// cuBLASLt workspace: 32 MiB is what cuBLAS itself uses on Hopper.
constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;

// LoRA's float32 scratch (CudaBackend::lora_scratch): 64 MB, shared by lora_add's partial
// sums and the fused products' shrink sums.
constexpr int64_t kLoraWorkFloats = int64_t{16} << 20;

// LoRA's dense products (CudaBackend::lora_add_dense): the deepest expand product
// ((slots − 1) · rank: 512, 8 adapters of rank 64 or 16 of rank 32) and the most rows of a
// window (with K = 512 and three modules, 25 MB of operand and 50 MB of s_all).
constexpr int64_t kLoraDenseMaxK = 512;
constexpr int64_t kLoraDenseMaxRows = 8192;

// Whether a gated product's operands have the types and shapes the fused SiLU kernel takes:
// x [M, K], w_gate_up [2 I, K] and out [M, I], all bf16.
bool gated_operands_fit(const Tensor& x, const Tensor& w_gate_up, const Tensor& out) {
  return x.dtype == DType::BF16 && w_gate_up.dtype == DType::BF16 &&
         out.dtype == DType::BF16 && x.ndim >= 1 && w_gate_up.ndim == 2 && out.ndim >= 1 &&
         out.size(0) == x.size(0) && w_gate_up.size(0) == 2 * out.row_elems() &&
         w_gate_up.size(1) == x.row_elems() && x.row_elems() > 0;
}

cudaStream_t as_stream(CUstream_st* s) { return s; }

using bf16_t = uint16_t;  // a bf16 element's storage (host code steps pointers by it)

void expect_dtype(const Tensor& t, DType want, const char* op, const char* what) {
  PAGELLM_CHECK(t.dtype == want) << "cuda backend: " << op << ": " << what << " must be "
                                 << dtype_name(want) << ", got " << dtype_name(t.dtype)
                                 << " " << t.shape_string();
}

void expect_data(const Tensor& t, const char* op, const char* what) {
  PAGELLM_CHECK(t.data != nullptr || t.numel() == 0)
      << "cuda backend: " << op << ": " << what << " " << t.shape_string()
      << " has no memory";
}

}  // namespace

// ---- set-up -----------------------------------------------------------------------------

CudaBackend::CudaBackend(int device, const CudaSettings& settings)
    : device_(device), settings_(settings) {
  const OpenedDevice opened = open_cuda_device(device);
  description_ = opened.description;
  total_memory_ = opened.total_memory;
  try {
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    memory_ = std::make_unique<DeviceMemory>(stream_, description_);
    matmul_workspace_bytes_ = kMatmulWorkspaceBytes;
    matmul_workspace_ = memory_->allocate(matmul_workspace_bytes_);
    matmul_ = std::make_unique<LtMatmul>(matmul_workspace_, matmul_workspace_bytes_,
                                         settings_.matmul_path, settings_.matmul_autotune);
    packed_ = std::make_unique<PackedWeights>(*memory_, settings_.packed_weights,
                                              opened.total_memory);
    attention_ = std::make_unique<AttentionDispatch>(*memory_, device_, settings_, stream_);
    batch_ = std::make_unique<BatchStaging>(*memory_, stream_);
    sampler_ = std::make_unique<GpuSampler>(*memory_, stream_);
  } catch (...) {
    release_all();
    throw;
  }
}

CudaBackend::~CudaBackend() { release_all(); }

void CudaBackend::release_all() noexcept {
  if (stream_ != nullptr) {
    abandon_stream_capture(stream_);
    cudaStreamSynchronize(stream_);
  }
  // The rooms free what they allocated from memory_, which goes last.
  sampler_.reset();
  batch_.reset();
  attention_.reset();
  packed_.reset();
  matmul_.reset();
  if (memory_) memory_->deallocate(matmul_workspace_);
  matmul_workspace_ = nullptr;
  if (memory_) memory_->deallocate(lora_work_);
  lora_work_ = nullptr;
  lora_work_floats_ = 0;
  if (memory_) memory_->deallocate(lora_dense_);
  lora_dense_ = nullptr;
  lora_dense_bytes_ = 0;
  memory_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  cudaGetLastError();  // nothing above may leave an error for a later check to misreport
}

bool CudaBackend::capturing() const { return stream_capturing(stream_); }

// ---- memory and transfers (DeviceMemory) ----------------------------------------------------

size_t CudaBackend::free_memory() const { return memory_->free_memory(); }

void* CudaBackend::allocate(size_t bytes) { return memory_->allocate(bytes); }

void CudaBackend::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  // The packed copies of matrices inside this buffer go with it (a later allocation at the
  // same address must not find them).
  if (const size_t bytes = memory_->size_of(ptr)) packed_->drop_within(ptr, bytes);
  memory_->deallocate(ptr);
}

void* CudaBackend::allocate_as(MemoryRole role, size_t bytes) {
  switch (role) {
    case MemoryRole::kWeights: return memory_->allocate(bytes, Residency::kWeights);
    case MemoryRole::kKvCache: return memory_->allocate(bytes, Residency::kKvCache);
    case MemoryRole::kOther: break;
  }
  return memory_->allocate(bytes);
}

BackendSleepResult CudaBackend::sleep(bool offload_weights) {
  PAGELLM_CHECK(!capturing()) << "cuda backend: sleep cannot run while a graph is captured";
  const ReleasedMemory released = memory_->sleep(offload_weights);
  BackendSleepResult result;
  result.kv_bytes = released.kv_cache;
  result.weight_bytes = released.weights;
  result.prepared_bytes = released.prepared;
  return result;
}

void CudaBackend::wake() {
  const bool repack = memory_->prepared_released();
  memory_->wake();
  if (repack) {
    packed_->repack_all(stream_);
    memory_->synchronize();
  }
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  memory_->copy_to_device(dst, src, bytes);
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  memory_->copy_to_host(dst, src, bytes);
}

void CudaBackend::synchronize() { memory_->synchronize(); }

void CudaBackend::upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                         int64_t n) {
  memory_->upload(dst, dst_offset, src, src_dtype, n);
}

std::vector<float> CudaBackend::download_f32(const Tensor& src) {
  return memory_->download_f32(src);
}

void CudaBackend::fill(Tensor& t, float value) {
  expect_data(t, "fill", "target");
  launch_fill(t.data, t.dtype, t.numel(), value, as_stream(stream_));
}

void CudaBackend::copy_kv_pages(std::vector<LayerKv>& kv,
                                const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  if (src_dst.empty()) return;
  PAGELLM_CHECK(!capturing())
      << "cuda backend: copy_kv_pages runs before a step's forward and cannot be captured in a "
         "graph";
  const size_t page_bytes = check_kv_page_copies(kv, src_dst, "cuda");
  // Every layer's K and V pages in one launch a wave of independent pairs (page_copy.cu).
  std::vector<char*> pools;
  pools.reserve(2 * kv.size());
  for (LayerKv& layer : kv) {
    pools.push_back(static_cast<char*>(layer.k.data));
    pools.push_back(static_cast<char*>(layer.v.data));
  }
  launch_copy_kv_pages(pools, page_bytes, src_dst, stream_);
}

// ---- batch metadata (BatchStaging) ---------------------------------------------------------

BatchTensors CudaBackend::upload_batch(const ForwardBatch& batch) {
  PAGELLM_CHECK(!capturing())
      << "cuda backend: upload_batch copies to the device and cannot be captured in a graph; "
         "upload before capture or replay";
  attention_->between_forwards(false);
  BatchTensors bt = batch_->upload(batch);
  if (bt.prefix_item_count > 0) ++prefix_item_batches_;
  return bt;
}

void CudaBackend::reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                                int32_t max_rows) {
  batch_->reserve(max_tokens, max_seqs, max_pages_per_seq, max_rows);
}

// ---- operations -----------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  expect_dtype(ids, DType::I32, "embedding", "token ids");
  PAGELLM_CHECK(table.ndim == 2 && out.dtype == table.dtype && out.numel() == ids.numel() * table.size(1))
      << "cuda backend: embedding: table " << dtype_name(table.dtype) << " "
      << table.shape_string() << ", " << ids.numel() << " ids and output "
      << dtype_name(out.dtype) << " " << out.shape_string() << " do not match (need output ["
      << ids.numel() << ", " << (table.ndim == 2 ? table.size(1) : 0) << "] of the table's dtype)";
  expect_data(table, "embedding", "table");
  expect_data(out, "embedding", "output");
  launch_gather_rows(table.data, table.size(0), ids.ptr<int32_t>(), out.data, ids.numel(),
                     table.size(1) * static_cast<int64_t>(dtype_size(table.dtype)),
                     as_stream(stream_));
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  expect_dtype(x, DType::BF16, "rms_norm", "input");
  expect_dtype(weight, DType::BF16, "rms_norm", "weight");
  expect_dtype(out, DType::BF16, "rms_norm", "output");
  const int64_t rows = x.ndim == 0 ? 0 : x.size(0), hidden = x.row_elems();
  PAGELLM_CHECK(weight.numel() == hidden && out.numel() == x.numel())
      << "cuda backend: rms_norm: input " << x.shape_string() << ", weight "
      << weight.shape_string() << " and output " << out.shape_string() << " do not match";
  launch_rms_norm(x.data, weight.data, out.data, rows, hidden, eps, as_stream(stream_));
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight,
                               float eps, Tensor& out) {
  expect_dtype(residual, DType::BF16, "add_rms_norm", "residual");
  expect_dtype(delta, DType::BF16, "add_rms_norm", "delta");
  expect_dtype(weight, DType::BF16, "add_rms_norm", "weight");
  expect_dtype(out, DType::BF16, "add_rms_norm", "output");
  const int64_t rows = residual.ndim == 0 ? 0 : residual.size(0), hidden = residual.row_elems();
  PAGELLM_CHECK(delta.numel() == residual.numel() && weight.numel() == hidden &&
                out.numel() == residual.numel())
      << "cuda backend: add_rms_norm: residual " << residual.shape_string() << ", delta "
      << delta.shape_string() << ", weight " << weight.shape_string() << " and output "
      << out.shape_string() << " do not match";
  launch_add_rms_norm(residual.data, delta.data, weight.data, out.data, rows, hidden, eps,
                      as_stream(stream_));
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  expect_dtype(x, DType::BF16, "matmul", "input");
  expect_dtype(w, DType::BF16, "matmul", "weight");
  PAGELLM_CHECK(out.dtype == DType::BF16 || out.dtype == DType::F32)
      << "cuda backend: matmul: output must be bfloat16 or float32, got "
      << dtype_name(out.dtype);
  PAGELLM_CHECK(x.ndim >= 1 && w.ndim == 2)
      << "cuda backend: matmul: need x [M, K] and w [N, K], got " << x.shape_string()
      << " and " << w.shape_string();
  const int64_t M = x.size(0), K = x.row_elems(), N = w.size(0);
  PAGELLM_CHECK(w.size(1) == K && out.ndim >= 1 && out.size(0) == M && out.row_elems() == N)
      << "cuda backend: matmul: x " << x.shape_string() << " times w " << w.shape_string()
      << "^T does not give output " << out.shape_string() << " (need [" << M << ", " << N
      << "] with w [N, " << K << "])";
  if (M == 0 || N == 0) return;
  if (K == 0) {
    launch_fill(out.data, out.dtype, out.numel(), 0.0f, as_stream(stream_));
    return;
  }
  matmul_->run(x.data, w.data, out.data, out.dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF, M,
               N, K, as_stream(stream_), packed_->find(w, 0));
}

void CudaBackend::float32_head(const Tensor& x, const Tensor& norm_weight, float eps,
                               const Tensor& w, Tensor& normed, Tensor& out) {
  expect_dtype(x, DType::BF16, "float32_head", "input rows");
  expect_dtype(norm_weight, DType::F32, "float32_head", "norm weight");
  expect_dtype(w, DType::F32, "float32_head", "output projection");
  expect_dtype(normed, DType::F32, "float32_head", "normalised rows");
  expect_dtype(out, DType::F32, "float32_head", "logits");
  PAGELLM_CHECK(x.ndim == 2 && w.ndim == 2)
      << "cuda backend: float32_head: need rows [R, H] and w [N, H], got " << x.shape_string()
      << " and " << w.shape_string();
  const int64_t R = x.size(0), H = x.size(1), N = w.size(0);
  PAGELLM_CHECK(norm_weight.numel() == H && w.size(1) == H && normed.numel() == R * H &&
                out.ndim == 2 && out.size(0) == R && out.size(1) == N)
      << "cuda backend: float32_head: rows " << x.shape_string() << ", norm weight "
      << norm_weight.shape_string() << ", w " << w.shape_string() << ", normed "
      << normed.shape_string() << " and logits " << out.shape_string() << " do not match";
  if (R == 0) return;
  launch_rms_norm_f32_out(x.data, norm_weight.ptr<float>(), normed.ptr<float>(), R, H, eps,
                          as_stream(stream_));
  matmul_->run_f32(normed.ptr<float>(), w.ptr<float>(), out.ptr<float>(), R, N, H,
                   as_stream(stream_));
}

namespace {

/// The kernel arguments of qk_norm_rope_store_kv (qkv may be null for the fused product,
/// which never writes it); the caller has checked the operands.
QkNormRopeArgs qk_norm_rope_args(const void* qkv, const Tensor& q_norm, const Tensor& k_norm,
                                 float eps, const RopeParams& rope, const AttentionShape& shape,
                                 const BatchTensors& batch, int64_t tokens, Tensor& q_out,
                                 LayerKv& kv) {
  QkNormRopeArgs a;
  a.qkv = qkv;
  a.q_norm = q_norm.data;
  a.k_norm = k_norm.data;
  a.positions = batch.positions.ptr<int32_t>();
  a.slot_mapping = batch.slot_mapping.ptr<int32_t>();
  a.q_out = q_out.data;
  a.k_pool = kv.k.data;
  a.v_pool = kv.v.data;
  a.num_tokens = static_cast<int32_t>(tokens);
  a.num_q_heads = static_cast<int32_t>(shape.num_q_heads);
  a.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
  a.head_dim = static_cast<int32_t>(shape.head_dim);
  a.page_size = static_cast<int32_t>(shape.page_size);
  a.num_pages = kv.k.size(0);
  a.eps = eps;
  a.rope_theta = static_cast<float>(rope.theta);
  return a;
}

}  // namespace

void CudaBackend::qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& q_norm,
                                        const Tensor& k_norm, float eps, const RopeParams& rope,
                                        const AttentionShape& shape, const BatchTensors& batch,
                                        Tensor& q_out, LayerKv& kv) {
  const char* op = "qk_norm_rope_store_kv";
  expect_dtype(qkv, DType::BF16, op, "qkv");
  expect_dtype(q_norm, DType::BF16, op, "q_norm weight");
  expect_dtype(k_norm, DType::BF16, op, "k_norm weight");
  expect_dtype(q_out, DType::BF16, op, "q output");
  expect_dtype(kv.k, DType::BF16, op, "K pool");
  expect_dtype(kv.v, DType::BF16, op, "V pool");
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t P = shape.page_size;
  PAGELLM_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0 && qk_norm_rope_supports_head_dim(
                                                          static_cast<int32_t>(D)) && P > 0)
      << "cuda backend: " << op << ": unsupported shape (" << Hq << " q heads, " << Hkv
      << " kv heads, head_dim " << D << ", page size " << P
      << "); need q heads a multiple of kv heads, head_dim 64, 128 or 256";
  PAGELLM_CHECK(rope.head_dim == 0 || rope.head_dim == D)
      << "cuda backend: " << op << ": RoPE over " << rope.head_dim << " of " << D
      << " dims is not supported (Qwen3 rotates the full head)";
  const int64_t T = qkv.ndim == 0 ? 0 : qkv.size(0);
  PAGELLM_CHECK(qkv.row_elems() == (Hq + 2 * Hkv) * D && q_norm.numel() == D &&
                k_norm.numel() == D && q_out.numel() == T * Hq * D)
      << "cuda backend: " << op << ": qkv " << qkv.shape_string() << ", q_norm "
      << q_norm.shape_string() << ", k_norm " << k_norm.shape_string() << ", q_out "
      << q_out.shape_string() << " do not match " << Hq << "+2x" << Hkv << " heads of " << D;
  PAGELLM_CHECK(kv.k.ndim == 4 && kv.v.ndim == 4 && kv.k.size(1) == Hkv && kv.k.size(2) == P &&
                kv.k.size(3) == D && kv.v.numel() == kv.k.numel() && kv.v.size(0) == kv.k.size(0))
      << "cuda backend: " << op << ": KV pools " << kv.k.shape_string() << " / "
      << kv.v.shape_string() << " are not [pages, " << Hkv << ", " << P << ", " << D << "]";
  PAGELLM_CHECK(batch.positions.numel() == T && batch.slot_mapping.numel() == T)
      << "cuda backend: " << op << ": " << T << " tokens but the batch has "
      << batch.positions.numel() << " positions and " << batch.slot_mapping.numel() << " slots";
  if (T == 0) return;
  const QkNormRopeArgs a =
      qk_norm_rope_args(qkv.data, q_norm, k_norm, eps, rope, shape, batch, T, q_out, kv);
  launch_qk_norm_rope_store_kv(a, as_stream(stream_));
}

int32_t CudaBackend::shared_prefix_min_seqs() const {
  // The TMA decode kernel is the one with the pass (AttentionDispatch::add_prefix_pass).
  const bool on = settings_.decode_cascade && settings_.decode_kernel == DecodeKernel::kTma &&
                  !attention_->batch_invariant();
  return on ? std::max(2, settings_.decode_cascade_min_seqs) : 0;
}

AttentionPlanRef CudaBackend::plan_attention(const BatchTensors& batch,
                                             const AttentionShape& shape, const LayerKv& kv) {
  // Shared-prefix items are packed at upload for the model's heads (from the next batch on:
  // the first forward, a prefill, has none to pack).
  PrefixItemSizes sizes;
  if (settings_.decode_cascade && !attention_->batch_invariant()) {
    const auto hq = static_cast<int32_t>(shape.num_q_heads);
    const auto hkv = static_cast<int32_t>(shape.num_kv_heads);
    sizes.members = decode_prefix_item_members(hq, hkv);
    sizes.half_members = decode_prefix_item_members(hq, hkv, kDecodePassRows / 2);
    sizes.kv_heads = hkv;
    sizes.max_half_ctas = decode_prefix_half_item_ctas();
  }
  batch_->set_prefix_item_sizes(sizes);
  return attention_->plan(batch, shape, kv);
}

void CudaBackend::attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                            const BatchTensors& batch, const AttentionPlanRef& plan,
                            Tensor& out) {
  attention_->run(q, kv, shape, batch, plan, out);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  expect_dtype(gate_up, DType::BF16, "silu_mul", "gate_up");
  expect_dtype(out, DType::BF16, "silu_mul", "output");
  const int64_t rows = out.ndim == 0 ? 0 : out.size(0), inter = out.row_elems();
  PAGELLM_CHECK(gate_up.ndim >= 1 && gate_up.size(0) == rows && gate_up.row_elems() == 2 * inter)
      << "cuda backend: silu_mul: gate_up " << gate_up.shape_string() << " is not [" << rows
      << ", 2 x " << inter << "] for output " << out.shape_string();
  launch_silu_mul(gate_up.data, out.data, rows, inter, as_stream(stream_));
}

static_assert(sizeof(LoraSlotRef) == sizeof(LoraSlotFactors) &&
                  offsetof(LoraSlotRef, a) == offsetof(LoraSlotFactors, a) &&
                  offsetof(LoraSlotRef, bt) == offsetof(LoraSlotFactors, bt) &&
                  offsetof(LoraSlotRef, rank) == offsetof(LoraSlotFactors, rank) &&
                  offsetof(LoraSlotRef, scale) == offsetof(LoraSlotFactors, scale) &&
                  offsetof(LoraSlotRef, a_packed) == offsetof(LoraSlotFactors, a_packed) &&
                  offsetof(LoraSlotRef, b_packed) == offsetof(LoraSlotFactors, b_packed),
              "the kernels' slot entries must read the model's tables");

void CudaBackend::lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                           Tensor& out) {
  expect_dtype(x, DType::BF16, "lora_add", "input");
  expect_dtype(out, DType::BF16, "lora_add", "output");
  const int64_t T = x.ndim == 0 ? 0 : x.size(0), in = x.row_elems(), N = out.row_elems();
  const int64_t W = group.width_total();
  PAGELLM_CHECK(out.ndim >= 1 && out.size(0) == T && in == group.in &&
                group.num_modules >= 1 && group.num_modules <= LoraGroup::kMaxModules &&
                group.col_offset >= 0 && group.col_offset + W <= N)
      << "cuda backend: lora_add: input " << x.shape_string() << " and output "
      << out.shape_string() << " do not fit a group of " << group.num_modules
      << " modules reading " << group.in << " and writing " << W << " columns at "
      << group.col_offset;
  if (batch.lora_slots.data == nullptr || T == 0) return;
  PAGELLM_CHECK(batch.lora_slots.numel() == T)
      << "cuda backend: lora_add: " << batch.lora_slots.numel() << " row slots for " << T
      << " rows";
  // Prefill chunks, where it applies.
  if (lora_add_dense(x, group, batch, out, /*accumulate=*/true)) return;
  // Scratch for the shrink's partial sums (lora_scratch); larger steps run in windows of
  // rows.
  float* const work = lora_scratch();
  LoraAddArgs args;
  args.x = x.data;
  args.in = in;
  args.slots = reinterpret_cast<const LoraSlotRef*>(group.slots);
  args.num_slots = group.num_slots;
  args.row_slots = batch.lora_slots.ptr<int32_t>();
  args.rows = T;
  args.num_modules = group.num_modules;
  for (int m = 0; m < group.num_modules; ++m) args.width[m] = group.width[static_cast<size_t>(m)];
  args.out = out.data;
  args.ld_out = N;
  args.col_offset = group.col_offset;
  args.work = work;
  args.work_floats = lora_work_floats_;
  launch_lora_add(args, as_stream(stream_));
}

bool CudaBackend::lora_add_dense(const Tensor& x, const LoraGroup& group,
                                 const BatchTensors& batch, Tensor& out, bool accumulate) {
  // Where it applies: prefill chunks outside capture (graphs would keep a scratch that may
  // grow), not in batch-invariant mode (cuBLASLt's bits depend on the chunk), the products
  // on cuBLASLt, slots · rank at most kLoraDenseMaxK.
  const int64_t T = x.size(0), in = x.row_elems(), N = out.row_elems();
  LoraDenseShape d;
  d.num_slots = group.num_slots;
  d.num_modules = group.num_modules;
  d.in = in;
  d.width = group.width_total();
  d.k_slot = (group.max_rank + 7) / 8 * 8;
  const int64_t K = d.K(), J = d.J();
  if (!settings_.lora_dense || !lora_add_planned(T, group.num_slots) || capturing() ||
      matmul_->batch_invariant() || matmul_->path() == MatmulPath::kSkinny ||
      group.num_slots < 2 || K > kLoraDenseMaxK || in % 8 != 0) {
    return false;
  }
  // Windows of equal size (so that none is small enough for the skinny kernel), each
  // within kLoraDenseMaxRows and the float32 scratch's s_all [rows, J].
  float* const s_all = lora_scratch();
  const int64_t max_rows = std::min(kLoraDenseMaxRows, lora_work_floats_ / J);
  const int64_t windows = (T + max_rows - 1) / max_rows;
  const int64_t rows = (T + windows - 1) / windows;
  const auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t a_bytes = aligned(static_cast<size_t>(J * in) * 2);
  const size_t w_bytes = aligned(static_cast<size_t>(d.width * K) * 2);
  const size_t s_bytes = static_cast<size_t>(d.num_modules * rows * K) * 2;
  char* const scratch = static_cast<char*>(lora_dense_scratch(a_bytes + w_bytes + s_bytes));
  if (scratch == nullptr) return false;
  void* const a_all = scratch;
  bf16_t* const w = reinterpret_cast<bf16_t*>(scratch + a_bytes);
  bf16_t* const s = reinterpret_cast<bf16_t*>(scratch + a_bytes + w_bytes);
  const auto* slots = reinterpret_cast<const LoraSlotRef*>(group.slots);
  cudaStream_t stream = as_stream(stream_);
  launch_lora_dense_factors(slots, d, a_all, w, stream);
  for (int64_t first = 0; first < T; first += rows) {
    const int64_t n = std::min(rows, T - first);
    const auto* xw = static_cast<const bf16_t*>(x.data) + first * in;
    auto* ow = static_cast<bf16_t*>(out.data) + first * N + group.col_offset;
    // The shrink for every slot at once, then the row's own block scaled into s.
    matmul_->run(xw, a_all, s_all, CUDA_R_32F, n, J, in, stream);
    launch_lora_dense_operand(slots, d, batch.lora_slots.ptr<int32_t>() + first, n, s_all, s,
                              stream);
    int64_t col = 0;
    for (int m = 0; m < group.num_modules; ++m) {
      const int64_t width = group.width[static_cast<size_t>(m)];
      if (width > 0 && !accumulate) {
        matmul_->run(s + m * n * K, w + col * K, ow + col, CUDA_R_16BF, n, width, K, stream,
                     nullptr, N);
      } else if (width > 0) {
        PAGELLM_CHECK(matmul_->run_accumulate(s + m * n * K, w + col * K, ow + col, n, width, K,
                                              stream, N))
            << "cuda backend: lora_add: the expand's product [" << n << ", " << K << "] x ["
            << width << ", " << K << "]^T did not take cuBLASLt";
      }
      col += width;
    }
  }
  return true;
}

bool CudaBackend::lora_matmul_dense(const Tensor& x, const Tensor& w, const LoraGroup& group,
                                    const BatchTensors& batch, Tensor& out) {
  // The delta written first, then the base product accumulating onto it in cuBLASLt's
  // epilogue: the output is written twice and read once, where the product then lora_add
  // wrote it, read it and wrote it again. Only where the group's modules fill the output
  // (every column written by the delta) and lora_add_dense applies.
  const bool fits =
      x.dtype == DType::BF16 && w.dtype == DType::BF16 && out.dtype == DType::BF16 &&
      x.ndim >= 1 && w.ndim == 2 && out.ndim >= 1 && x.size(0) > 0 &&
      out.size(0) == x.size(0) && w.size(1) == x.row_elems() && out.row_elems() == w.size(0) &&
      x.row_elems() == group.in && group.num_modules >= 1 &&
      group.num_modules <= LoraGroup::kMaxModules && group.col_offset == 0 &&
      group.width_total() == out.row_elems() && batch.lora_slots.data != nullptr &&
      batch.lora_slots.numel() == x.size(0);
  if (!fits || !lora_add_dense(x, group, batch, out, /*accumulate=*/false)) return false;
  PAGELLM_CHECK(matmul_->run_accumulate(x.data, w.data, out.data, x.size(0), w.size(0),
                                        x.row_elems(), as_stream(stream_)))
      << "cuda backend: lora_matmul: the product [" << x.size(0) << ", " << x.row_elems()
      << "] x [" << w.size(0) << ", " << x.row_elems() << "]^T did not take cuBLASLt";
  return true;
}

void* CudaBackend::lora_dense_scratch(size_t bytes) {
  if (bytes <= lora_dense_bytes_) return lora_dense_;
  if (lora_dense_refused_ != 0 && bytes >= lora_dense_refused_) return nullptr;
  // Grown: the old scratch may still be read by enqueued work.
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  memory_->deallocate(lora_dense_);
  lora_dense_ = nullptr;
  lora_dense_bytes_ = 0;
  try {
    lora_dense_ = memory_->allocate(bytes);
  } catch (const Error&) {
    lora_dense_refused_ = bytes;
    return nullptr;
  }
  lora_dense_bytes_ = bytes;
  return lora_dense_;
}

bool CudaBackend::qkv_fusable(const Tensor& x, const Tensor& w_qkv, const Tensor& q_norm,
                              const Tensor& k_norm, const RopeParams& rope,
                              const AttentionShape& shape, const BatchTensors& batch,
                              const Tensor& q_out, const LayerKv& kv) const {
  // Fused when the product would take the skinny kernel (decode batches), heads are the
  // kernel's 128-row tiles and every operand has the shape and type the fused kernel
  // writes. PAGELLM_DISABLE_QKV_FUSION=1 (settings_.qkv_fusion false) keeps them apart (an
  // ablation switch).
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t T = x.ndim == 0 ? 0 : x.size(0);
  const int64_t N = (Hq + 2 * Hkv) * D;
  const auto bf16 = [](const Tensor& t) { return t.dtype == DType::BF16; };
  return settings_.qkv_fusion && D == kSkinnyQkHeadDim &&
         (rope.head_dim == 0 || rope.head_dim == D) && Hq > 0 && Hkv > 0 && Hq % Hkv == 0 &&
         shape.page_size > 0 && bf16(x) && bf16(w_qkv) && bf16(q_norm) && bf16(k_norm) &&
         bf16(q_out) && bf16(kv.k) && bf16(kv.v) && x.ndim >= 1 && T > 0 && w_qkv.ndim == 2 &&
         w_qkv.size(0) == N && w_qkv.size(1) == x.row_elems() && x.row_elems() > 0 &&
         q_norm.numel() == D && k_norm.numel() == D && q_out.numel() == T * Hq * D &&
         batch.positions.numel() == T && batch.slot_mapping.numel() == T && kv.k.ndim == 4 &&
         kv.k.size(0) > 0 && kv.k.size(1) == Hkv && kv.k.size(2) == shape.page_size &&
         kv.k.size(3) == D && kv.v.numel() == kv.k.numel() && kv.v.size(0) == kv.k.size(0) &&
         matmul_->path_for(x.data, w_qkv.data, q_out.data, CUDA_R_16BF, T, N, x.row_elems()) ==
             MatmulPath::kSkinny;
}

void CudaBackend::matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv, Tensor& qkv,
                                               const Tensor& q_norm, const Tensor& k_norm,
                                               float eps, const RopeParams& rope,
                                               const AttentionShape& shape,
                                               const BatchTensors& batch, Tensor& q_out,
                                               LayerKv& kv) {
  // Otherwise the two ops, which check their operands and name what is wrong.
  if (!qkv_fusable(x, w_qkv, q_norm, k_norm, rope, shape, batch, q_out, kv)) {
    Backend::matmul_qk_norm_rope_store_kv(x, w_qkv, qkv, q_norm, k_norm, eps, rope, shape, batch,
                                          q_out, kv);
    return;
  }
  const int64_t T = x.size(0);
  const QkNormRopeArgs e =
      qk_norm_rope_args(nullptr, q_norm, k_norm, eps, rope, shape, batch, T, q_out, kv);
  launch_skinny_gemm_qk_norm_rope(x.data, w_qkv.data, T, x.row_elems(), e, as_stream(stream_),
                                  0, packed_->find(w_qkv, 0), matmul_->batch_invariant());
}

float* CudaBackend::lora_scratch() {
  // Made once, outside any capture (the forward before a capture makes it), and never
  // moved, since graphs keep its address.
  if (lora_work_ == nullptr) {
    PAGELLM_CHECK(!capturing()) << "cuda backend: LoRA's scratch must be made before a graph "
                                   "captures it (run one forward first)";
    lora_work_ = memory_->allocate(static_cast<size_t>(kLoraWorkFloats) * sizeof(float));
    lora_work_floats_ = kLoraWorkFloats;
  }
  return static_cast<float*>(lora_work_);
}

std::optional<SkinnyLora> CudaBackend::skinny_lora(const LoraGroup& group,
                                                   const BatchTensors& batch, int64_t T,
                                                   int64_t product_cols) {
  bool widths = group.num_modules >= 1 && group.num_modules <= LoraGroup::kMaxModules &&
                group.col_offset == 0 && group.width_total() == product_cols;
  // The fused expand gives each 64-row half of a tile one module (skinny_gemm.h).
  for (int m = 0; m < group.num_modules; ++m) {
    widths = widths && group.width[static_cast<size_t>(m)] % kSkinnyLoraWidthMultiple == 0;
  }
  if (!widths || group.slots == nullptr || group.num_slots > kSkinnyLoraMaxSlots ||
      batch.lora_slots.data == nullptr ||
      batch.lora_slots.numel() != T || T <= 0 ||
      lora_skinny_s_floats(T, group.num_modules) > kLoraWorkFloats) {
    return std::nullopt;
  }
  SkinnyLora l;
  l.slots = reinterpret_cast<const LoraSlotRef*>(group.slots);
  l.num_slots = group.num_slots;
  l.row_slots = batch.lora_slots.ptr<int32_t>();
  l.num_modules = group.num_modules;
  l.max_rank = group.max_rank;
  for (int m = 0; m < group.num_modules; ++m) l.width[m] = group.width[static_cast<size_t>(m)];
  l.s = lora_scratch();
  l.counters = group.counters;
  return l;
}

void CudaBackend::lora_matmul(const Tensor& x, const Tensor& w, const LoraGroup& group,
                              const BatchTensors& batch, Tensor& out) {
  const bool shapes = x.dtype == DType::BF16 && w.dtype == DType::BF16 &&
                      out.dtype == DType::BF16 && x.ndim >= 1 && w.ndim == 2 && out.ndim >= 1 &&
                      out.size(0) == x.size(0) && w.size(1) == x.row_elems() &&
                      out.row_elems() == w.size(0) && x.row_elems() == group.in &&
                      x.row_elems() > 0;
  if (shapes && matmul_->path_for(x.data, w.data, out.data, CUDA_R_16BF, x.size(0), w.size(0),
                                  x.row_elems()) == MatmulPath::kSkinny) {
    if (const auto l = skinny_lora(group, batch, x.size(0), w.size(0))) {
      launch_skinny_gemm(x.data, w.data, out.data, false, x.size(0), w.size(0), x.row_elems(),
                         as_stream(stream_), 0, packed_->find(w, 0), matmul_->batch_invariant(),
                         &*l);
      return;
    }
  }
  if (lora_matmul_dense(x, w, group, batch, out)) return;
  Backend::lora_matmul(x, w, group, batch, out);
}

void CudaBackend::lora_matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv,
                                                    const LoraGroup& group, Tensor& qkv,
                                                    const Tensor& q_norm, const Tensor& k_norm,
                                                    float eps, const RopeParams& rope,
                                                    const AttentionShape& shape,
                                                    const BatchTensors& batch, Tensor& q_out,
                                                    LayerKv& kv) {
  if (qkv_fusable(x, w_qkv, q_norm, k_norm, rope, shape, batch, q_out, kv) &&
      x.row_elems() == group.in) {
    if (const auto l = skinny_lora(group, batch, x.size(0), w_qkv.size(0))) {
      const int64_t T = x.size(0);
      const QkNormRopeArgs e =
          qk_norm_rope_args(nullptr, q_norm, k_norm, eps, rope, shape, batch, T, q_out, kv);
      launch_skinny_gemm_qk_norm_rope(x.data, w_qkv.data, T, x.row_elems(), e,
                                      as_stream(stream_), 0, packed_->find(w_qkv, 0),
                                      matmul_->batch_invariant(), &*l);
      return;
    }
  }
  if (lora_matmul_dense(x, w_qkv, group, batch, qkv)) {
    qk_norm_rope_store_kv(qkv, q_norm, k_norm, eps, rope, shape, batch, q_out, kv);
    return;
  }
  Backend::lora_matmul_qk_norm_rope_store_kv(x, w_qkv, group, qkv, q_norm, k_norm, eps, rope,
                                             shape, batch, q_out, kv);
}

void CudaBackend::lora_matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up,
                                       const LoraGroup& group, const BatchTensors& batch,
                                       Tensor& gate_up, Tensor& out) {
  if (gated_operands_fit(x, w_gate_up, out) && x.row_elems() == group.in &&
      matmul_->path_for(x.data, w_gate_up.data, out.data, CUDA_R_16BF, x.size(0),
                        w_gate_up.size(0), x.row_elems()) == MatmulPath::kSkinny) {
    if (const auto l = skinny_lora(group, batch, x.size(0), w_gate_up.size(0))) {
      launch_skinny_gemm_silu_mul(x.data, w_gate_up.data, out.data, x.size(0), out.row_elems(),
                                  x.row_elems(), as_stream(stream_), 0,
                                  packed_->find(w_gate_up, out.row_elems()),
                                  matmul_->batch_invariant(), &*l);
      return;
    }
  }
  if (lora_matmul_dense(x, w_gate_up, group, batch, gate_up)) {
    silu_mul(gate_up, out);
    return;
  }
  Backend::lora_matmul_silu_mul(x, w_gate_up, group, batch, gate_up, out);
}

size_t CudaBackend::lora_packed_a_bytes(int64_t rows, int64_t in) const {
  return cuda::lora_packed_a_bytes(rows, in);
}

void CudaBackend::pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed) {
  cuda::pack_lora_a(a, rows, in, packed, as_stream(stream_));
}

size_t CudaBackend::lora_packed_b_bytes(int32_t rank, int64_t width_total) const {
  return cuda::lora_packed_b_bytes(rank, width_total);
}

void CudaBackend::pack_lora_b(const void* bt, int32_t rank, int64_t width_total, bool paired,
                              void* packed) {
  cuda::pack_lora_b(bt, rank, width_total, paired ? width_total / 2 : 0, packed,
                    as_stream(stream_));
}

void CudaBackend::matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up,
                                  Tensor& out) {
  // Fused when the product would take the skinny kernel (decode batches) and every operand
  // has the shape and type the fused kernel writes; otherwise the two ops, which check
  // their operands and name what is wrong.
  if (gated_operands_fit(x, w_gate_up, out) && matmul_->run_silu_mul(x.data, w_gate_up.data, out.data, x.size(0),
                                       out.row_elems(), x.row_elems(), as_stream(stream_),
                                       packed_->find(w_gate_up, out.row_elems()))) {
    return;
  }
  Backend::matmul_silu_mul(x, w_gate_up, gate_up, out);
}

void CudaBackend::matmul_add_rms_norm(const Tensor& x, const Tensor& w, Tensor& proj,
                                      Tensor& residual, const Tensor& weight, float eps,
                                      Tensor& out) {
  // Fused when every operand is what the fused path reads and writes (bf16 rows of the
  // product's shape; the norm's output and weight checked as add_rms_norm checks them) and
  // the product runs on cuBLASLt; otherwise the two ops, which name what is wrong.
  const bool fits =
      x.dtype == DType::BF16 && w.dtype == DType::BF16 && residual.dtype == DType::BF16 &&
      out.dtype == DType::BF16 && weight.dtype == DType::BF16 && x.ndim >= 1 && w.ndim == 2 &&
      residual.ndim >= 1 && w.size(1) == x.row_elems() && residual.size(0) == x.size(0) &&
      residual.row_elems() == w.size(0) && out.numel() == residual.numel() &&
      weight.numel() == residual.row_elems();
  if (fits && matmul_->run_accumulate(x.data, w.data, residual.data, x.size(0), w.size(0),
                                      x.row_elems(), as_stream(stream_))) {
    launch_rms_norm(residual.data, weight.data, out.data, residual.size(0),
                    residual.row_elems(), eps, as_stream(stream_));
    return;
  }
  Backend::matmul_add_rms_norm(x, w, proj, residual, weight, eps, out);
}

size_t CudaBackend::prepare_matrix(const Tensor& w, int64_t gated_inter) {
  return packed_->prepare(w, gated_inter, stream_, capturing());
}

// ---- weight updates ---------------------------------------------------------------------------

std::string CudaBackend::check_weight_source(const void* src, size_t bytes,
                                             TensorMemory memory) const {
  (void)bytes;  // the runtime tells an allocation's kind, not its extent
  if (src == nullptr) return "has no data (null pointer)";
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
    cudaGetLastError();
    attr.type = cudaMemoryTypeUnregistered;
  }
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  const std::string found =
      on_device ? "device memory of GPU " + std::to_string(attr.device)
                : attr.type == cudaMemoryTypeHost ? "pinned host memory" : "pageable host memory";
  switch (memory) {
    case TensorMemory::kDevice:
      if (!on_device) return "is " + found + ", not device memory";
      if (attr.device != device_)
        return "is " + found + ", but the engine runs on GPU " + std::to_string(device_);
      return "";
    case TensorMemory::kHostPinned:
      if (attr.type != cudaMemoryTypeHost) return "is " + found + ", not pinned host memory";
      return "";
    case TensorMemory::kHost:
      if (on_device) return "is " + found + ", not host memory";
      return "";
  }
  return "has an unknown memory kind";
}

void* CudaBackend::allocate_host_pinned(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    PAGELLM_FAIL() << "cannot allocate " << format_bytes(bytes)
                   << " of pinned host memory: " << cudaGetErrorString(err);
  }
  return ptr;
}

void* CudaBackend::open_ipc_memory(const std::array<uint8_t, 64>& handle) {
  static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // a failed open is not sticky: clear it so later checks pass
    PAGELLM_FAIL() << "cannot open a CUDA IPC memory handle: " << cudaGetErrorString(err)
                   << " (the handle must come from cudaIpcGetMemHandle in another live process "
                      "on this machine, for memory on this GPU; a process cannot open its own)";
  }
  return base;
}

void CudaBackend::close_ipc_memory(void* base) {
  if (base != nullptr) PAGELLM_CUDA_CHECK(cudaIpcCloseMemHandle(base));
}

// ---- collectives between processes (NcclCommunicator) ------------------------------------

#if PAGELLM_HAVE_NCCL
std::vector<uint8_t> CudaBackend::new_communicator_id() {
  return new_nccl_group_id(settings_.nccl_library);
}

std::unique_ptr<Communicator> CudaBackend::join_communicator(const std::vector<uint8_t>& id,
                                                             int rank, int size) {
  return std::make_unique<NcclCommunicator>(*this, id, rank, size);
}
#else
// Built without nccl.h (src/CMakeLists.txt): no device collectives.
std::vector<uint8_t> CudaBackend::new_communicator_id() { return {}; }

std::unique_ptr<Communicator> CudaBackend::join_communicator(const std::vector<uint8_t>& id,
                                                             int rank, int size) {
  (void)id;
  PAGELLM_FAIL() << "join_communicator: this cuda backend was built without nccl.h, so it has "
                    "no device collectives (rank "
                 << rank << " of " << size << "); rebuild with the CUDA toolkit's NCCL headers";
}
#endif

void CudaBackend::free_host_pinned(void* ptr) {
  if (ptr != nullptr) PAGELLM_CUDA_CHECK(cudaFreeHost(ptr));
}

void CudaBackend::write_weights(Tensor& dst, int64_t dst_offset, const void* src,
                                DType src_dtype, int64_t n, TensorMemory memory) {
  PAGELLM_CHECK(!capturing()) << "cuda backend: write_weights while capturing a graph";
  PAGELLM_CHECK(n >= 0 && dst_offset >= 0 && dst_offset + n <= dst.numel())
      << "cuda backend: write_weights of " << n << " elements at offset " << dst_offset
      << " does not fit tensor " << dst.shape_string();
  if (n == 0) return;
  char* out = static_cast<char*>(dst.data) + dst_offset * static_cast<int64_t>(dtype_size(dst.dtype));
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dst.dtype);
  if (memory == TensorMemory::kDevice) {
    if (src_dtype == dst.dtype) {
      PAGELLM_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyDeviceToDevice,
                                         as_stream(stream_)));
    } else {
      launch_convert(src, src_dtype, out, dst.dtype, n, as_stream(stream_));
    }
    return;
  }
  if (memory == TensorMemory::kHostPinned && src_dtype == dst.dtype) {
    // Straight from the caller's page-locked memory: a DMA at PCIe speed, no staging.
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(out, src, bytes, cudaMemcpyHostToDevice,
                                       as_stream(stream_)));
    return;
  }
  // Pageable memory (or a dtype to convert): staged through the pinned upload buffers.
  memory_->upload(dst, dst_offset, src, src_dtype, n);
}

void CudaBackend::write_weights_2d(Tensor& dst, int64_t dst_offset, const void* src,
                                   DType src_dtype, int64_t rows, int64_t cols,
                                   int64_t src_row_stride, TensorMemory memory) {
  PAGELLM_CHECK(!capturing()) << "cuda backend: write_weights_2d while capturing a graph";
  PAGELLM_CHECK(rows >= 0 && cols >= 0 && src_row_stride >= cols && dst_offset >= 0 &&
                dst_offset + rows * cols <= dst.numel())
      << "cuda backend: write_weights_2d of " << rows << " x " << cols
      << " elements (source rows " << src_row_stride << " apart) at offset " << dst_offset
      << " does not fit tensor " << dst.shape_string();
  if (rows == 0 || cols == 0) return;
  const size_t in_size = dtype_size(src_dtype);
  const bool same = src_dtype == dst.dtype;
  if (same && (memory == TensorMemory::kDevice || memory == TensorMemory::kHostPinned)) {
    // One strided copy engine transfer (device to device, or DMA from page-locked memory).
    char* out = static_cast<char*>(dst.data) + dst_offset * static_cast<int64_t>(in_size);
    const size_t width = static_cast<size_t>(cols) * in_size;
    PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(
        out, width, src, static_cast<size_t>(src_row_stride) * in_size, width,
        static_cast<size_t>(rows),
        memory == TensorMemory::kDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
        as_stream(stream_)));
    return;
  }
  if (memory == TensorMemory::kDevice) {
    // A dtype to convert on the device: row by row (a trainer sending another dtype).
    Backend::write_weights_2d(dst, dst_offset, src, src_dtype, rows, cols, src_row_stride,
                              memory);
    return;
  }
  // Host memory: gathered here into one contiguous block, which the staged upload reads
  // before it returns (so the block may go at once).
  std::vector<uint8_t> block(static_cast<size_t>(rows * cols) * in_size);
  const auto* base = static_cast<const uint8_t*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(block.data() + static_cast<size_t>(r * cols) * in_size,
                base + static_cast<size_t>(r * src_row_stride) * in_size,
                static_cast<size_t>(cols) * in_size);
  }
  memory_->upload(dst, dst_offset, block.data(), src_dtype, rows * cols);
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  expect_dtype(indices, DType::I32, "gather_rows", "indices");
  const int64_t R = indices.numel();
  PAGELLM_CHECK(x.ndim >= 1 && out.dtype == x.dtype && out.ndim >= 1 && out.size(0) == R &&
                out.row_elems() == x.row_elems())
      << "cuda backend: gather_rows: x " << dtype_name(x.dtype) << " " << x.shape_string()
      << ", " << R << " indices and output " << dtype_name(out.dtype) << " "
      << out.shape_string() << " do not match";
  launch_gather_rows(x.data, x.size(0), indices.ptr<int32_t>(), out.data, R,
                     x.row_elems() * static_cast<int64_t>(dtype_size(x.dtype)),
                     as_stream(stream_));
}

// ---- attention dispatch (AttentionDispatch) -------------------------------------------------

void CudaBackend::set_attention_backend(const std::string& choice) {
  const AttentionBackendChoice c = parse_attention_backend(choice);
  PAGELLM_CHECK(!capturing())
      << "cuda backend: the attention backend cannot change during graph capture";
  if (matmul_->batch_invariant()) {
    // The mode runs attention natively (set_batch_invariant); auto stays native.
    PAGELLM_CHECK(c != AttentionBackendChoice::kCudnn)
        << "--attention-backend cudnn cannot be combined with --batch-invariant (cuDNN's "
           "reduction order is not fixed per row): use auto or native";
    return;
  }
  attention_->set_choice(c);
}

void CudaBackend::set_batch_invariant(bool on) {
  PAGELLM_CHECK(!capturing())
      << "cuda backend: batch-invariant mode cannot change during graph capture";
  if (on) {
    PAGELLM_CHECK(current_device_info(nullptr) == 90)
        << "batch-invariant mode on the cuda backend needs an sm_90 GPU (H100/H200): it runs "
           "every product on the skinny kernel (wgmma); this is "
        << description_ << ". Run without --batch-invariant";
    PAGELLM_CHECK(attention_->choice() != "cudnn")
        << "batch-invariant mode runs attention on the native kernels (cuDNN's reduction "
           "order is not fixed per row): use --attention-backend auto or native with "
           "--batch-invariant";
    attention_->set_choice(AttentionBackendChoice::kNative);
  }
  matmul_->set_batch_invariant(on);
  attention_->set_batch_invariant(on);
}

bool CudaBackend::batch_invariant() const { return matmul_->batch_invariant(); }

std::string CudaBackend::attention_backend() const { return attention_->choice(); }

AttentionRouteStats CudaBackend::attention_route_stats() const {
  AttentionRouteStats s = attention_->stats();
  s.prefix_item_batches = prefix_item_batches_;
  return s;
}

const AttentionPlan* CudaBackend::last_attention_plan() const {
  return attention_->last_plan();
}

size_t CudaBackend::attention_workspace_bytes() const { return attention_->workspace_bytes(); }

size_t CudaBackend::packed_weight_bytes() const { return packed_->bytes(); }

size_t CudaBackend::packed_matrices() const { return packed_->count(); }

void CudaBackend::set_packed_weights_enabled(bool on) { packed_->set_enabled(on); }

// ---- sampling (GpuSampler) ------------------------------------------------------------------

std::vector<SampledToken> CudaBackend::sample(const Tensor& logits,
                                              const std::vector<SamplingRow>& rows) {
  return sampler_->sample(logits, rows, capturing());
}

SampleTicket CudaBackend::sample_async(const Tensor& logits,
                                       const std::vector<SamplingRow>& rows) {
  return sampler_->sample_async(logits, rows, capturing());
}

std::vector<SampledToken> CudaBackend::wait_sampled(SampleTicket& ticket) {
  return sampler_->wait(ticket);
}

void CudaBackend::feed_sampled_tokens(const SampleTicket& ticket,
                                      const std::vector<int32_t>& src_rows, Tensor& token_ids) {
  PAGELLM_CHECK(!capturing()) << "cuda backend: feed_sampled_tokens cannot be captured";
  sampler_->feed(ticket, src_rows, token_ids);
}

// ---- graphs, bandwidth, trace -------------------------------------------------------------

void CudaBackend::begin_capture() {
  PAGELLM_CHECK(!capturing()) << "cuda backend: begin_capture while already capturing";
  attention_->between_forwards(true);
  begin_stream_capture(stream_);
}

std::unique_ptr<RecordedGraph> CudaBackend::end_capture() { return end_stream_capture(stream_); }

double CudaBackend::measure_copy_bandwidth() { return cuda::measure_copy_bandwidth(stream_); }

std::string CudaBackend::begin_kernel_trace() { return cuda::begin_kernel_trace(); }

std::vector<KernelSpan> CudaBackend::end_kernel_trace() {
  synchronize();  // every traced kernel has finished and its record can be flushed
  return cuda::end_kernel_trace();
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<cuda::CudaBackend>(device, cuda::CudaSettings::from_environment());
}

}  // namespace pagellm
