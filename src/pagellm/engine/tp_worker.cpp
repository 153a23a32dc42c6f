#include "pagellm/engine/tp_worker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "pagellm/backend/host_communicator.h"
#include "pagellm/common/framed_socket.h"
#include "pagellm/engine/model_runner.h"
#include "pagellm/engine/tp_protocol.h"
#include "pagellm/engine/weight_group.h"
#include "pagellm/model/tensor_parallel.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {

namespace {

struct WorkerArgs {
  std::string host;
  int port = 0;
  int rank = -1;
  int size = 0;
  long leader_pid = 0;
};

bool parse_int(const char* text, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

/// Empty on success, else what is wrong.
std::string parse_args(int argc, char** argv, WorkerArgs& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return flag + " needs a value";
    const char* value = argv[++i];
    long v = 0;
    if (flag == "--connect") {
      const std::string s = value;
      const size_t colon = s.rfind(':');
      if (colon == std::string::npos || !parse_int(s.c_str() + colon + 1, &v) || v <= 0 ||
          v > 65535) {
        return "--connect " + s + " is not HOST:PORT";
      }
      a.host = s.substr(0, colon);
      a.port = static_cast<int>(v);
    } else if (flag == "--rank" && parse_int(value, &v)) {
      a.rank = static_cast<int>(v);
    } else if (flag == "--size" && parse_int(value, &v)) {
      a.size = static_cast<int>(v);
    } else if (flag == "--leader-pid" && parse_int(value, &v)) {
      a.leader_pid = v;
    } else {
      return "unknown or bad argument " + flag + " " + value;
    }
  }
  if (a.host.empty()) return "--connect HOST:PORT is required";
  if (a.size < 2 || a.rank < 1 || a.rank >= a.size) {
    return "--rank " + std::to_string(a.rank) + " --size " + std::to_string(a.size) +
           " (a worker is a rank in 1 .. size - 1)";
  }
  if (a.leader_pid <= 0) return "--leader-pid is required";
  return "";
}

int connect_to(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PAGELLM_CHECK(fd >= 0) << "socket: " << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    PAGELLM_FAIL() << "--connect: '" << host << "' is not an IPv4 address";
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    PAGELLM_FAIL() << "connecting to the leader at " << host << ":" << port << ": "
                   << std::strerror(err);
  }
  return fd;
}

/// The next frame from the leader, of type `want`; false when the leader said shutdown or
/// went away (the worker then exits quietly). An abort from the leader throws.
bool receive_from_leader(FramedSocket& leader, uint32_t want, Frame& frame) {
  const ReceiveStatus status = leader.receive(frame, -1);
  if (status != ReceiveStatus::kFrame || frame.type == tp::kShutdown) return false;
  PAGELLM_CHECK(frame.type != kFrameAbort)
      << "the group was aborted: " << std::string(frame.payload.begin(), frame.payload.end());
  PAGELLM_CHECK(want == 0 || frame.type == want)
      << "the leader sent a " << tp::message_name(frame.type) << " message where "
      << tp::message_name(want) << " was due";
  return true;
}

// A worker's side of the weight operations (docs/design.md, "Weight updates at TP > 1"):
// rank 0 checked each update against the whole model already; every failure here is
// answered, not thrown, so that rank 0 can tell whether the ranks still agree.
class WorkerWeights {
 public:
  WorkerWeights(ModelRunner& runner, int rank) : runner_(runner), rank_(rank) {}

  tp::WeightsDone handle(const Frame& frame) {
    tp::WeightsDone done;
    try {
      switch (frame.type) {
        case tp::kJoinWeightGroup: join(tp::decode_weight_group_spec(frame.payload)); break;
        case tp::kLeaveWeightGroup:
          if (!frame.payload.empty()) PAGELLM_FAIL() << "a leave message with a payload";
          group_.reset();
          staging_.release();
          break;
        case tp::kLoadWeights: load(tp::decode_load_weights(frame.payload), done); break;
        case tp::kBroadcastWeights: broadcast(tp::decode_broadcast_op(frame.payload), done); break;
        default: PAGELLM_FAIL() << "not a weights operation: " << tp::message_name(frame.type);
      }
    } catch (const std::exception& e) {
      done.error = e.what();
    }
    return done;
  }

 private:
  void join(WeightGroupSpec spec) {
    if (group_ && group_->broken()) group_.reset();
    PAGELLM_CHECK(group_ == nullptr) << "a weight group is joined already";
    spec.rank += rank_;  // rank 0's rank in the trainer's world, plus this rank's
    group_ = join_weight_group(runner_.backend(), spec);
  }

  void load(const std::string& path, tp::WeightsDone& done) {
    const WeightStore store = WeightStore::open(path);
    const std::vector<NamedTensor> tensors = named_tensors_of(store);
    Qwen3Model& model = runner_.model();
    try {
      model.check_weights_update(tensors);
    } catch (const Error& e) {
      PAGELLM_FAIL() << store.source() << ": " << e.what();
    }
    done.changed = true;
    const WeightWriteStats stats = model.update_weights(tensors);
    done.tensors = stats.tensors;
    done.bytes = stats.bytes;
  }

  void broadcast(const tp::BroadcastOp& op, tp::WeightsDone& done) {
    const std::vector<BroadcastBucket> buckets = plan_broadcast_buckets(op.tensors, op.bucket_bytes);
    PAGELLM_CHECK(group_ != nullptr && !group_->broken())
        << "tensor-parallel rank " << rank_ << " has no usable weight group";
    if (op.drain) {
      drain_broadcast(*group_, runner_.backend(), staging_, buckets, op.update);
      return;
    }
    const BroadcastWrite w = receive_broadcast_update(*group_, runner_.backend(), staging_,
                                                      runner_.model(), op.tensors, buckets,
                                                      op.update);
    done.changed = w.written > 0;
    done.buckets = w.written;
    done.tensors = w.stats.tensors;
    done.bytes = w.stats.bytes;
    if (!w.error.empty()) {
      group_.reset();  // as rank 0 does: a failed transfer leaves the group
      PAGELLM_FAIL() << w.error;
    }
  }

  ModelRunner& runner_;
  int rank_;
  std::unique_ptr<WeightReceiver> group_;
  BroadcastStaging staging_;  // kept across updates, like rank 0's
};

int serve(FramedSocket& leader, int rank, int size) {
  Frame frame;
  if (!receive_from_leader(leader, tp::kSetup, frame)) return 0;
  const tp::WorkerSetup setup = tp::decode_worker_setup(frame.payload);
  std::unique_ptr<Backend> backend = create_backend(setup.backend, setup.device);
  backend->set_attention_backend(setup.attention_backend);
  backend->set_batch_invariant(setup.batch_invariant);
  if (!leader.send(tp::kBackendUp, nullptr, 0)) return 0;
  std::unique_ptr<Communicator> comm;
  if (setup.communicator_id.empty()) {
    comm = std::make_unique<HostCommunicator>(rank, size, std::vector<FramedSocket*>{&leader},
                                              setup.timeout_ms);
  } else {
    comm = backend->join_communicator(setup.communicator_id, rank, size);
  }
  const Qwen3Config config = setup.source.config();
  const TensorParallel parallel{plan_tensor_parallel(config, size, rank), comm.get()};
  std::unique_ptr<Qwen3Model> model = setup.source.load(*backend, &parallel);

  if (!receive_from_leader(leader, tp::kRunnerConfig, frame)) return 0;
  const ModelRunnerConfig runner_config = tp::decode_runner_config(frame.payload);
  RunnerGroup group;
  group.comm = std::move(comm);
  group.agree_num_pages = [&](int64_t own) {
    WireWriter w;
    w.put<int64_t>(own);
    Frame agreed;
    PAGELLM_CHECK(leader.send(tp::kPages, w.bytes()) &&
                  receive_from_leader(leader, tp::kPagesAgreed, agreed))
        << "the leader went away while the ranks agreed on the KV page count";
    WireReader r(agreed.payload, "pages agreed");
    const int64_t pages = r.get<int64_t>();
    r.expect_end();
    return pages;
  };
  ModelRunner runner(std::move(backend), std::move(model), runner_config, std::move(group));
  if (!leader.send(tp::kReady, nullptr, 0)) return 0;
  WorkerWeights weights(runner, rank);

  for (;;) {
    if (!receive_from_leader(leader, 0, frame)) return 0;
    if (frame.type == tp::kForward) {
      int32_t bucket = 0;
      const ForwardBatch batch = tp::decode_forward(frame.payload, &bucket);
      runner.follow_forward(batch, bucket);
    } else if (frame.type == tp::kCopyPages) {
      runner.follow_copy_kv_pages(tp::decode_page_copies(frame.payload));
    } else if (frame.type == tp::kJoinWeightGroup || frame.type == tp::kLeaveWeightGroup ||
               frame.type == tp::kLoadWeights || frame.type == tp::kBroadcastWeights) {
      if (!leader.send(tp::kWeightsDone, tp::encode(weights.handle(frame)))) return 0;
    } else {
      PAGELLM_FAIL() << "the leader sent a " << tp::message_name(frame.type)
                     << " message between steps";
    }
  }
}

}  // namespace

int run_tensor_parallel_worker(int argc, char** argv) {
  WorkerArgs args;
  const std::string bad = parse_args(argc, argv, args);
  if (!bad.empty()) {
    std::fprintf(stderr,
                 "pagellm-worker: %s\n(pagellm-worker is started by a pagellm engine with "
                 "tensor_parallel_size > 1, not by hand)\n",
                 bad.c_str());
    return 2;
  }
  // Die with the leader, also when it is killed; a leader gone before this line is seen by
  // the parent check.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != static_cast<pid_t>(args.leader_pid)) return 1;
  const char* token_env = std::getenv(tp::kTokenEnv);
  const std::string token = token_env != nullptr ? token_env : "";
  ::unsetenv(tp::kTokenEnv);  // not for anything this process starts
  const std::string me = "pagellm-worker (tensor-parallel rank " + std::to_string(args.rank) + ")";

  std::unique_ptr<FramedSocket> leader;
  try {
    leader = std::make_unique<FramedSocket>(connect_to(args.host, args.port),
                                            "the tensor-parallel leader (rank 0)");
    WireWriter hello;
    hello.put<uint64_t>(tp::kMagic).put<uint32_t>(tp::kProtocolVersion);
    hello.put<int32_t>(args.rank).put_string(token);
    PAGELLM_CHECK(leader->send(tp::kHello, hello.bytes()))
        << "the leader closed the connection before the handshake";
    Frame welcome;
    PAGELLM_CHECK(leader->receive(welcome, 30'000) == ReceiveStatus::kFrame &&
                  welcome.type == tp::kWelcome)
        << "the leader did not welcome this worker (a wrong token, or another program on "
        << "the port)";
    WireReader r(welcome.payload, "welcome");
    const uint64_t magic = r.get<uint64_t>();
    const uint32_t version = r.get<uint32_t>();
    PAGELLM_CHECK(magic == tp::kMagic && version == tp::kProtocolVersion)
        << "the leader speaks tensor-parallel protocol version " << version << ", this worker "
        << tp::kProtocolVersion;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", me.c_str(), e.what());
    return 1;
  }
  try {
    return serve(*leader, args.rank, args.size);
  } catch (const std::exception& e) {
    const std::string text = "rank " + std::to_string(args.rank) + ": " + e.what();
    leader->send(kFrameAbort, text.data(), text.size());
    std::fprintf(stderr, "%s: error: %s\n", me.c_str(), e.what());
    return 1;
  }
}

}  // namespace pagellm
