// The routes of `pagellm serve` over cpp-httplib (header-only). docs/design.md, "Server",
// gives the thread model: handlers run on httplib's pool, engine work on AsyncEngine's loop,
// and the two meet only in an Inflight queue per HTTP request.
#include "pagellm/server/server.h"

// cpp-httplib's default accept backlog is 5: a burst of clients connecting at once (64 in
// the load test) overflows it and some connections are reset. Keep-alive connections
// (the openai client keeps its own) serve up to 1000 requests before being closed.
#define CPPHTTPLIB_LISTEN_BACKLOG 1024
#define CPPHTTPLIB_KEEPALIVE_MAX_COUNT 1000
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <vector>
#include <mutex>

#include "pagellm/async_engine.h"
#include "pagellm/common/check.h"
#include "pagellm/error.h"
#include "pagellm/server/metrics.h"
#include "pagellm/server/protocol.h"
#include "pagellm/server/worker_pool.h"

namespace pagellm::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

/// The engine requests (one per prompt) of one HTTP request, and the deltas their callbacks
/// (on the engine loop) have delivered and the handler (on an HTTP thread) has not taken.
struct Inflight {
  std::mutex mu;
  std::condition_variable cv;
  struct Item {
    int prompt = 0;
    RequestOutput delta;
  };
  std::deque<Item> deltas;
  std::vector<std::string> ids;  // engine request ids, per prompt
  int unfinished = 0;
  // Timing, touched only by the callbacks (the loop thread runs them one at a time).
  Clock::time_point arrival = Clock::now();
  std::map<std::pair<int, int>, Clock::time_point> last_token;  // (prompt, sample) ->

  /// Waits up to `timeout` for deltas and moves them out.
  std::deque<Item> take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return !deltas.empty() || unfinished == 0; });
    std::deque<Item> out;
    out.swap(deltas);
    return out;
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu);
    return unfinished == 0 && deltas.empty();
  }
};

/// cpp-httplib's task queue over WorkerPool: each accepted connection is one job.
class HttpWorkers : public httplib::TaskQueue {
 public:
  HttpWorkers(size_t max_threads, std::chrono::milliseconds idle_timeout, size_t max_jobs)
      : pool_(max_threads, idle_timeout, max_jobs) {}
  void enqueue(std::function<void()> job) override {
    try {
      pool_.enqueue(job);
    } catch (const Error&) {
      // No thread could be started and none runs: serve the connection on the accepting
      // thread rather than leak its socket (the job closes it).
      job();
    }
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  WorkerPool pool_;
};

HttpError engine_error(const Error& e) { return HttpError(400, e.what()); }

PauseMode parse_mode(const json& body) {
  auto it = body.find("mode");
  if (it == body.end() || it->is_null()) return PauseMode::kWait;
  if (it->is_string()) {
    const std::string m = it->get<std::string>();
    if (m == "wait") return PauseMode::kWait;
    if (m == "abort") return PauseMode::kAbort;
    if (m == "keep") return PauseMode::kKeep;
  }
  throw HttpError(400, "mode: must be \"wait\", \"abort\" or \"keep\", got " + it->dump(), "mode");
}

json optional_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw HttpError(400, "the request body must be a JSON object (or empty)");
  }
  return j;
}

void reply_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

struct Server::Impl {
  AsyncEngine& engine;
  ServerOptions options;
  std::string model_dir;
  ProtocolContext ctx;
  ServerMetrics metrics;
  httplib::Server http;
  std::atomic<int64_t> unfinished_requests{0};
  std::atomic<uint64_t> counter{0};
  int port = -1;
  // The loaded LoRA adapters by name, so that parsing a request's "model" and GET
  // /v1/models never wait on the engine loop (which a paused or busy engine holds). Kept by
  // the load/unload routes; a request naming an adapter unloaded after this check ends
  // with the engine's error.
  std::mutex adapters_mu;
  std::map<std::string, LoraAdapterInfo> adapters;

  Impl(AsyncEngine& e, ServerOptions o, std::string dir)
      : engine(e), options(std::move(o)), model_dir(std::move(dir)) {}

  DecodeFn decoder() {
    return [this](const std::vector<int32_t>& ids, bool skip) { return engine.decode(ids, skip); };
  }

  void fail(httplib::Response& res, const HttpError& e) {
    metrics.count_http_error(e.status);
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
  }

  /// Runs a handler body, turning its errors into OpenAI error objects.
  template <class Fn>
  void guarded(httplib::Response& res, Fn fn) {
    try {
      fn();
    } catch (const HttpError& e) {
      fail(res, e);
    } catch (const Error& e) {
      fail(res, engine_error(e));
    } catch (const std::exception& e) {
      fail(res, HttpError(500, std::string("internal error: ") + e.what(), "", "internal_error"));
    }
  }

  /// Submits one engine request per prompt; their deltas go to `inflight`. Throws HttpError
  /// (503 when the queue is full or the engine sleeps, 400 for a prompt the engine rejects;
  /// requests already submitted are aborted).
  std::shared_ptr<Inflight> submit(const std::vector<Prompt>& prompts, const SamplingParams& params,
                                   const std::string& id, const std::string& lora = "") {
    const int64_t count = static_cast<int64_t>(prompts.size());
    const int64_t before = unfinished_requests.fetch_add(count);
    if (options.max_queued_requests > 0 && before + count > options.max_queued_requests) {
      unfinished_requests.fetch_sub(count);
      throw HttpError(503,
                      "the server's queue is full (" + std::to_string(before) +
                          " requests unfinished, --max-queued-requests " +
                          std::to_string(options.max_queued_requests) + "); retry later",
                      "", "service_unavailable");
    }
    if (engine.load().asleep) {
      unfinished_requests.fetch_sub(count);
      throw HttpError(503, "the engine is asleep; POST /wake_up first", "", "service_unavailable");
    }
    auto inflight = std::make_shared<Inflight>();
    inflight->unfinished = static_cast<int>(count);
    for (int p = 0; p < static_cast<int>(count); ++p) {
      const std::string engine_id = id + "-" + std::to_string(p);
      auto callback = [this, inflight, p](const RequestOutput& delta) {
        record(*inflight, p, delta);
        std::lock_guard<std::mutex> lock(inflight->mu);
        inflight->deltas.push_back({p, delta});
        if (delta.finished) {
          --inflight->unfinished;
          unfinished_requests.fetch_sub(1);
        }
        inflight->cv.notify_all();
      };
      try {
        engine.submit(prompts[static_cast<size_t>(p)], params, callback, engine_id, lora);
        std::lock_guard<std::mutex> lock(inflight->mu);
        inflight->ids.push_back(engine_id);
      } catch (...) {
        // This prompt and those after it never reach the engine; those before are aborted
        // (their callbacks count them off as they end).
        const int64_t never = count - p;
        unfinished_requests.fetch_sub(never);
        {
          std::lock_guard<std::mutex> lock(inflight->mu);
          inflight->unfinished -= static_cast<int>(never);
        }
        abort_all(*inflight);
        try {
          throw;
        } catch (const Error& e) {
          const std::string where =
              count > 1 ? "prompt " + std::to_string(p) + ": " : std::string();
          throw HttpError(400, where + e.what(), prompts.size() > 1 ? "prompt" : "");
        }
      }
    }
    return inflight;
  }

  void abort_all(Inflight& inflight) {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(inflight.mu);
      if (inflight.unfinished == 0) return;
      ids = inflight.ids;
    }
    for (const std::string& id : ids) engine.abort(id);
  }

  /// One turn of a streaming response: what the engine delivered within 50 ms. When nothing
  /// came and the request still runs, it is the moment to notice a client that went away:
  /// its request is aborted and `gone` set (the provider then returns false).
  std::deque<Inflight::Item> next_items(Inflight& inflight, httplib::DataSink& sink, bool& gone) {
    std::deque<Inflight::Item> items = inflight.take(std::chrono::milliseconds(50));
    gone = false;
    if (items.empty() && !inflight.done() && !sink.is_writable()) {
      abort_all(inflight);
      gone = true;
    }
    return items;
  }

  /// Latency and token metrics of one delta (on the loop thread).
  void record(Inflight& inflight, int prompt, const RequestOutput& delta) {
    const Clock::time_point now = Clock::now();
    if (!delta.prompt_token_ids.empty()) {
      metrics.add_prompt_tokens(static_cast<int64_t>(delta.prompt_token_ids.size()));
    }
    for (const CompletionOutput& o : delta.outputs) {
      const size_t n = o.token_ids.size();
      if (n == 0) continue;
      metrics.add_generation_tokens(static_cast<int64_t>(n));
      auto [it, first] = inflight.last_token.try_emplace({prompt, o.index}, now);
      if (first) {
        metrics.time_to_first_token().observe(
            std::chrono::duration<double>(now - inflight.arrival).count());
      } else {
        // Tokens that came in one delta share the gap since the last one.
        const double gap = std::chrono::duration<double>(now - it->second).count() / n;
        for (size_t t = 0; t < n; ++t) metrics.inter_token_latency().observe(gap);
        it->second = now;
      }
    }
    if (delta.finished) {
      metrics.e2e_latency().observe(std::chrono::duration<double>(now - inflight.arrival).count());
      for (const CompletionOutput& o : delta.outputs) {
        if (o.finished()) metrics.finish_request(finish_reason_openai(o.finish_reason));
      }
    }
  }

  std::string next_id(const char* prefix) {
    return std::string(prefix) + std::to_string(counter.fetch_add(1) + 1);
  }

  // ---- OpenAI routes ----------------------------------------------------------------
  void openai(const httplib::Request& req, httplib::Response& res, bool chat) {
    OpenAiRequest r = chat ? parse_chat_request(req.body, ctx) : parse_completion_request(req.body, ctx);
    ResponseMeta meta{next_id(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)),
                      r.lora.empty() ? ctx.model_name : r.lora};
    std::shared_ptr<Inflight> inflight = submit(r.prompts, r.params, meta.id, r.lora);
    if (!r.stream) {
      std::vector<RequestOutput> outputs(r.prompts.size());
      for (;;) {
        for (Inflight::Item& item : inflight->take(std::chrono::milliseconds(100))) {
          merge_delta(outputs[static_cast<size_t>(item.prompt)], item.delta);
        }
        if (inflight->done()) break;
      }
      for (const RequestOutput& o : outputs) {
        for (const CompletionOutput& c : o.outputs) {
          if (c.finish_reason == FinishReason::kError) {
            throw HttpError(500, "the engine failed the request: " + c.error, "", "internal_error");
          }
        }
      }
      std::vector<ScoreOutput> scores;
      if (const std::optional<int> k = r.prompt_score_top_k()) {
        std::vector<std::vector<int32_t>> ids;
        for (const RequestOutput& o : outputs) ids.push_back(o.prompt_token_ids);
        scores = score_prompts(ids, *k, r.lora);
      }
      reply_json(res, format_response(r, meta, outputs, decoder(), scores));
      return;
    }
    stream_openai(res, std::make_shared<OpenAiRequest>(std::move(r)), meta, inflight);
  }

  /// Prompts' log-probabilities (echo with logprobs, prompt_logprobs): the scoring path over
  /// each one's tokens, every token after the first, all in one call (one batched prefill
  /// for a request of many prompts, as lm-evaluation-harness sends); a one-token prompt has
  /// none.
  std::vector<ScoreOutput> score_prompts(const std::vector<std::vector<int32_t>>& prompts,
                                         int top_k, const std::string& lora) {
    std::vector<ScoreOutput> out(prompts.size());
    std::vector<std::vector<int32_t>> scored;
    std::vector<size_t> where;
    for (size_t i = 0; i < prompts.size(); ++i) {
      out[i].token_ids = prompts[i];
      if (prompts[i].size() < 2) continue;
      scored.push_back(prompts[i]);
      where.push_back(i);
    }
    if (scored.empty()) return out;
    std::vector<ScoreOutput> results =
        engine.score(scored, std::vector<int32_t>(scored.size(), 1), top_k, lora);
    for (size_t j = 0; j < results.size(); ++j) out[where[j]] = std::move(results[j]);
    return out;
  }

  void stream_openai(httplib::Response& res, std::shared_ptr<OpenAiRequest> r, ResponseMeta meta,
                     std::shared_ptr<Inflight> inflight) {
    struct State {
      std::map<int, bool> started;                 // choice index -> first chunk sent
      std::vector<std::vector<int32_t>> prompt_ids;
      std::vector<std::string> prompt_text;
      std::vector<ScoreOutput> prompt_scores;      // with r->prompt_score_top_k()
      std::map<int, ChatOutputParser> parsers;     // choice index -> its text's parser
      int64_t prompt_tokens = 0, completion_tokens = 0;
    };
    auto state = std::make_shared<State>();
    state->prompt_ids.resize(r->prompts.size());
    state->prompt_text.resize(r->prompts.size());
    state->prompt_scores.resize(r->prompts.size());
    const bool parse = r->chat && (r->parse_reasoning || r->parse_tool_calls);
    const bool per_token = r->logprobs.has_value() || r->return_token_ids;
    DecodeFn decode = decoder();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, r, meta, inflight, state, decode, parse, per_token](size_t,
                                                                   httplib::DataSink& sink) {
          bool gone = false;
          std::deque<Inflight::Item> items = next_items(*inflight, sink, gone);
          if (gone) return false;
          if (items.empty() && !inflight->done()) return true;
          std::string out;
          for (Inflight::Item& item : items) {
            const size_t p = static_cast<size_t>(item.prompt);
            if (!item.delta.prompt_token_ids.empty()) {
              state->prompt_ids[p] = item.delta.prompt_token_ids;
              state->prompt_tokens += static_cast<int64_t>(item.delta.prompt_token_ids.size());
              state->prompt_text[p] = item.delta.prompt.empty()
                                          ? decode(item.delta.prompt_token_ids, true)
                                          : item.delta.prompt;
              if (const std::optional<int> k = r->prompt_score_top_k()) {
                try {
                  state->prompt_scores[p] = score_prompts({state->prompt_ids[p]}, *k, r->lora)[0];
                } catch (const Error& e) {
                  // The headers are sent: the error goes in the stream, which ends.
                  abort_all(*inflight);
                  const std::string end = "data: " + error_body(engine_error(e)) +
                                          "\n\ndata: [DONE]\n\n";
                  sink.write(end.data(), end.size());
                  sink.done();
                  return true;
                }
              }
            }
            for (const CompletionOutput& o : item.delta.outputs) {
              state->completion_tokens += static_cast<int64_t>(o.token_ids.size());
              const int index = item.prompt * r->params.n + o.index;
              bool& started = state->started[index];
              ChunkExtras extras;
              if (r->prompt_score_top_k()) extras.prompt_score = &state->prompt_scores[p];
              ChatPieces pieces;
              if (parse) {
                auto it = state->parsers
                              .try_emplace(index, r->parse_reasoning, r->parse_tool_calls,
                                           prompt_opens_thinking(state->prompt_text[p]),
                                           tool_call_id_prefix(meta, index))
                              .first;
                pieces = it->second.feed(o.text);
                if (o.finished()) pieces.append(it->second.finish());
                extras.pieces = &pieces;
                extras.called_tools = it->second.tool_calls() > 0;
                // Text held back by the parser: a chunk only if it has tokens to report.
                if (started && pieces.empty() && !o.finished() &&
                    !(per_token && !o.token_ids.empty())) {
                  continue;
                }
              }
              if (started && o.token_ids.empty() && o.text.empty() && !o.finished()) continue;
              out += sse_event(format_chunk(*r, meta, index, o, state->prompt_ids[p], !started,
                                            state->prompt_text[p], decode, extras));
              started = true;
            }
          }
          const bool finished = inflight->done();
          if (finished) {
            if (r->include_usage) {
              out += sse_event(format_usage_chunk(*r, meta, state->prompt_tokens,
                                                  state->completion_tokens));
            }
            out += "data: [DONE]\n\n";
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            abort_all(*inflight);
            return false;
          }
          if (finished) sink.done();
          return true;
        },
        [this, inflight](bool) { abort_all(*inflight); });
  }

  // ---- token-level generation --------------------------------------------------------
  void generate(const httplib::Request& req, httplib::Response& res) {
    GenerateRequest g = parse_generate_request(req.body);
    if (!g.lora_name.empty() && !has_adapter(g.lora_name)) {
      throw HttpError(404, "lora_name: no LoRA adapter `" + g.lora_name +
                               "` is loaded (GET /v1/models lists them; POST "
                               "/v1/load_lora_adapter loads one)",
                      "lora_name", "NotFoundError");
    }
    const std::string id = next_id("gen-");
    std::shared_ptr<Inflight> inflight =
        submit({Prompt::from_token_ids(g.prompt_token_ids)}, g.params, id, g.lora_name);
    if (!g.stream) {
      RequestOutput total;
      for (;;) {
        for (Inflight::Item& item : inflight->take(std::chrono::milliseconds(100))) {
          merge_delta(total, item.delta);
        }
        if (inflight->done()) break;
      }
      total.request_id = id;
      reply_json(res, format_generate(total, g.params));
      return;
    }
    auto params = std::make_shared<SamplingParams>(g.params);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, inflight, params, id](size_t, httplib::DataSink& sink) {
          bool gone = false;
          std::deque<Inflight::Item> items = next_items(*inflight, sink, gone);
          if (gone) return false;
          if (items.empty() && !inflight->done()) return true;
          std::string out;
          for (Inflight::Item& item : items) {
            item.delta.request_id = id;
            out += sse_event(format_generate(item.delta, *params));
          }
          const bool finished = inflight->done();
          if (finished) out += "data: [DONE]\n\n";
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            abort_all(*inflight);
            return false;
          }
          if (finished) sink.done();
          return true;
        },
        [this, inflight](bool) { abort_all(*inflight); });
  }

  // ---- LoRA adapters ------------------------------------------------------------------
  bool has_adapter(const std::string& name) {
    std::lock_guard<std::mutex> lock(adapters_mu);
    return adapters.count(name) > 0;
  }

  void refresh_adapters() {
    std::map<std::string, LoraAdapterInfo> loaded;
    for (const LoraAdapterInfo& a : engine.list_lora_adapters()) loaded.emplace(a.name, a);
    std::lock_guard<std::mutex> lock(adapters_mu);
    adapters.swap(loaded);
  }

  static json adapter_json(const LoraAdapterInfo& a) {
    return {{"lora_name", a.name}, {"lora_int_id", a.id}, {"lora_path", a.path},
            {"rank", a.rank},      {"scale", a.scale},    {"slot", a.slot},
            {"version", a.version}};
  }

  /// vLLM's load_lora_adapter; a loaded name is replaced in place (its version goes up).
  json load_lora(const std::string& body) {
    const LoadLoraRequest r = parse_load_lora_request(body);
    if (r.name == ctx.model_name) {
      throw HttpError(400, "lora_name: `" + r.name + "` is the base model's name; pick another",
                      "lora_name");
    }
    LoraAdapterInfo info;
    try {
      info = engine.load_lora_adapter(LoraRequest{r.name, r.id, r.path});
    } catch (const Error& e) {
      throw HttpError(400, std::string("lora_path: ") + e.what(), "lora_path");
    }
    refresh_adapters();
    return adapter_json(info);
  }

  json unload_lora(const std::string& body) {
    const std::string name = parse_unload_lora_request(body);
    if (!has_adapter(name)) refresh_adapters();  // loaded by another front end meanwhile
    if (!has_adapter(name)) {
      throw HttpError(404, "lora_name: no LoRA adapter `" + name + "` is loaded", "lora_name",
                      "NotFoundError");
    }
    engine.unload_lora_adapter(name);
    refresh_adapters();
    return {{"lora_name", name}, {"unloaded", true}};
  }

  // ---- control ----------------------------------------------------------------------
  json health() {
    const EngineLoad load = engine.load();
    return {{"status", load.asleep ? "asleep" : (load.paused ? "paused" : "ok")},
            {"running", load.running},
            {"waiting", load.waiting},
            {"free_pages", load.free_pages},
            {"usable_pages", load.usable_pages},
            {"paused", load.paused},
            {"asleep", load.asleep},
            {"unfinished_requests", unfinished_requests.load()},
            {"weights_version", engine.weights_version()}};
  }

  json update_weights(const json& body) {
    const PauseMode mode = parse_mode(body);
    const auto report = [](const WeightUpdateResult& r) -> json {
      return {{"weights_version", r.weights_version}, {"tensors_updated", r.tensors_updated},
              {"bytes", r.bytes},         {"seconds", r.seconds},
              {"wait_seconds", r.wait_seconds}, {"mode", pause_mode_name(r.mode)},
              {"requests_aborted", r.requests_aborted}, {"requests_kept", r.requests_kept},
              {"requests_waited", r.requests_waited}};
    };
    if (auto broadcast = body.find("broadcast"); broadcast != body.end()) {
      const BroadcastUpdateRequest request = parse_broadcast_update(*broadcast);
      return report(engine.update_weights_from_broadcast(request.tensors, request.bucket_bytes,
                                                         mode, request.group_name));
    }
    if (auto ipc = body.find("ipc_tensors"); ipc != body.end()) {
      return report(engine.update_weights_from_ipc(parse_ipc_tensors(*ipc), mode));
    }
    auto path = body.find("path");
    if (path == body.end() || !path->is_string() || path->get<std::string>().empty()) {
      throw HttpError(400,
                      "path: a safetensors folder or file is required (or \"ipc_tensors\", or "
                      "\"broadcast\" from a joined weight group)",
                      "path");
    }
    return report(engine.load_weights(path->get<std::string>(), mode));
  }

  json init_weights_group(const json& body) {
    const WeightGroupSpec spec = parse_init_weights_group(body, engine.tensor_parallel_size());
    if (engine.has_weight_group()) {
      throw HttpError(409, "a weight group is joined already: POST /destroy_weights_group first",
                      "", "conflict");
    }
    engine.init_weight_group(spec);
    return {{"joined", true},
            {"backend", spec.transport},
            {"rank", spec.rank},
            {"world_size", spec.world_size},
            {"group_name", spec.name}};
  }

  void install_routes() {
    http.new_task_queue = [n = options.http_threads, idle = options.http_thread_idle_seconds,
                           jobs = options.http_thread_max_connections] {
      return new HttpWorkers(static_cast<size_t>(n),
                             std::chrono::milliseconds(static_cast<int64_t>(idle * 1000)),
                             static_cast<size_t>(jobs));
    };
    http.set_payload_max_length(options.max_body_bytes);
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (options.api_key.empty() || req.path == "/health" || req.path == "/metrics") {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      if (req.get_header_value("Authorization") != "Bearer " + options.api_key) {
        fail(res, HttpError(401,
                            req.has_header("Authorization")
                                ? "the API key is wrong"
                                : "an API key is required: send \"Authorization: Bearer <key>\"",
                            "", "authentication_error"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // our own error object
      if (res.status == 413) {
        fail(res, HttpError(413,
                            "the request body is larger than the server accepts (" +
                                std::to_string(options.max_body_bytes) + " bytes; pagellm serve --max-body-mb)"));
      } else if (res.status == 404) {
        fail(res, HttpError(404,
                            "no route " + req.method + " " + req.path +
                                "; the routes are GET /v1/models, POST /v1/completions, POST "
                                "/v1/chat/completions, POST /generate, POST /tokenize, "
                                "/detokenize, /v1/load_lora_adapter, /v1/unload_lora_adapter, "
                                "GET /health, GET /metrics and "
                                "POST /pause, /resume, /update_weights, /init_weights_group, "
                                "/destroy_weights_group, /reset_prefix_cache, /sleep, "
                                "/wake_up",
                            "", "NotFoundError"));
      } else {
        fail(res, HttpError(res.status, "HTTP error " + std::to_string(res.status)));
      }
    });

    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        const int64_t created = static_cast<int64_t>(std::time(nullptr));
        json data = json::array();
        data.push_back({{"id", ctx.model_name}, {"object", "model"}, {"created", created},
                        {"owned_by", "pagellm"}, {"root", model_dir}, {"parent", nullptr},
                        {"max_model_len", ctx.max_model_len},
                        {"tensor_parallel_size", engine.tensor_parallel_size()}});
        // Adapters as vLLM lists them: root = the adapter folder, parent = the base model.
        std::vector<LoraAdapterInfo> loaded;
        {
          std::lock_guard<std::mutex> lock(adapters_mu);
          for (const auto& entry : adapters) loaded.push_back(entry.second);
        }
        for (const LoraAdapterInfo& a : loaded) {
          data.push_back({{"id", a.name}, {"object", "model"}, {"created", created},
                          {"owned_by", "pagellm"}, {"root", a.path},
                          {"parent", ctx.model_name}, {"max_model_len", ctx.max_model_len},
                          {"lora", adapter_json(a)}});
        }
        reply_json(res, {{"object", "list"}, {"data", data}});
      });
    });
    http.Post("/v1/load_lora_adapter", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { reply_json(res, load_lora(req.body)); });
    });
    http.Post("/v1/unload_lora_adapter", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { reply_json(res, unload_lora(req.body)); });
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { openai(req, res, false); });
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { openai(req, res, true); });
    });
    http.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { generate(req, res); });
    });
    // vLLM's tokenizer routes: the ids the engine would run for a prompt or a chat, and the
    // text of ids. Neither touches the engine loop.
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const std::vector<int32_t> ids = engine.prompt_token_ids(parse_tokenize_request(req.body));
        reply_json(res, {{"count", ids.size()},
                         {"max_model_len", ctx.max_model_len},
                         {"tokens", ids}});
      });
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const std::vector<int32_t> ids = parse_detokenize_request(req.body);
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] >= engine.vocab_size()) {
            throw HttpError(400,
                            "tokens: element " + std::to_string(i) + " (" +
                                std::to_string(ids[i]) + ") is not below the vocabulary size " +
                                std::to_string(engine.vocab_size()),
                            "tokens");
          }
        }
        reply_json(res, {{"prompt", engine.decode(ids, false)}});
      });
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      reply_json(res, health());
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        res.set_content(metrics.render(engine.load(), engine.prefix_cache_stats(),
                                       engine.weights_version()),
                        "text/plain; version=0.0.4");
      });
    });
    http.Post("/pause", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const PauseMode mode = parse_mode(optional_body(req));
        engine.pause(mode);
        reply_json(res, {{"paused", true}, {"mode", pause_mode_name(mode)}});
      });
    });
    http.Post("/resume", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        engine.resume();
        reply_json(res, {{"paused", false}});
      });
    });
    http.Post("/update_weights", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { reply_json(res, update_weights(optional_body(req))); });
    });
    http.Post("/init_weights_group", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { reply_json(res, init_weights_group(optional_body(req))); });
    });
    http.Post("/destroy_weights_group", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        const bool had = engine.has_weight_group();
        engine.destroy_weight_group();
        reply_json(res, {{"left", had}});
      });
    });
    http.Post("/reset_prefix_cache", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        engine.reset_prefix_cache();
        reply_json(res, {{"reset", true}});
      });
    });
    http.Post("/sleep", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const json body = optional_body(req);
        SleepOptions o;
        if (auto it = body.find("offload_weights"); it != body.end() && !it->is_null()) {
          if (!it->is_boolean()) {
            throw HttpError(400, "offload_weights: must be true or false", "offload_weights");
          }
          o.offload_weights = it->get<bool>();
        }
        const SleepReport r = engine.sleep(o);
        reply_json(res, {{"asleep", true},
                         {"kv_bytes_released", r.kv_bytes_released},
                         {"weight_bytes_offloaded", r.weight_bytes_offloaded},
                         {"seconds", r.seconds}});
      });
    });
    http.Post("/wake_up", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        const WakeReport r = engine.wake_up();
        reply_json(res, {{"asleep", false}, {"seconds", r.seconds}});
      });
    });
  }
};

Server::Server(AsyncEngine& engine, ServerOptions options, std::string model_dir)
    : impl_(std::make_unique<Impl>(engine, std::move(options), std::move(model_dir))) {
  Impl& s = *impl_;
  PAGELLM_CHECK(s.options.http_threads >= 1)
      << "--http-threads must be >= 1, got " << s.options.http_threads;
  PAGELLM_CHECK(s.options.http_thread_idle_seconds >= 0.001 &&
                s.options.http_thread_idle_seconds <= 86400)
      << "--http-thread-idle-seconds must be in [0.001, 86400], got "
      << s.options.http_thread_idle_seconds;
  PAGELLM_CHECK(s.options.http_thread_max_connections >= 0)
      << "--http-thread-max-connections must be >= 0 (0: no limit), got "
      << s.options.http_thread_max_connections;
  PAGELLM_CHECK(s.options.max_queued_requests >= 0)
      << "--max-queued-requests must be >= 0 (0: no limit), got " << s.options.max_queued_requests;
  PAGELLM_CHECK(s.options.reasoning_parser.empty() || s.options.reasoning_parser == "qwen3")
      << "--reasoning-parser: only \"qwen3\" is known, got \"" << s.options.reasoning_parser
      << "\"";
  PAGELLM_CHECK(s.options.tool_call_parser.empty() || s.options.tool_call_parser == "hermes")
      << "--tool-call-parser: only \"hermes\" (Qwen3's <tool_call> format) is known, got \""
      << s.options.tool_call_parser << "\"";
  PAGELLM_CHECK(!s.options.enable_auto_tool_choice || !s.options.tool_call_parser.empty())
      << "--enable-auto-tool-choice needs --tool-call-parser hermes";
  s.ctx.model_name = s.options.model_name.empty()
                         ? std::filesystem::path(s.model_dir).lexically_normal().filename().string()
                         : s.options.model_name;
  if (s.ctx.model_name.empty()) s.ctx.model_name = s.model_dir;
  s.ctx.max_model_len = engine.max_model_len();
  s.ctx.has_adapter = [&s](const std::string& name) { return s.has_adapter(name); };
  s.ctx.reasoning_parser = s.options.reasoning_parser;
  s.ctx.tool_call_parser = s.options.tool_call_parser;
  s.ctx.enable_auto_tool_choice = s.options.enable_auto_tool_choice;
  s.refresh_adapters();
  s.install_routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& s = *impl_;
  s.port = s.options.port == 0 ? s.http.bind_to_any_port(s.options.host)
                               : (s.http.bind_to_port(s.options.host, s.options.port)
                                      ? s.options.port
                                      : -1);
  PAGELLM_CHECK(s.port > 0) << "cannot listen on " << s.options.host << ":" << s.options.port
                            << " (in use, or not an address of this machine)";
  return s.port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (impl_) impl_->http.stop();
}

int Server::port() const { return impl_->port; }

}  // namespace pagellm::server
