// Default implementations of the Backend interface: host sampling, a host-memory copy
// bandwidth, and a clear refusal of graph capture.
#include "pagellm/backend/backend.h"

#include <algorithm>
#include <chrono>
#include <vector>

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

void Backend::begin_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

std::unique_ptr<RecordedGraph> Backend::end_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

}  // namespace pagellm
