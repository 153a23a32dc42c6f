// The CUDA backend: device set-up and its failure messages, memory and transfers, batch
// metadata, and the dispatch of each Backend operation to its kernel (kernels.h,
// attention.h, sampling.h) or to cuBLASLt (matmul.h).
#include "pagellm/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "pagellm/attention/planner.h"
#include "pagellm/common/random.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_decode_variants.h"
#include "pagellm/cuda/support/cuda_check.h"
#if PAGELLM_HAVE_CUDNN
#include "pagellm/cuda/attention/cudnn_attention.h"
#endif
#include "pagellm/cuda/support/kernel_trace.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/matmul/matmul.h"
#include "pagellm/cuda/attention/page_table.h"
#include "pagellm/cuda/sampling/sampling.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {
namespace cuda {
namespace {

// cuBLASLt workspace: 32 MiB is what cuBLAS itself uses on Hopper.
constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;
// Decode attention's split-KV partials are sized for 8 splits of 256 query tokens of 64
// heads x 128 (~64 MiB): every Qwen3 up to 32B, and twice the tokens for 32 heads. Decode
// plans no more splits than fit, so a larger batch is still correct; it just splits less,
// which it does not need to once the batch alone fills the GPU.
constexpr int32_t kAttentionWorkspaceTokens = 256;
constexpr int32_t kAttentionWorkspaceHeads = 64;
constexpr int32_t kAttentionWorkspaceHeadDim = 128;
constexpr int32_t kAttentionWorkspaceSplits = 8;
// Host-to-device upload chunk (two pinned buffers of this size).
constexpr size_t kUploadChunkBytes = size_t{16} << 20;
// Batch metadata regions start on 64-byte boundaries.
constexpr int64_t kBatchAlign = 16;  // int32 elements

cudaStream_t as_stream(CUstream_st* s) { return s; }
cudaEvent_t as_event(CUevent_st* e) { return e; }

std::string format_bytes(size_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(bytes >= (size_t{1} << 30) ? 2 : 1);
  if (bytes >= (size_t{1} << 30)) {
    os << static_cast<double>(bytes) / double(size_t{1} << 30) << " GiB";
  } else {
    os << static_cast<double>(bytes) / double(size_t{1} << 20) << " MiB";
  }
  return os.str();
}

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

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

// Converts n elements from src (from) into dst (to) on the host, in parallel blocks.
void convert_on_host(const void* src, DType from, void* dst, DType to, int64_t n) {
  const size_t in_size = dtype_size(from), out_size = dtype_size(to);
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * in_size);
    return;
  }
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, count = std::min(kBlock, n - begin);
    const void* s = static_cast<const char*>(src) + begin * static_cast<int64_t>(in_size);
    void* d = static_cast<char*>(dst) + begin * static_cast<int64_t>(out_size);
    if (to == DType::F32) {
      convert_to_f32(s, from, static_cast<float*>(d), static_cast<size_t>(count));
    } else if (from == DType::F32) {
      convert_from_f32(static_cast<const float*>(s), d, to, static_cast<size_t>(count));
    } else {
      thread_local std::vector<float> tmp;
      tmp.resize(static_cast<size_t>(count));
      convert_to_f32(s, from, tmp.data(), static_cast<size_t>(count));
      convert_from_f32(tmp.data(), d, to, static_cast<size_t>(count));
    }
  }
}

bool is_float_type(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

/// A captured CUDA graph, replayed on the backend's stream.
class CudaGraph final : public RecordedGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// Why no device could be opened, for people rather than for CUDA experts.
[[noreturn]] void fail_no_device(cudaError_t err) {
  std::string reason;
  switch (err) {
    case cudaErrorNoDevice:
      reason = "no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      break;
    case cudaErrorInsufficientDriver:
      reason = "the NVIDIA driver is missing or older than this build's CUDA runtime needs "
               "(install or update the driver)";
      break;
    default:
      reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
               cudaGetErrorString(err) + ")";
  }
  PAGELLM_FAIL() << "cuda backend unavailable: " << reason << "; use the cpu backend instead";
}

// The crossover tables `auto` may use: the shipped data/attention (beside the binary or
// in the source tree it was built from), then `extra` ($PAGELLM_ATTENTION_TABLES).
std::vector<std::string> crossover_table_paths(const std::vector<std::string>& extra) {
  std::vector<std::string> found = shipped_crossover_table_paths();
  found.insert(found.end(), extra.begin(), extra.end());
#ifdef PAGELLM_SOURCE_DIR
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path source = fs::path(PAGELLM_SOURCE_DIR) / "data" / "attention";
  if (fs::is_directory(source, ec)) {
    bool listed = false;
    for (const std::string& p : found) listed = listed || fs::equivalent(p, source, ec);
    // Lowest priority: a bundle's own tables or the user's override win over it.
    if (!listed) found.insert(found.begin(), source.string());
  }
#endif
  return found;
}

}  // namespace

/// The attention dispatcher's per-backend state: the planner (rebuilt when the choice
/// changes), the tables it reads, the cuDNN plan cache, and this forward's plan.
struct AttentionRoute {
  AttentionBackendChoice choice = AttentionBackendChoice::kAuto;
  bool profiled = false;  // device profile and tables loaded (not for native)
  DeviceProfile device;
  CrossoverTables tables;
#if PAGELLM_HAVE_CUDNN
  std::unique_ptr<CudnnPlanCache> cudnn;
#endif
  std::unique_ptr<AttentionPlanner> planner;
  // A planner replaced during a forward (cuDNN failed under auto): `plan` may point into
  // it, so it lives until the forward ends.
  std::unique_ptr<AttentionPlanner> retired_planner;
  // This forward's plan (null between forwards) and the serial plan_attention gave it.
  const AttentionPlan* plan = nullptr;
  uint64_t serial = 0;
  uint64_t plans_made = 0;
  AttentionDomain domain;  // the shape `plan` was made for
  // The key `auto` requested in the last forward (rule 5), and that forward's last call:
  // a plan built for it at begin_capture is run once on those buffers before capturing.
  bool pending_valid = false;
  CudnnPlanKey pending_key;
  bool last_call_valid = false;
  PagedAttentionParams last_call;
  AttentionRouteStats stats;
};

// ---- set-up -----------------------------------------------------------------------------

CudaBackend::CudaBackend(int device, const CudaSettings& settings)
    : device_(device), settings_(settings) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess) {
    cudaGetLastError();
    fail_no_device(count_err);
  }
  if (count == 0) fail_no_device(cudaErrorNoDevice);
  PAGELLM_CHECK(device >= 0 && device < count)
      << "cuda backend unavailable: device " << device << " requested, but " << count
      << " CUDA device(s) are visible (valid: 0.." << count - 1 << ")";

  cudaDeviceProp prop{};
  PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  {
    std::ostringstream os;
    os << prop.name << " (device " << device << ", compute capability " << prop.major << "."
       << prop.minor << ", " << format_bytes(prop.totalGlobalMem) << ")";
    description_ = os.str();
  }
  PAGELLM_CHECK(prop.major >= 8)
      << "cuda backend unavailable: " << description_
      << " is not supported; the CUDA backend needs compute capability 8.0 or newer (bf16 "
         "tensor cores); use the cpu backend instead";
  total_memory_ = prop.totalGlobalMem;
  PAGELLM_CUDA_CHECK(cudaSetDevice(device));
  const cudaError_t image = probe_kernel_image();
  PAGELLM_CHECK(image == cudaSuccess)
      << "cuda backend unavailable: this build has no kernels that run on " << description_
      << " (" << cudaGetErrorString(image) << "); rebuild with "
      << "-DCMAKE_CUDA_ARCHITECTURES=" << prop.major << prop.minor << " (the default build "
      << "targets sm_90a, that is H100/H200)";

  try {
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    matmul_workspace_bytes_ = kMatmulWorkspaceBytes;
    matmul_workspace_ = allocate(matmul_workspace_bytes_);
    attention_workspace_bytes_ = paged_attention_workspace_bytes(
        kAttentionWorkspaceTokens, kAttentionWorkspaceHeads, kAttentionWorkspaceHeadDim,
        kAttentionWorkspaceSplits);
    attention_workspace_ = allocate(attention_workspace_bytes_);
    // Decode's split counters start at zero (attention.h); every call leaves them so.
    PAGELLM_CUDA_CHECK(cudaMemset(attention_workspace_, 0, attention_workspace_bytes_));
    matmul_ = std::make_unique<LtMatmul>(matmul_workspace_, matmul_workspace_bytes_,
                                         settings_.matmul_path, settings_.matmul_autotune);

    uint64_t table[kPruneTableSize];
    fill_prune_table(table);
    prune_table_ = static_cast<uint64_t*>(allocate(sizeof(table)));
    PAGELLM_CUDA_CHECK(cudaMemcpy(prune_table_, table, sizeof(table), cudaMemcpyHostToDevice));

    upload_chunk_bytes_ = kUploadChunkBytes;
    for (PinnedSlot& slot : upload_staging_) {
      PAGELLM_CUDA_CHECK(cudaHostAlloc(&slot.host, upload_chunk_bytes_, cudaHostAllocDefault));
      PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    for (PinnedSlot& slot : batch_staging_) {
      PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    BatchCapacity initial;
    initial.tokens = 256;
    initial.seqs = 64;
    initial.page_entries = 64 * 64;
    initial.rows = 64;
    grow_batch_buffers(initial);
  } catch (...) {
    release_all();
    throw;
  }
}

CudaBackend::~CudaBackend() { release_all(); }

void CudaBackend::release_all() noexcept {
  if (stream_ != nullptr) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;
      if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    }
    cudaStreamSynchronize(stream_);
  }
  attention_route_.reset();
  matmul_.reset();
  auto free_device = [](void* p) {
    if (p) cudaFree(p);
  };
  auto free_slot = [](PinnedSlot& slot) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.done) cudaEventDestroy(slot.done);
    slot = PinnedSlot{};
  };
  for (auto& entry : packed_) free_device(entry.second.data);
  packed_.clear();
  packed_bytes_ = 0;
  allocations_.clear();
  free_device(matmul_workspace_);
  free_device(attention_workspace_);
  free_device(prune_table_);
  free_device(batch_device_);
  free_device(page_table_);
  free_device(sampling_device_);
  free_device(sampling_scratch_);
  if (sampling_host_) cudaFreeHost(sampling_host_);
  for (PinnedSlot& slot : upload_staging_) free_slot(slot);
  for (PinnedSlot& slot : batch_staging_) free_slot(slot);
  matmul_workspace_ = attention_workspace_ = nullptr;
  prune_table_ = nullptr;
  batch_device_ = nullptr;
  page_table_ = nullptr;
  sampling_device_ = sampling_host_ = nullptr;
  sampling_scratch_ = nullptr;
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  cudaGetLastError();  // nothing above may leave an error for a later check to misreport
}

size_t CudaBackend::free_memory() const {
  size_t free_bytes = 0, total_bytes = 0;
  PAGELLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PAGELLM_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream_), &status));
  return status != cudaStreamCaptureStatusNone;
}

// ---- memory ---------------------------------------------------------------------------

void* CudaBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky; clear it so the next launch check does not see it
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    PAGELLM_FAIL() << "out of GPU memory: cannot allocate " << format_bytes(bytes) << " on "
                   << description_ << "; " << format_bytes(free_bytes) << " of "
                   << format_bytes(total_bytes)
                   << " are free (use a smaller model, fewer KV pages or a shorter context)";
  }
  PAGELLM_CUDA_CHECK(err);
  allocations_[ptr] = bytes;
  return ptr;
}

void CudaBackend::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  // The packed copies of matrices inside this buffer go with it (a later allocation at the
  // same address must not find them).
  const auto alloc = allocations_.find(ptr);
  if (alloc != allocations_.end()) {
    const auto* begin = static_cast<const char*>(ptr);
    const char* end = begin + alloc->second;
    allocations_.erase(alloc);
    for (auto it = packed_.begin(); it != packed_.end();) {
      const auto* key = static_cast<const char*>(it->first);
      it = key >= begin && key < end ? drop_packed(it) : std::next(it);
    }
  }
  // Called from destructors: report, never throw.
  const cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "pagellm: cudaFree failed: %s\n", cudaGetErrorString(err));
  }
}

CudaBackend::PackedMap::iterator CudaBackend::drop_packed(PackedMap::iterator it) {
  void* copy = it->second.data;
  packed_bytes_ -= it->second.bytes;
  it = packed_.erase(it);
  deallocate(copy);
  return it;
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream_)));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream_)));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

void CudaBackend::synchronize() { PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_))); }

void CudaBackend::upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                         int64_t n) {
  PAGELLM_CHECK(n >= 0 && dst_offset >= 0 && dst_offset + n <= dst.numel())
      << "cuda backend: upload of " << n << " elements at offset " << dst_offset
      << " does not fit tensor " << dst.shape_string();
  if (n == 0) return;
  PAGELLM_CHECK(dst.data != nullptr && src != nullptr)
      << "cuda backend: upload needs a destination and a source";
  if (!is_float_type(dst.dtype) || !is_float_type(src_dtype)) {
    PAGELLM_CHECK(dst.dtype == src_dtype)
        << "cuda backend: cannot upload " << dtype_name(src_dtype) << " into "
        << dtype_name(dst.dtype) << " (float types convert among float32, bfloat16 and "
        << "float16; integer types must match)";
  }
  const size_t in_size = dtype_size(src_dtype), out_size = dtype_size(dst.dtype);
  const int64_t chunk = static_cast<int64_t>(upload_chunk_bytes_ / out_size);
  char* dst_base = static_cast<char*>(dst.data) + dst_offset * static_cast<int64_t>(out_size);
  int index = 0;
  for (int64_t begin = 0; begin < n; begin += chunk, ++index) {
    const int64_t count = std::min(chunk, n - begin);
    PinnedSlot& slot = upload_staging_[index % 2];
    // The copy that last read this staging buffer must be done before it is refilled.
    PAGELLM_CUDA_CHECK(cudaEventSynchronize(as_event(slot.done)));
    convert_on_host(static_cast<const char*>(src) + begin * static_cast<int64_t>(in_size),
                    src_dtype, slot.host, dst.dtype, count);
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst_base + begin * static_cast<int64_t>(out_size),
                                       slot.host, static_cast<size_t>(count) * out_size,
                                       cudaMemcpyHostToDevice, as_stream(stream_)));
    PAGELLM_CUDA_CHECK(cudaEventRecord(as_event(slot.done), as_stream(stream_)));
  }
}

std::vector<float> CudaBackend::download_f32(const Tensor& src) {
  const size_t n = static_cast<size_t>(src.numel());
  std::vector<float> out(n);
  if (n == 0) return out;
  expect_data(src, "download_f32", "source");
  std::vector<unsigned char> raw(src.nbytes());
  copy_to_host(raw.data(), src.data, raw.size());
  switch (src.dtype) {
    case DType::I32: {
      const auto* v = reinterpret_cast<const int32_t*>(raw.data());
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
      break;
    }
    case DType::I64: {
      const auto* v = reinterpret_cast<const int64_t*>(raw.data());
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
      break;
    }
    default: convert_to_f32(raw.data(), src.dtype, out.data(), n);
  }
  return out;
}

void CudaBackend::fill(Tensor& t, float value) {
  expect_data(t, "fill", "target");
  launch_fill(t.data, t.dtype, t.numel(), value, as_stream(stream_));
}

std::string CudaBackend::begin_kernel_trace() { return cuda::begin_kernel_trace(); }

std::vector<KernelSpan> CudaBackend::end_kernel_trace() {
  synchronize();  // every traced kernel has finished and its record can be flushed
  return cuda::end_kernel_trace();
}

double CudaBackend::measure_copy_bandwidth() {
  PAGELLM_CHECK(!capturing()) << "cuda backend: cannot measure bandwidth during graph capture";
  // Large enough that launch latency is noise; halve while memory is short (the KV cache
  // may already hold most of it).
  for (size_t bytes = size_t{1} << 30; bytes >= (size_t{16} << 20); bytes /= 2) {
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (a) cudaFree(a);
      continue;
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    std::vector<float> ms;
    try {
      PAGELLM_CUDA_CHECK(cudaEventCreate(&start));
      PAGELLM_CUDA_CHECK(cudaEventCreate(&stop));
      cudaStream_t s = as_stream(stream_);
      PAGELLM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
      for (int i = 0; i < 5; ++i) {
        PAGELLM_CUDA_CHECK(cudaEventRecord(start, s));
        PAGELLM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        PAGELLM_CUDA_CHECK(cudaEventRecord(stop, s));
        PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0.0f;
        PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        ms.push_back(elapsed);
      }
    } catch (...) {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
      cudaFree(a);
      cudaFree(b);
      throw;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    std::sort(ms.begin(), ms.end());
    return 2.0 * static_cast<double>(bytes) / (static_cast<double>(ms[ms.size() / 2]) * 1e-3);
  }
  PAGELLM_FAIL() << "cuda backend: not even 32 MiB of GPU memory free to measure bandwidth";
}

// ---- batch metadata -------------------------------------------------------------------------

CudaBackend::BatchLayout CudaBackend::batch_layout() const {
  BatchLayout l{};
  int64_t at = 0;
  auto region = [&at](int64_t elements) {
    const int64_t start = at;
    at += align_up(std::max<int64_t>(elements, 1), kBatchAlign);
    return static_cast<size_t>(start);
  };
  l.token_ids = region(cap_tokens_);
  l.positions = region(cap_tokens_);
  l.slot_mapping = region(cap_tokens_);
  l.query_start = region(cap_seqs_ + 1);
  l.kv_lens = region(cap_seqs_);
  l.logits_indices = region(cap_rows_);
  // The persistent page table's inputs (sized only once a persistent batch has come, so
  // that the dense path's copy stays as small as before), then the page table last: the
  // dense path copies up to its used part, the persistent path up to the used values.
  l.seq_slots = region(cap_slots_);
  l.page_runs = region(4 * cap_runs_);
  l.page_values = region(cap_values_);
  l.page_table = region(cap_page_entries_);
  l.total = static_cast<size_t>(at);
  return l;
}

void CudaBackend::grow_batch_buffers(const BatchCapacity& need) {
  if (need.tokens <= cap_tokens_ && need.seqs <= cap_seqs_ &&
      need.page_entries <= cap_page_entries_ && need.rows <= cap_rows_ &&
      need.slots <= cap_slots_ && need.runs <= cap_runs_ && need.values <= cap_values_ &&
      batch_device_ != nullptr) {
    return;
  }
  PAGELLM_CHECK(!capturing())
      << "cuda backend: the batch metadata buffers must grow, which cannot happen during "
         "graph capture; call reserve_batch() with the largest batch before capturing";
  // Grow geometrically so that a slowly growing workload reallocates rarely.
  auto grown = [](int64_t need, int64_t have) { return need <= have ? have : std::max(need, 2 * have); };
  const int64_t new_tokens = grown(need.tokens, cap_tokens_);
  const int64_t new_seqs = grown(need.seqs, cap_seqs_);
  const int64_t new_pages = grown(need.page_entries, cap_page_entries_);
  const int64_t new_rows = grown(need.rows, cap_rows_);
  const int64_t new_slots = grown(need.slots, cap_slots_);
  const int64_t new_runs = grown(need.runs, cap_runs_);
  const int64_t new_values = grown(need.values, cap_values_);
  // Everything that reads the old buffers must be done before they are freed.
  synchronize();
  cap_tokens_ = new_tokens;
  cap_seqs_ = new_seqs;
  cap_page_entries_ = new_pages;
  cap_rows_ = new_rows;
  cap_slots_ = new_slots;
  cap_runs_ = new_runs;
  cap_values_ = new_values;
  const size_t bytes = batch_layout().total * sizeof(int32_t);
  try {
    deallocate(batch_device_);
    batch_device_ = nullptr;
    batch_device_ = static_cast<int32_t*>(allocate(bytes));
    for (PinnedSlot& slot : batch_staging_) {
      if (slot.host) cudaFreeHost(slot.host);
      slot.host = nullptr;
      PAGELLM_CUDA_CHECK(cudaHostAlloc(&slot.host, bytes, cudaHostAllocDefault));
    }
  } catch (...) {
    // Leave no half-grown state: the next upload_batch allocates afresh.
    deallocate(batch_device_);
    batch_device_ = nullptr;
    for (PinnedSlot& slot : batch_staging_) {
      if (slot.host) cudaFreeHost(slot.host);
      slot.host = nullptr;
    }
    cap_tokens_ = cap_seqs_ = cap_page_entries_ = cap_rows_ = 0;
    cap_slots_ = cap_runs_ = cap_values_ = 0;
    throw;
  }
}

void CudaBackend::reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                                int32_t max_rows) {
  PAGELLM_CHECK(max_tokens >= 0 && max_seqs >= 0 && max_pages_per_seq >= 0 && max_rows >= 0)
      << "cuda backend: reserve_batch needs non-negative sizes";
  reserved_seqs_ = std::max<int64_t>(reserved_seqs_, max_seqs);
  reserved_pages_per_seq_ = std::max<int64_t>(reserved_pages_per_seq_, max_pages_per_seq);
  BatchCapacity need;
  need.tokens = max_tokens;
  need.seqs = max_seqs;
  need.page_entries = int64_t{max_seqs} * max_pages_per_seq;
  need.rows = max_rows;
  if (cap_slots_ > 0) need = with_persistent_reserve(need);
  grow_batch_buffers(need);
}

CudaBackend::BatchCapacity CudaBackend::with_persistent_reserve(BatchCapacity need) const {
  // A step of the reserved batch may rewrite every row it holds, in up to four runs per
  // sequence, without growing the buffers (which would invalidate captured graphs).
  need.slots = std::max(need.slots, reserved_seqs_);
  need.runs = std::max(need.runs, 4 * reserved_seqs_ + 16);
  need.values = std::max(need.values, reserved_seqs_ * reserved_pages_per_seq_);
  return need;
}

void CudaBackend::ensure_page_table(int64_t rows, int64_t cols) {
  if (rows <= table_rows_ && cols <= table_cols_ && page_table_ != nullptr) return;
  const int64_t new_rows = std::max(rows, table_rows_), new_cols = std::max(cols, table_cols_);
  const size_t bytes = static_cast<size_t>(new_rows * new_cols) * sizeof(int32_t);
  auto* grown = static_cast<int32_t*>(allocate(bytes));
  cudaStream_t s = as_stream(stream_);
  // Zero-filled (row 0 and every entry not yet written read as page 0), then the old
  // table's rows copied in, so that a wider or taller table keeps what the engine sent.
  try {
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(grown, 0, bytes, s));
    if (page_table_ != nullptr) {
      PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(
          grown, static_cast<size_t>(new_cols) * sizeof(int32_t), page_table_,
          static_cast<size_t>(table_cols_) * sizeof(int32_t),
          static_cast<size_t>(table_cols_) * sizeof(int32_t), static_cast<size_t>(table_rows_),
          cudaMemcpyDeviceToDevice, s));
    }
    synchronize();
  } catch (...) {
    deallocate(grown);
    throw;
  }
  deallocate(page_table_);
  page_table_ = grown;
  table_rows_ = new_rows;
  table_cols_ = new_cols;
}

BatchTensors CudaBackend::upload_batch(const ForwardBatch& batch) {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  const int64_t R = static_cast<int64_t>(batch.logits_indices.size());
  const int64_t P = static_cast<int64_t>(batch.page_table.size());
  const bool persistent = !batch.seq_slots.empty();
  PAGELLM_CHECK(static_cast<int64_t>(batch.positions.size()) == T &&
                static_cast<int64_t>(batch.slot_mapping.size()) == T)
      << "cuda backend: upload_batch: token_ids, positions and slot_mapping differ in length ("
      << T << ", " << batch.positions.size() << ", " << batch.slot_mapping.size() << ")";
  PAGELLM_CHECK(static_cast<int64_t>(batch.query_start.size()) == B + 1)
      << "cuda backend: upload_batch: query_start has " << batch.query_start.size()
      << " entries for " << B << " sequences (need " << B + 1 << ")";
  if (persistent) {
    check_persistent_page_table(batch);
  } else {
    PAGELLM_CHECK(batch.max_pages_per_seq >= 0 && P == B * batch.max_pages_per_seq)
        << "cuda backend: upload_batch: page table has " << P << " entries, expected " << B
        << " x " << batch.max_pages_per_seq;
  }
  PAGELLM_CHECK(!capturing())
      << "cuda backend: upload_batch copies to the device and cannot be captured in a graph; "
         "upload before capture or replay";
  attention_between_forwards(false);
  const int64_t U = static_cast<int64_t>(batch.page_table_updates.size());
  const int64_t NV = static_cast<int64_t>(batch.page_table_values.size());
  const int64_t table_entries = B * batch.max_pages_per_seq;
  BatchCapacity need;
  need.tokens = T;
  need.seqs = B;
  need.page_entries = table_entries;
  need.rows = R;
  if (persistent) {
    need.slots = B;
    need.runs = U;
    need.values = NV;
    // The first persistent batch sizes the persistent regions for the reserved batch too.
    if (cap_slots_ == 0) need = with_persistent_reserve(need);
    ensure_page_table(batch.page_table_rows, batch.max_pages_per_seq);
  }
  grow_batch_buffers(need);
  const BatchLayout l = batch_layout();

  PinnedSlot& slot = batch_staging_[batch_slot_];
  batch_slot_ ^= 1;
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(as_event(slot.done)));
  auto* staged = static_cast<int32_t*>(slot.host);
  auto put = [staged](size_t offset, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(staged + offset, v.data(), v.size() * sizeof(int32_t));
  };
  put(l.token_ids, batch.token_ids);
  put(l.positions, batch.positions);
  put(l.slot_mapping, batch.slot_mapping);
  put(l.query_start, batch.query_start);
  put(l.kv_lens, batch.kv_lens);
  put(l.logits_indices, batch.logits_indices);
  size_t used = 0;
  bool runs_overlap = false;
  if (persistent) {
    put(l.seq_slots, batch.seq_slots);
    // Runs as {row, begin, end, offset into the values}; a row named twice makes the
    // runs order-dependent (applied one after another on the device).
    int32_t* runs = staged + l.page_runs;
    int32_t offset = 0;
    ++run_stamp_;
    if (run_seen_.size() < static_cast<size_t>(batch.page_table_rows)) {
      run_seen_.resize(static_cast<size_t>(batch.page_table_rows), 0);
    }
    for (int64_t u = 0; u < U; ++u) {
      const PageTableUpdate& up = batch.page_table_updates[static_cast<size_t>(u)];
      runs[4 * u + 0] = up.row;
      runs[4 * u + 1] = up.begin;
      runs[4 * u + 2] = up.end;
      runs[4 * u + 3] = offset;
      offset += up.end - up.begin;
      uint64_t& seen = run_seen_[static_cast<size_t>(up.row)];
      runs_overlap = runs_overlap || seen == run_stamp_;
      seen = run_stamp_;
    }
    put(l.page_values, batch.page_table_values);
    used = (l.page_values + static_cast<size_t>(NV)) * sizeof(int32_t);
  } else {
    put(l.page_table, batch.page_table);
    used = (l.page_table + static_cast<size_t>(P)) * sizeof(int32_t);
  }
  cudaStream_t s = as_stream(stream_);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(batch_device_, staged, used, cudaMemcpyHostToDevice, s));
  PAGELLM_CUDA_CHECK(cudaEventRecord(as_event(slot.done), s));
  if (persistent) {
    // Outside any graph, before the forward: the table takes this step's changes, then
    // the batch's rows are gathered where the dense path would have copied them.
    launch_apply_page_table_runs(page_table_, table_cols_, batch_device_ + l.page_runs,
                                 static_cast<int32_t>(U), batch_device_ + l.page_values,
                                 runs_overlap, s);
    launch_gather_page_table_rows(page_table_, table_cols_, batch_device_ + l.seq_slots,
                                  static_cast<int32_t>(B), batch_device_ + l.page_table,
                                  batch.max_pages_per_seq, s);
  }

  BatchTensors bt;
  bt.host = &batch;
  bt.token_ids = Tensor(batch_device_ + l.token_ids, DType::I32, {T});
  bt.positions = Tensor(batch_device_ + l.positions, DType::I32, {T});
  bt.slot_mapping = Tensor(batch_device_ + l.slot_mapping, DType::I32, {T});
  bt.query_start = Tensor(batch_device_ + l.query_start, DType::I32, {B + 1});
  bt.kv_lens = Tensor(batch_device_ + l.kv_lens, DType::I32, {B});
  bt.page_table = Tensor(batch_device_ + l.page_table, DType::I32, {B, batch.max_pages_per_seq});
  bt.logits_indices = Tensor(batch_device_ + l.logits_indices, DType::I32, {R});
  return bt;
}

void CudaBackend::check_persistent_page_table(const ForwardBatch& batch) const {
  const int64_t B = batch.num_seqs();
  const int64_t rows = batch.page_table_rows, cols = batch.max_pages_per_seq;
  PAGELLM_CHECK(batch.page_table.empty())
      << "cuda backend: upload_batch: a batch with seq_slots (the persistent page table) must "
         "leave page_table empty, got "
      << batch.page_table.size() << " entries";
  PAGELLM_CHECK(static_cast<int64_t>(batch.seq_slots.size()) == B)
      << "cuda backend: upload_batch: " << batch.seq_slots.size() << " seq_slots for " << B
      << " sequences (need one per sequence)";
  PAGELLM_CHECK(rows >= 1 && cols >= 0 && rows * std::max<int64_t>(cols, 1) <= INT32_MAX)
      << "cuda backend: upload_batch: a persistent page table of " << rows << " rows x "
      << cols << " pages is not accepted (need at least 1 row, the reserved row 0, and "
      << "fewer than 2^31 entries)";
  for (int64_t b = 0; b < B; ++b) {
    const int32_t slot = batch.seq_slots[static_cast<size_t>(b)];
    PAGELLM_CHECK(slot >= 0 && slot < rows)
        << "cuda backend: upload_batch: seq_slots[" << b << "] = " << slot
        << " is not a row of the persistent page table [0, " << rows << ")";
  }
  int64_t values = 0;
  for (size_t u = 0; u < batch.page_table_updates.size(); ++u) {
    const PageTableUpdate& up = batch.page_table_updates[u];
    PAGELLM_CHECK(up.row >= 1 && up.row < rows && up.begin >= 0 && up.begin <= up.end &&
                  up.end <= cols)
        << "cuda backend: upload_batch: page_table_updates[" << u << "] (row " << up.row
        << ", entries [" << up.begin << ", " << up.end << ")) is outside the table (rows 1.."
        << rows - 1 << ", row 0 being the reserved all-zero row; entries within [0, " << cols
        << "))";
    values += up.end - up.begin;
  }
  PAGELLM_CHECK(values == static_cast<int64_t>(batch.page_table_values.size()))
      << "cuda backend: upload_batch: page_table_updates cover " << values
      << " entries but page_table_values holds " << batch.page_table_values.size();
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
               N, K, as_stream(stream_), packed_for(w, 0));
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

namespace {

AttentionDomain attention_domain(const AttentionShape& shape) {
  AttentionDomain domain;
  domain.dtype = DType::BF16;
  domain.num_q_heads = static_cast<int32_t>(shape.num_q_heads);
  domain.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
  domain.head_dim = static_cast<int32_t>(shape.head_dim);
  domain.page_size = static_cast<int32_t>(shape.page_size);
  domain.scale = shape.scale;
  return domain;
}

}  // namespace

AttentionPlanRef CudaBackend::plan_attention(const BatchTensors& batch,
                                             const AttentionShape& shape, const LayerKv& kv) {
  PAGELLM_CHECK(batch.host != nullptr)
      << "cuda backend: plan_attention needs the batch's host metadata (BatchTensors::host)";
  PAGELLM_CHECK(kv.k.ndim == 4)
      << "cuda backend: plan_attention: KV pools " << kv.k.shape_string()
      << " are not [pages, kv heads, page size, head_dim]";
  const ForwardBatch& host = *batch.host;
  AttentionRoute& r = attention_route();
  r.domain = attention_domain(shape);
#if PAGELLM_HAVE_CUDNN
  if (r.cudnn && r.cudnn->num_pages() != kv.k.size(0)) r.cudnn->set_num_pages(kv.k.size(0));
#endif
  // Graph mode whenever the forward may be replayed: the decision must then hold for every
  // replay (and never routes a ragged batch, whose arrays are uploaded per forward).
  const LaunchMode mode =
      host.kv_len_capacity > 0 || capturing() ? LaunchMode::kGraph : LaunchMode::kEager;
  AttentionBatchView view = batch_view(host);
  // The persistent page table leaves ForwardBatch::page_table empty; the device table the
  // kernels read is [B, max_pages_per_seq] all the same (gathered by upload_batch).
  if (!host.seq_slots.empty()) {
    view.page_table_size = static_cast<size_t>(host.num_seqs()) *
                           static_cast<size_t>(std::max(host.max_pages_per_seq, 0));
  }
  r.plan = &r.planner->plan(r.domain, view, mode);
  r.serial = ++r.plans_made;
  ++r.stats.forwards_planned;
  r.pending_valid = r.plan->decided_by == static_cast<int>(AdmissionRule::kPlanReady);
  if (r.pending_valid) r.pending_key = r.plan->cudnn_key;
#if PAGELLM_HAVE_CUDNN
  if (r.plan->provider == AttentionProvider::kCudnn) r.cudnn->upload(*r.plan, as_stream(stream_));
#endif
  AttentionPlanRef ref;
  ref.serial = r.serial;
  ref.plan = r.plan;
  return ref;
}

void CudaBackend::attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                            const BatchTensors& batch, const AttentionPlanRef& plan,
                            Tensor& out) {
  const char* op = "attention";
  expect_dtype(q, DType::BF16, op, "q");
  expect_dtype(out, DType::BF16, op, "output");
  expect_dtype(kv.k, DType::BF16, op, "K pool");
  expect_dtype(kv.v, DType::BF16, op, "V pool");
  PAGELLM_CHECK(batch.host != nullptr)
      << "cuda backend: attention needs the batch's host metadata (BatchTensors::host)";
  const ForwardBatch& host = *batch.host;
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t T = q.ndim == 0 ? 0 : q.size(0);
  PAGELLM_CHECK(q.numel() == T * Hq * D && out.numel() == T * Hq * D)
      << "cuda backend: attention: q " << q.shape_string() << " and output "
      << out.shape_string() << " are not [" << T << ", " << Hq << " x " << D << "]";
  PAGELLM_CHECK(kv.k.ndim == 4 && kv.k.size(1) == Hkv && kv.k.size(2) == shape.page_size &&
                kv.k.size(3) == D && kv.v.numel() == kv.k.numel())
      << "cuda backend: attention: KV pools " << kv.k.shape_string() << " are not [pages, "
      << Hkv << ", " << shape.page_size << ", " << D << "]";
  PAGELLM_CHECK(batch.page_table.ndim == 2 && batch.query_start.numel() == batch.kv_lens.numel() + 1)
      << "cuda backend: attention: malformed batch tensors (page table "
      << batch.page_table.shape_string() << ", " << batch.query_start.numel()
      << " query offsets for " << batch.kv_lens.numel() << " sequences)";
  // The plan must be this forward's: upload_batch and begin_capture end a forward.
  AttentionRoute& r = attention_route();
  PAGELLM_CHECK(plan.serial != 0 && r.plan != nullptr && plan.serial == r.serial &&
                plan.plan == r.plan)
      << "cuda backend: attention needs this forward's plan: call plan_attention once per "
         "forward, after upload_batch (and begin_capture), and pass its result to every "
         "layer (got "
      << (plan.serial == 0 ? std::string("no plan") : "the plan of an earlier forward") << ")";
  PAGELLM_CHECK(attention_domain(shape) == r.domain)
      << "cuda backend: attention: the layer's shape (" << Hq << " q heads, " << Hkv
      << " kv heads, head_dim " << D << ", page size " << shape.page_size
      << ") is not the one plan_attention was given";
  if (T == 0) return;
  PagedAttentionParams p;
  p.q = q.data;
  p.k_pool = kv.k.data;
  p.v_pool = kv.v.data;
  p.out = out.data;
  p.query_start = batch.query_start.ptr<int32_t>();
  p.kv_lens = batch.kv_lens.ptr<int32_t>();
  p.page_table = batch.page_table.ptr<int32_t>();
  p.num_seqs = static_cast<int32_t>(batch.kv_lens.numel());
  p.num_tokens = static_cast<int32_t>(T);
  p.num_q_heads = static_cast<int32_t>(Hq);
  p.num_kv_heads = static_cast<int32_t>(Hkv);
  p.head_dim = static_cast<int32_t>(D);
  p.page_size = static_cast<int32_t>(shape.page_size);
  p.max_pages_per_seq = static_cast<int32_t>(batch.page_table.size(1));
  p.num_pages = static_cast<int32_t>(kv.k.size(0));
  const int32_t max_query_len = host.num_seqs() > 0 ? host.max_query_len() : 0;
  p.max_query_len = max_query_len;
  p.max_kv_len = std::max(host.kv_len_capacity, host.num_seqs() > 0 ? host.max_kv_len() : 0);
  p.scale = shape.scale;
  p.workspace = attention_workspace_;
  p.workspace_bytes = attention_workspace_bytes_;
  p.num_splits = 0;

  r.last_call = p;
  r.last_call_valid = true;
#if PAGELLM_HAVE_CUDNN
  // After a cuDNN failure under auto (choice now native), the rest of the forward runs
  // natively although its plan said cuDNN.
  if (r.plan->provider == AttentionProvider::kCudnn && r.choice != AttentionBackendChoice::kNative) {
    try {
      r.cudnn->run(p, *r.plan, as_stream(stream_));
      ++r.stats.cudnn_calls;
      return;
    } catch (const Error& e) {
      if (r.choice == AttentionBackendChoice::kCudnn) throw;
      // auto never fails because of cuDNN: this call and every later one run natively.
      std::fprintf(stderr,
                   "pagellm: warning: cuDNN attention failed (%s); --attention-backend auto "
                   "continues with the native kernels\n",
                   e.what());
      r.choice = AttentionBackendChoice::kNative;
      AttentionPlannerConfig native;
      native.choice = AttentionBackendChoice::kNative;
      // r.plan points into the old planner: keep it until the forward ends.
      r.retired_planner = std::move(r.planner);
      r.planner = std::make_unique<AttentionPlanner>(native);
      r.pending_valid = false;
    }
  }
#endif
  ++r.stats.native_calls;
  if (max_query_len <= 1) {
    paged_decode_attention_with(p, settings_.decode_kernel, as_stream(stream_));
  } else {
    paged_prefill_attention(p, as_stream(stream_));
  }
}

// ---- attention dispatch -------------------------------------------------------------------

AttentionRoute& CudaBackend::attention_route() {
  if (!attention_route_) {
    attention_route_ = std::make_unique<AttentionRoute>();
    configure_attention(AttentionBackendChoice::kAuto);
  }
  return *attention_route_;
}

void CudaBackend::set_attention_backend(const std::string& choice) {
  const AttentionBackendChoice c = parse_attention_backend(choice);
  PAGELLM_CHECK(!capturing())
      << "cuda backend: the attention backend cannot change during graph capture";
  configure_attention(c);
}

void CudaBackend::configure_attention(AttentionBackendChoice c) {
#if PAGELLM_HAVE_CUDNN
  if (c == AttentionBackendChoice::kCudnn) {
    const CudnnLibrary& lib = cudnn_library();
    PAGELLM_CHECK(lib.version > 0)
        << "--attention-backend cudnn: " << lib.error
        << ". Use --attention-backend auto (falls back to the native kernels) or native";
  }
#else
  PAGELLM_CHECK(c != AttentionBackendChoice::kCudnn)
      << "--attention-backend cudnn: this build has no cuDNN route (cudnn-frontend was not "
         "found when it was built: pip install --no-deps nvidia-cudnn-frontend==1.32.0, then "
         "reconfigure). Use --attention-backend auto or native";
#endif
  if (!attention_route_) attention_route_ = std::make_unique<AttentionRoute>();
  AttentionRoute& r = *attention_route_;
  r.choice = c;
  if (c != AttentionBackendChoice::kNative && !r.profiled) {
    r.profiled = true;
#if PAGELLM_HAVE_CUDNN
    r.device = cuda_device_profile(device_);  // loads cuDNN (dlopen) if it can
    r.cudnn = std::make_unique<CudnnPlanCache>(device_);
#else
    cudaDeviceProp prop{};
    PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    r.device.name = prop.name;
    r.device.sm_count = prop.multiProcessorCount;
    r.device.cc_major = prop.major;
    r.device.cc_minor = prop.minor;
#endif
    try {
      r.tables = CrossoverTables::load(crossover_table_paths(settings_.attention_tables));
    } catch (const Error& e) {
      // A broken table is reported, and `auto` stays native rather than failing.
      std::fprintf(stderr,
                   "pagellm: warning: attention crossover tables not used (auto stays native): "
                   "%s\n",
                   e.what());
      r.tables = CrossoverTables{};
    }
  }
  AttentionPlannerConfig config;
  config.choice = c;
  config.device = r.device;
  config.tables = &r.tables;
#if PAGELLM_HAVE_CUDNN
  config.registry = r.cudnn.get();
#endif
  r.planner = std::make_unique<AttentionPlanner>(config);
  r.retired_planner.reset();
  r.plan = nullptr;
  r.serial = 0;
  r.pending_valid = false;
}

void CudaBackend::attention_between_forwards(bool before_capture) {
  if (!attention_route_) return;
  AttentionRoute& r = *attention_route_;
#if PAGELLM_HAVE_CUDNN
  if (r.cudnn && r.cudnn->num_requested() > 0) {
    const size_t before = r.cudnn->num_plans();
    const std::vector<std::string> refused = r.cudnn->build_requested();
    r.stats.plans_built += static_cast<int64_t>(r.cudnn->num_plans() - before);
    r.stats.plans_refused += static_cast<int64_t>(refused.size());
    // Before a capture: run each new plan once on the forward just run, so that cuDNN
    // loads its kernels outside the capture. Dense (decode) plans only: a ragged one
    // would need that forward's arrays, and graphs never route ragged batches to cuDNN.
    if (before_capture && r.pending_valid && r.last_call_valid && !r.pending_key.ragged &&
        r.cudnn->has_plan(r.pending_key)) {
      AttentionPlan warm;
      warm.provider = AttentionProvider::kCudnn;
      warm.cudnn_key = r.pending_key;
      try {
        r.cudnn->run(r.last_call, warm, as_stream(stream_));
        synchronize();
        ++r.stats.warmups;
      } catch (const Error& e) {
        std::fprintf(stderr, "pagellm: warning: cuDNN attention warm-up failed: %s\n",
                     e.what());
      }
    }
  }
#else
  (void)before_capture;
#endif
  r.pending_valid = false;
  // The buffers of the last call may be reused or regrown by the next upload, and the
  // forward's plan ends with it.
  r.last_call_valid = false;
  r.plan = nullptr;
  r.serial = 0;
  r.retired_planner.reset();
}

std::string CudaBackend::attention_backend() const {
  return choice_name(attention_route_ ? attention_route_->choice : AttentionBackendChoice::kAuto);
}

AttentionRouteStats CudaBackend::attention_route_stats() const {
  return attention_route_ ? attention_route_->stats : AttentionRouteStats{};
}

const AttentionPlan* CudaBackend::last_attention_plan() const {
  return attention_route_ && attention_route_->planner &&
                 attention_route_->stats.forwards_planned > 0
             ? &attention_route_->planner->last_plan()
             : nullptr;
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

void CudaBackend::matmul_qk_norm_rope_store_kv(const Tensor& x, const Tensor& w_qkv, Tensor& qkv,
                                               const Tensor& q_norm, const Tensor& k_norm,
                                               float eps, const RopeParams& rope,
                                               const AttentionShape& shape,
                                               const BatchTensors& batch, Tensor& q_out,
                                               LayerKv& kv) {
  // Fused when the product would take the skinny kernel (decode batches), heads are the
  // kernel's 128-row tiles and every operand has the shape and type the fused kernel
  // writes; otherwise the two ops, which check their operands and name what is wrong.
  // PAGELLM_DISABLE_QKV_FUSION=1 (settings_.qkv_fusion false) keeps them apart (an
  // ablation switch).
  const bool fusion_off = !settings_.qkv_fusion;
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t T = x.ndim == 0 ? 0 : x.size(0);
  const int64_t N = (Hq + 2 * Hkv) * D;
  const auto bf16 = [](const Tensor& t) { return t.dtype == DType::BF16; };
  const bool fusable =
      !fusion_off && D == kSkinnyQkHeadDim && (rope.head_dim == 0 || rope.head_dim == D) &&
      Hq > 0 && Hkv > 0 && Hq % Hkv == 0 && shape.page_size > 0 && bf16(x) && bf16(w_qkv) &&
      bf16(q_norm) && bf16(k_norm) && bf16(q_out) && bf16(kv.k) && bf16(kv.v) && x.ndim >= 1 &&
      T > 0 && w_qkv.ndim == 2 && w_qkv.size(0) == N && w_qkv.size(1) == x.row_elems() &&
      x.row_elems() > 0 && q_norm.numel() == D && k_norm.numel() == D &&
      q_out.numel() == T * Hq * D && batch.positions.numel() == T &&
      batch.slot_mapping.numel() == T && kv.k.ndim == 4 && kv.k.size(0) > 0 &&
      kv.k.size(1) == Hkv && kv.k.size(2) == shape.page_size && kv.k.size(3) == D &&
      kv.v.numel() == kv.k.numel() && kv.v.size(0) == kv.k.size(0) &&
      matmul_->path_for(x.data, w_qkv.data, q_out.data, CUDA_R_16BF, T, N, x.row_elems()) ==
          MatmulPath::kSkinny;
  if (!fusable) {
    Backend::matmul_qk_norm_rope_store_kv(x, w_qkv, qkv, q_norm, k_norm, eps, rope, shape, batch,
                                          q_out, kv);
    return;
  }
  const QkNormRopeArgs e =
      qk_norm_rope_args(nullptr, q_norm, k_norm, eps, rope, shape, batch, T, q_out, kv);
  launch_skinny_gemm_qk_norm_rope(x.data, w_qkv.data, T, x.row_elems(), e, as_stream(stream_),
                                  0, packed_for(w_qkv, 0));
}

void CudaBackend::matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up,
                                  Tensor& out) {
  // Fused when the product would take the skinny kernel (decode batches) and every operand
  // has the shape and type the fused kernel writes; otherwise the two ops, which check
  // their operands and name what is wrong.
  const bool fusable = x.dtype == DType::BF16 && w_gate_up.dtype == DType::BF16 &&
                       out.dtype == DType::BF16 && x.ndim >= 1 && w_gate_up.ndim == 2 &&
                       out.ndim >= 1 && out.size(0) == x.size(0) &&
                       w_gate_up.size(0) == 2 * out.row_elems() &&
                       w_gate_up.size(1) == x.row_elems() && x.row_elems() > 0;
  if (fusable && matmul_->run_silu_mul(x.data, w_gate_up.data, out.data, x.size(0),
                                       out.row_elems(), x.row_elems(), as_stream(stream_),
                                       packed_for(w_gate_up, out.row_elems()))) {
    return;
  }
  Backend::matmul_silu_mul(x, w_gate_up, gate_up, out);
}

size_t CudaBackend::prepare_matrix(const Tensor& w, int64_t gated_inter) {
  if (settings_.packed_weights == PackPolicy::kNever || w.dtype != DType::BF16 || w.ndim != 2) return 0;
  const int64_t N = w.size(0), K = w.size(1);
  // Only matrices the skinny kernel can stream (sm_90, K % 8, 16-byte aligned).
  if (!skinny_gemm_supported(w.data, w.data, w.data, 1, N, K)) return 0;
  if (gated_inter < 0 || (gated_inter > 0 && N != 2 * gated_inter)) return 0;
  PAGELLM_CHECK(!capturing())
      << "cuda backend: prepare_matrix allocates and cannot run while a graph is captured";
  const size_t bytes = skinny_packed_bytes(N, K);
  auto it = packed_.find(w.data);
  if (it != packed_.end() && (it->second.rows != N || it->second.cols != K ||
                              it->second.gated_inter != gated_inter)) {
    // Another matrix now lives at this address: drop the stale copy.
    drop_packed(it);
    it = packed_.end();
  }
  size_t allocated = 0;
  if (it == packed_.end()) {
    if (settings_.packed_weights == PackPolicy::kAuto && packed_bytes_ + bytes > total_memory_ / 4) return 0;
    void* copy = nullptr;
    try {
      copy = allocate(bytes);
    } catch (const Error&) {
      if (settings_.packed_weights == PackPolicy::kAlways) throw;
      // Packing is an optimisation: without memory for it, the products read w.
      cudaGetLastError();
      return 0;
    }
    it = packed_.emplace(w.data, PackedMatrix{copy, bytes, N, K, gated_inter}).first;
    packed_bytes_ += bytes;
    allocated = bytes;
  }
  pack_skinny_weights(w.data, N, K, gated_inter, it->second.data, as_stream(stream_));
  return allocated;
}

const void* CudaBackend::packed_for(const Tensor& w, int64_t gated_inter) const {
  if (!packed_enabled_ || packed_.empty() || w.ndim != 2) return nullptr;
  const auto it = packed_.find(w.data);
  if (it == packed_.end()) return nullptr;
  const PackedMatrix& p = it->second;
  return p.rows == w.size(0) && p.cols == w.size(1) && p.gated_inter == gated_inter ? p.data
                                                                                    : nullptr;
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

// ---- graphs -----------------------------------------------------------------------------------

void CudaBackend::begin_capture() {
  PAGELLM_CHECK(!capturing()) << "cuda backend: begin_capture while already capturing";
  attention_between_forwards(true);
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream_), cudaStreamCaptureModeThreadLocal));
}

std::unique_ptr<RecordedGraph> CudaBackend::end_capture() {
  PAGELLM_CHECK(capturing()) << "cuda backend: end_capture without begin_capture";
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(as_stream(stream_), &graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    PAGELLM_FAIL() << "cuda backend: graph capture failed (" << cudaGetErrorName(err) << ": "
                   << cudaGetErrorString(err)
                   << "); an operation during capture synchronised, allocated or copied";
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PAGELLM_CUDA_CHECK(inst);
  return std::make_unique<CudaGraph>(exec, as_stream(stream_));
}

// ---- sampling ---------------------------------------------------------------------------------

void CudaBackend::ensure_sampling_capacity(size_t bytes, size_t scratch_floats) {
  if (bytes > sampling_bytes_) {
    synchronize();
    deallocate(sampling_device_);
    if (sampling_host_) cudaFreeHost(sampling_host_);
    sampling_device_ = sampling_host_ = nullptr;
    sampling_bytes_ = 0;
    const size_t grown = std::max(bytes, size_t{64} << 10);
    sampling_device_ = allocate(grown);
    PAGELLM_CUDA_CHECK(cudaHostAlloc(&sampling_host_, grown, cudaHostAllocDefault));
    sampling_bytes_ = grown;
  }
  if (scratch_floats > sampling_scratch_floats_) {
    synchronize();
    deallocate(sampling_scratch_);
    sampling_scratch_ = nullptr;
    sampling_scratch_floats_ = 0;
    sampling_scratch_ = static_cast<float*>(allocate(scratch_floats * sizeof(float)));
    sampling_scratch_floats_ = scratch_floats;
  }
}

std::vector<SampledToken> CudaBackend::sample(const Tensor& logits,
                                              const std::vector<SamplingRow>& rows) {
  PAGELLM_CHECK(logits.dtype == DType::F32 && logits.ndim == 2)
      << "cuda backend: sample: logits must be a float32 [rows, vocab] tensor, got "
      << dtype_name(logits.dtype) << " " << logits.shape_string();
  const int64_t R = logits.size(0), V = logits.size(1);
  PAGELLM_CHECK(static_cast<size_t>(R) == rows.size())
      << "cuda backend: sample: " << R << " rows of logits but " << rows.size()
      << " sampling rows";
  if (R == 0) return {};
  PAGELLM_CHECK(V > 0 && V <= INT32_MAX && R <= INT32_MAX)
      << "cuda backend: sample: unsupported logits shape " << logits.shape_string();
  PAGELLM_CHECK(!capturing()) << "cuda backend: sample synchronises and cannot be captured";

  // Per-row parameters and the penalty lists, built on the host.
  std::vector<GpuSamplingRow> params(static_cast<size_t>(R));
  std::vector<GpuPenaltyEntry> entries;
  int32_t penalised_rows = 0;
  for (int64_t r = 0; r < R; ++r) {
    const SamplingRow& row = rows[static_cast<size_t>(r)];
    try {
      PAGELLM_CHECK(row.params != nullptr) << "sampling: the row has no SamplingParams";
      const SamplingParams& sp = *row.params;
      validate_sampling_params(sp);
      GpuSamplingRow& g = params[static_cast<size_t>(r)];
      g.temperature = sp.temperature;
      g.top_p = sp.top_p;
      g.min_p = sp.min_p;
      g.repetition_penalty = sp.repetition_penalty;
      g.presence_penalty = sp.presence_penalty;
      g.frequency_penalty = sp.frequency_penalty;
      g.top_k = sp.top_k;
      g.flags = (sp.greedy() ? kSampleGreedy : 0u) |
                (sp.processed_logprobs ? kSampleProcessedLogprobs : 0u);
      g.stream_key = sampling_stream_key(row.seed, static_cast<uint64_t>(row.output_index));
      if (penalties_enabled(sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty)) {
        // The host sampler's counting (sampling/rules.h); the kernel applies the same rule.
        g.flags |= kSamplePenalties;
        g.scratch_row = penalised_rows++;
        g.penalty_begin = static_cast<int32_t>(entries.size());
        penalty_counter_.count(row.prompt_tokens, row.output_tokens,
                               sp.repetition_penalty != 1.0f, V, entries);
        g.penalty_count = static_cast<int32_t>(entries.size()) - g.penalty_begin;
      }
    } catch (const Error& e) {
      PAGELLM_FAIL() << "row " << r << ": " << e.what();
    }
  }

  // One buffer: rows | penalty entries | results, each 256-byte aligned.
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t rows_bytes = aligned(params.size() * sizeof(GpuSamplingRow));
  const size_t entries_bytes = aligned(std::max<size_t>(entries.size(), 1) * sizeof(GpuPenaltyEntry));
  const size_t results_bytes = aligned(params.size() * sizeof(GpuSampledToken));
  ensure_sampling_capacity(rows_bytes + entries_bytes + results_bytes,
                           static_cast<size_t>(penalised_rows) * static_cast<size_t>(V));
  auto* host = static_cast<char*>(sampling_host_);
  auto* dev = static_cast<char*>(sampling_device_);
  std::memcpy(host, params.data(), params.size() * sizeof(GpuSamplingRow));
  if (!entries.empty()) {
    std::memcpy(host + rows_bytes, entries.data(), entries.size() * sizeof(GpuPenaltyEntry));
  }
  cudaStream_t s = as_stream(stream_);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dev, host, rows_bytes + entries_bytes,
                                     cudaMemcpyHostToDevice, s));
  auto* results_dev = reinterpret_cast<GpuSampledToken*>(dev + rows_bytes + entries_bytes);
  launch_sample_rows(logits.ptr<float>(), static_cast<int32_t>(R), static_cast<int32_t>(V),
                     reinterpret_cast<const GpuSamplingRow*>(dev),
                     reinterpret_cast<const GpuPenaltyEntry*>(dev + rows_bytes),
                     sampling_scratch_, prune_table_, results_dev, s);
  auto* results_host = reinterpret_cast<GpuSampledToken*>(host + rows_bytes + entries_bytes);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(results_host, results_dev,
                                     params.size() * sizeof(GpuSampledToken),
                                     cudaMemcpyDeviceToHost, s));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(s));

  std::vector<SampledToken> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const GpuSampledToken& g = results_host[r];
    PAGELLM_CHECK(g.status != kSampleNoFiniteLogit)
        << "row " << r << ": sampling: the row of logits has no finite value (all " << V
        << " are NaN or -inf)";
    PAGELLM_CHECK(g.status != kSampleNoFiniteAfterPenalties)
        << "row " << r << ": sampling: no finite logit is left after the penalties";
    PAGELLM_ASSERT(g.status == kSampleOk && g.token >= 0 && g.token < V)
        << "GPU sampler returned status " << g.status << ", token " << g.token;
    out[static_cast<size_t>(r)] = SampledToken{g.token, g.logprob, g.processed_logprob};
  }
  return out;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<cuda::CudaBackend>(device, cuda::CudaSettings::from_environment());
}

}  // namespace pagellm
