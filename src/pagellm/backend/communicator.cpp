#include "pagellm/backend/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>

#include "pagellm/common/check.h"

namespace pagellm {

void Communicator::broadcast(Backend& backend, void* data, size_t bytes, int root) {
  (void)data;
  PAGELLM_FAIL() << "this " << backend.name() << " communicator (rank " << rank() << " of "
                 << size() << ") cannot broadcast " << bytes << " bytes from rank " << root
                 << ": only a device communicator (NCCL) broadcasts";
}

/// Every rank waits in arrive_and_wait until all `count` have arrived (a generation count,
/// so the barrier is reusable at once), or until a rank aborts the group: then it throws.
struct InProcessGroup::Barrier {
  explicit Barrier(int count) : count(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex);
    throw_if_aborted();
    const uint64_t gen = generation;
    if (++arrived == count) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) throw_if_aborted();
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!aborted) reason = why;
    aborted = true;
    cv.notify_all();
  }
  void throw_if_aborted() const {
    PAGELLM_CHECK(!aborted) << "tensor-parallel group aborted: " << reason;
  }
  const int count;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::mutex mutex;
  std::condition_variable cv;
};

class InProcessGroup::Rank final : public Communicator {
 public:
  Rank(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }
  void abort(const std::string& reason) override {
    group_.barrier_->abort("rank " + std::to_string(rank_) + ": " + reason);
  }
  /// What a collective does when the ranks' tensors disagree: aborts the group (so no rank
  /// waits for this one), then throws.
  [[noreturn]] void fail(const std::string& why) {
    abort(why);
    PAGELLM_FAIL() << why;
  }

  void all_reduce_sum(Backend& backend, Tensor& t) override {
    auto& slots = group_.slots_;
    slots[static_cast<size_t>(rank_)] = backend.download_f32(t);
    group_.barrier_->arrive_and_wait();  // every rank's copy is in its slot
    const size_t n = slots[0].size();
    std::vector<float> sum(n, 0.0f);
    for (const std::vector<float>& part : slots) {
      if (part.size() != n) {
        fail("all_reduce_sum: ranks passed tensors of " + std::to_string(n) + " and " +
             std::to_string(part.size()) + " elements");
      }
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    }
    group_.barrier_->arrive_and_wait();  // every rank has read the slots
    backend.upload(t, 0, sum.data(), DType::F32, static_cast<int64_t>(n));
  }

  void all_gather_columns(Backend& backend, const Tensor& part, Tensor& full) override {
    if (!(part.ndim == 2 && full.ndim == 2 && full.size(0) == part.size(0) &&
          full.size(1) == part.size(1) * size())) {
      fail("all_gather_columns: part " + part.shape_string() + " and full " +
           full.shape_string() + " are not [R, C] and [R, " + std::to_string(size()) + " x C]");
    }
    auto& slots = group_.slots_;
    slots[static_cast<size_t>(rank_)] = backend.download_f32(part);
    group_.barrier_->arrive_and_wait();
    const int64_t R = part.size(0), C = part.size(1);
    std::vector<float> out(static_cast<size_t>(R * C * size()));
    for (int r = 0; r < size(); ++r) {
      const std::vector<float>& src = slots[static_cast<size_t>(r)];
      if (static_cast<int64_t>(src.size()) != R * C) {
        fail("all_gather_columns: rank " + std::to_string(r) + " passed " +
             std::to_string(src.size()) + " elements, not " + std::to_string(R * C));
      }
      for (int64_t row = 0; row < R; ++row) {
        std::copy(src.begin() + row * C, src.begin() + (row + 1) * C,
                  out.begin() + (row * size() + r) * C);
      }
    }
    group_.barrier_->arrive_and_wait();
    backend.upload(full, 0, out.data(), DType::F32, static_cast<int64_t>(out.size()));
  }

 private:
  InProcessGroup& group_;
  int rank_;
};

InProcessGroup::InProcessGroup(int size)
    : size_(size),
      barrier_(std::make_shared<Barrier>(size >= 1 ? size : 1)),
      slots_(static_cast<size_t>(size >= 1 ? size : 1)) {
  PAGELLM_CHECK(size >= 1) << "InProcessGroup: a group needs at least 1 rank, got " << size;
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  PAGELLM_CHECK(rank >= 0 && rank < size_)
      << "InProcessGroup: rank " << rank << " outside 0.." << size_ - 1;
  return std::make_unique<Rank>(*this, rank);
}

}  // namespace pagellm
