// AsyncEngine: EngineCore on a loop thread. Callers only touch the queues below (under
// `mu`); the core, the engine and the tokenizer's stream decoders are used by the loop
// thread alone, so the engine itself needs no locks.
#include "pagellm/async_engine.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "pagellm/api/engine_core.h"
#include "pagellm/engine/ipc_weights.h"
#include "pagellm/common/check.h"

namespace pagellm {

struct RequestStream::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestOutput> queue;  // deltas not yet taken by next()
  RequestOutput accumulated;        // every delta so far, merged (for collect())
  bool final_queued = false;
  bool final_taken = false;
  std::weak_ptr<AsyncEngine::Impl> engine;
};

struct AsyncEngine::Impl {
  std::shared_ptr<const api::TextModel> text;
  std::unique_ptr<api::EngineCore> core;  // the loop thread's alone while it runs
  api::RequestLimits limits;
  int64_t usable_pages = 0;
  std::atomic<uint64_t> weights_version{0};
  int tensor_parallel_size = 1;  // set at construction, before the loop starts
  // The load snapshot the loop thread publishes (AsyncEngine::load()).
  std::atomic<int64_t> running{0}, engine_waiting{0}, free_pages{0};
  std::atomic<bool> paused{false}, asleep{false};
  std::atomic<int64_t> queued{0};  // samples in `pending`, not yet added to the engine
  /// Set with every wake-up below, cleared when the loop takes the lists: a pipelined run
  /// of decode steps ends early for it (Engine::set_run_interrupt).
  std::atomic<bool> input{false};

  std::mutex mu;  // guards everything below
  std::condition_variable wake;
  std::vector<api::TrackedRequest> pending;
  std::vector<std::string> aborts;
  std::vector<std::function<void()>> tasks;  // run on the loop thread between steps
  std::set<std::string> live_ids;            // submitted and not yet finished
  uint64_t counter = 0;
  bool stopping = false;
  std::string failure;  // why the loop stopped on its own, if it did

  std::mutex shutdown_mu;
  std::thread loop;
  std::thread::id loop_id;  // set once at construction (read without a lock)

  // pause(kWait): promises kept when the engine is drained (loop thread only).
  std::vector<std::shared_ptr<std::promise<void>>> drain_waiters;

  void run();
  /// Runs fn on the loop thread between steps and returns its result (rethrows its error).
  template <class Fn>
  auto call(Fn fn) -> decltype(fn());
  /// When the engine is paused with kWait: blocks until no request from before the pause is
  /// left. Returns at once otherwise.
  void wait_drained();
  /// Keeps the drain promises once the engine is drained (loop thread).
  void notify_drained();
  /// At loop exit: runs the tasks still queued (their callers wait on them) and fails the
  /// drain promises.
  void finish_waiters(const std::string& why);
  std::string queue(const Prompt& prompt, const SamplingParams& params, std::string request_id,
                    std::function<void(RequestOutput&&)> sink, const std::string& lora);
  void request_abort(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    if (!live_ids.count(id)) return;
    aborts.push_back(id);
    input.store(true, std::memory_order_relaxed);
    wake.notify_one();
  }
  /// Stores the engine's counts for load() (loop thread).
  void publish_load() {
    const Engine& engine = core->engine();
    running.store(static_cast<int64_t>(engine.num_running()), std::memory_order_relaxed);
    engine_waiting.store(static_cast<int64_t>(engine.num_waiting()), std::memory_order_relaxed);
    free_pages.store(static_cast<int64_t>(engine.allocator().num_free()),
                     std::memory_order_relaxed);
    paused.store(engine.paused(), std::memory_order_relaxed);
    asleep.store(engine.asleep(), std::memory_order_relaxed);
  }
  void forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    live_ids.erase(id);
  }
};

void AsyncEngine::Impl::run() {
  for (;;) {
    std::vector<api::TrackedRequest> adds;
    std::vector<std::string> cancels;
    std::vector<std::function<void()>> work;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      // A paused engine with nothing it may run waits for a task (resume) instead of spinning.
      wake.wait(lock, [&] {
        return stopping || !pending.empty() || !aborts.empty() || !tasks.empty() ||
               (core->has_requests() && core->engine().has_runnable());
      });
      adds.swap(pending);
      cancels.swap(aborts);
      work.swap(tasks);
      input.store(false, std::memory_order_relaxed);
      stop = stopping;
    }
    try {
      for (api::TrackedRequest& r : adds) {
        queued.fetch_sub(r.params.n, std::memory_order_relaxed);
        core->add(std::move(r));
      }
      for (const std::string& id : cancels) core->abort(id);
      for (auto& task : work) task();
      if (stop) {
        core->abort_all();
        core->emit();
        PAGELLM_ASSERT(!core->has_requests()) << "requests left after aborting all at shutdown";
        finish_waiters("the AsyncEngine shut down");
        return;
      }
      core->step();
      weights_version.store(core->engine().weights_version(), std::memory_order_release);
      publish_load();
      notify_drained();
    } catch (const std::exception& e) {
      // An engine failure ends every request (aborted) and the loop; later calls say why.
      {
        std::lock_guard<std::mutex> lock(mu);
        stopping = true;
        failure = std::string("the engine loop stopped after an error: ") + e.what();
      }
      try {
        core->abort_all();
        core->emit();
      } catch (const std::exception&) {
      }
      finish_waiters(failure);
      return;
    }
  }
}

template <class Fn>
auto AsyncEngine::Impl::call(Fn fn) -> decltype(fn()) {
  using Result = decltype(fn());
  PAGELLM_CHECK(std::this_thread::get_id() != loop_id)
      << "AsyncEngine: pause, resume, weight updates, scoring, sleep and wake_up cannot be "
         "called from a callback on the engine loop thread (they wait for that thread); call "
         "them from another thread";
  std::packaged_task<Result()> task(std::move(fn));
  std::future<Result> result = task.get_future();
  {
    std::lock_guard<std::mutex> guard(shutdown_mu);
    std::lock_guard<std::mutex> lock(mu);
    PAGELLM_CHECK(!stopping && loop.joinable())
        << (failure.empty() ? "the AsyncEngine has shut down" : failure);
    tasks.push_back([&task] { task(); });
    input.store(true, std::memory_order_relaxed);
    wake.notify_one();
  }
  return result.get();  // rethrows the engine's Error on this thread
}

void AsyncEngine::Impl::notify_drained() {
  if (drain_waiters.empty() || (core->engine().paused() && !core->engine().drained())) return;
  // Drained, or resumed meanwhile (nothing left to wait for either way).
  for (auto& waiter : drain_waiters) waiter->set_value();
  drain_waiters.clear();
}

void AsyncEngine::Impl::wait_drained() {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> drained = done->get_future();
  const bool wait = call([&] {
    Engine& engine = core->engine();
    // Only a kWait pause lets requests run to their end; the others have nothing to wait for.
    if (!engine.paused() || engine.pause_mode() != PauseMode::kWait || engine.drained())
      return false;
    drain_waiters.push_back(done);
    return true;
  });
  if (wait) drained.get();
}

void AsyncEngine::Impl::finish_waiters(const std::string& why) {
  std::vector<std::function<void()>> left;
  {
    std::lock_guard<std::mutex> lock(mu);
    left.swap(tasks);
  }
  for (auto& task : left) task();  // their callers wait; an engine error reaches them
  for (auto& waiter : drain_waiters) {
    waiter->set_exception(std::make_exception_ptr(Error(why)));
  }
  drain_waiters.clear();
}

std::string AsyncEngine::Impl::queue(const Prompt& prompt, const SamplingParams& params,
                                     std::string request_id,
                                     std::function<void(RequestOutput&&)> sink,
                                     const std::string& lora) {
  // The checks and the tokenization run on the caller's thread, before any engine work.
  api::TrackedRequest r;
  r.lora = lora;
  r.prompt = text->encode_prompt(prompt);
  api::check_request(r.prompt, params, limits, text->has_tokenizer());
  r.params = params;
  std::lock_guard<std::mutex> lock(mu);
  PAGELLM_CHECK(!stopping) << (failure.empty() ? "submit after shutdown: the AsyncEngine no "
                                                 "longer accepts requests"
                                               : failure);
  if (request_id.empty()) request_id = "req-" + std::to_string(counter++);
  PAGELLM_CHECK(!live_ids.count(request_id))
      << "request id '" << request_id << "' is already in use by an unfinished request";
  live_ids.insert(request_id);
  r.request_id = request_id;
  r.sink = std::move(sink);
  queued.fetch_add(r.params.n, std::memory_order_relaxed);
  pending.push_back(std::move(r));
  input.store(true, std::memory_order_relaxed);
  wake.notify_one();
  return request_id;
}

AsyncEngine::AsyncEngine(const std::string& model_dir, const EngineOptions& options)
    : impl_(std::make_shared<Impl>()) {
  const EngineConfig config = api::to_engine_config(options, model_dir);
  impl_->text = std::make_shared<const api::TextModel>(model_dir);
  impl_->core = std::make_unique<api::EngineCore>(Engine::create(model_dir, config), impl_->text);
  impl_->limits = api::limits_of(impl_->core->engine());
  impl_->usable_pages = impl_->core->engine().allocator().num_usable();
  impl_->publish_load();
  impl_->weights_version = impl_->core->engine().weights_version();
  impl_->tensor_parallel_size = impl_->core->engine().tensor_parallel_size();
  // New requests, aborts and calls wait one decode step, not a pipelined run of them.
  impl_->core->engine().set_run_interrupt(
      [impl = impl_.get()] { return impl->input.load(std::memory_order_relaxed); });
  impl_->loop = std::thread([impl = impl_.get()] { impl->run(); });
  impl_->loop_id = impl_->loop.get_id();
}

AsyncEngine::~AsyncEngine() { shutdown(); }

std::shared_ptr<RequestStream> AsyncEngine::submit(const Prompt& prompt,
                                                   const SamplingParams& params,
                                                   std::string request_id,
                                                   const std::string& lora) {
  auto state = std::make_shared<RequestStream::State>();
  state->engine = impl_;
  Impl* impl = impl_.get();
  auto sink = [state, impl](RequestOutput&& delta) {
    const bool last = delta.finished;
    if (last) impl->forget(delta.request_id);
    std::lock_guard<std::mutex> lock(state->mu);
    merge_delta(state->accumulated, delta);
    state->final_queued = last;
    state->queue.push_back(std::move(delta));
    state->cv.notify_all();
  };
  const std::string id =
      impl_->queue(prompt, params, std::move(request_id), std::move(sink), lora);
  return std::make_shared<RequestStream>(id, state);
}

std::string AsyncEngine::submit(const Prompt& prompt, const SamplingParams& params,
                                Callback callback, std::string request_id,
                                const std::string& lora) {
  PAGELLM_CHECK(callback) << "submit: the callback is empty";
  Impl* impl = impl_.get();
  auto failed = std::make_shared<bool>(false);  // touched by the loop thread only
  auto sink = [impl, callback = std::move(callback), failed](RequestOutput&& delta) {
    const bool last = delta.finished;
    if (last) impl->forget(delta.request_id);
    if (*failed) return;
    try {
      callback(delta);
    } catch (...) {
      // The caller's code failed: stop spending work on its request.
      *failed = true;
      if (!last) impl->request_abort(delta.request_id);
    }
  };
  return impl_->queue(prompt, params, std::move(request_id), std::move(sink), lora);
}

void AsyncEngine::abort(const std::string& request_id) { impl_->request_abort(request_id); }

void AsyncEngine::shutdown() {
  std::lock_guard<std::mutex> guard(impl_->shutdown_mu);
  if (!impl_->loop.joinable()) return;
  PAGELLM_CHECK(std::this_thread::get_id() != impl_->loop.get_id())
      << "AsyncEngine::shutdown() called from a callback on the engine loop thread (it "
         "would wait for itself); call it from another thread";
  // A weight-group join or transfer that waits for the trainer ends now, not after the
  // group's timeout.
  interrupt_weight_transfers();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->input.store(true, std::memory_order_relaxed);
    impl_->wake.notify_one();
  }
  impl_->loop.join();
}

int AsyncEngine::tensor_parallel_size() const { return impl_->tensor_parallel_size; }

uint64_t AsyncEngine::weights_version() const {
  return impl_->weights_version.load(std::memory_order_acquire);
}

std::vector<int32_t> AsyncEngine::encode(const std::string& text) const {
  return impl_->text->encode(text);
}

std::string AsyncEngine::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->text->decode(ids, skip_special_tokens);
}

std::string AsyncEngine::apply_chat_template(const Prompt& chat_prompt) const {
  return impl_->text->render_chat(chat_prompt);
}

std::vector<int32_t> AsyncEngine::prompt_token_ids(const Prompt& prompt) const {
  return impl_->text->encode_prompt(prompt).ids;
}

int64_t AsyncEngine::check_invariants_and_count_free_pages() {
  auto inspect = [core = impl_->core.get()] {
    core->engine().check_invariants();
    return static_cast<int64_t>(core->engine().allocator().num_free());
  };
  std::packaged_task<int64_t()> task(inspect);
  std::future<int64_t> result = task.get_future();
  {
    std::lock_guard<std::mutex> guard(impl_->shutdown_mu);
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (impl_->stopping || !impl_->loop.joinable()) {
      // No loop will run it: wait for the loop to end, then inspect here.
      lock.unlock();
      if (impl_->loop.joinable() && std::this_thread::get_id() != impl_->loop.get_id()) {
        impl_->loop.join();
      }
      return inspect();
    }
    impl_->tasks.push_back([&task] { task(); });
    impl_->input.store(true, std::memory_order_relaxed);
    impl_->wake.notify_one();
  }
  return result.get();
}

std::vector<ScoreOutput> AsyncEngine::score(const std::vector<std::vector<int32_t>>& sequences,
                                            const std::vector<int32_t>& prompt_lengths,
                                            int top_k, const std::string& lora) {
  return impl_->call([core = impl_->core.get(), &sequences, &prompt_lengths, top_k, &lora] {
    return core->engine().score(sequences, prompt_lengths, top_k, lora);
  });
}

int64_t AsyncEngine::num_usable_pages() const { return impl_->usable_pages; }

int32_t AsyncEngine::max_model_len() const { return impl_->limits.max_model_len; }
int64_t AsyncEngine::vocab_size() const { return impl_->limits.vocab_size; }

EngineLoad AsyncEngine::load() const {
  const Impl& impl = *impl_;
  EngineLoad load;
  load.running = impl.running.load(std::memory_order_relaxed);
  load.waiting = impl.engine_waiting.load(std::memory_order_relaxed) +
                 impl.queued.load(std::memory_order_relaxed);
  load.free_pages = impl.free_pages.load(std::memory_order_relaxed);
  load.usable_pages = impl.usable_pages;
  load.paused = impl.paused.load(std::memory_order_relaxed);
  load.asleep = impl.asleep.load(std::memory_order_relaxed);
  return load;
}

void AsyncEngine::pause(PauseMode mode) {
  impl_->call([impl = impl_.get(), mode] {
    impl->core->engine().pause(mode);
    impl->publish_load();  // before the caller returns: load() shows the pause at once
  });
  if (mode == PauseMode::kWait) impl_->wait_drained();
}

void AsyncEngine::resume() {
  impl_->call([impl = impl_.get()] {
    impl->core->engine().resume();
    impl->publish_load();
  });
}

namespace {

// The pause protocol of AsyncEngine::update_weights: check (on the loop thread, before any
// pause), pause unless paused, wait for the drain, update, resume what it paused. `check`
// (Engine&) throws for a bad update; `update` (Engine&) writes and returns the result.
template <class Check, class Update>
WeightUpdateResult update_on_loop(AsyncEngine::Impl& impl, PauseMode mode, Check check,
                                  Update update) {
  const bool paused_here = impl.call([&] {
    Engine& engine = impl.core->engine();
    check(engine);
    if (engine.paused()) return false;
    engine.pause(mode);
    return true;
  });
  try {
    // kWait: the loop keeps stepping (and delivering deltas) until the requests finish.
    impl.wait_drained();
    WeightUpdateResult result = impl.call([&] {
      WeightUpdateResult r = update(impl.core->engine());
      impl.weights_version.store(r.weights_version, std::memory_order_release);
      return r;
    });
    if (paused_here) impl.call([&] { impl.core->engine().resume(); });
    return result;
  } catch (...) {
    try {
      impl.call([&] {
        Engine& engine = impl.core->engine();
        // A failed broadcast may have written part of the weights and advanced the version.
        impl.weights_version.store(engine.weights_version(), std::memory_order_release);
        if (paused_here) engine.resume();
      });
    } catch (const std::exception&) {
    }
    throw;
  }
}

WeightUpdateResult update_on_loop(AsyncEngine::Impl& impl, PauseMode mode,
                                  const std::vector<NamedTensor>& tensors) {
  return update_on_loop(
      impl, mode, [&](Engine& engine) { engine.check_weights_update(tensors); },
      [&](Engine& engine) { return engine.update_weights(tensors, mode); });
}

}  // namespace

namespace {

// Runs fn on the loop thread between two steps and returns its result; once the loop has
// stopped, runs it here after the loop thread has ended (no step can race it then).
template <class Fn>
auto run_between_steps(AsyncEngine::Impl& impl, Fn fn) -> decltype(fn()) {
  using Result = decltype(fn());
  std::packaged_task<Result()> task(fn);
  std::future<Result> result = task.get_future();
  {
    std::lock_guard<std::mutex> guard(impl.shutdown_mu);
    std::unique_lock<std::mutex> lock(impl.mu);
    if (impl.stopping || !impl.loop.joinable()) {
      lock.unlock();
      if (impl.loop.joinable() && std::this_thread::get_id() != impl.loop.get_id()) {
        impl.loop.join();
      }
      return fn();
    }
    impl.tasks.push_back([&task] { task(); });
    impl.input.store(true, std::memory_order_relaxed);
    impl.wake.notify_one();
  }
  return result.get();
}

}  // namespace


WeightUpdateResult AsyncEngine::update_weights(const std::vector<NamedTensor>& tensors,
                                               PauseMode mode) {
  return update_on_loop(*impl_, mode, tensors);
}

WeightUpdateResult AsyncEngine::update_weights_from_ipc(const std::vector<IpcTensor>& tensors,
                                                     PauseMode mode) {
  std::shared_ptr<IpcWeights> mapped = impl_->call([&] {
    return std::make_shared<IpcWeights>(impl_->core->engine().backend(), tensors);
  });
  // Closed on the loop thread, whatever the update's outcome.
  auto unmap = [&] {
    try {
      impl_->call([&] { mapped.reset(); });
    } catch (const std::exception&) {
      mapped.reset();  // the loop has stopped: no step can race the close here
    }
  };
  try {
    WeightUpdateResult result = update_on_loop(*impl_, mode, mapped->tensors());
    unmap();
    return result;
  } catch (...) {
    unmap();
    throw;
  }
}

void AsyncEngine::init_weight_group(const WeightGroupSpec& spec) {
  impl_->call([&] { impl_->core->engine().join_weight_group(spec); });
}

void AsyncEngine::interrupt_weight_transfers() {
  impl_->core->engine().interrupt_weight_transfers();  // an atomic: safe from any thread
}

void AsyncEngine::destroy_weight_group() {
  impl_->call([&] { impl_->core->engine().leave_weight_group(); });
}

bool AsyncEngine::has_weight_group() const {
  return impl_->call([&] { return impl_->core->engine().weight_group() != nullptr; });
}

WeightUpdateResult AsyncEngine::update_weights_from_broadcast(
    const std::vector<BroadcastTensor>& tensors, uint64_t bucket_bytes, PauseMode mode,
    const std::string& group) {
  return update_on_loop(
      *impl_, mode,
      [&](Engine& engine) { engine.check_broadcast_update(tensors, bucket_bytes, group); },
      [&](Engine& engine) {
        return engine.update_weights_from_broadcast(tensors, bucket_bytes, mode, group);
      });
}

WeightUpdateResult AsyncEngine::load_weights(const std::string& path, PauseMode mode) {
  // The files are opened and mapped here, on the caller's thread.
  const WeightStore store = WeightStore::open(path);
  return update_on_loop(
      *impl_, mode, [&](Engine& engine) { engine.check_load_weights(store); },
      [&](Engine& engine) { return engine.load_weights(store, mode); });
}

SleepReport AsyncEngine::sleep(const SleepOptions& options) {
  return impl_->call([impl = impl_.get(), options] {
    SleepReport report = impl->core->engine().sleep(options);
    impl->publish_load();
    return report;
  });
}

WakeReport AsyncEngine::wake_up() {
  return impl_->call([impl = impl_.get()] {
    WakeReport report = impl->core->engine().wake_up();
    impl->publish_load();
    return report;
  });
}

LoraAdapterInfo AsyncEngine::load_lora_adapter(const LoraRequest& request) {
  return run_between_steps(
      *impl_, [core = impl_->core.get(), &request] { return core->engine().load_lora_adapter(request); });
}

void AsyncEngine::unload_lora_adapter(const std::string& name) {
  run_between_steps(*impl_,
                    [core = impl_->core.get(), &name] { core->engine().unload_lora_adapter(name); });
}

std::vector<LoraAdapterInfo> AsyncEngine::list_lora_adapters() {
  return run_between_steps(*impl_,
                           [core = impl_->core.get()] { return core->engine().lora_adapters(); });
}

void AsyncEngine::reset_prefix_cache() {
  run_between_steps(*impl_, [core = impl_->core.get()] { core->engine().reset_prefix_cache(); });
}

PrefixCacheStats AsyncEngine::prefix_cache_stats() {
  return run_between_steps(*impl_,
                           [core = impl_->core.get()] { return core->engine().prefix_cache_stats(); });
}

RequestStream::RequestStream(std::string request_id, std::shared_ptr<State> state)
    : request_id_(std::move(request_id)), state_(std::move(state)) {}

bool RequestStream::next(RequestOutput& delta, std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  auto ready = [&] { return !state_->queue.empty() || state_->final_taken; };
  if (timeout) {
    if (!state_->cv.wait_for(lock, *timeout, ready)) return false;
  } else {
    state_->cv.wait(lock, ready);
  }
  if (state_->queue.empty()) return false;  // ended
  delta = std::move(state_->queue.front());
  state_->queue.pop_front();
  if (delta.finished) state_->final_taken = true;
  return true;
}

RequestOutput RequestStream::collect() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->final_queued; });
  state_->queue.clear();
  state_->final_taken = true;
  return state_->accumulated;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->final_taken;
}

void RequestStream::abort() {
  if (auto engine = state_->engine.lock()) engine->request_abort(request_id_);
}

}  // namespace pagellm
