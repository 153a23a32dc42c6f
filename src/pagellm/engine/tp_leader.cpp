#include "pagellm/engine/tp_leader.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "pagellm/backend/host_communicator.h"

extern char** environ;

namespace pagellm {

namespace {

namespace fs = std::filesystem;

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) +
           (name != nullptr ? std::string(" (") + name + ")" : std::string());
  }
  return "ended with wait status " + std::to_string(status);
}

std::string random_token() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    PAGELLM_CHECK(n > 0) << "tensor parallel: getrandom failed: " << std::strerror(errno);
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (uint8_t b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

}  // namespace

std::string find_worker_executable() {
  if (const char* env = std::getenv("PAGELLM_WORKER"); env != nullptr && *env != '\0') {
    PAGELLM_CHECK(is_executable_file(env))
        << "PAGELLM_WORKER=" << env << " is not an executable file (it must name the "
        << "pagellm-worker program that runs each tensor-parallel rank after the first)";
    return env;
  }
  std::vector<std::string> looked;
  auto look_in = [&looked](const fs::path& dir) -> std::string {
    const std::string candidate = (dir / "pagellm-worker").lexically_normal().string();
    if (std::find(looked.begin(), looked.end(), candidate) != looked.end()) return "";
    looked.push_back(candidate);
    return is_executable_file(candidate) ? candidate : "";
  };
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (std::string found = look_in(exe.parent_path()); !found.empty()) return found;
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_worker_executable), &info) != 0 &&
      info.dli_fname != nullptr) {
    const fs::path library = fs::weakly_canonical(info.dli_fname, ec);
    if (!ec) {
      if (std::string found = look_in(library.parent_path()); !found.empty()) return found;
      if (std::string found = look_in(library.parent_path().parent_path() / "bin");
          !found.empty()) {
        return found;
      }
    }
  }
  std::string list;
  for (const std::string& p : looked) list += (list.empty() ? "" : ", ") + p;
  PAGELLM_FAIL() << "tensor parallelism needs the pagellm-worker program (one process per "
                 << "rank after the first), but it was not found; looked for " << list
                 << ". Install it beside pagellm, or set PAGELLM_WORKER to its path";
}

std::unique_ptr<TpLeader> TpLeader::launch(const Options& options) {
  PAGELLM_CHECK(options.size >= 2)
      << "TpLeader: a group of worker processes needs size >= 2, got " << options.size;
  Options resolved = options;
  if (resolved.worker_path.empty()) resolved.worker_path = find_worker_executable();
  std::unique_ptr<TpLeader> leader(new TpLeader(resolved));
  try {
    leader->spawn_and_join();
  } catch (...) {
    leader->kill_and_reap_all();
    throw;
  }
  return leader;
}

void TpLeader::spawn_and_join() {
  const int size = options_.size;
  workers_.resize(static_cast<size_t>(size));

  // A listening socket on the loopback, on a port the kernel picks.
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PAGELLM_CHECK(listen_fd_ >= 0) << "tensor parallel: socket: " << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  PAGELLM_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      << "tensor parallel: binding a loopback port: " << std::strerror(errno);
  PAGELLM_CHECK(::listen(listen_fd_, size) == 0)
      << "tensor parallel: listen: " << std::strerror(errno);
  socklen_t len = sizeof(addr);
  PAGELLM_CHECK(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      << "tensor parallel: getsockname: " << std::strerror(errno);
  const int port = ntohs(addr.sin_port);
  const std::string token = random_token();

  // The workers' environment: ours, and the token (never in argv, which /proc shows to
  // every user of the machine).
  std::vector<std::string> env_strings;
  const std::string token_prefix = std::string(tp::kTokenEnv) + "=";
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, token_prefix.c_str(), token_prefix.size()) != 0) env_strings.push_back(*e);
  }
  for (const std::string& setting : options_.default_env) {
    const std::string name = setting.substr(0, setting.find('='));
    if (std::getenv(name.c_str()) == nullptr) env_strings.push_back(setting);
  }
  env_strings.push_back(token_prefix + token);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  // Spawn from a thread that lives as long as the workers (see spawner_).
  std::vector<std::string> spawn_errors(static_cast<size_t>(size));
  bool spawned = false;
  spawner_ = std::thread([&, this] {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // stdin/out/err only
    for (int r = 1; r < size; ++r) {
      std::vector<std::string> args = {options_.worker_path,
                                       "--connect",
                                       "127.0.0.1:" + std::to_string(port),
                                       "--rank",
                                       std::to_string(r),
                                       "--size",
                                       std::to_string(size),
                                       "--leader-pid",
                                       std::to_string(::getpid())};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      pid_t pid = -1;
      const int rc = ::posix_spawn(&pid, options_.worker_path.c_str(), &actions, nullptr,
                                   argv.data(), envp.data());
      if (rc != 0) {
        spawn_errors[static_cast<size_t>(r)] = std::strerror(rc);
      } else {
        workers_[static_cast<size_t>(r)].pid = pid;
      }
    }
    posix_spawn_file_actions_destroy(&actions);
    std::unique_lock<std::mutex> lock(spawner_mutex_);
    spawned = true;
    spawner_cv_.notify_all();
    spawner_cv_.wait(lock, [this] { return spawner_stop_; });
  });
  {
    std::unique_lock<std::mutex> lock(spawner_mutex_);
    spawner_cv_.wait(lock, [&] { return spawned; });
  }
  for (int r = 1; r < size; ++r) {
    PAGELLM_CHECK(spawn_errors[static_cast<size_t>(r)].empty())
        << "tensor parallel: could not start " << options_.worker_path << " for rank " << r
        << ": " << spawn_errors[static_cast<size_t>(r)];
  }

  // Accept until every rank has said hello with the token.
  const int64_t deadline = monotonic_ms() + options_.join_timeout_ms;
  int joined = 0;
  while (joined < size - 1) {
    for (int r = 1; r < size; ++r) {
      Worker& w = workers_[static_cast<size_t>(r)];
      if (w.socket == nullptr && reap(r, false)) {
        PAGELLM_FAIL() << "tensor-parallel rank " << r << " (" << options_.worker_path
                       << ", pid " << w.pid << ") " << status_text(w.status)
                       << " before it joined the group (its error output says why)";
      }
    }
    const int64_t left = deadline - monotonic_ms();
    if (left <= 0) {
      std::string missing;
      for (int r = 1; r < size; ++r) {
        if (workers_[static_cast<size_t>(r)].socket == nullptr) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (pid " +
                     std::to_string(workers_[static_cast<size_t>(r)].pid) + ")";
        }
      }
      PAGELLM_FAIL() << "tensor-parallel rank(s) " << missing << " did not join within "
                     << options_.join_timeout_ms / 1000.0 << " s (" << options_.worker_path
                     << " started but never connected back to 127.0.0.1:" << port << ")";
    }
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (ready <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto socket = std::make_unique<FramedSocket>(fd, "a connection to the tensor-parallel port");
    // A stranger on the port (wrong magic or token, malformed, or silent) is dropped: only
    // our own workers know the token.
    Frame hello;
    uint32_t version = 0;
    int32_t rank = -1;
    try {
      if (socket->receive(hello, 2000) != ReceiveStatus::kFrame || hello.type != tp::kHello) {
        continue;
      }
      WireReader r(hello.payload, "hello");
      const uint64_t magic = r.get<uint64_t>();
      version = r.get<uint32_t>();
      rank = r.get<int32_t>();
      if (magic != tp::kMagic || r.get_string() != token) continue;
    } catch (const Error&) {
      continue;
    }
    PAGELLM_CHECK(version == tp::kProtocolVersion)
        << options_.worker_path << " speaks tensor-parallel protocol version " << version
        << ", this library version " << tp::kProtocolVersion
        << " (a pagellm-worker of another build: install the two together)";
    if (rank < 1 || rank >= size || workers_[static_cast<size_t>(rank)].socket != nullptr) {
      continue;
    }
    WireWriter welcome;
    welcome.put<uint64_t>(tp::kMagic).put<uint32_t>(tp::kProtocolVersion);
    if (!socket->send(tp::kWelcome, welcome.bytes())) continue;
    socket->set_peer("tensor-parallel rank " + std::to_string(rank));
    workers_[static_cast<size_t>(rank)].socket = std::move(socket);
    ++joined;
  }
  ::close(listen_fd_);  // nothing else may join
  listen_fd_ = -1;
}

TpLeader::~TpLeader() {
  request_shutdown();
  for (Worker& w : workers_) {
    if (w.socket) w.socket->close();  // end of file: a worker in any wait exits
  }
  const int64_t deadline = monotonic_ms() + 10'000;
  for (int r = 1; r < static_cast<int>(workers_.size()); ++r) {
    while (!reap(r, false) && monotonic_ms() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  kill_and_reap_all();
}

void TpLeader::kill_and_reap_all() {
  for (int r = 1; r < static_cast<int>(workers_.size()); ++r) {
    Worker& w = workers_[static_cast<size_t>(r)];
    if (w.pid > 0 && !w.reaped) {
      ::kill(w.pid, SIGKILL);
      reap(r, true);
    }
  }
  if (spawner_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(spawner_mutex_);
      spawner_stop_ = true;
    }
    spawner_cv_.notify_all();
    spawner_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

bool TpLeader::reap(int rank, bool wait) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  if (w.pid <= 0) return false;
  if (w.reaped) return true;
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(w.pid, &status, wait ? 0 : WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == w.pid) {
    w.reaped = true;
    w.status = status;
    return true;
  }
  if (got < 0) {  // not our child any more (reaped elsewhere): nothing to wait for
    w.reaped = true;
    w.status = -1;
    return true;
  }
  return false;
}

std::vector<pid_t> TpLeader::worker_pids() const {
  std::vector<pid_t> pids;
  for (size_t r = 1; r < workers_.size(); ++r) pids.push_back(workers_[r].pid);
  return pids;
}

std::string TpLeader::describe(int rank) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  const int64_t deadline = monotonic_ms() + 1000;
  while (!reap(rank, false) && monotonic_ms() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string text = "pid " + std::to_string(w.pid);
  if (w.reaped && w.status != -1) text += ", " + status_text(w.status);
  return text;
}

void TpLeader::throw_if_failed() const {
  PAGELLM_CHECK(failed_.empty()) << "the tensor-parallel group failed earlier: " << failed_;
  std::lock_guard<std::mutex> lock(lost_mutex_);
  PAGELLM_CHECK(lost_.empty()) << "the tensor-parallel group failed: " << lost_;
}

void TpLeader::start_watchdog(Communicator* comm) {
  PAGELLM_CHECK(comm != nullptr && watchdog_ == nullptr)
      << "TpLeader::start_watchdog: needs a communicator, once";
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 1; r < size(); ++r) {
    fds.push_back(workers_[static_cast<size_t>(r)].socket->fd());
    pids.push_back(workers_[static_cast<size_t>(r)].pid);
  }
  watchdog_ = std::make_unique<PeerWatchdog>(fds, [this, comm, pids](size_t i) {
    const std::string why = "tensor-parallel rank " + std::to_string(i + 1) + " (pid " +
                            std::to_string(pids[i]) +
                            ") closed its connection: the worker process ended";
    {
      std::lock_guard<std::mutex> lock(lost_mutex_);
      lost_ = why;
    }
    comm->abort(why);  // a collective that waits for the rank returns
  });
}

void TpLeader::send_all(uint32_t type, const std::vector<uint8_t>& payload) {
  throw_if_failed();
  PAGELLM_CHECK(!shutdown_sent_) << "the tensor-parallel group is shutting down";
  for (int r = 1; r < size(); ++r) {
    if (!workers_[static_cast<size_t>(r)].socket->send(type, payload)) {
      failed_ = "tensor-parallel rank " + std::to_string(r) + " (" + describe(r) +
                ") is gone: its connection closed before the leader's " +
                tp::message_name(type) + " message";
      PAGELLM_FAIL() << failed_;
    }
  }
}

Frame TpLeader::receive(int rank, uint32_t want, int64_t timeout_ms) {
  throw_if_failed();
  if (timeout_ms < 0) timeout_ms = options_.timeout_ms;
  Frame frame;
  const ReceiveStatus status = workers_[static_cast<size_t>(rank)].socket->receive(frame, timeout_ms);
  const std::string who = "tensor-parallel rank " + std::to_string(rank);
  if (status == ReceiveStatus::kClosed) {
    failed_ = who + " (" + describe(rank) + ") closed its connection before its " +
              tp::message_name(want) + " message";
  } else if (status != ReceiveStatus::kFrame) {
    failed_ = who + " (pid " + std::to_string(workers_[static_cast<size_t>(rank)].pid) +
              ") sent no " + tp::message_name(want) + " message within " +
              std::to_string(timeout_ms / 1000) + " s";
  } else if (frame.type == kFrameAbort) {
    failed_ = "tensor-parallel " + std::string(frame.payload.begin(), frame.payload.end());
  } else if (frame.type != want) {
    failed_ = who + " sent a " + tp::message_name(frame.type) + " message where its " +
              tp::message_name(want) + " message was due";
  }
  PAGELLM_CHECK(failed_.empty()) << failed_;
  return frame;
}

std::vector<tp::WeightsDone> TpLeader::weights_done(int64_t timeout_ms) {
  std::vector<tp::WeightsDone> out;
  for (int r = 1; r < size(); ++r) {
    out.push_back(tp::decode_weights_done(receive(r, tp::kWeightsDone, timeout_ms).payload));
  }
  return out;
}

void TpLeader::send_setup(tp::WorkerSetup setup) {
  throw_if_failed();
  for (int r = 1; r < size(); ++r) {
    setup.device = r;
    const std::vector<uint8_t> bytes = tp::encode(setup);
    if (!workers_[static_cast<size_t>(r)].socket->send(tp::kSetup, bytes)) {
      failed_ = "tensor-parallel rank " + std::to_string(r) + " (" + describe(r) +
                ") is gone: its connection closed before its setup";
      PAGELLM_FAIL() << failed_;
    }
  }
}

std::unique_ptr<Communicator> TpLeader::host_communicator() {
  std::vector<FramedSocket*> peers(static_cast<size_t>(size()), nullptr);
  for (int r = 1; r < size(); ++r) peers[static_cast<size_t>(r)] = workers_[static_cast<size_t>(r)].socket.get();
  return std::make_unique<HostCommunicator>(0, size(), std::move(peers), options_.timeout_ms,
                                            [this](int rank) { return describe(rank); });
}

void TpLeader::send_runner_config(const ModelRunnerConfig& config) {
  send_all(tp::kRunnerConfig, tp::encode(config));
}

int64_t TpLeader::agree_num_pages(int64_t own) {
  int64_t pages = own;
  for (int r = 1; r < size(); ++r) {
    const Frame frame = receive(r, tp::kPages);
    WireReader reader(frame.payload, "pages");
    pages = std::min(pages, reader.get<int64_t>());
    reader.expect_end();
  }
  WireWriter w;
  w.put<int64_t>(pages);
  send_all(tp::kPagesAgreed, w.bytes());
  return pages;
}

void TpLeader::wait_backends_up() {
  for (int r = 1; r < size(); ++r) receive(r, tp::kBackendUp);
}

void TpLeader::wait_ready() {
  for (int r = 1; r < size(); ++r) receive(r, tp::kReady);
}

void TpLeader::request_shutdown() {
  // First: the workers' connections end from here on, as they should.
  if (watchdog_) watchdog_->stop();
  if (shutdown_sent_) return;
  shutdown_sent_ = true;
  for (Worker& w : workers_) {
    if (w.socket) w.socket->send(tp::kShutdown, nullptr, 0);  // one already gone: ignored
  }
}

void TpLeader::copy_kv_pages(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  send_all(tp::kCopyPages, tp::encode_page_copies(src_dst));
}

void TpLeader::forward(const ForwardBatch& batch, int32_t graph_bucket) {
  send_all(tp::kForward, tp::encode_forward(batch, graph_bucket));
}

}  // namespace pagellm
