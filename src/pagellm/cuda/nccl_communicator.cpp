// NCCL, loaded at run time, and the communicator over it (nccl_communicator.h).
#include "pagellm/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "pagellm/common/check.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {

/// The NCCL entry points the communicator calls, resolved from the loaded library (the
/// types are nccl.h's, so a signature that changed would not compile).
struct NcclApi {
  void* handle = nullptr;
  NcclLibraryInfo info;
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
};

namespace {

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown ncclResult_t";
  }
}

// "ncclSystemError (unhandled system error): <NCCL's last message>".
std::string describe(const NcclApi& api, ncclResult_t r, ncclComm_t comm) {
  std::string s = result_name(r);
  s += " (";
  s += api.get_error_string(r);
  s += ")";
  const char* last = api.get_last_error(comm);
  if (last != nullptr && last[0] != '\0') {
    s += ": ";
    s += last;
  }
  return s;
}

// Where the loader is asked for NCCL, for messages.
std::string where(const std::string& configured) {
  return configured.empty()
             ? std::string("libnccl.so.2 through the loader's search (LD_LIBRARY_PATH, the ld.so "
                           "cache, the system folders)")
             : "PAGELLM_NCCL_LIBRARY=" + configured;
}

constexpr const char* kWhereToFindNccl =
    "set PAGELLM_NCCL_LIBRARY to the full path of a libnccl.so.2 (PyTorch's nvidia-nccl-cu13 "
    "wheel has one in nvidia/nccl/lib) or put its folder on LD_LIBRARY_PATH";

// Opens and checks the library; throws Error saying what was tried and what failed.
std::unique_ptr<NcclApi> open_nccl(const std::string& configured) {
  const std::string name = configured.empty() ? "libnccl.so.2" : configured;
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    PAGELLM_FAIL() << "NCCL: cannot load " << where(configured) << ": "
                   << (e != nullptr ? e : "dlopen failed") << "; " << kWhereToFindNccl;
  }
  auto api = std::make_unique<NcclApi>();
  api->handle = handle;
  std::string missing;
  const auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + symbol;
  };
  bind(api->get_version, "ncclGetVersion");
  bind(api->get_unique_id, "ncclGetUniqueId");
  bind(api->comm_init_rank, "ncclCommInitRank");
  bind(api->comm_destroy, "ncclCommDestroy");
  bind(api->comm_abort, "ncclCommAbort");
  bind(api->comm_get_async_error, "ncclCommGetAsyncError");
  bind(api->all_reduce, "ncclAllReduce");
  bind(api->all_gather, "ncclAllGather");
  bind(api->broadcast, "ncclBroadcast");
  bind(api->get_error_string, "ncclGetErrorString");
  bind(api->get_last_error, "ncclGetLastError");
  // The file the loader found (the name may have been a bare soname).
  api->info.path = name;
  Dl_info found{};
  if (api->get_version != nullptr &&
      dladdr(reinterpret_cast<void*>(api->get_version), &found) != 0 &&
      found.dli_fname != nullptr) {
    api->info.path = found.dli_fname;
  }
  int version = 0;
  if (api->get_version != nullptr && api->get_version(&version) != ncclSuccess) version = 0;
  api->info.version = version;
  if (api->get_version == nullptr || version < kMinNcclVersion) {
    dlclose(handle);
    PAGELLM_FAIL() << "NCCL: " << api->info.path << " (from " << where(configured) << ") is "
                   << (api->get_version == nullptr
                           ? std::string("not NCCL (no ncclGetVersion)")
                           : "version " + nccl_version_string(version))
                   << "; pagellm needs NCCL " << nccl_version_string(kMinNcclVersion)
                   << " or newer: " << kWhereToFindNccl;
  }
  if (!missing.empty()) {
    dlclose(handle);
    PAGELLM_FAIL() << "NCCL: " << api->info.path << " (version " << nccl_version_string(version)
                   << ") lacks " << missing << "; " << kWhereToFindNccl;
  }
  return api;
}

// The library for `configured`, loaded at the first successful call and kept for the
// process (NCCL's threads and communicators may still use it at exit).
const NcclApi& nccl_api(const std::string& configured) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<NcclApi>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  // NCCL reads its variables when it first initialises, after this. NVLink SHARP's
  // multicast objects have taken GPUs of shared hosts out of service; a user who wants
  // it sets the variable.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  auto it = loaded.find(configured);
  if (it == loaded.end()) it = loaded.emplace(configured, open_nccl(configured)).first;
  return *it->second;
}

}  // namespace

std::string nccl_version_string(int code) {
  // ncclGetVersion's code is major * 10000 + minor * 100 + patch from 2.9 on, and was
  // major * 1000 + minor * 100 + patch before.
  const bool old = code < 20900;
  const int major = old ? code / 1000 : code / 10000;
  const int minor = old ? (code % 1000) / 100 : (code % 10000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

NcclLibraryInfo load_nccl_library(const std::string& configured) {
  return nccl_api(configured).info;
}

std::vector<uint8_t> new_nccl_group_id(const std::string& configured) {
  const NcclApi& api = nccl_api(configured);
  ncclUniqueId id{};
  const ncclResult_t r = api.get_unique_id(&id);
  PAGELLM_CHECK(r == ncclSuccess) << "NCCL: ncclGetUniqueId failed (NCCL "
                                  << nccl_version_string(api.info.version) << " from "
                                  << api.info.path << "): " << describe(api, r, nullptr);
  const auto* bytes = reinterpret_cast<const uint8_t*>(id.internal);
  return std::vector<uint8_t>(bytes, bytes + sizeof(id.internal));
}

// ---- the communicator ---------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(CudaBackend& backend, const std::vector<uint8_t>& id,
                                   int rank, int size)
    : backend_(backend), rank_(rank), size_(size) {
  PAGELLM_CHECK(size >= 1 && rank >= 0 && rank < size)
      << "join_communicator: rank " << rank << " of " << size
      << " is not a rank of a group (a group has size >= 1 and ranks 0 .. size - 1)";
  PAGELLM_CHECK(id.size() == NCCL_UNIQUE_ID_BYTES)
      << "join_communicator: the group id has " << id.size() << " bytes; an NCCL group id has "
      << NCCL_UNIQUE_ID_BYTES << " (rank 0's new_communicator_id())";
  PAGELLM_CHECK(!stream_capturing(backend.stream()))
      << "join_communicator: cannot join a group while a graph is captured";
  api_ = &nccl_api(backend.settings().nccl_library);
  library_ = api_->info;
  PAGELLM_CUDA_CHECK(cudaSetDevice(backend.device()));
  ncclUniqueId uid{};
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = api_->comm_init_rank(&comm, size, uid, rank);
  if (r != ncclSuccess) {
    const std::string why = describe(*api_, r, comm);
    if (comm != nullptr) api_->comm_abort(comm);
    PAGELLM_FAIL() << "join_communicator: ncclCommInitRank failed for rank " << rank << " of "
                   << size << " on " << backend.device_description() << " (NCCL "
                   << nccl_version_string(library_.version) << " from " << library_.path
                   << "): " << why;
  }
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    ncclResult_t async = ncclSuccess;
    const bool broken = std::uncaught_exceptions() > 0 ||
                        api_->comm_get_async_error(comm_, &async) != ncclSuccess ||
                        (async != ncclSuccess && async != ncclInProgress);
    const ncclResult_t r = broken ? api_->comm_abort(comm_) : api_->comm_destroy(comm_);
    if (r != ncclSuccess) {
      std::fprintf(stderr, "pagellm: %s failed on tensor-parallel rank %d of %d: %s\n",
                   broken ? "ncclCommAbort" : "ncclCommDestroy", rank_, size_,
                   api_->get_error_string(r));
    }
    comm_ = nullptr;
  }
  // After the communicator: its pending work may still have read them.
  backend_.deallocate(scratch_);
  for (void* p : kept_scratch_) backend_.deallocate(p);
}

size_t NcclCommunicator::scratch_bytes() const { return scratch_size_ + kept_bytes_; }

void NcclCommunicator::abort(const std::string& reason) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (comm_ == nullptr) return;  // the first reason stays
  failure_ = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + reason;
  const ncclResult_t r = api_->comm_abort(comm_);
  comm_ = nullptr;
  if (r != ncclSuccess) {
    std::fprintf(stderr, "pagellm: ncclCommAbort failed on tensor-parallel rank %d of %d: %s\n",
                 rank_, size_, api_->get_error_string(r));
  }
}

void NcclCommunicator::fail(const std::string& why) {
  abort(why);
  PAGELLM_FAIL() << why;
}

void NcclCommunicator::check_usable(const char* op, const Backend& backend) {
  PAGELLM_CHECK(comm_ != nullptr) << "NCCL " << op << ": the tensor-parallel group was aborted ("
                                  << failure_ << ")";
  if (&backend != static_cast<const Backend*>(&backend_)) {
    fail(std::string("NCCL ") + op + ": called with another backend than the one rank " +
         std::to_string(rank_) + " joined the group on");
  }
}

void NcclCommunicator::check_call(int result, const char* call) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  std::string what = call;
  if (r == ncclSuccess) {
    // A failure inside NCCL's own threads (a peer's connection lost) shows here.
    ncclResult_t async = ncclSuccess;
    r = api_->comm_get_async_error(comm_, &async);
    if (r != ncclSuccess) {
      what = "ncclCommGetAsyncError after " + what;
    } else if (async != ncclSuccess && async != ncclInProgress) {
      r = async;
      what += " (asynchronous error)";
    }
  }
  if (r == ncclSuccess) return;
  fail("NCCL error in " + what + " on rank " + std::to_string(rank_) + " of " +
       std::to_string(size_) + ": " + describe(*api_, r, comm_));
}

void* NcclCommunicator::gather_scratch(size_t bytes) {
  const bool capturing = stream_capturing(backend_.stream());
  if (bytes > scratch_size_) {
    // Refused before NCCL is called, without aborting: every rank captures the same shapes,
    // so every rank refuses alike and none is left waiting.
    PAGELLM_CHECK(!capturing)
        << "NCCL all_gather_columns: needs " << format_bytes(bytes)
        << " of scratch inside a graph capture, where nothing can be allocated, and holds "
        << format_bytes(scratch_size_)
        << ": run the same forward once before capturing (the engine's warm-up does)";
    const size_t grown = std::max(bytes, 2 * scratch_size_);
    void* fresh = nullptr;
    try {
      fresh = backend_.allocate(grown);
    } catch (const Error& e) {
      fail(std::string("NCCL all_gather_columns: ") + e.what());
    }
    if (scratch_ != nullptr && scratch_captured_) {
      kept_scratch_.push_back(scratch_);  // a graph still reads it
      kept_bytes_ += scratch_size_;
    } else {
      backend_.deallocate(scratch_);  // cudaFree waits for the work that used it
    }
    scratch_ = fresh;
    scratch_size_ = grown;
    scratch_captured_ = false;
  }
  if (capturing) scratch_captured_ = true;
  return scratch_;
}

void NcclCommunicator::all_reduce_sum(Backend& backend, Tensor& t) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  check_usable("all_reduce_sum", backend);
  ncclDataType_t type = ncclFloat32;
  if (t.dtype == DType::BF16) {
    type = ncclBfloat16;
  } else if (t.dtype != DType::F32) {
    fail(std::string("NCCL all_reduce_sum: the tensor must be bf16 or float32, got ") +
         dtype_name(t.dtype) + " " + t.shape_string());
  }
  const int64_t n = t.numel();
  if (n == 0) return;  // every rank passes the same shape, so every rank returns here
  if (t.data == nullptr) fail("NCCL all_reduce_sum: the tensor " + t.shape_string() + " has no memory");
  check_call(api_->all_reduce(t.data, t.data, static_cast<size_t>(n), type, ncclSum, comm_,
                              backend_.stream()),
             "ncclAllReduce");
}

void NcclCommunicator::broadcast(Backend& backend, void* data, size_t bytes, int root) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  check_usable("broadcast", backend);
  if (root < 0 || root >= size_) {
    fail("NCCL broadcast: root " + std::to_string(root) + " is not a rank of " +
         std::to_string(size_));
  }
  if (bytes == 0) return;
  if (data == nullptr) fail("NCCL broadcast: " + std::to_string(bytes) + " bytes at a null pointer");
  check_call(api_->broadcast(data, data, bytes, ncclUint8, root, comm_, backend_.stream()),
             "ncclBroadcast");
}

void NcclCommunicator::all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  check_usable("all_gather_columns", backend);
  if (!(part.ndim == 2 && full.ndim == 2 && full.size(0) == part.size(0) &&
        full.size(1) == part.size(1) * size_ && full.dtype == part.dtype)) {
    fail("NCCL all_gather_columns: part " + std::string(dtype_name(part.dtype)) + " " +
         part.shape_string() + " and full " + dtype_name(full.dtype) + " " + full.shape_string() +
         " are not [R, C] and [R, " + std::to_string(size_) + " x C] of one dtype");
  }
  const int64_t R = part.size(0), C = part.size(1);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(part.dtype);
  const size_t block = static_cast<size_t>(R) * row_bytes;  // one rank's part
  if (block == 0) return;
  if (part.data == nullptr || full.data == nullptr) {
    fail("NCCL all_gather_columns: part or full has no memory");
  }
  cudaStream_t stream = backend_.stream();
  // Rank-major [size, R, C] is [R, size · C] when R = 1.
  if (R == 1) {
    check_call(api_->all_gather(part.data, full.data, block, ncclUint8, comm_, stream),
               "ncclAllGather");
    return;
  }
  char* scratch = static_cast<char*>(gather_scratch(block * static_cast<size_t>(size_)));
  check_call(api_->all_gather(part.data, scratch, block, ncclUint8, comm_, stream),
             "ncclAllGather");
  char* out = static_cast<char*>(full.data);
  for (int r = 0; r < size_; ++r) {
    // Rank r's R rows of C go to columns [r · C, (r + 1) · C) of every row.
    const cudaError_t err = cudaMemcpy2DAsync(
        out + static_cast<size_t>(r) * row_bytes, row_bytes * static_cast<size_t>(size_),
        scratch + static_cast<size_t>(r) * block, row_bytes, row_bytes, static_cast<size_t>(R),
        cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(std::string("NCCL all_gather_columns: cudaMemcpy2DAsync of rank ") +
           std::to_string(r) + "'s columns failed: " + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")");
    }
  }
}

}  // namespace pagellm::cuda
