#include "pagellm/cuda/support/kernel_trace.h"

#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace pagellm::cuda {
namespace {

// The CUPTI entry points the trace needs, resolved from the library at run time.
struct Cupti {
  void* handle = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
  std::string error;  // why loading failed; empty when every entry point was found
};

const Cupti& cupti() {
  static const Cupti lib = [] {
    Cupti c;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      c.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (c.handle) break;
    }
    if (!c.handle) {
      c.error = "kernel trace: cannot load CUPTI (libcupti.so.13): " + std::string(dlerror()) +
                "; it ships with the CUDA toolkit (lib64 or extras/CUPTI/lib64), put its "
                "folder on LD_LIBRARY_PATH";
      return c;
    }
    const auto bind = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(c.handle, symbol));
      if (!fn && c.error.empty()) c.error = std::string("kernel trace: CUPTI lacks ") + symbol;
    };
    bind(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    bind(c.enable, "cuptiActivityEnable");
    bind(c.disable, "cuptiActivityDisable");
    bind(c.flush_all, "cuptiActivityFlushAll");
    bind(c.next_record, "cuptiActivityGetNextRecord");
    bind(c.callback_name, "cuptiGetCallbackName");
    return c;
  }();
  return lib;
}

constexpr size_t kBufferBytes = size_t{8} << 20;
// Device kernels and copies, and the host's runtime calls (to see what the host does while
// the device idles).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_RUNTIME};

std::mutex g_mutex;
std::vector<KernelSpan> g_spans;  // guarded by g_mutex
bool g_active = false;            // guarded by g_mutex
bool g_registered = false;        // guarded by g_mutex

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

// CUPTI hands back full buffers from its own thread, and at flush time from the caller's.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelSpan> spans;
  CUpti_Activity* record = nullptr;
  while (buffer && cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    KernelSpan span;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      const char* mangled = k->name ? k->name : "?";
      int status = 0;
      std::unique_ptr<char, void (*)(void*)> demangled(
          abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
      span.name = short_kernel_name(status == 0 && demangled ? demangled.get() : mangled);
      span.start_ns = k->start;
      span.end_ns = k->end;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      const char* direction = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                              : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                              : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                               : "other";
      span.name = std::string("memcpy ") + direction;
      span.start_ns = m->start;
      span.end_ns = m->end;
      span.kind = KernelSpan::Kind::kCopy;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const char* name = nullptr;
      if (cupti().callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS ||
          name == nullptr) {
        name = "runtime call";
      }
      span.name = name;
      span.start_ns = a->start;
      span.end_ns = a->end;
      span.kind = KernelSpan::Kind::kHostCall;
    } else {
      continue;
    }
    spans.push_back(std::move(span));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.insert(g_spans.end(), spans.begin(), spans.end());
}

}  // namespace

std::string begin_kernel_trace() {
  const Cupti& c = cupti();
  if (!c.error.empty()) return c.error;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active) return "kernel trace: a trace is already running";
  if (!g_registered) {
    if (c.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
      return "kernel trace: cuptiActivityRegisterCallbacks failed";
    }
    g_registered = true;
  }
  g_spans.clear();
  for (CUpti_ActivityKind kind : kKinds) {
    if (c.enable(kind) != CUPTI_SUCCESS) {
      for (CUpti_ActivityKind k : kKinds) c.disable(k);
      return "kernel trace: cuptiActivityEnable(" + std::to_string(static_cast<int>(kind)) +
             ") failed (another profiler attached?)";
    }
  }
  g_active = true;
  return "";
}

std::vector<KernelSpan> end_kernel_trace() {
  const Cupti& c = cupti();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_active) return {};
  }
  // Flush outside the lock: it calls buffer_completed on this thread.
  c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind kind : kKinds) c.disable(kind);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_active = false;
  std::vector<KernelSpan> spans = std::move(g_spans);
  g_spans.clear();
  std::stable_sort(spans.begin(), spans.end(), [](const KernelSpan& a, const KernelSpan& b) {
    return a.start_ns < b.start_ns;
  });
  return spans;
}

}  // namespace pagellm::cuda
