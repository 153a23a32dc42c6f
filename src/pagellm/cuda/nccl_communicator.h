// The cuda backend's device collectives between processes (docs/design.md, "Tensor
// parallelism"): a Communicator over NCCL whose calls run on the backend's stream, so that
// eager forwards and captured decode graphs both carry them.
//
// NCCL is not linked: libnccl.so.2 is about 220 MB, and the machines that run pagellm get
// it from elsewhere (PyTorch's nvidia-nccl-cu13 wheel). It is dlopen'ed on first use,
// from CudaSettings::nccl_library (PAGELLM_NCCL_LIBRARY) when set, else "libnccl.so.2"
// through the loader's search, and refused below kMinNcclVersion. Before anything of NCCL
// runs, NCCL_NVLS_ENABLE is set to 0 unless the user set it: NVLink SHARP (multicast over
// the NVSwitch) has taken GPUs of shared hosts out of service.
//
// CUDA- and NCCL-free header (nccl.h's types stay in the .cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pagellm/backend/communicator.h"

struct ncclComm;

namespace pagellm::cuda {

class CudaBackend;
struct NcclApi;

/// The oldest NCCL the communicator works with, as ncclGetVersion reports it: 2.13.0, the
/// first with ncclGetLastError (2.10 brought bfloat16, 2.9 graph capture).
inline constexpr int kMinNcclVersion = 21300;

/// "2.28.9" for ncclGetVersion's 22809 (and the pre-2.9 code 2800 + patch as "2.8.p").
std::string nccl_version_string(int code);

/// Where NCCL was loaded from, and its version.
struct NcclLibraryInfo {
  std::string path;  // the file the loader opened
  int version = 0;   // ncclGetVersion's code
};

/// Loads NCCL (once per process and `configured` path; a failure is not kept, so a later
/// call may succeed): `configured` when not empty, else "libnccl.so.2" through the loader's
/// search. Sets NCCL_NVLS_ENABLE=0 first unless it is set. Throws Error naming the path
/// tried and why it failed (cannot be opened, lacks an entry point, version below
/// kMinNcclVersion: found and needed). Needs no GPU.
NcclLibraryInfo load_nccl_library(const std::string& configured);

/// A new group id (ncclGetUniqueId's 128 bytes) from the NCCL that `configured` names
/// (as load_nccl_library). Needs no GPU.
std::vector<uint8_t> new_nccl_group_id(const std::string& configured);

/// One rank's end of an NCCL group, bound to one CudaBackend: its collectives are enqueued
/// on the backend's stream and return at once (later work on the stream sees the result),
/// so a graph captured on the stream records them. Every rank must issue the same
/// collectives, in the same order, eagerly or captured alike (NCCL's rule). Not thread-safe,
/// like the backend: the thread that drives the backend calls it, abort included.
///
/// A collective that refuses its operands, or whose NCCL call fails (checked after each
/// call, ncclCommGetAsyncError included), aborts the communicator and throws Error naming
/// the call; every later call then throws naming the reason. Ranks in other processes are
/// not told: their launcher must abort them (NCCL has no way to wake a peer that waits).
class NcclCommunicator final : public Communicator {
 public:
  /// Joins the group `id` (new_nccl_group_id's bytes, from rank 0) as `rank` of `size` on
  /// the backend's device (ncclCommInitRank, which blocks until every rank has joined).
  /// Throws Error for an id that is not 128 bytes, a rank outside [0, size), a capturing
  /// stream, an NCCL that cannot be loaded (the backend's settings().nccl_library) or a
  /// failed join. The backend must outlive the communicator.
  NcclCommunicator(CudaBackend& backend, const std::vector<uint8_t>& id, int rank, int size);
  /// ncclCommDestroy (which completes the communicator's pending work), or ncclCommAbort
  /// when a call failed, or when destroyed by an exception's unwinding (the group is
  /// broken then, and destroy could wait for peers forever). Graphs that captured this
  /// communicator's calls must be destroyed first.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// In place, bf16 or float32: ncclAllReduce with ncclSum. Every rank gets the same bits:
  /// NCCL's ring and tree algorithms reduce each element once, in one order, and send that
  /// result to every rank. The order is NCCL's (not rank order), and bf16 partial sums are
  /// rounded to bf16 at each step (with two ranks: one rounding of the exact sum).
  void all_reduce_sum(Backend& backend, Tensor& t) override;
  /// `part` [R, C] of any dtype -> `full` [R, size · C]: ncclAllGather into a scratch
  /// [size, R, C], then one cudaMemcpy2DAsync per rank puts its block at its columns (a
  /// single 2-D copy cannot reorder the rank and row axes). With R = 1 (decode of one
  /// sequence) the layouts coincide and NCCL writes `full` directly. The scratch is grown
  /// outside graph capture (a forward run before capturing, as the engine's warm-up, grows
  /// it; a capture that needs more throws Error, before calling NCCL and without aborting,
  /// as every rank does alike); a scratch that a graph captured is kept until
  /// the communicator goes, since the graph still reads it.
  void all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) override;
  /// In place: ncclBroadcast of `bytes` (as uint8) from `root`, on the backend's stream.
  void broadcast(Backend& backend, void* data, size_t bytes, int root) override;
  /// ncclCommAbort, once; later calls throw Error naming `reason`. Safe from another
  /// thread while this one waits for the group's work (the tensor-parallel watchdog): NCCL
  /// ends the kernels waiting for peers, and a lock keeps the abort from racing a call's
  /// enqueue.
  void abort(const std::string& reason) override;

  /// The NCCL that was loaded.
  const NcclLibraryInfo& library() const { return library_; }
  /// Bytes of device memory held for all_gather_columns (the scratch and those kept for
  /// graphs).
  size_t scratch_bytes() const;

 private:
  /// Throws when the group was aborted; fails (aborting) when `backend` is not this one's.
  void check_usable(const char* op, const Backend& backend);
  /// abort(why), then throws Error(why).
  [[noreturn]] void fail(const std::string& why);
  /// Throws through fail() when an NCCL call returned an error or the communicator holds
  /// an asynchronous one.
  void check_call(int result, const char* call);
  /// A scratch of at least `bytes` (grown outside capture, at least doubling).
  void* gather_scratch(size_t bytes);

  CudaBackend& backend_;
  const NcclApi* api_ = nullptr;
  NcclLibraryInfo library_;
  /// Held by every collective's checks and enqueue, and by abort (recursive: a failing
  /// collective aborts).
  std::recursive_mutex mutex_;
  ncclComm* comm_ = nullptr;  // null once aborted
  int rank_ = 0;
  int size_ = 1;
  std::string failure_;  // why the group was aborted
  void* scratch_ = nullptr;
  size_t scratch_size_ = 0;
  bool scratch_captured_ = false;     // a graph captured a call that used scratch_
  std::vector<void*> kept_scratch_;   // earlier scratches that graphs captured
  size_t kept_bytes_ = 0;
};

}  // namespace pagellm::cuda
