// HostCommunicator (backend/host_communicator.h): ranks as threads of this process talking
// over socket pairs, as the tensor-parallel processes talk over loopback TCP. Every rank's
// sums and gathers are the same bits, and the same bits as InProcessGroup's; a peer that
// closes its connection or aborts makes the collectives throw an Error naming it (never a
// hang).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagellm/backend/communicator.h"
#include "pagellm/backend/host_communicator.h"
#include "pagellm/cpu/cpu_backend.h"

namespace pagellm {
namespace {

// A star of `size` ranks: rank 0 holds one socket per other rank, rank r the other end.
struct Star {
  explicit Star(int size) : to_rank(static_cast<size_t>(size)), to_leader(static_cast<size_t>(size)) {
    for (int r = 1; r < size; ++r) {
      int fds[2];
      EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
      to_rank[static_cast<size_t>(r)] = std::make_unique<FramedSocket>(fds[0], "rank " + std::to_string(r));
      to_leader[static_cast<size_t>(r)] = std::make_unique<FramedSocket>(fds[1], "rank 0");
    }
  }
  std::unique_ptr<HostCommunicator> comm(int rank, int64_t timeout_ms = 20'000) {
    const int size = static_cast<int>(to_rank.size());
    std::vector<FramedSocket*> peers;
    if (rank == 0) {
      peers.push_back(nullptr);
      for (int r = 1; r < size; ++r) peers.push_back(to_rank[static_cast<size_t>(r)].get());
    } else {
      peers.push_back(to_leader[static_cast<size_t>(rank)].get());
    }
    return std::make_unique<HostCommunicator>(rank, size, peers, timeout_ms);
  }
  std::vector<std::unique_ptr<FramedSocket>> to_rank, to_leader;
};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs an all-reduce of each rank's random [rows, cols] and an all-gather of [rows, cols]
// parts through `comms` (one thread per rank); returns each rank's (sum, gathered).
template <class MakeComm>
std::vector<std::pair<std::vector<float>, std::vector<float>>> run_collectives(int size,
                                                                               MakeComm make) {
  const int64_t rows = 3, cols = 257;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> out(static_cast<size_t>(size));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(make(r));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        CpuBackend backend;
        std::vector<float> mine = random_values(static_cast<size_t>(rows * cols), 100 + r);
        Tensor t(mine.data(), DType::F32, {rows, cols});
        comms[static_cast<size_t>(r)]->all_reduce_sum(backend, t);
        std::vector<float> part = random_values(static_cast<size_t>(rows * cols), 200 + r);
        std::vector<float> full(static_cast<size_t>(rows * cols * size));
        Tensor p(part.data(), DType::F32, {rows, cols});
        Tensor f(full.data(), DType::F32, {rows, cols * size});
        comms[static_cast<size_t>(r)]->all_gather_columns(backend, p, f);
        out[static_cast<size_t>(r)] = {mine, full};
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return out;
}

TEST(HostCommunicator, SameBitsOnEveryRankAndAsInProcessGroup) {
  for (int size : {2, 3, 4}) {
    Star star(size);
    const auto host = run_collectives(size, [&](int r) { return star.comm(r); });
    InProcessGroup group(size);
    const auto threads = run_collectives(size, [&](int r) { return group.communicator(r); });
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(same_bits(host[static_cast<size_t>(r)].first, host[0].first)) << size << " " << r;
      EXPECT_TRUE(same_bits(host[static_cast<size_t>(r)].second, host[0].second)) << size << " " << r;
      EXPECT_TRUE(same_bits(host[static_cast<size_t>(r)].first, threads[0].first)) << size << " " << r;
      EXPECT_TRUE(same_bits(host[static_cast<size_t>(r)].second, threads[0].second)) << size << " " << r;
    }
    // The sum is a sum: rank 0's part differs from the result (not a copy).
    EXPECT_FALSE(same_bits(host[0].first, random_values(host[0].first.size(), 100)));
  }
}

TEST(HostCommunicator, PeerThatClosesMakesTheCollectiveThrowNamingIt) {
  Star star(3);
  auto leader = star.comm(0, 5'000);
  auto rank1 = star.comm(1, 5'000);
  std::string leader_error, rank1_error;
  std::thread t1([&] {
    CpuBackend backend;
    std::vector<float> v(8, 1.0f);
    Tensor t(v.data(), DType::F32, {8});
    try {
      rank1->all_reduce_sum(backend, t);
    } catch (const Error& e) {
      rank1_error = e.what();
    }
  });
  star.to_leader[2]->close();  // rank 2 goes away without a word
  CpuBackend backend;
  std::vector<float> v(8, 1.0f);
  Tensor t(v.data(), DType::F32, {8});
  try {
    leader->all_reduce_sum(backend, t);
  } catch (const Error& e) {
    leader_error = e.what();
  }
  t1.join();
  EXPECT_NE(leader_error.find("tensor-parallel rank 2 closed its connection during all_reduce_sum"),
            std::string::npos)
      << leader_error;
  // Rank 1 waited for rank 0's result: the abort rank 0 sent reaches it.
  EXPECT_NE(rank1_error.find("tensor-parallel group aborted: rank 0: tensor-parallel rank 2"),
            std::string::npos)
      << rank1_error;
  // Every later collective throws at once.
  EXPECT_THROW(leader->all_reduce_sum(backend, t), Error);
}

TEST(HostCommunicator, AbortFromAnotherThreadEndsAWaitAndReachesThePeers) {
  Star star(2);
  auto leader = star.comm(0, 60'000);
  auto rank1 = star.comm(1, 60'000);
  std::string leader_error, rank1_error;
  // Rank 0 waits for rank 1's part, which never comes: rank 1 aborts instead.
  std::thread waiter([&] {
    CpuBackend backend;
    std::vector<float> v(4, 1.0f);
    Tensor t(v.data(), DType::F32, {4});
    try {
      leader->all_reduce_sum(backend, t);
    } catch (const Error& e) {
      leader_error = e.what();
    }
  });
  rank1->abort("its loader failed");
  waiter.join();
  EXPECT_EQ(leader_error, "tensor-parallel group aborted: rank 1: its loader failed");
  CpuBackend backend;
  std::vector<float> v(4, 1.0f);
  Tensor t(v.data(), DType::F32, {4});
  try {
    rank1->all_reduce_sum(backend, t);
    ADD_FAILURE() << "an aborted rank's collective returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "tensor-parallel group aborted: rank 1: its loader failed");
  }
  // abort on this thread while another waits: the wait ends (checked every 100 ms).
  Star star2(2);
  auto lone = star2.comm(0, 60'000);
  std::thread waiter2([&] {
    CpuBackend b;
    std::vector<float> w(4, 1.0f);
    Tensor t2(w.data(), DType::F32, {4});
    EXPECT_THROW(lone->all_reduce_sum(b, t2), Error);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  lone->abort("the engine is shutting down");
  waiter2.join();
}

TEST(HostCommunicator, SilentPeerTimesOut) {
  Star star(2);
  auto leader = star.comm(0, 300);
  CpuBackend backend;
  std::vector<float> v(4, 1.0f);
  Tensor t(v.data(), DType::F32, {4});
  try {
    leader->all_reduce_sum(backend, t);
    ADD_FAILURE() << "returned without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-parallel rank 1 sent nothing for"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagellm
