// Collectives between the ranks of a tensor-parallel model (docs/design.md, "Tensor
// parallelism"): what Qwen3Model calls after its row-split products and its vocabulary-split
// head. A backend-independent interface, so that the model layer does not know how ranks
// talk: NCCL between GPUs, or InProcessGroup's threads of one process (the CPU tests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"

namespace pagellm {

/// One rank's end of a group. Every rank calls the same collectives in the same order with
/// tensors of the same shape and dtype; a call returns once this rank's result is written,
/// or (a device communicator: NCCL's) once it is enqueued on the backend's stream, where
/// the backend's later operations see it.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// `t` (on `backend`) becomes the element-wise sum over the ranks' `t`, the same bits on
  /// every rank (InProcessGroup sums in rank order, NCCL in its algorithm's order).
  virtual void all_reduce_sum(Backend& backend, Tensor& t) = 0;
  /// `full` [R, size · C] becomes the ranks' `part` [R, C] side by side: rank r's at columns
  /// [r · C, (r + 1) · C).
  virtual void all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) = 0;
  /// The `bytes` at `data` (this backend's memory) become rank `root`'s on every rank:
  /// what a trainer's weight broadcast uses (docs/design.md, "Weight updates"). The
  /// default throws Error: the tensor-parallel communicators between the engine's own
  /// ranks (InProcessGroup, HostCommunicator) never broadcast.
  virtual void broadcast(Backend& backend, void* data, size_t bytes, int root);
  /// Gives up on the group (this rank failed between or inside collectives, saying why):
  /// every rank waiting in a collective, and every later collective on any rank, throws
  /// Error naming the reason instead of waiting for this rank forever.
  virtual void abort(const std::string& reason) = 0;
};

/// A group of `size` ranks that are threads of one process, each with its own backend: the
/// collectives meet at a barrier and exchange float32 copies through host memory (summed in
/// rank order, so every rank gets the same bits). For tests and the CPU backend. A rank that
/// fails calls abort (a collective that finds the ranks' tensors disagree does so itself);
/// one that just stops calling leaves the others waiting, as any collective library would.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  int size() const { return size_; }
  /// Rank `rank`'s communicator (0 <= rank < size); the group must outlive it.
  std::unique_ptr<Communicator> communicator(int rank);

 private:
  class Rank;
  struct Barrier;
  int size_;
  std::shared_ptr<Barrier> barrier_;
  std::vector<std::vector<float>> slots_;  // one per rank, written between barriers
};

}  // namespace pagellm
