// The collectives of a tensor-parallel group whose ranks are processes and whose backend has
// no device collectives (the cpu backend): float32 copies over the ranks' loopback TCP
// connections, a star through rank 0 (docs/design.md, "Tensor parallelism").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "pagellm/backend/communicator.h"
#include "pagellm/common/framed_socket.h"

namespace pagellm {

/// Frame types of HostCommunicator on the group's connections (beside the engine's own).
enum HostCollectiveFrame : uint32_t {
  /// A rank's part, to rank 0: { uint32 op, uint64 sequence, int64 R, int64 C, float[] }.
  kFrameCollectivePart = 0x4000'0001u,
  /// Rank 0's result, to every other rank: { uint64 sequence, float[] }.
  kFrameCollectiveResult = 0x4000'0002u,
};

/// One rank's end of a group of processes. Rank 0 receives every other rank's float32 copy,
/// sums (or places) them in rank order starting from 0.0f, exactly as InProcessGroup does,
/// and sends the result back: every rank gets the same bits, and the same bits as an
/// InProcessGroup of threads. The connections are the ones the engine also sends its step
/// messages on (the group never reads a frame outside a collective, and both sides take
/// the frames in the order they were sent).
///
/// Failures never hang: a peer that closes its connection, sends kFrameAbort, or sends
/// nothing for `timeout_ms` inside a collective makes the collective throw an Error naming
/// that rank, after the group is aborted (abort() notifies the peers with kFrameAbort, so
/// their collectives throw too). abort() may be called from any thread.
class HostCommunicator final : public Communicator {
 public:
  /// Says more about a rank whose connection ended ("pid 41 was killed by signal 9").
  using PeerDescriber = std::function<std::string(int rank)>;
  /// `peers`: on rank 0, one connection per rank (peers[0] unused, may be null); on
  /// another rank, one: its connection to rank 0. The sockets must outlive the
  /// communicator.
  HostCommunicator(int rank, int size, std::vector<FramedSocket*> peers, int64_t timeout_ms,
                   PeerDescriber describe = nullptr);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Backend& backend, Tensor& t) override;
  void all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) override;
  void abort(const std::string& reason) override;
  /// Whether the group was aborted (by this rank or a peer), and why.
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;

 private:
  enum class Op : uint32_t { kAllReduceSum = 1, kAllGatherColumns = 2 };
  /// Rank 0: every rank's part (R x C floats each; rank 0's is `own`), checked; the result
  /// is sent to every rank and returned. Other ranks: sends `own`, returns rank 0's result.
  std::vector<float> exchange(Op op, const char* name, std::vector<float> own, int64_t rows,
                              int64_t cols);
  /// Receives the next frame from `peer_rank` (rank 0: any rank; others: 0), throwing (after
  /// aborting the group) on end-of-file, timeout, an abort from the peer or a frame of
  /// another kind.
  Frame receive_from(int peer_rank, const char* name);
  [[noreturn]] void fail(const std::string& why);
  void throw_if_aborted() const;
  std::string describe(int peer_rank) const;

  int rank_;
  int size_;
  std::vector<FramedSocket*> peers_;
  int64_t timeout_ms_;
  PeerDescriber describe_;
  uint64_t sequence_ = 0;
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;
};

}  // namespace pagellm
