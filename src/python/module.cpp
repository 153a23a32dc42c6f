// pagellm._core: the nanobind extension under the Python package. It binds the public API
// (include/pagellm) almost one to one; python/pagellm wraps it in vLLM's shapes (keyword
// arguments, dataclasses, tqdm, asyncio). docs/design.md, "Python package", gives the
// thread and GIL rules this file follows:
//   - every call that runs the engine releases the GIL;
//   - LLM.generate's step callback takes the GIL back briefly on the caller's thread (tqdm,
//     PyErr_CheckSignals for Ctrl-C);
//   - AsyncEngine callbacks run on the engine loop thread and never take the GIL: they push
//     the delta onto a queue and write an eventfd that asyncio watches (DeltaQueue).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "pagellm/api/model_folder.h"
#include "pagellm/common/check.h"
#include "pagellm/model/make_model.h"
#include "pagellm/pagellm.h"

#ifdef PAGELLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace pagellm::python {
namespace {

// pagellm.PagellmError: a subclass of both ValueError and RuntimeError, so that
// `except ValueError` catches bad arguments (almost every pagellm::Error names bad input)
// and `except RuntimeError` catches engine failures, as callers of vLLM expect either.
PyObject* g_pagellm_error = nullptr;

int cuda_device_count() {
#ifdef PAGELLM_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

// ---- DLPack tensors -> NamedTensor --------------------------------------------------------

TensorDType tensor_dtype(const std::string& name, const nb::dlpack::dtype& dt) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == 32) return TensorDType::kFloat32;
    if (code == Code::Bfloat && dt.bits == 16) return TensorDType::kBFloat16;
    if (code == Code::Float && dt.bits == 16) return TensorDType::kFloat16;
    if (code == Code::Int && dt.bits == 32) return TensorDType::kInt32;
    if (code == Code::Int && dt.bits == 64) return TensorDType::kInt64;
  }
  std::ostringstream msg;
  msg << "update_weights: tensor '" << name << "' has DLPack dtype (code " << int(dt.code)
      << ", " << int(dt.bits) << " bits, " << int(dt.lanes)
      << " lanes); accepted: float32, bfloat16, float16 (int32/int64 are named as wrong)";
  throw nb::value_error(msg.str().c_str());
}

// A view of each tensor, checked on the Python side of the call (contiguity and device
// are the binding's to check; names, shapes and dtypes are the library's).
std::vector<NamedTensor> to_named_tensors(
    const std::vector<std::pair<std::string, nb::ndarray<>>>& tensors) {
  std::vector<NamedTensor> out;
  out.reserve(tensors.size());
  for (const auto& [name, array] : tensors) {
    NamedTensor t;
    t.name = name;
    t.data = array.data();
    t.dtype = tensor_dtype(name, array.dtype());
    int64_t expected_stride = 1;
    for (size_t d = array.ndim(); d-- > 0;) {
      if (array.shape(d) != 1 && array.stride(d) != expected_stride) {
        std::ostringstream msg;
        msg << "update_weights: tensor '" << name
            << "' is not contiguous (row-major); pass tensor.contiguous()";
        throw nb::value_error(msg.str().c_str());
      }
      expected_stride *= static_cast<int64_t>(array.shape(d));
    }
    for (size_t d = 0; d < array.ndim(); ++d) t.shape.push_back(static_cast<int64_t>(array.shape(d)));
    const int device = array.device_type();
    if (device == nb::device::cpu::value) {
      t.memory = TensorMemory::kHost;
    } else if (device == nb::device::cuda_host::value) {
      t.memory = TensorMemory::kHostPinned;
    } else if (device == nb::device::cuda::value || device == nb::device::cuda_managed::value) {
      t.memory = TensorMemory::kDevice;
    } else {
      std::ostringstream msg;
      msg << "update_weights: tensor '" << name << "' lives on DLPack device type " << device
          << "; accepted: CPU (1), CUDA (2), pinned CUDA host memory (3)";
      throw nb::value_error(msg.str().c_str());
    }
    out.push_back(std::move(t));
  }
  return out;
}

// ---- AsyncEngine with an eventfd -------------------------------------------------------

/// An AsyncEngine whose deltas are queued for Python instead of handed to a Python
/// callback: the loop thread pushes under a mutex and writes the eventfd (no GIL); the
/// asyncio loop watches the fd (loop.add_reader) and calls drain() under the GIL.
class DeltaQueue {
 public:
  DeltaQueue(const std::string& model_dir, const EngineOptions& options)
      : engine_(model_dir, options) {
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  }
  ~DeltaQueue() {
    engine_.shutdown();
    if (fd_ >= 0) close(fd_);
  }

  std::string submit(const Prompt& prompt, const SamplingParams& params,
                     const std::string& request_id, const std::string& lora) {
    return engine_.submit(
        prompt, params,
        [this](const RequestOutput& delta) {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            pending_.push_back(delta);
          }
          const uint64_t one = 1;
          // A full counter (2^64 - 2 unread writes) cannot happen; EAGAIN is harmless.
          [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof(one));
        },
        request_id, lora);
  }

  /// Every delta queued since the last call, oldest first; resets the eventfd.
  std::vector<RequestOutput> drain() {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = read(fd_, &count, sizeof(count));
    std::deque<RequestOutput> taken;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      taken.swap(pending_);
    }
    return {std::make_move_iterator(taken.begin()), std::make_move_iterator(taken.end())};
  }

  int fd() const { return fd_; }
  AsyncEngine& engine() { return engine_; }

 private:
  AsyncEngine engine_;
  int fd_ = -1;
  std::mutex mutex_;
  std::deque<RequestOutput> pending_;
};

PauseMode parse_pause_mode(const std::string& mode) {
  if (mode == "wait") return PauseMode::kWait;
  if (mode == "abort") return PauseMode::kAbort;
  if (mode == "keep") return PauseMode::kKeep;
  throw nb::value_error(("pause mode must be 'wait', 'abort' or 'keep', got '" + mode + "'").c_str());
}

}  // namespace

void make_model_folder(const std::string& out_dir, const std::string& preset, uint64_t seed,
                       const std::string& dtype, const std::string& package_dir) {
  MakeModelOptions options;
  options.preset = preset;
  options.out_dir = out_dir;
  options.seed = seed;
  options.dtype = parse_dtype(dtype);
  PAGELLM_CHECK(options.dtype == DType::F32 || options.dtype == DType::BF16 ||
                options.dtype == DType::F16)
      << "make_model: dtype must be float32, bfloat16 or float16, got '" << dtype << "'";
  make_model(options);
  api::write_model_tokenizer(out_dir, preset_config(preset).vocab_size, package_dir);
}

}  // namespace pagellm::python

NB_MODULE(_core, m) {
  using namespace pagellm;
  using pagellm::python::DeltaQueue;
  m.doc() = "pagellm's C++ core; use the pagellm package, which wraps it.";

  nb::object bases = nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_RuntimeError));
  pagellm::python::g_pagellm_error =
      PyErr_NewExceptionWithDoc("pagellm._core.PagellmError",
                                "An error from pagellm's C++ core; its message says what was "
                                "wrong and what is accepted. Subclasses ValueError and "
                                "RuntimeError.",
                                bases.ptr(), nullptr);
  m.attr("PagellmError") = nb::handle(pagellm::python::g_pagellm_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pagellm::Error& e) {
      PyErr_SetString(pagellm::python::g_pagellm_error, e.what());
    }
  });

  m.attr("has_cuda") =
#ifdef PAGELLM_HAVE_CUDA
      true;
#else
      false;
#endif
  m.attr("OFFLINE_PIPELINED_DECODE_STEPS") = pagellm::kOfflinePipelinedDecodeSteps;
  m.def("cuda_device_count", &pagellm::python::cuda_device_count,
        "CUDA devices visible (0 without the CUDA backend).");
  m.def("version", [] { return std::string(PAGELLM_VERSION_STRING); });
  m.def("make_model", &pagellm::python::make_model_folder, "out_dir"_a, "preset"_a, "seed"_a,
        "dtype"_a, "package_dir"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("model_presets", &model_presets);

  nb::class_<EngineOptions>(m, "EngineOptions", "Engine settings (pagellm/engine_options.h); LLM and AsyncLLM fill it from keyword arguments.")
      .def(nb::init<>())
      .def_rw("backend", &EngineOptions::backend)
      .def_rw("page_size", &EngineOptions::page_size)
      .def_rw("kv_cache_bytes", &EngineOptions::kv_cache_bytes)
      .def_rw("num_pages", &EngineOptions::num_pages)
      .def_rw("max_num_seqs", &EngineOptions::max_num_seqs)
      .def_rw("max_num_batched_tokens", &EngineOptions::max_num_batched_tokens)
      .def_rw("offline", &EngineOptions::offline)
      .def_rw("max_model_len", &EngineOptions::max_model_len)
      .def_rw("use_graphs", &EngineOptions::use_graphs)
      .def_rw("attention_backend", &EngineOptions::attention_backend)
      .def_rw("float32_head", &EngineOptions::float32_head)
      .def_rw("batch_invariant", &EngineOptions::batch_invariant)
      .def_rw("enable_prefix_caching", &EngineOptions::enable_prefix_caching)
      .def_rw("max_loras", &EngineOptions::max_loras)
      .def_rw("max_lora_rank", &EngineOptions::max_lora_rank)
      .def_rw("pipelined_decode_steps", &EngineOptions::pipelined_decode_steps)
      .def_rw("tensor_parallel_size", &EngineOptions::tensor_parallel_size);

  nb::class_<SamplingParams>(m, "SamplingParams", "The C++ SamplingParams (pagellm/sampling_params.h); pagellm.SamplingParams builds it.")
      .def(nb::init<>())
      .def_rw("n", &SamplingParams::n)
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("stop", &SamplingParams::stop)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def_rw("processed_logprobs", &SamplingParams::processed_logprobs)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def("validate", [](const SamplingParams& p) { validate_sampling_params(p); });

  nb::class_<Prompt>(m, "Prompt", "A prompt: text, token ids, or chat messages as JSON (pagellm/prompt.h).")
      .def_static("from_text", &Prompt::from_text)
      .def_static("from_token_ids", &Prompt::from_token_ids)
      .def_static("from_messages_json", &Prompt::from_messages_json, "messages_json"_a,
                  "chat_template_kwargs_json"_a = "");

  nb::class_<TokenLogprob>(m, "TokenLogprob", "One entry of a top-k list: a token id and its raw log-probability.")
      .def_ro("token_id", &TokenLogprob::token_id)
      .def_ro("logprob", &TokenLogprob::logprob);

  nb::class_<CompletionOutput>(m, "CompletionOutput", "One sample of a request as the core reports it (pagellm/outputs.h).")
      .def_ro("index", &CompletionOutput::index)
      .def_ro("text", &CompletionOutput::text)
      .def_ro("token_ids", &CompletionOutput::token_ids)
      .def_ro("logprobs", &CompletionOutput::logprobs)
      .def_ro("processed_logprobs", &CompletionOutput::processed_logprobs)
      .def_ro("top_logprobs", &CompletionOutput::top_logprobs)
      .def_ro("logprob_ranks", &CompletionOutput::logprob_ranks)
      .def_ro("cumulative_logprob", &CompletionOutput::cumulative_logprob)
      .def_ro("weights_versions", &CompletionOutput::weights_versions)
      .def_prop_ro("finish_reason",
                   [](const CompletionOutput& o) { return finish_reason_name(o.finish_reason); })
      .def_prop_ro("finish_reason_openai",
                   [](const CompletionOutput& o) { return finish_reason_openai(o.finish_reason); })
      .def_ro("error", &CompletionOutput::error);

  nb::class_<RequestOutput>(m, "RequestOutput", "A request's prompt and samples as the core reports it; in a stream, a delta.")
      .def(nb::init<>())
      .def_ro("request_id", &RequestOutput::request_id)
      .def_ro("prompt", &RequestOutput::prompt)
      .def_ro("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_ro("outputs", &RequestOutput::outputs)
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("weights_version", &RequestOutput::weights_version);

  m.def("merge_delta", &merge_delta, "total"_a, "delta"_a,
        "Appends a stream delta to an accumulated RequestOutput.");

  nb::class_<ScoreOutput>(m, "ScoreOutput", "LLM.score_outputs: per scored token its raw log-probability, rank (1 = most likely) and, with top_k, the top_k most likely tokens.")
      .def_ro("token_ids", &ScoreOutput::token_ids)
      .def_ro("prompt_length", &ScoreOutput::prompt_length)
      .def_ro("logprobs", &ScoreOutput::logprobs)
      .def_ro("ranks", &ScoreOutput::ranks)
      .def_ro("top_logprobs", &ScoreOutput::top_logprobs);

  nb::class_<WeightUpdateResult>(m, "WeightUpdateResult", "What one weight update did: the new weights version, tensors and bytes written, seconds, and how running requests were treated.")
      .def_ro("weights_version", &WeightUpdateResult::weights_version)
      .def_ro("tensors_updated", &WeightUpdateResult::tensors_updated)
      .def_ro("bytes", &WeightUpdateResult::bytes)
      .def_ro("seconds", &WeightUpdateResult::seconds)
      .def_ro("wait_seconds", &WeightUpdateResult::wait_seconds)
      .def_ro("requests_aborted", &WeightUpdateResult::requests_aborted)
      .def_ro("requests_kept", &WeightUpdateResult::requests_kept)
      .def_ro("requests_waited", &WeightUpdateResult::requests_waited);

  nb::class_<SleepReport>(m, "SleepReport", "What sleep released, in bytes, and the backend's free memory before and after.")
      .def_ro("kv_bytes_released", &SleepReport::kv_bytes_released)
      .def_ro("weight_bytes_offloaded", &SleepReport::weight_bytes_offloaded)
      .def_ro("prepared_bytes_released", &SleepReport::prepared_bytes_released)
      .def_ro("free_memory_before", &SleepReport::free_memory_before)
      .def_ro("free_memory_after", &SleepReport::free_memory_after)
      .def_ro("seconds", &SleepReport::seconds);
  nb::class_<WakeReport>(m, "WakeReport", "How long wake_up took and the backend's free memory after.")
      .def_ro("seconds", &WakeReport::seconds)
      .def_ro("free_memory_after", &WakeReport::free_memory_after);

  nb::class_<PrefixCacheStats>(m, "PrefixCacheStats", "Prefix cache counters since loading: tokens looked up and hit, evictions, pages cached now.")
      .def_ro("queried_tokens", &PrefixCacheStats::queried_tokens)
      .def_ro("hit_tokens", &PrefixCacheStats::hit_tokens)
      .def_ro("evictions", &PrefixCacheStats::evictions)
      .def_ro("cached_pages", &PrefixCacheStats::cached_pages)
      .def_ro("cached_free_pages", &PrefixCacheStats::cached_free_pages);

  using Guard = nb::call_guard<nb::gil_scoped_release>;
  using Tensors = std::vector<std::pair<std::string, nb::ndarray<>>>;

  nb::class_<LoraRequest>(m, "LoraRequest", "A LoRA adapter by name, the caller's id and a PEFT folder (pagellm/lora_request.h); pagellm.LoRARequest builds it.")
      .def(nb::init<>())
      .def_rw("name", &LoraRequest::name)
      .def_rw("id", &LoraRequest::id)
      .def_rw("path", &LoraRequest::path);
  nb::class_<LoraAdapterInfo>(m, "LoraAdapterInfo", "A loaded LoRA adapter: name, id, path, rank, scale (alpha / r), slot and version (1, then +1 per replace in place).")
      .def_ro("name", &LoraAdapterInfo::name)
      .def_ro("id", &LoraAdapterInfo::id)
      .def_ro("path", &LoraAdapterInfo::path)
      .def_ro("rank", &LoraAdapterInfo::rank)
      .def_ro("scale", &LoraAdapterInfo::scale)
      .def_ro("slot", &LoraAdapterInfo::slot)
      .def_ro("version", &LoraAdapterInfo::version);

  nb::class_<LLM>(m, "LLM", "The C++ LLM (pagellm/llm.h); pagellm.LLM wraps it.")
      .def(nb::init<const std::string&, const EngineOptions&>(), "model_dir"_a, "options"_a,
           Guard())
      // on_step(finished, total) -> bool runs with the GIL held; the engine steps without.
      .def(
          "generate",
          [](LLM& llm, const std::vector<Prompt>& prompts,
             const std::vector<SamplingParams>& params, const std::vector<LoraRequest>& loras,
             nb::object on_step) {
            LLM::StepCallback callback;
            std::optional<nb::python_error> raised;
            if (!on_step.is_none()) {
              callback = [&on_step, &raised](size_t finished, size_t total) {
                nb::gil_scoped_acquire gil;
                try {
                  // Runs Python's signal handlers: Ctrl-C raises KeyboardInterrupt here.
                  if (PyErr_CheckSignals() != 0) throw nb::python_error();
                  return nb::cast<bool>(on_step(finished, total));
                } catch (nb::python_error& e) {
                  raised.emplace(std::move(e));
                  return false;
                }
              };
            }
            std::vector<RequestOutput> out;
            {
              nb::gil_scoped_release release;
              out = llm.generate(prompts, params, loras, callback);
            }
            if (raised) throw std::move(*raised);
            return out;
          },
          "prompts"_a, "params"_a, "lora_requests"_a, "on_step"_a = nb::none())
      .def("load_lora_adapter", &LLM::load_lora_adapter, "request"_a, Guard())
      .def("unload_lora_adapter", &LLM::unload_lora_adapter, "name"_a, Guard())
      .def("list_lora_adapters", &LLM::list_lora_adapters, Guard())
      .def("score", &LLM::score, "sequences"_a, "prompt_lengths"_a, "top_k"_a,
           "lora"_a = std::string(), Guard())
      .def("encode", &LLM::encode, Guard())
      .def("decode", &LLM::decode, "ids"_a, "skip_special_tokens"_a = true, Guard())
      .def("apply_chat_template", &LLM::apply_chat_template, Guard())
      .def("prompt_token_ids", &LLM::prompt_token_ids, Guard())
      .def_prop_ro("has_tokenizer", &LLM::has_tokenizer)
      .def_prop_ro("vocab_size", &LLM::vocab_size)
      .def_prop_ro("max_model_len", &LLM::max_model_len)
      .def("num_free_pages", &LLM::num_free_pages)
      .def("num_usable_pages", &LLM::num_usable_pages)
      .def_prop_ro("weights_version", &LLM::weights_version)
      .def("update_weights",
           [](LLM& llm, const Tensors& tensors) {
             const std::vector<NamedTensor> named = pagellm::python::to_named_tensors(tensors);
             nb::gil_scoped_release release;
             return llm.update_weights(named);
           })
      .def("load_weights", &LLM::load_weights, Guard())
      .def(
          "sleep",
          [](LLM& llm, bool offload_weights) {
            SleepOptions options;
            options.offload_weights = offload_weights;
            return llm.sleep(options);
          },
          "offload_weights"_a, Guard())
      .def("wake_up", &LLM::wake_up, Guard())
      .def_prop_ro("is_sleeping", &LLM::is_sleeping)
      .def("reset_prefix_cache", &LLM::reset_prefix_cache, Guard())
      .def("prefix_cache_stats", &LLM::prefix_cache_stats);

  nb::class_<DeltaQueue>(m, "AsyncEngine", "The C++ AsyncEngine whose deltas queue up for Python behind an eventfd (fileno, drain); pagellm.AsyncLLM wraps it.")
      .def(nb::init<const std::string&, const EngineOptions&>(), "model_dir"_a, "options"_a,
           Guard())
      .def("fileno", &DeltaQueue::fd)
      .def("submit", &DeltaQueue::submit, "prompt"_a, "params"_a, "request_id"_a, "lora"_a,
           Guard())
      .def("load_lora_adapter",
           [](DeltaQueue& q, const LoraRequest& r) { return q.engine().load_lora_adapter(r); },
           "request"_a, Guard())
      .def("unload_lora_adapter",
           [](DeltaQueue& q, const std::string& name) { q.engine().unload_lora_adapter(name); },
           "name"_a, Guard())
      .def("list_lora_adapters", [](DeltaQueue& q) { return q.engine().list_lora_adapters(); },
           Guard())
      .def("drain", &DeltaQueue::drain, Guard())
      .def("abort", [](DeltaQueue& q, const std::string& id) { q.engine().abort(id); }, Guard())
      .def("shutdown", [](DeltaQueue& q) { q.engine().shutdown(); }, Guard())
      .def_prop_ro("weights_version", [](DeltaQueue& q) { return q.engine().weights_version(); })
      .def(
          "pause",
          [](DeltaQueue& q, const std::string& mode) {
            const PauseMode m = pagellm::python::parse_pause_mode(mode);
            nb::gil_scoped_release release;
            q.engine().pause(m);
          },
          "mode"_a)
      .def("resume", [](DeltaQueue& q) { q.engine().resume(); }, Guard())
      .def(
          "update_weights",
          [](DeltaQueue& q, const Tensors& tensors, const std::string& mode) {
            const std::vector<NamedTensor> named = pagellm::python::to_named_tensors(tensors);
            const PauseMode m = pagellm::python::parse_pause_mode(mode);
            nb::gil_scoped_release release;
            return q.engine().update_weights(named, m);
          },
          "tensors"_a, "mode"_a)
      .def(
          "load_weights",
          [](DeltaQueue& q, const std::string& path, const std::string& mode) {
            const PauseMode m = pagellm::python::parse_pause_mode(mode);
            nb::gil_scoped_release release;
            return q.engine().load_weights(path, m);
          },
          "path"_a, "mode"_a)
      .def("score",
           [](DeltaQueue& q, const std::vector<std::vector<int32_t>>& sequences,
              const std::vector<int32_t>& prompt_lengths, int top_k, const std::string& lora) {
             return q.engine().score(sequences, prompt_lengths, top_k, lora);
           },
           "sequences"_a, "prompt_lengths"_a, "top_k"_a, "lora"_a = std::string(), Guard())
      .def(
          "sleep",
          [](DeltaQueue& q, bool offload_weights) {
            SleepOptions options;
            options.offload_weights = offload_weights;
            return q.engine().sleep(options);
          },
          "offload_weights"_a, Guard())
      .def("wake_up", [](DeltaQueue& q) { return q.engine().wake_up(); }, Guard())
      .def("reset_prefix_cache", [](DeltaQueue& q) { q.engine().reset_prefix_cache(); }, Guard())
      .def("check_invariants_and_count_free_pages",
           [](DeltaQueue& q) { return q.engine().check_invariants_and_count_free_pages(); },
           Guard())
      .def("num_usable_pages", [](DeltaQueue& q) { return q.engine().num_usable_pages(); })
      .def("encode", [](DeltaQueue& q, const std::string& t) { return q.engine().encode(t); },
           Guard())
      .def(
          "decode",
          [](DeltaQueue& q, const std::vector<int32_t>& ids, bool skip) {
            return q.engine().decode(ids, skip);
          },
          "ids"_a, "skip_special_tokens"_a = true, Guard());
}
