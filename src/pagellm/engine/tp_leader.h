// The leader's side of a tensor-parallel engine (docs/design.md, "Tensor parallelism"):
// rank 0 is the engine's own process; it spawns one pagellm-worker process per other rank,
// which connects back over loopback TCP, and tells each worker every device operation of a
// step before running it itself (StepMirror).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pagellm/backend/communicator.h"
#include "pagellm/common/framed_socket.h"
#include "pagellm/engine/model_runner.h"
#include "pagellm/engine/peer_watchdog.h"
#include "pagellm/engine/tp_protocol.h"

namespace pagellm {

/// The path of the pagellm-worker executable: $PAGELLM_WORKER when set (it must be an
/// executable file), else the first executable `pagellm-worker` beside this process's
/// executable (/proc/self/exe), beside the file that holds this library (dladdr: the
/// Python extension module), or in that file's ../bin. Throws Error naming every place it
/// looked.
std::string find_worker_executable();

/// Rank 0 of a tensor-parallel group: the worker processes of ranks 1..size-1 and their
/// connections. Not thread-safe (the engine's thread), except that the destructor may run
/// after a failure anywhere.
class TpLeader final : public StepMirror {
 public:
  struct Options {
    int size = 2;
    /// Empty: find_worker_executable().
    std::string worker_path;
    /// How long the workers have to start and connect.
    int64_t join_timeout_ms = 60'000;
    /// How long any later wait for a worker may take (loading, a collective).
    int64_t timeout_ms = 600'000;
    /// NAME=VALUE settings added to the workers' environment where it lacks NAME.
    std::vector<std::string> default_env;
  };

  /// Spawns the workers (posix_spawn) and waits until each has connected with this
  /// launch's token. Throws Error, leaving no process behind, when the worker executable
  /// is missing, a worker exits before it joins (naming its rank and exit status) or does
  /// not join within join_timeout_ms.
  static std::unique_ptr<TpLeader> launch(const Options& options);
  /// Tells the workers to exit, waits for them (up to 10 s, then SIGKILL) and reaps them.
  ~TpLeader() override;
  TpLeader(const TpLeader&) = delete;
  TpLeader& operator=(const TpLeader&) = delete;

  int size() const { return options_.size; }
  /// The workers' process ids, rank 1 first.
  std::vector<pid_t> worker_pids() const;

  /// Sends each worker its setup (device = its rank).
  void send_setup(tp::WorkerSetup setup);
  /// The communicator over the workers' connections, for a backend without device
  /// collectives (HostCommunicator, rank 0); it must not outlive this leader.
  std::unique_ptr<Communicator> host_communicator();
  /// Sends every worker the runner's configuration.
  void send_runner_config(const ModelRunnerConfig& config);
  /// RunnerGroup::agree_num_pages: the minimum of `own` and every worker's count, which
  /// every worker is then told.
  int64_t agree_num_pages(int64_t own);
  /// Waits until every worker has made its backend (after send_setup). Before joining a
  /// device group, whose join (ncclCommInitRank) would wait forever for a rank that failed
  /// to make its backend (a missing GPU): such a rank's Error arrives here instead.
  void wait_backends_up();
  /// Waits until every worker has built its runner.
  void wait_ready();
  /// Records that the group failed (a step threw on this rank: its collectives were
  /// aborted, or a worker is gone): every later operation throws Error with `why`.
  void mark_failed(const std::string& why) {
    if (failed_.empty()) failed_ = why;
  }
  /// Throws Error when the group failed earlier (or the watchdog saw a worker go),
  /// repeating why.
  void throw_if_failed() const;
  /// Starts the watchdog over the workers' connections (PeerWatchdog). When one ends (the
  /// worker exited, was killed, or failed and went), `comm` (rank 0's device communicator,
  /// whose abort is safe from another thread) is aborted from the watchdog's thread, so a
  /// collective waiting for that rank returns, and the group fails: every later operation
  /// throws naming the rank. For device collectives, which nothing reads the connections
  /// during (HostCommunicator reads them and sees their end itself). `comm` must outlive the
  /// watchdog: request_shutdown (or the destructor) stops it.
  void start_watchdog(Communicator* comm);
  /// Stops the watchdog, then asks the workers to exit (they will not be told anything
  /// more); the destructor reaps.
  void request_shutdown();

  // StepMirror
  void copy_kv_pages(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  void forward(const ForwardBatch& batch, int32_t graph_bucket) override;

  /// Sends every worker a weights operation (tp::kJoinWeightGroup, kLeaveWeightGroup,
  /// kLoadWeights, kBroadcastWeights), which each answers with a kWeightsDone.
  void send_weights_op(uint32_t type, const std::vector<uint8_t>& payload) {
    send_all(type, payload);
  }
  /// Every worker's kWeightsDone (rank 1 first), waiting up to timeout_ms for each (-1:
  /// Options::timeout_ms). A worker gone, silent or aborting marks the group failed.
  std::vector<tp::WeightsDone> weights_done(int64_t timeout_ms = -1);

  /// "pid 41, killed by signal 9 (Killed)": what is known of rank `rank`'s process, for
  /// errors. Waits up to a second for a process whose connection ended to be reaped.
  std::string describe(int rank);

 private:
  explicit TpLeader(Options options) : options_(std::move(options)) {}
  void spawn_and_join();
  /// Sends one frame to every worker; throws Error naming a rank that is gone.
  void send_all(uint32_t type, const std::vector<uint8_t>& payload);
  /// The next frame from `rank`, which must be of type `want`: an abort frame, end of file
  /// or a timeout throws Error naming the rank (with its process's fate).
  Frame receive(int rank, uint32_t want, int64_t timeout_ms = -1);
  /// Records the exit status of rank `rank` when it has exited (waitpid, no hang).
  bool reap(int rank, bool wait);
  void kill_and_reap_all();

  struct Worker {
    pid_t pid = -1;
    bool reaped = false;
    int status = 0;
    std::unique_ptr<FramedSocket> socket;
  };
  Options options_;
  std::vector<Worker> workers_;  // index = rank (0 unused)
  int listen_fd_ = -1;
  /// The thread that spawned the workers lives as long as they do: PR_SET_PDEATHSIG (the
  /// workers die with the leader) fires when the spawning *thread* ends, and the engine may
  /// be made on a thread that ends before the engine does.
  std::thread spawner_;
  std::mutex spawner_mutex_;
  std::condition_variable spawner_cv_;
  bool spawner_stop_ = false;
  /// Set once the group failed: every later operation throws this.
  std::string failed_;
  /// Set by the watchdog's thread when a worker's connection ended.
  mutable std::mutex lost_mutex_;
  std::string lost_;
  std::unique_ptr<PeerWatchdog> watchdog_;
  bool shutdown_sent_ = false;
};

}  // namespace pagellm
