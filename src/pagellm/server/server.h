// `pagellm serve`: an OpenAI-compatible HTTP server over AsyncEngine, with the token-level
// /generate endpoint and the control calls RL trainers use. docs/design.md, "Server".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pagellm {
class AsyncEngine;
}

namespace pagellm::server {

/// How the server listens and what it accepts.
struct ServerOptions {
  std::string host = "127.0.0.1";
  /// 0: pick a free port (Server::port() tells which).
  int port = 8000;
  /// When set, every route but /health and /metrics needs "Authorization: Bearer <key>".
  std::string api_key;
  /// The model name of /v1/models and of responses; requests naming another get 404.
  std::string model_name;
  /// Bodies larger than this get 413.
  size_t max_body_bytes = size_t{32} << 20;
  /// Most engine requests (prompts) unfinished at once; a request that would exceed it
  /// gets 503. 0: no limit.
  int64_t max_queued_requests = 4096;
  /// Most HTTP worker threads: each open connection (an SSE stream holds one for its whole
  /// life) occupies one, so this bounds the concurrent streams. Threads start on demand.
  int http_threads = 512;
  /// A worker thread idle this long ends (its stack and allocator caches go back), in s.
  double http_thread_idle_seconds = 10.0;
  /// A worker thread ends after serving this many connections (a fresh one takes its
  /// place), so that per-thread allocator caches do not grow for the server's whole life.
  /// 0: no limit.
  int64_t http_thread_max_connections = 100;
  /// Chat output parsing, as vLLM's flags of the same names: "qwen3" splits the reasoning
  /// into reasoning_content; "hermes" with enable_auto_tool_choice turns the <tool_call>
  /// blocks of requests that give tools into tool_calls. Empty: the text as generated.
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
};

/// The HTTP server. Handlers run on cpp-httplib's worker threads; engine work runs on the
/// AsyncEngine's loop thread, and a handler only waits on its own queue of deltas (filled
/// by the engine's callbacks) or on a blocking control call, never holding the loop.
class Server {
 public:
  /// The engine must outlive the server, and requests the server submitted call back into
  /// it until they end: after run() returns, shut the engine down (which ends them) before
  /// destroying the server, as `pagellm serve` does. `model_dir` is reported by /v1/models.
  Server(AsyncEngine& engine, ServerOptions options, std::string model_dir);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the socket; throws pagellm::Error when it cannot. Returns the port.
  int bind();
  /// Serves until stop(); bind() first.
  void run();
  /// Makes run() return (from any thread); open streams are aborted.
  void stop();
  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagellm::server
