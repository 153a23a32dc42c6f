// `pagellm serve`: parses the options, loads the model into an AsyncEngine and runs the
// library's HTTP server (src/pagellm/server) until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/async_engine.h"
#include "pagellm/common/check.h"
#include "pagellm/error.h"

namespace pagellm::cli {

#ifndef PAGELLM_HAVE_SERVER
void register_serve_command(CLI::App& app) {
  app.add_subcommand("serve", "an OpenAI-compatible HTTP server (not built)")->callback([] {
    PAGELLM_FAIL() << "this pagellm was built without the server (cpp-httplib's header was "
                      "not found; run scripts/setup.sh and build again)";
  });
}
#else
}  // namespace pagellm::cli

#include "pagellm/server/server.h"

namespace pagellm::cli {

namespace {

int g_stop_pipe[2] = {-1, -1};

struct ServeArgs {
  std::string model;
  server::ServerOptions server;
  double max_body_mb = 32.0;
  EngineSettings engine;
  /// --lora NAME=PATH (repeatable): adapters loaded before the server starts.
  std::vector<std::string> loras;
};

/// Loads each --lora NAME=PATH into the engine; the library's message names a bad folder.
void load_serve_loras(AsyncEngine& engine, const std::vector<std::string>& specs) {
  int64_t id = 0;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    PAGELLM_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < spec.size())
        << "--lora: '" << spec << "' is not NAME=PATH (a name, '=', then a PEFT adapter folder)";
    LoraRequest r{spec.substr(0, eq), ++id, spec.substr(eq + 1)};
    for (const LoraAdapterInfo& loaded : engine.list_lora_adapters()) {
      PAGELLM_CHECK(loaded.name != r.name) << "--lora: the name '" << r.name << "' is given twice";
    }
    try {
      engine.load_lora_adapter(r);
    } catch (const Error& e) {
      PAGELLM_FAIL() << "--lora " << r.name << ": " << e.what();
    }
    std::fprintf(stderr, "pagellm: LoRA adapter %s loaded from %s\n", r.name.c_str(),
                 r.path.c_str());
  }
}

void run_serve(ServeArgs args) {
  PAGELLM_CHECK(args.max_body_mb > 0) << "--max-body-mb must be > 0, got " << args.max_body_mb;
  args.server.max_body_bytes = static_cast<size_t>(args.max_body_mb * (1 << 20));
  const std::string model_dir = args.model.empty() ? default_model_dir() : args.model;
  // SIGINT/SIGTERM: the handler only writes a byte to a pipe (async-signal-safe); a thread
  // of our own reads it and stops the server. (sigwait cannot be used: OpenBLAS starts its
  // threads before main, so a process-wide signal may land on a thread that never blocked it.)
  PAGELLM_CHECK(pipe(g_stop_pipe) == 0) << "serve: cannot create a pipe";
  struct sigaction action {};
  action.sa_handler = [](int) {
    const char byte = 1;
    [[maybe_unused]] ssize_t written = write(g_stop_pipe[1], &byte, 1);
  };
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  std::fprintf(stderr, "pagellm: loading %s\n", model_dir.c_str());
  AsyncEngine engine(model_dir, engine_options(args.engine));
  load_serve_loras(engine, args.loras);
  server::Server http(engine, args.server, model_dir);
  const int port = http.bind();
  std::fprintf(stderr, "pagellm: serving %s on http://%s:%d (max_model_len %d, %lld KV pages)\n",
               model_dir.c_str(), args.server.host.c_str(), port, engine.max_model_len(),
               static_cast<long long>(engine.num_usable_pages()));
  std::thread watcher([&] {
    char byte = 0;
    if (read(g_stop_pipe[0], &byte, 1) == 1 && byte == 1) {
      std::fprintf(stderr, "pagellm: stopping on a signal\n");
    }
    // A request joining a trainer's group, or receiving its broadcast, would hold the stop
    // for the group's timeout (the loop thread waits for the trainer): end it first.
    engine.interrupt_weight_transfers();
    http.stop();
  });
  http.run();
  // run() may also end on its own (a listen error): wake the watcher so it can be joined.
  const char wake = 0;
  [[maybe_unused]] ssize_t written = write(g_stop_pipe[1], &wake, 1);
  watcher.join();
  engine.shutdown();
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto sa = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server");
  cmd->add_option("--model", sa->model,
                  "Hugging Face Qwen3 folder (default: an embedded tiny model made on first use)");
  cmd->add_option("--host", sa->server.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", sa->server.port, "port (0: a free one, printed)")->capture_default_str();
  cmd->add_option("--api-key", sa->server.api_key,
                  "require \"Authorization: Bearer KEY\" (all routes but /health and /metrics)");
  cmd->add_option("--served-model-name", sa->server.model_name,
                  "the model's name in the API (default: the folder's name)");
  cmd->add_option("--max-queued-requests", sa->server.max_queued_requests,
                  "most unfinished requests (prompts); more get 503 (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--max-body-mb", sa->max_body_mb, "largest request body; larger get 413")
      ->capture_default_str();
  cmd->add_option("--http-threads", sa->server.http_threads,
                  "most HTTP worker threads (started on demand): the most connections "
                  "(streams) served at once")
      ->capture_default_str();
  cmd->add_option("--http-thread-idle-seconds", sa->server.http_thread_idle_seconds,
                  "an HTTP worker thread idle this long ends")
      ->capture_default_str();
  cmd->add_option("--http-thread-max-connections", sa->server.http_thread_max_connections,
                  "an HTTP worker thread ends after serving this many connections; a fresh one "
                  "takes its place (0: never)")
      ->capture_default_str();
  cmd->add_option("--lora", sa->loras,
                  "NAME=PATH: a PEFT LoRA adapter folder to load at start, served as model NAME "
                  "(repeatable; POST /v1/load_lora_adapter loads more)");
  cmd->add_option("--reasoning-parser", sa->server.reasoning_parser,
                  "qwen3: chat responses carry the model's <think> text as reasoning_content, "
                  "apart from the content");
  cmd->add_option("--tool-call-parser", sa->server.tool_call_parser,
                  "hermes: the <tool_call> blocks Qwen3 writes become tool_calls (with "
                  "--enable-auto-tool-choice)");
  cmd->add_flag("--enable-auto-tool-choice", sa->server.enable_auto_tool_choice,
                "chat requests that give tools get their tool calls parsed (tool_choice "
                "\"auto\")");
  add_engine_options(cmd, sa->engine);
  cmd->callback([sa] { run_serve(*sa); });
}
#endif

}  // namespace pagellm::cli
