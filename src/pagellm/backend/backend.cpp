// Default implementations of the Backend interface: host sampling, host-memory copy
// bandwidths, ordinary memory as "pinned" memory, and a clear refusal of graph capture.
#include "pagellm/backend/backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pagellm/backend/communicator.h"
#include "pagellm/common/check.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {

std::vector<SampledToken> Backend::sample(const Tensor& logits,
                                          const std::vector<SamplingRow>& rows) {
  PAGELLM_CHECK(logits.dtype == DType::F32 && logits.ndim == 2)
      << "Backend::sample: logits must be a float32 [rows, vocab] tensor, got "
      << dtype_name(logits.dtype) << " " << logits.shape_string();
  const int64_t num_rows = logits.size(0);
  const int64_t vocab_size = logits.size(1);
  PAGELLM_CHECK(static_cast<size_t>(num_rows) == rows.size())
      << "Backend::sample: " << num_rows << " rows of logits but " << rows.size()
      << " sampling rows";
  if (num_rows == 0) return {};
  // [R, V] float32 on the host; copy_to_host waits for the forward pass that wrote it.
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  copy_to_host(host.data(), logits.data, logits.nbytes());
  return sample_rows(host.data(), num_rows, vocab_size, rows);
}

SampleTicket Backend::sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows) {
  static std::atomic<uint64_t> next_id{1};
  SampleTicket ticket;
  ticket.tokens = sample(logits, rows);
  ticket.id = next_id.fetch_add(1);
  ticket.rows = static_cast<int32_t>(rows.size());
  return ticket;
}

std::vector<SampledToken> Backend::wait_sampled(SampleTicket& ticket) {
  PAGELLM_CHECK(ticket.id != 0) << name() << " backend: wait_sampled: an empty ticket";
  ticket.id = 0;
  return std::move(ticket.tokens);
}

void Backend::feed_sampled_tokens(const SampleTicket& ticket, const std::vector<int32_t>& src_rows,
                                  Tensor& token_ids) {
  PAGELLM_CHECK(ticket.id != 0 && ticket.tokens.size() == static_cast<size_t>(ticket.rows))
      << name() << " backend: feed_sampled_tokens: the ticket holds no tokens";
  PAGELLM_CHECK(token_ids.dtype == DType::I32 &&
                static_cast<int64_t>(src_rows.size()) <= token_ids.numel())
      << name() << " backend: feed_sampled_tokens: " << src_rows.size()
      << " tokens into an int32 tensor of " << token_ids.numel();
  std::vector<int32_t> tokens(src_rows.size());
  for (size_t i = 0; i < src_rows.size(); ++i) {
    PAGELLM_CHECK(src_rows[i] >= 0 && src_rows[i] < ticket.rows)
        << name() << " backend: feed_sampled_tokens: row " << src_rows[i] << " of a ticket of "
        << ticket.rows << " rows";
    tokens[i] = ticket.tokens[static_cast<size_t>(src_rows[i])].token;
  }
  if (!tokens.empty()) {
    copy_to_device(token_ids.data, tokens.data(), tokens.size() * sizeof(int32_t));
  }
}

void Backend::copy_kv_pages(std::vector<LayerKv>& kv,
                            const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  (void)kv;
  PAGELLM_CHECK(src_dst.empty())
      << "the " << name() << " backend cannot copy KV pages (copy_kv_pages), which n-sample "
      << "fan-out needs; use n = 1 or the cpu or cuda backend";
}

size_t check_kv_page_copies(const std::vector<LayerKv>& kv,
                            const std::vector<std::pair<int32_t, int32_t>>& src_dst,
                            const std::string& backend) {
  PAGELLM_CHECK(!kv.empty()) << backend << " backend: copy_kv_pages got no layers";
  const Tensor& first = kv[0].k;
  PAGELLM_CHECK(first.ndim == 4) << backend << " backend: copy_kv_pages needs pools of shape "
                                    "[num_pages, num_kv_heads, page_size, head_dim], got "
                                 << first.shape_string();
  for (size_t l = 0; l < kv.size(); ++l) {
    for (const Tensor* pool : {&kv[l].k, &kv[l].v}) {
      PAGELLM_CHECK(pool->data != nullptr && pool->ndim == 4 && pool->dtype == first.dtype &&
                    std::equal(pool->shape, pool->shape + 4, first.shape))
          << backend << " backend: copy_kv_pages: layer " << l << "'s "
          << (pool == &kv[l].k ? "K" : "V") << " pool is " << dtype_name(pool->dtype) << " "
          << pool->shape_string() << ", layer 0's K pool " << dtype_name(first.dtype) << " "
          << first.shape_string() << " (every pool must match)";
    }
  }
  const int64_t num_pages = first.size(0);
  for (size_t i = 0; i < src_dst.size(); ++i) {
    const auto [src, dst] = src_dst[i];
    PAGELLM_CHECK(src >= 1 && src < num_pages && dst >= 1 && dst < num_pages && src != dst)
        << backend << " backend: copy_kv_pages pair " << i << " copies page " << src
        << " to page " << dst << "; pages must differ and lie in 1.." << num_pages - 1;
  }
  return first.nbytes() / static_cast<size_t>(num_pages);
}

void Backend::float32_head(const Tensor& x, const Tensor& norm_weight, float eps,
                           const Tensor& w, Tensor& normed, Tensor& out) {
  PAGELLM_CHECK(x.dtype == DType::F32 && norm_weight.dtype == DType::F32 &&
                w.dtype == DType::F32 && normed.dtype == DType::F32 && out.dtype == DType::F32)
      << name() << " backend: float32_head's default needs float32 activations and weights, got "
      << dtype_name(x.dtype) << " rows and " << dtype_name(w.dtype) << " weights";
  rms_norm(x, norm_weight, eps, normed);
  matmul(normed, w, out);
}

AttentionPlanRef Backend::plan_attention(const BatchTensors& batch, const AttentionShape& shape,
                                         const LayerKv& kv) {
  (void)batch;
  (void)shape;
  (void)kv;
  AttentionPlanRef ref;
  ref.serial = 1;
  return ref;
}

void Backend::matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up,
                              Tensor& out) {
  matmul(x, w_gate_up, gate_up);
  silu_mul(gate_up, out);
}

void Backend::matmul_add_rms_norm(const Tensor& x, const Tensor& w, Tensor& proj,
                                  Tensor& residual, const Tensor& weight, float eps,
                                  Tensor& out) {
  matmul(x, w, proj);
  add_rms_norm(residual, proj, weight, eps, out);
}

void Backend::lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                       Tensor& out) {
  (void)x;
  (void)group;
  (void)batch;
  (void)out;
  PAGELLM_FAIL() << "the " << name()
                 << " backend has no LoRA kernels; serve LoRA adapters with the cpu or cuda "
                    "backend";
}

void Backend::lora_matmul(const Tensor& x, const Tensor& w, const LoraGroup& group,
                          const BatchTensors& batch, Tensor& out) {
  matmul(x, w, out);
  lora_add(x, group, batch, out);
}

void Backend::lora_matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv,
                                                const LoraGroup& group, Tensor& qkv,
                                                const Tensor& q_norm, const Tensor& k_norm,
                                                float eps, const RopeParams& rope,
                                                const AttentionShape& shape,
                                                const BatchTensors& batch, Tensor& q_out,
                                                LayerKv& kv) {
  matmul(x, w_qkv, qkv);
  lora_add(x, group, batch, qkv);
  qk_norm_rope_store_kv(qkv, q_norm, k_norm, eps, rope, shape, batch, q_out, kv);
}

void Backend::lora_matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up,
                                   const LoraGroup& group, const BatchTensors& batch,
                                   Tensor& gate_up, Tensor& out) {
  matmul(x, w_gate_up, gate_up);
  lora_add(x, group, batch, gate_up);
  silu_mul(gate_up, out);
}

void Backend::pack_lora_a(const void* a, int64_t rows, int64_t in, void* packed) {
  (void)a;
  (void)rows;
  (void)in;
  (void)packed;
  PAGELLM_FAIL() << "the " << name() << " backend streams LoRA factors unpacked (pack_lora_a)";
}

void Backend::pack_lora_b(const void* bt, int32_t rank, int64_t width_total, bool paired,
                          void* packed) {
  (void)bt;
  (void)rank;
  (void)width_total;
  (void)paired;
  (void)packed;
  PAGELLM_FAIL() << "the " << name() << " backend reads LoRA factors unpacked (pack_lora_b)";
}

void Backend::matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv, Tensor& qkv,
                                           const Tensor& q_norm, const Tensor& k_norm, float eps,
                                           const RopeParams& rope, const AttentionShape& shape,
                                           const BatchTensors& batch, Tensor& q_out,
                                           LayerKv& kv) {
  matmul(x, w_qkv, qkv);
  qk_norm_rope_store_kv(qkv, q_norm, k_norm, eps, rope, shape, batch, q_out, kv);
}

BackendSleepResult Backend::sleep(bool offload_weights) {
  (void)offload_weights;
  PAGELLM_FAIL() << "sleep is not supported by the " << name()
                 << " backend (the cpu and cuda backends support it)";
}

void Backend::wake() {
  PAGELLM_FAIL() << "wake is not supported by the " << name()
                 << " backend (the cpu and cuda backends support it)";
}

double Backend::measure_copy_bandwidth() {
  // Generic: device-to-device copies through copy_to_device of a host staging buffer
  // would measure the wrong thing, so backends with device memory override this. Here
  // the "device" is host memory: time memcpy of 256 MiB, median of 5.
  const size_t bytes = size_t{256} << 20;
  DeviceBuffer a(this, bytes), b(this, bytes);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    copy_to_host(b.get(), a.get(), bytes);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin() + 1, times.end());
  return 2.0 * static_cast<double>(bytes) / times[3];
}

Backend::MatmulRate Backend::measure_matmul_rate(int64_t rows, int64_t n, int64_t k) {
  PAGELLM_CHECK(rows > 0 && n > 0 && k > 0)
      << name() << " backend: measure_matmul_rate needs a positive shape, got " << rows << " x "
      << n << " x " << k;
  const DType act = activation_dtype(), wt = weight_dtype();
  for (int64_t m = rows; m >= std::min<int64_t>(rows, 256); m /= 2) {
    const size_t x_bytes = static_cast<size_t>(m * k) * dtype_size(act);
    const size_t w_bytes = static_cast<size_t>(n * k) * dtype_size(wt);
    const size_t out_bytes = static_cast<size_t>(m * n) * dtype_size(act);
    DeviceBuffer x, w, out;
    try {
      x = DeviceBuffer(this, x_bytes);
      w = DeviceBuffer(this, w_bytes);
      out = DeviceBuffer(this, out_bytes);
    } catch (const Error&) {
      continue;  // memory is short: fewer rows
    }
    const std::vector<uint8_t> zeros(std::max(x_bytes, w_bytes), 0);
    copy_to_device(x.get(), zeros.data(), x_bytes);
    copy_to_device(w.get(), zeros.data(), w_bytes);
    const Tensor tx = x.tensor(act, {m, k});
    const Tensor tw = w.tensor(wt, {n, k});
    Tensor to = out.tensor(act, {m, n});
    matmul(tx, tw, to);  // plans and autotunes the shape
    synchronize();
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      matmul(tx, tw, to);
      synchronize();
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    return {2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
                times[2],
            m};
  }
  return {};
}

void Backend::write_weights_2d(Tensor& dst, int64_t dst_offset, const void* src,
                               DType src_dtype, int64_t rows, int64_t cols,
                               int64_t src_row_stride, TensorMemory memory) {
  PAGELLM_CHECK(rows >= 0 && cols >= 0 && src_row_stride >= cols && dst_offset >= 0 &&
                dst_offset + rows * cols <= dst.numel())
      << name() << " backend: write_weights_2d of " << rows << " x " << cols
      << " elements (source rows " << src_row_stride << " apart) at offset " << dst_offset
      << " does not fit tensor " << dst.shape_string();
  const auto* base = static_cast<const uint8_t*>(src);
  const size_t row_bytes = static_cast<size_t>(src_row_stride) * dtype_size(src_dtype);
  for (int64_t r = 0; r < rows; ++r) {
    write_weights(dst, dst_offset + r * cols, base + static_cast<size_t>(r) * row_bytes,
                  src_dtype, cols, memory);
  }
}

void* Backend::open_ipc_memory(const std::array<uint8_t, 64>& handle) {
  (void)handle;
  PAGELLM_FAIL() << "the " << name() << " backend cannot open CUDA IPC memory handles: weight "
                 << "updates from another process's GPU memory need the cuda backend; send the "
                 << "weights as a safetensors folder (load_weights) or as host tensors instead";
}

void Backend::close_ipc_memory(void* base) { (void)base; }

void* Backend::allocate_host_pinned(size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  PAGELLM_CHECK(p != nullptr) << name() << " backend: out of host memory allocating " << bytes
                              << " bytes";
  return p;
}

void Backend::free_host_pinned(void* ptr) { std::free(ptr); }

double Backend::measure_host_to_device_bandwidth() {
  // Half of free memory at most, so that a full device still measures something.
  const size_t bytes =
      std::min<size_t>(size_t{256} << 20, std::max<size_t>(free_memory() / 2, size_t{1} << 20));
  void* host = allocate_host_pinned(bytes);
  std::vector<double> times;
  try {
    std::memset(host, 1, bytes);  // touch every page before timing
    DeviceBuffer device(this, bytes);
    for (int i = 0; i < 6; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      copy_to_device(device.get(), host, bytes);  // waits for the copy
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  } catch (...) {
    free_host_pinned(host);
    throw;
  }
  free_host_pinned(host);
  std::sort(times.begin() + 1, times.end());  // the first copy warms up, and is dropped
  return static_cast<double>(bytes) / times[3];
}

std::unique_ptr<Communicator> Backend::join_communicator(const std::vector<uint8_t>& id,
                                                         int rank, int size) {
  (void)id;
  PAGELLM_FAIL() << name() << " backend has no device collectives (rank " << rank << " of "
                 << size << "): use a host communicator";
}

void Backend::begin_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

std::unique_ptr<RecordedGraph> Backend::end_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

}  // namespace pagellm
