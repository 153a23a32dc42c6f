// Attention planning and dispatch (attention_dispatch.h).
#include "pagellm/cuda/attention/attention_dispatch.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "pagellm/attention/crossover_table.h"
#include "pagellm/attention/planner.h"
#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_decode_variants.h"
#include "pagellm/cuda/attention/attention_prefill_variants.h"
#if PAGELLM_HAVE_CUDNN
#include "pagellm/cuda/attention/cudnn_attention.h"
#endif
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

// Decode attention's split-KV partials are sized for 8 splits of 256 query tokens of 64
// heads x 128 (~64 MiB): every Qwen3 up to 32B, and twice the tokens for 32 heads. Decode
// plans no more splits than fit, so a larger batch is still correct; it just splits less,
// which it does not need to once the batch alone fills the GPU.
constexpr int32_t kAttentionWorkspaceTokens = 256;
constexpr int32_t kAttentionWorkspaceHeads = 64;
constexpr int32_t kAttentionWorkspaceHeadDim = 128;
constexpr int32_t kAttentionWorkspaceSplits = 8;

cudaStream_t as_stream(CUstream_st* s) { return s; }

void expect_dtype(const Tensor& t, DType want, const char* op, const char* what) {
  PAGELLM_CHECK(t.dtype == want) << "cuda backend: " << op << ": " << what << " must be "
                                 << dtype_name(want) << ", got " << dtype_name(t.dtype)
                                 << " " << t.shape_string();
}

// The crossover tables `auto` may use: the shipped data/attention (beside the binary or
// in the source tree it was built from), then `extra` ($PAGELLM_ATTENTION_TABLES).
std::vector<std::string> crossover_table_paths(const std::vector<std::string>& extra) {
  std::vector<std::string> found = shipped_crossover_table_paths();
  found.insert(found.end(), extra.begin(), extra.end());
#ifdef PAGELLM_SOURCE_DIR
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path source = fs::path(PAGELLM_SOURCE_DIR) / "data" / "attention";
  if (fs::is_directory(source, ec)) {
    bool listed = false;
    for (const std::string& p : found) listed = listed || fs::equivalent(p, source, ec);
    // Lowest priority: a bundle's own tables or the user's override win over it.
    if (!listed) found.insert(found.begin(), source.string());
  }
#endif
  return found;
}

AttentionDomain attention_domain(const AttentionShape& shape) {
  AttentionDomain domain;
  domain.dtype = DType::BF16;
  domain.num_q_heads = static_cast<int32_t>(shape.num_q_heads);
  domain.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
  domain.head_dim = static_cast<int32_t>(shape.head_dim);
  domain.page_size = static_cast<int32_t>(shape.page_size);
  domain.scale = shape.scale;
  return domain;
}

}  // namespace

/// The attention dispatcher's per-backend state: the planner (rebuilt when the choice
/// changes), the tables it reads, the cuDNN plan cache, and this forward's plan.
struct AttentionDispatch::Route {
  AttentionBackendChoice choice = AttentionBackendChoice::kAuto;
  bool profiled = false;  // device profile and tables loaded (not for native)
  DeviceProfile device;
  CrossoverTables tables;
#if PAGELLM_HAVE_CUDNN
  std::unique_ptr<CudnnPlanCache> cudnn;
#endif
  std::unique_ptr<AttentionPlanner> planner;
  // A planner replaced during a forward (cuDNN failed under auto): `plan` may point into
  // it, so it lives until the forward ends.
  std::unique_ptr<AttentionPlanner> retired_planner;
  // This forward's plan (null between forwards) and the serial plan_attention gave it.
  const AttentionPlan* plan = nullptr;
  uint64_t serial = 0;
  uint64_t plans_made = 0;
  AttentionDomain domain;  // the shape `plan` was made for
  // The forward's leading decode rows that native calls split off (eager forwards only).
  MixedDecodeRun mixed_run;
  // The key `auto` requested in the last forward (rule 5), and that forward's last call:
  // a plan built for it at begin_capture is run once on those buffers before capturing.
  bool pending_valid = false;
  CudnnPlanKey pending_key;
  bool last_call_valid = false;
  PagedAttentionParams last_call;
  AttentionRouteStats stats;
};

AttentionDispatch::AttentionDispatch(DeviceMemory& memory, int device,
                                     const CudaSettings& settings, CUstream_st* stream)
    : memory_(memory), device_(device), settings_(settings), stream_(stream) {
  workspace_bytes_ = paged_attention_workspace_bytes(
      kAttentionWorkspaceTokens, kAttentionWorkspaceHeads, kAttentionWorkspaceHeadDim,
      kAttentionWorkspaceSplits);
  workspace_ = memory_.allocate(workspace_bytes_);
  // Decode's split counters start at zero (attention.h); every call leaves them so.
  const cudaError_t err = cudaMemset(workspace_, 0, workspace_bytes_);
  if (err != cudaSuccess) {
    memory_.deallocate(workspace_);
    PAGELLM_CUDA_CHECK(err);
  }
}

AttentionDispatch::~AttentionDispatch() {
  route_.reset();
  memory_.deallocate(workspace_);
}

AttentionPlanRef AttentionDispatch::plan(const BatchTensors& batch, const AttentionShape& shape,
                                         const LayerKv& kv) {
  PAGELLM_CHECK(batch.host != nullptr)
      << "cuda backend: plan_attention needs the batch's host metadata (BatchTensors::host)";
  PAGELLM_CHECK(kv.k.ndim == 4)
      << "cuda backend: plan_attention: KV pools " << kv.k.shape_string()
      << " are not [pages, kv heads, page size, head_dim]";
  const ForwardBatch& host = *batch.host;
  Route& r = route();
  r.domain = attention_domain(shape);
#if PAGELLM_HAVE_CUDNN
  if (r.cudnn && r.cudnn->num_pages() != kv.k.size(0)) r.cudnn->set_num_pages(kv.k.size(0));
#endif
  // Graph mode whenever the forward may be replayed: the decision must then hold for every
  // replay (and never routes a ragged batch, whose arrays are uploaded per forward).
  const LaunchMode mode =
      host.kv_len_capacity > 0 || stream_capturing(stream_) ? LaunchMode::kGraph : LaunchMode::kEager;
  r.plan = &r.planner->plan(r.domain, batch_view(host), mode);
  r.mixed_run = mode == LaunchMode::kEager
                    ? find_mixed_decode_run(host.num_seqs(), host.query_start.data(),
                                            host.kv_lens.data())
                    : MixedDecodeRun{};
  r.serial = ++r.plans_made;
  ++r.stats.forwards_planned;
  r.pending_valid = r.plan->decided_by == static_cast<int>(AdmissionRule::kPlanReady);
  if (r.pending_valid) r.pending_key = r.plan->cudnn_key;
#if PAGELLM_HAVE_CUDNN
  if (r.plan->provider == AttentionProvider::kCudnn) r.cudnn->upload(*r.plan, as_stream(stream_));
#endif
  AttentionPlanRef ref;
  ref.serial = r.serial;
  ref.plan = r.plan;
  return ref;
}

void AttentionDispatch::run(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                            const BatchTensors& batch, const AttentionPlanRef& plan, Tensor& out) {
  const char* op = "attention";
  expect_dtype(q, DType::BF16, op, "q");
  expect_dtype(out, DType::BF16, op, "output");
  expect_dtype(kv.k, DType::BF16, op, "K pool");
  expect_dtype(kv.v, DType::BF16, op, "V pool");
  PAGELLM_CHECK(batch.host != nullptr)
      << "cuda backend: attention needs the batch's host metadata (BatchTensors::host)";
  const ForwardBatch& host = *batch.host;
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t T = q.ndim == 0 ? 0 : q.size(0);
  PAGELLM_CHECK(q.numel() == T * Hq * D && out.numel() == T * Hq * D)
      << "cuda backend: attention: q " << q.shape_string() << " and output "
      << out.shape_string() << " are not [" << T << ", " << Hq << " x " << D << "]";
  PAGELLM_CHECK(kv.k.ndim == 4 && kv.k.size(1) == Hkv && kv.k.size(2) == shape.page_size &&
                kv.k.size(3) == D && kv.v.numel() == kv.k.numel())
      << "cuda backend: attention: KV pools " << kv.k.shape_string() << " are not [pages, "
      << Hkv << ", " << shape.page_size << ", " << D << "]";
  PAGELLM_CHECK(batch.page_table.ndim == 2 && batch.query_start.numel() == batch.kv_lens.numel() + 1)
      << "cuda backend: attention: malformed batch tensors (page table "
      << batch.page_table.shape_string() << ", " << batch.query_start.numel()
      << " query offsets for " << batch.kv_lens.numel() << " sequences)";
  // The plan must be this forward's: upload_batch and begin_capture end a forward.
  Route& r = route();
  PAGELLM_CHECK(plan.serial != 0 && r.plan != nullptr && plan.serial == r.serial &&
                plan.plan == r.plan)
      << "cuda backend: attention needs this forward's plan: call plan_attention once per "
         "forward, after upload_batch (and begin_capture), and pass its result to every "
         "layer (got "
      << (plan.serial == 0 ? std::string("no plan") : "the plan of an earlier forward") << ")";
  PAGELLM_CHECK(attention_domain(shape) == r.domain)
      << "cuda backend: attention: the layer's shape (" << Hq << " q heads, " << Hkv
      << " kv heads, head_dim " << D << ", page size " << shape.page_size
      << ") is not the one plan_attention was given";
  if (T == 0) return;
  PagedAttentionParams p;
  p.q = q.data;
  p.k_pool = kv.k.data;
  p.v_pool = kv.v.data;
  p.out = out.data;
  p.query_start = batch.query_start.ptr<int32_t>();
  p.kv_lens = batch.kv_lens.ptr<int32_t>();
  p.page_table = batch.page_table.ptr<int32_t>();
  p.num_seqs = static_cast<int32_t>(batch.kv_lens.numel());
  p.num_tokens = static_cast<int32_t>(T);
  p.num_q_heads = static_cast<int32_t>(Hq);
  p.num_kv_heads = static_cast<int32_t>(Hkv);
  p.head_dim = static_cast<int32_t>(D);
  p.page_size = static_cast<int32_t>(shape.page_size);
  p.max_pages_per_seq = static_cast<int32_t>(batch.page_table.size(1));
  p.num_pages = static_cast<int32_t>(kv.k.size(0));
  const int32_t max_query_len = host.num_seqs() > 0 ? host.max_query_len() : 0;
  p.max_query_len = max_query_len;
  p.max_kv_len = std::max(host.kv_len_capacity, host.num_seqs() > 0 ? host.max_kv_len() : 0);
  p.scale = shape.scale;
  p.workspace = workspace_;
  p.workspace_bytes = workspace_bytes_;
  p.num_splits = 0;

  r.last_call = p;
  r.last_call_valid = true;
#if PAGELLM_HAVE_CUDNN
  // After a cuDNN failure under auto (choice now native), the rest of the forward runs
  // natively although its plan said cuDNN.
  if (r.plan->provider == AttentionProvider::kCudnn && r.choice != AttentionBackendChoice::kNative) {
    try {
      r.cudnn->run(p, *r.plan, as_stream(stream_));
      ++r.stats.cudnn_calls;
      return;
    } catch (const Error& e) {
      if (r.choice == AttentionBackendChoice::kCudnn) throw;
      // auto never fails because of cuDNN: this call and every later one run natively.
      std::fprintf(stderr,
                   "pagellm: warning: cuDNN attention failed (%s); --attention-backend auto "
                   "continues with the native kernels\n",
                   e.what());
      r.choice = AttentionBackendChoice::kNative;
      AttentionPlannerConfig native;
      native.choice = AttentionBackendChoice::kNative;
      // r.plan points into the old planner: keep it until the forward ends.
      r.retired_planner = std::move(r.planner);
      r.planner = std::make_unique<AttentionPlanner>(native);
      r.pending_valid = false;
    }
  }
#endif
  ++r.stats.native_calls;
  if (batch_invariant_) {
    // One KV split: a CTA attends query token i of its sequence over keys [0, its causal
    // end) in 16-key tiles dealt to the 4 warps in turn, merged in warp order. That is
    // the same work for token i whether it is a lone decode row or one of a prefill
    // chunk's rows (taken one after another), and whatever else the batch holds.
    p.num_splits = 1;
    paged_decode_attention_with(p, settings_.decode_kernel, as_stream(stream_));
    return;
  }
  const NativeAttentionCalls calls = plan_native_attention(p, r.mixed_run);
  if (calls.run_decode) {
    PagedAttentionParams d = calls.decode;
    if (!calls.run_prefill) add_prefix_pass(batch, d);
    paged_decode_attention_with(d, settings_.decode_kernel, as_stream(stream_));
  }
  if (calls.run_prefill) {
    paged_prefill_attention_with(calls.prefill, settings_.prefill_kernel, as_stream(stream_));
  }
}

void AttentionDispatch::add_prefix_pass(const BatchTensors& batch, PagedAttentionParams& p) {
  // A captured graph (and the forward that warms it up, kv_len_capacity set) keeps the pass
  // for every replay: its items come with each upload, none when nothing is shared. An
  // eager call runs it only when this batch has items.
  if (!settings_.decode_cascade || settings_.decode_kernel != DecodeKernel::kTma ||
      batch.prefix_tokens.data == nullptr || p.num_seqs < settings_.decode_cascade_min_seqs ||
      (batch.prefix_item_count == 0 && batch.host->kv_len_capacity == 0 &&
       !stream_capturing(stream_))) {
    return;
  }
  PagedAttentionParams c = p;
  c.prefix_items = batch.prefix_items.ptr<int32_t>();
  c.prefix_tokens = batch.prefix_tokens.ptr<int32_t>();
  c.max_prefix_items = p.num_seqs;
  c.prefix_fold_keys = settings_.decode_prefix_fold_keys;
  if (decode_cascade_supported(c)) {
    p = c;
    ++route().stats.prefix_pass_calls;
  }
}

AttentionDispatch::Route& AttentionDispatch::route() {
  if (!route_) configure(AttentionBackendChoice::kAuto);
  return *route_;
}

void AttentionDispatch::set_choice(AttentionBackendChoice c) { configure(c); }

void AttentionDispatch::configure(AttentionBackendChoice c) {
#if PAGELLM_HAVE_CUDNN
  if (c == AttentionBackendChoice::kCudnn) {
    const CudnnLibrary& lib = cudnn_library();
    PAGELLM_CHECK(lib.version > 0)
        << "--attention-backend cudnn: " << lib.error
        << ". Use --attention-backend auto (falls back to the native kernels) or native";
  }
#else
  PAGELLM_CHECK(c != AttentionBackendChoice::kCudnn)
      << "--attention-backend cudnn: this build has no cuDNN route (cudnn-frontend was not "
         "found when it was built: pip install --no-deps nvidia-cudnn-frontend==1.32.0, then "
         "reconfigure). Use --attention-backend auto or native";
#endif
  if (!route_) route_ = std::make_unique<Route>();
  Route& r = *route_;
  r.choice = c;
  if (c != AttentionBackendChoice::kNative && !r.profiled) {
    r.profiled = true;
#if PAGELLM_HAVE_CUDNN
    r.device = cuda_device_profile(device_);  // loads cuDNN (dlopen) if it can
    r.cudnn = std::make_unique<CudnnPlanCache>(device_);
#else
    cudaDeviceProp prop{};
    PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    r.device.name = prop.name;
    r.device.sm_count = prop.multiProcessorCount;
    r.device.cc_major = prop.major;
    r.device.cc_minor = prop.minor;
#endif
    try {
      r.tables = CrossoverTables::load(crossover_table_paths(settings_.attention_tables));
    } catch (const Error& e) {
      // A broken table is reported, and `auto` stays native rather than failing.
      std::fprintf(stderr,
                   "pagellm: warning: attention crossover tables not used (auto stays native): "
                   "%s\n",
                   e.what());
      r.tables = CrossoverTables{};
    }
  }
  AttentionPlannerConfig config;
  config.choice = c;
  config.device = r.device;
  config.tables = &r.tables;
#if PAGELLM_HAVE_CUDNN
  config.registry = r.cudnn.get();
#endif
  r.planner = std::make_unique<AttentionPlanner>(config);
  r.retired_planner.reset();
  r.plan = nullptr;
  r.serial = 0;
  r.pending_valid = false;
}

void AttentionDispatch::between_forwards(bool before_capture) {
  if (!route_) return;
  Route& r = *route_;
#if PAGELLM_HAVE_CUDNN
  if (r.cudnn && r.cudnn->num_requested() > 0) {
    const size_t before = r.cudnn->num_plans();
    const std::vector<std::string> refused = r.cudnn->build_requested();
    r.stats.plans_built += static_cast<int64_t>(r.cudnn->num_plans() - before);
    r.stats.plans_refused += static_cast<int64_t>(refused.size());
    // Before a capture: run each new plan once on the forward just run, so that cuDNN
    // loads its kernels outside the capture. Dense (decode) plans only: a ragged one
    // would need that forward's arrays, and graphs never route ragged batches to cuDNN.
    if (before_capture && r.pending_valid && r.last_call_valid && !r.pending_key.ragged &&
        r.cudnn->has_plan(r.pending_key)) {
      AttentionPlan warm;
      warm.provider = AttentionProvider::kCudnn;
      warm.cudnn_key = r.pending_key;
      try {
        r.cudnn->run(r.last_call, warm, as_stream(stream_));
        memory_.synchronize();
        ++r.stats.warmups;
      } catch (const Error& e) {
        std::fprintf(stderr, "pagellm: warning: cuDNN attention warm-up failed: %s\n",
                     e.what());
      }
    }
  }
#else
  (void)before_capture;
#endif
  r.pending_valid = false;
  // The buffers of the last call may be reused or regrown by the next upload, and the
  // forward's plan ends with it.
  r.last_call_valid = false;
  r.plan = nullptr;
  r.serial = 0;
  r.retired_planner.reset();
}

std::string AttentionDispatch::choice() const {
  return choice_name(route_ ? route_->choice : AttentionBackendChoice::kAuto);
}

AttentionRouteStats AttentionDispatch::stats() const {
  return route_ ? route_->stats : AttentionRouteStats{};
}

const AttentionPlan* AttentionDispatch::last_plan() const {
  return route_ && route_->planner && route_->stats.forwards_planned > 0
             ? &route_->planner->last_plan()
             : nullptr;
}

}  // namespace pagellm::cuda
