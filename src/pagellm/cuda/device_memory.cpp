// Opening the device, allocations and transfers (device_memory.h).
#include "pagellm/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "pagellm/common/check.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

// Host-to-device upload chunk (two pinned buffers of this size).
constexpr size_t kUploadChunkBytes = size_t{16} << 20;

cudaStream_t as_stream(CUstream_st* s) { return s; }
cudaEvent_t as_event(CUevent_st* e) { return e; }

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

}  // namespace

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

OpenedDevice open_cuda_device(int device) {
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
  OpenedDevice opened;
  {
    std::ostringstream os;
    os << prop.name << " (device " << device << ", compute capability " << prop.major << "."
       << prop.minor << ", " << format_bytes(prop.totalGlobalMem) << ")";
    opened.description = os.str();
  }
  PAGELLM_CHECK(prop.major >= 8)
      << "cuda backend unavailable: " << opened.description
      << " is not supported; the CUDA backend needs compute capability 8.0 or newer (bf16 "
         "tensor cores); use the cpu backend instead";
  opened.total_memory = prop.totalGlobalMem;
  PAGELLM_CUDA_CHECK(cudaSetDevice(device));
  const cudaError_t image = probe_kernel_image();
  PAGELLM_CHECK(image == cudaSuccess)
      << "cuda backend unavailable: this build has no kernels that run on " << opened.description
      << " (" << cudaGetErrorString(image) << "); rebuild with "
      << "-DCMAKE_CUDA_ARCHITECTURES=" << prop.major << prop.minor << " (the default build "
      << "targets sm_90a, that is H100/H200)";
  return opened;
}

bool stream_capturing(CUstream_st* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PAGELLM_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

DeviceMemory::DeviceMemory(CUstream_st* stream, std::string description)
    : stream_(stream), description_(std::move(description)) {
  upload_chunk_bytes_ = kUploadChunkBytes;
  try {
    for (PinnedSlot& slot : upload_staging_) {
      PAGELLM_CUDA_CHECK(cudaHostAlloc(&slot.host, upload_chunk_bytes_, cudaHostAllocDefault));
      PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
  } catch (...) {
    free_staging();
    throw;
  }
}

void DeviceMemory::free_staging() noexcept {
  for (PinnedSlot& slot : upload_staging_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.done) cudaEventDestroy(slot.done);
    slot = PinnedSlot{};
  }
}

DeviceMemory::~DeviceMemory() {
  free_staging();
  // The allocations still listed belong to owners that outlive the backend by mistake or
  // were freed with it (the process's device memory goes with the context); forget them.
  allocations_.clear();
  cudaGetLastError();
}

size_t DeviceMemory::free_memory() const {
  size_t free_bytes = 0, total_bytes = 0;
  PAGELLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

size_t DeviceMemory::size_of(const void* ptr) const {
  const auto it = allocations_.find(const_cast<void*>(ptr));
  if (it != allocations_.end()) return it->second;
  for (const auto& arena : arenas_) {
    if (arena && arena->owns(ptr)) return arena->size_of(ptr);
  }
  return 0;
}

void* DeviceMemory::allocate(size_t bytes, Residency residency) {
  if (bytes == 0) return nullptr;
  if (residency != Residency::kResident) {
    static const char* const kNames[] = {"", "weights", "packed weight copies", "KV cache"};
    std::unique_ptr<VmmArena>& arena = arenas_[static_cast<int>(residency)];
    if (!arena) arena = std::make_unique<VmmArena>(kNames[static_cast<int>(residency)], description_);
    return arena->allocate(bytes);
  }
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

void DeviceMemory::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  for (auto& arena : arenas_) {
    if (arena && arena->owns(ptr)) {
      arena->deallocate(ptr);
      return;
    }
  }
  allocations_.erase(ptr);
  // Called from destructors: report, never throw.
  const cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "pagellm: cudaFree failed: %s\n", cudaGetErrorString(err));
  }
}

ReleasedMemory DeviceMemory::sleep(bool offload_weights) {
  PAGELLM_CHECK(!asleep_) << "cuda backend: sleep called while already asleep (wake first)";
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  ReleasedMemory released;
  auto release = [&](Residency r, bool keep) -> size_t {
    VmmArena* arena = arenas_[static_cast<int>(r)].get();
    return arena && arena->used_bytes() > 0 ? arena->release(keep, stream_) : 0;
  };
  if (offload_weights) {
    // First: the weights' host copy is made before any memory is given back, so that a
    // failure (host memory short) leaves everything as it was.
    released.weights = release(Residency::kWeights, true);
    released.prepared = release(Residency::kPrepared, false);
  }
  released.kv_cache = release(Residency::kKvCache, false);
  asleep_ = true;
  return released;
}

void DeviceMemory::wake() {
  PAGELLM_CHECK(asleep_) << "cuda backend: wake called while awake (sleep first)";
  for (auto& arena : arenas_) {
    if (!arena || !arena->released()) continue;
    try {
      arena->restore(stream_);
    } catch (const Error& e) {
      PAGELLM_FAIL() << "wake: " << e.what()
                     << "; the memory released by sleep must be free again before wake "
                        "(call wake again once the other user of the device has freed it)";
    }
  }
  asleep_ = false;
}

bool DeviceMemory::prepared_released() const {
  const auto& arena = arenas_[static_cast<int>(Residency::kPrepared)];
  return arena && arena->released();
}

void DeviceMemory::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream_)));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

void DeviceMemory::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream_)));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

void DeviceMemory::synchronize() { PAGELLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_))); }

void DeviceMemory::upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
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

std::vector<float> DeviceMemory::download_f32(const Tensor& src) {
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

}  // namespace pagellm::cuda
