#include "pagellm/backend/host_communicator.h"

#include <algorithm>
#include <utility>

#include "pagellm/common/check.h"

namespace pagellm {

HostCommunicator::HostCommunicator(int rank, int size, std::vector<FramedSocket*> peers,
                                   int64_t timeout_ms, PeerDescriber describe)
    : rank_(rank),
      size_(size),
      peers_(std::move(peers)),
      timeout_ms_(timeout_ms),
      describe_(std::move(describe)) {
  PAGELLM_CHECK(size >= 1 && rank >= 0 && rank < size)
      << "HostCommunicator: rank " << rank << " of " << size << " (needs 0 <= rank < size)";
  const size_t want = rank == 0 ? static_cast<size_t>(size) : 1;
  PAGELLM_CHECK(peers_.size() == want)
      << "HostCommunicator: rank " << rank << " of " << size << " needs " << want
      << " connection(s), got " << peers_.size();
  for (size_t i = rank == 0 ? 1 : 0; i < peers_.size(); ++i) {
    PAGELLM_CHECK(peers_[i] != nullptr) << "HostCommunicator: connection " << i << " is null";
  }
}

std::string HostCommunicator::abort_reason() const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  return reason_;
}

void HostCommunicator::throw_if_aborted() const {
  PAGELLM_CHECK(!aborted_.load()) << "tensor-parallel group aborted: " << abort_reason();
}

std::string HostCommunicator::describe(int peer_rank) const {
  const std::string more = describe_ ? describe_(peer_rank) : "";
  return "tensor-parallel rank " + std::to_string(peer_rank) + (more.empty() ? "" : " (" + more + ")");
}

void HostCommunicator::abort(const std::string& reason) {
  const std::string text = "rank " + std::to_string(rank_) + ": " + reason;
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (aborted_.load()) return;  // the first reason stands; the peers know it already
    reason_ = text;
    aborted_.store(true);
  }
  for (size_t i = rank_ == 0 ? 1 : 0; i < peers_.size(); ++i) {
    peers_[i]->send(kFrameAbort, text.data(), text.size());  // a peer gone already: ignored
  }
}

void HostCommunicator::fail(const std::string& why) {
  abort(why);
  PAGELLM_FAIL() << why;
}

Frame HostCommunicator::receive_from(int peer_rank, const char* name) {
  FramedSocket& socket = *peers_[rank_ == 0 ? static_cast<size_t>(peer_rank) : 0];
  Frame frame;
  const ReceiveStatus status = socket.receive(frame, timeout_ms_, &aborted_);
  if (status == ReceiveStatus::kInterrupted) {
    PAGELLM_FAIL() << "tensor-parallel group aborted: " << abort_reason();
  }
  if (status == ReceiveStatus::kClosed) {
    fail(describe(peer_rank) + " closed its connection during " + name);
  }
  if (status == ReceiveStatus::kTimedOut) {
    fail(describe(peer_rank) + " sent nothing for " + std::to_string(timeout_ms_ / 1000) +
         " s during " + name);
  }
  if (frame.type == kFrameAbort) {
    const std::string reason(frame.payload.begin(), frame.payload.end());
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      if (!aborted_.load()) {
        reason_ = reason;
        aborted_.store(true);
        // Rank 0 relays a rank's abort to the others (they talk only to rank 0).
        for (size_t i = rank_ == 0 ? 1 : peers_.size(); i < peers_.size(); ++i) {
          if (static_cast<int>(i) != peer_rank) peers_[i]->send(kFrameAbort, frame.payload);
        }
      }
    }
    PAGELLM_FAIL() << "tensor-parallel group aborted: " << abort_reason();
  }
  const uint32_t want = rank_ == 0 ? kFrameCollectivePart : kFrameCollectiveResult;
  if (frame.type != want) {
    fail(describe(peer_rank) + " sent message type " + std::to_string(frame.type) + " during " +
         name + " (expected " + std::to_string(want) + "): the ranks ran different steps");
  }
  return frame;
}

std::vector<float> HostCommunicator::exchange(Op op, const char* name, std::vector<float> own,
                                              int64_t rows, int64_t cols) {
  throw_if_aborted();
  const uint64_t sequence = sequence_++;
  if (rank_ != 0) {
    WireWriter w;
    w.put<uint32_t>(static_cast<uint32_t>(op)).put<uint64_t>(sequence).put<int64_t>(rows);
    w.put<int64_t>(cols).put_vector(own);
    if (!peers_[0]->send(kFrameCollectivePart, w.bytes())) {
      fail(describe(0) + " closed its connection during " + name);
    }
    const Frame frame = receive_from(0, name);
    WireReader r(frame.payload, name);
    const uint64_t got = r.get<uint64_t>();
    std::vector<float> result = r.get_vector<float>();
    r.expect_end();
    if (got != sequence) {
      fail(std::string(name) + ": rank 0 answered collective " + std::to_string(got) +
           ", this rank is at " + std::to_string(sequence) + ": the ranks ran different steps");
    }
    return result;
  }

  std::vector<std::vector<float>> parts(static_cast<size_t>(size_));
  parts[0] = std::move(own);
  for (int r = 1; r < size_; ++r) {
    const Frame frame = receive_from(r, name);
    WireReader reader(frame.payload, name);
    const auto got_op = static_cast<Op>(reader.get<uint32_t>());
    const uint64_t got_sequence = reader.get<uint64_t>();
    const int64_t got_rows = reader.get<int64_t>(), got_cols = reader.get<int64_t>();
    parts[static_cast<size_t>(r)] = reader.get_vector<float>();
    reader.expect_end();
    if (got_op != op || got_sequence != sequence) {
      fail(std::string(name) + ": rank " + std::to_string(r) + " is in collective " +
           std::to_string(got_sequence) + " (op " + std::to_string(static_cast<uint32_t>(got_op)) +
           "), rank 0 in " + std::to_string(sequence) + ": the ranks ran different steps");
    }
    if (op == Op::kAllGatherColumns && (got_rows != rows || got_cols != cols)) {
      fail(std::string(name) + ": rank " + std::to_string(r) + " passed [" +
           std::to_string(got_rows) + ", " + std::to_string(got_cols) + "], rank 0 [" +
           std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
  }
  std::vector<float> result;
  const size_t n = parts[0].size();
  if (op == Op::kAllReduceSum) {
    // InProcessGroup's arithmetic exactly: 0.0f, then each rank's part in rank order.
    result.assign(n, 0.0f);
    for (int r = 0; r < size_; ++r) {
      const std::vector<float>& part = parts[static_cast<size_t>(r)];
      if (part.size() != n) {
        fail(std::string(name) + ": ranks passed tensors of " + std::to_string(n) + " and " +
             std::to_string(part.size()) + " elements (rank " + std::to_string(r) + ")");
      }
      for (size_t i = 0; i < n; ++i) result[i] += part[i];
    }
  } else {
    result.resize(static_cast<size_t>(rows * cols * size_));
    for (int r = 0; r < size_; ++r) {
      const std::vector<float>& src = parts[static_cast<size_t>(r)];
      if (static_cast<int64_t>(src.size()) != rows * cols) {
        fail(std::string(name) + ": rank " + std::to_string(r) + " passed " +
             std::to_string(src.size()) + " elements, not " + std::to_string(rows * cols));
      }
      for (int64_t row = 0; row < rows; ++row) {
        std::copy(src.begin() + row * cols, src.begin() + (row + 1) * cols,
                  result.begin() + (row * size_ + r) * cols);
      }
    }
  }
  WireWriter w;
  w.put<uint64_t>(sequence).put_vector(result);
  for (int r = 1; r < size_; ++r) {
    if (!peers_[static_cast<size_t>(r)]->send(kFrameCollectiveResult, w.bytes())) {
      fail(describe(r) + " closed its connection during " + name);
    }
  }
  return result;
}

void HostCommunicator::all_reduce_sum(Backend& backend, Tensor& t) {
  std::vector<float> sum =
      exchange(Op::kAllReduceSum, "all_reduce_sum", backend.download_f32(t), 1, t.numel());
  if (static_cast<int64_t>(sum.size()) != t.numel()) {
    fail("all_reduce_sum: rank 0 returned " + std::to_string(sum.size()) + " elements for " +
         std::to_string(t.numel()));
  }
  backend.upload(t, 0, sum.data(), DType::F32, static_cast<int64_t>(sum.size()));
}

void HostCommunicator::all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) {
  if (!(part.ndim == 2 && full.ndim == 2 && full.size(0) == part.size(0) &&
        full.size(1) == part.size(1) * size())) {
    fail("all_gather_columns: part " + part.shape_string() + " and full " + full.shape_string() +
         " are not [R, C] and [R, " + std::to_string(size()) + " x C]");
  }
  std::vector<float> out = exchange(Op::kAllGatherColumns, "all_gather_columns",
                                    backend.download_f32(part), part.size(0), part.size(1));
  if (static_cast<int64_t>(out.size()) != full.numel()) {
    fail("all_gather_columns: rank 0 returned " + std::to_string(out.size()) +
         " elements for " + full.shape_string());
  }
  backend.upload(full, 0, out.data(), DType::F32, static_cast<int64_t>(out.size()));
}

}  // namespace pagellm
