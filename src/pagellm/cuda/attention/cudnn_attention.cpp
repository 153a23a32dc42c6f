// cuDNN paged SDPA forward through the cudnn-frontend graph API (see cudnn_attention.h).
//
// The frontend is used in its dynamic-loading mode: libcudnn is dlopen'ed on first use and
// every backend call goes through the handle we set, so pagellm links no cuDNN library and
// runs where none is installed. (The frontend then also reaches a few CUDA runtime entry
// points through a dlopen'ed libcudart; CUDNN_FRONTEND_CUDART_LIB_NAME selects which.)
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "pagellm/cuda/attention/cudnn_attention.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/cuda_settings.h"

// The frontend's dynamic loader reads the library handle from here.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace pagellm::cuda {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graph (any distinct values; fixed so that a variant pack is a map).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kSeqLenQ,
  kSeqLenKv,
  kPageTableK,
  kPageTableV,
  kQOffsets,
  kOOffsets,
};

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PAGELLM_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

struct FullKey {
  CudnnPlanKey key;
  int64_t num_pages = 0;
  bool operator==(const FullKey& o) const { return key == o.key && num_pages == o.num_pages; }
};

struct FullKeyHash {
  size_t operator()(const FullKey& k) const {
    return CudnnPlanKeyHash{}(k.key) * 31 + std::hash<int64_t>{}(k.num_pages);
  }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN refused the shape
  std::string error;
  int64_t workspace = 0;
  std::unordered_map<int64_t, void*> pack;  // filled in place on every run: no allocation
};

// Device memory that captured graphs may point at is retired, not freed, when replaced.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

std::string fe_message(fe::error_t status) {
  std::ostringstream s;
  s << status.get_message() << " (cudnn-frontend code " << static_cast<int>(status.get_code())
    << ")";
  return s.str();
}

// The graph of one plan key; see the shapes in cudnn_attention.h.
std::shared_ptr<fe::graph::Graph> make_graph(const CudnnPlanKey& k, int64_t num_pages) {
  const int64_t B = k.num_seqs, Hq = k.num_q_heads, Hkv = k.num_kv_heads, D = k.head_dim;
  const int64_t S = k.max_query_len, P = k.page_size, T = k.max_pages_per_seq;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(k.dtype == DType::F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);

  const auto offsets = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(fe::DataType_t::INT32)
                         .set_dim({B + 1, 1, 1, 1})
                         .set_stride({1, 1, 1, 1}));
  };
  const auto per_seq = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(fe::DataType_t::INT32)
                         .set_dim({B, 1, 1, 1})
                         .set_stride({1, 1, 1, 1}));
  };
  const auto table = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(fe::DataType_t::INT32)
                         .set_dim({B, 1, T, 1})
                         .set_stride({T, T, 1, 1}));
  };
  const auto container = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({num_pages, Hkv, P, D})
                         .set_stride({Hkv * P * D, P * D, D, 1}));
  };

  // Token-major [T, Hq, D] seen as [B, Hq, S, D]; ragged offsets place each sequence.
  auto q_attr = fe::graph::Tensor_attributes()
                    .set_name("Q")
                    .set_uid(kQ)
                    .set_dim({B, Hq, S, D})
                    .set_stride({S * Hq * D, D, Hq * D, 1});
  if (k.ragged) q_attr.set_ragged_offset(offsets("q_offsets", kQOffsets));
  auto Q = g->tensor(q_attr);
  auto K = container("container_k", kK);
  auto V = container("container_v", kV);

  auto options = fe::graph::SDPA_attributes()
                     .set_name("paged_attention")
                     .set_generate_stats(false)
                     .set_attn_scale(k.scale)
                     .set_padding_mask(true)
                     .set_seq_len_q(per_seq("seq_len_q", kSeqLenQ))
                     .set_seq_len_kv(per_seq("seq_len_kv", kSeqLenKv))
                     .set_paged_attention_k_table(table("page_table_k", kPageTableK))
                     .set_paged_attention_v_table(table("page_table_v", kPageTableV))
                     .set_paged_attention_max_seq_len_kv(k.max_kv_len);
  // Decode: the single query of a sequence sees all of its keys; no mask needed.
  if (k.ragged) options.set_causal_mask_bottom_right(true);

  auto [O, stats] = g->sdpa(Q, K, V, options);
  (void)stats;
  O->set_output(true).set_uid(kO).set_dim({B, Hq, S, D}).set_stride({S * Hq * D, D, Hq * D, 1});
  if (k.ragged) O->set_ragged_offset(offsets("o_offsets", kOOffsets));
  return g;
}

}  // namespace

// ---- library ------------------------------------------------------------------------------

const CudnnLibrary& cudnn_library() {
  static const CudnnLibrary library = [] {
    CudnnLibrary lib;
    std::vector<std::string> candidates;
    // PAGELLM_CUDNN_LIB, through the process's settings (cuDNN is loaded once).
    std::string configured;
    try {
      configured = CudaSettings::process().cudnn_library;
    } catch (const Error& e) {
      lib.error = e.what();  // never throws: a bad setting reads as no cuDNN, with why
      return lib;
    }
    if (!configured.empty()) candidates.push_back(configured);
    for (const char* c : {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9",
                          "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"}) {
      candidates.push_back(c);
    }
    std::ostringstream errors;
    for (const std::string& path : candidates) {
      dlerror();
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* e = dlerror();
        errors << "\n  " << path << ": " << (e ? e : "cannot be opened");
        continue;
      }
      using GetVersion = size_t (*)();
      auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"));
      const size_t version = get_version ? get_version() : 0;
      if (version < 90000 || version >= 1000000) {
        errors << "\n  " << path << ": cudnnGetVersion() = " << version
               << " (pagellm needs cuDNN 9)";
        dlclose(handle);
        continue;
      }
      fe::cudnn_dlhandle = handle;
      lib.version = static_cast<CudnnVersion>(version);
      lib.path = path;
      return lib;
    }
    lib.error = "no usable cuDNN 9 library was found (set PAGELLM_CUDNN_LIB to the path of "
                "libcudnn.so.9); tried:" + errors.str();
    return lib;
  }();
  return library;
}

DeviceProfile cuda_device_profile(int device) {
  cudaDeviceProp prop{};
  PAGELLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceProfile p;
  p.name = prop.name;
  p.sm_count = prop.multiProcessorCount;
  p.cc_major = prop.major;
  p.cc_minor = prop.minor;
  p.cudnn_version = cudnn_library().version;
  return p;
}

bool cudnn_attention_supported(const AttentionDomain& domain, AttentionPhase phase, int device,
                               std::string* why) {
  const DeviceProfile profile = cuda_device_profile(device);
  const RuleResult r = cudnn_static_support(domain, phase, profile);
  if (r.failed() && why != nullptr) {
    *why = describe(AdmissionRule::kDomain, r);
    if (r.reason == Reason::kNoCudnn) *why += ": " + cudnn_library().error;
  }
  return !r.failed();
}

// ---- plan cache ---------------------------------------------------------------------------

struct CudnnPlanCache::Impl {
  int device = 0;
  int64_t num_pages = 0;
  cudnnHandle_t handle = nullptr;
  std::unordered_map<FullKey, Plan, FullKeyHash> plans;
  std::vector<CudnnPlanKey> requested;
  std::unordered_set<CudnnPlanKey, CudnnPlanKeyHash> requested_set;

  DeviceBuffer workspace;
  DeviceBuffer ones;     // int32 1s: seq_len_q of every decode plan
  DeviceBuffer meta;     // int32 [seq_len_q (B) | offsets (B + 1)] of the current forward
  std::vector<DeviceBuffer> retired;
  int32_t* staging[2] = {nullptr, nullptr};  // pinned mirrors of `meta`, used alternately
  cudaEvent_t staged[2] = {nullptr, nullptr};
  size_t staging_ints = 0;
  int slot = 0;
  uint64_t uploaded_epoch = 0;  // epoch of the plan whose arrays `meta` holds
  int32_t uploaded_seqs = -1;

  ~Impl() {
    for (DeviceBuffer* b : {&workspace, &ones, &meta}) {
      if (b->ptr) cudaFree(b->ptr);
    }
    for (DeviceBuffer& b : retired) cudaFree(b.ptr);
    for (int i = 0; i < 2; ++i) {
      if (staging[i]) cudaFreeHost(staging[i]);
      if (staged[i]) cudaEventDestroy(staged[i]);
    }
    if (handle) fe::detail::destroy_handle(handle);
  }

  // Replaces `b` by a buffer of at least `bytes`, keeping the old one alive (a captured
  // graph may still read it).
  void grow(DeviceBuffer& b, size_t bytes) {
    if (b.bytes >= bytes) return;
    DeviceBuffer fresh;
    PAGELLM_CUDA_CHECK(cudaSetDevice(device));
    PAGELLM_CUDA_CHECK(cudaMalloc(&fresh.ptr, bytes));
    fresh.bytes = bytes;
    if (b.ptr) retired.push_back(b);
    b = fresh;
  }

  void ensure_handle() {
    if (handle) return;
    const CudnnLibrary& lib = cudnn_library();
    PAGELLM_CHECK(lib.version > 0) << "cuDNN attention: " << lib.error;
    PAGELLM_CUDA_CHECK(cudaSetDevice(device));
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    try {
      st = fe::detail::create_handle(&handle);
    } catch (const std::exception& e) {
      PAGELLM_FAIL() << "cuDNN attention: cannot create a cuDNN handle: " << e.what();
    }
    PAGELLM_CHECK(st == CUDNN_STATUS_SUCCESS)
        << "cuDNN attention: cudnnCreate failed with status " << static_cast<int>(st);
  }

  void ensure_ones(int32_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
    if (ones.bytes >= bytes) return;
    grow(ones, std::max(bytes, size_t{256} * sizeof(int32_t)));
    std::vector<int32_t> host(ones.bytes / sizeof(int32_t), 1);
    PAGELLM_CUDA_CHECK(cudaMemcpy(ones.ptr, host.data(), ones.bytes, cudaMemcpyHostToDevice));
  }

  Plan& build(const CudnnPlanKey& key) {
    PAGELLM_CHECK(num_pages > 0)
        << "cuDNN attention: set_num_pages() must be called before building plans";
    // cuDNN's paged loads: ceil(s_kv / page_size) must equal the page-table row length.
    PAGELLM_CHECK(key.page_size > 0 && key.max_pages_per_seq > 0 &&
                  int64_t{key.max_kv_len} == int64_t{key.max_pages_per_seq} * key.page_size)
        << "cuDNN attention: plan " << key.describe() << " must declare s_kv = "
        << "max_pages_per_seq x page_size (make_cudnn_plan_key does)";
    const FullKey fk{key, num_pages};
    auto it = plans.find(fk);
    if (it != plans.end()) {
      PAGELLM_CHECK(it->second.graph) << "cuDNN cannot run attention " << key.describe() << ": "
                                      << it->second.error;
      return it->second;
    }
    ensure_handle();
    Plan plan;
    try {
      auto g = make_graph(key, num_pages);
      fe::error_t st = g->validate();
      if (st.is_good()) st = g->build_operation_graph(handle);
      if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
      if (st.is_good()) st = g->check_support(handle);
      if (st.is_good()) st = g->build_plans(handle);
      if (st.is_good()) st = g->get_workspace_size(plan.workspace);
      if (st.is_good()) {
        plan.graph = std::move(g);
      } else {
        plan.error = fe_message(st);
      }
    } catch (const std::exception& e) {
      plan.error = e.what();
    }
    if (plan.graph) {
      grow(workspace, static_cast<size_t>(std::max<int64_t>(plan.workspace, 0)));
      if (!key.ragged) ensure_ones(key.num_seqs);
      PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
    }
    Plan& stored = plans.emplace(fk, std::move(plan)).first->second;
    PAGELLM_CHECK(stored.graph) << "cuDNN cannot run attention " << key.describe() << ": "
                                << stored.error;
    return stored;
  }
};

CudnnPlanCache::CudnnPlanCache(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
}

CudnnPlanCache::~CudnnPlanCache() = default;

void CudnnPlanCache::set_num_pages(int64_t num_pages) {
  PAGELLM_CHECK(num_pages > 0) << "cuDNN attention: the pool must have pages, got " << num_pages;
  impl_->num_pages = num_pages;
}

int64_t CudnnPlanCache::num_pages() const { return impl_->num_pages; }

bool CudnnPlanCache::has_plan(const CudnnPlanKey& key) const {
  auto it = impl_->plans.find(FullKey{key, impl_->num_pages});
  return it != impl_->plans.end() && it->second.graph != nullptr;
}

void CudnnPlanCache::request_plan(const CudnnPlanKey& key) {
  // A shape cuDNN refused once is not asked for again.
  if (impl_->plans.count(FullKey{key, impl_->num_pages})) return;
  if (impl_->requested_set.insert(key).second) impl_->requested.push_back(key);
}

size_t CudnnPlanCache::num_requested() const { return impl_->requested.size(); }

void CudnnPlanCache::build(const CudnnPlanKey& key) { impl_->build(key); }

std::vector<std::string> CudnnPlanCache::build_requested() {
  std::vector<std::string> refused;
  std::vector<CudnnPlanKey> keys;
  keys.swap(impl_->requested);
  impl_->requested_set.clear();
  for (const CudnnPlanKey& key : keys) {
    try {
      impl_->build(key);
    } catch (const Error& e) {
      refused.push_back(e.what());
    }
  }
  return refused;
}

void CudnnPlanCache::upload(const AttentionPlan& plan, cudaStream_t stream) {
  if (plan.provider != AttentionProvider::kCudnn || !plan.cudnn_key.ragged) return;
  Impl& m = *impl_;
  PAGELLM_CHECK(!capturing(stream))
      << "cuDNN attention: the ragged route's per-forward arrays cannot be uploaded during "
         "stream capture (the planner never routes ragged batches to cuDNN under a graph)";
  const int32_t B = plan.cudnn_key.num_seqs;
  PAGELLM_ASSERT(plan.cudnn_seq_len_q.size() == static_cast<size_t>(B) &&
                 plan.cudnn_ragged_offsets.size() == static_cast<size_t>(B) + 1);
  const size_t ints = 2 * static_cast<size_t>(B) + 1;
  m.grow(m.meta, ints * sizeof(int32_t));
  if (m.staging_ints < ints) {
    for (int i = 0; i < 2; ++i) {
      if (m.staged[i]) PAGELLM_CUDA_CHECK(cudaEventSynchronize(m.staged[i]));
      if (m.staging[i]) PAGELLM_CUDA_CHECK(cudaFreeHost(m.staging[i]));
      PAGELLM_CUDA_CHECK(cudaMallocHost(&m.staging[i], m.meta.bytes));
      if (!m.staged[i]) {
        PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&m.staged[i], cudaEventDisableTiming));
      }
    }
    m.staging_ints = m.meta.bytes / sizeof(int32_t);
  }
  // The slot used two uploads ago: its copy has long finished, so this rarely waits.
  m.slot ^= 1;
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(m.staged[m.slot]));
  int32_t* host = m.staging[m.slot];
  std::memcpy(host, plan.cudnn_seq_len_q.data(), static_cast<size_t>(B) * sizeof(int32_t));
  std::memcpy(host + B, plan.cudnn_ragged_offsets.data(), (static_cast<size_t>(B) + 1) * sizeof(int32_t));
  PAGELLM_CUDA_CHECK(
      cudaMemcpyAsync(m.meta.ptr, host, ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  PAGELLM_CUDA_CHECK(cudaEventRecord(m.staged[m.slot], stream));
  m.uploaded_epoch = plan.epoch;
  m.uploaded_seqs = B;
}

void CudnnPlanCache::run(const PagedAttentionParams& p, const AttentionPlan& plan,
                         cudaStream_t stream) {
  Impl& m = *impl_;
  const CudnnPlanKey& key = plan.cudnn_key;
  PAGELLM_CHECK(plan.provider == AttentionProvider::kCudnn)
      << "cuDNN attention: the plan chose " << provider_name(plan.provider);
  PAGELLM_CHECK(p.num_seqs == key.num_seqs && p.num_q_heads == key.num_q_heads &&
                p.num_kv_heads == key.num_kv_heads && p.head_dim == key.head_dim &&
                p.page_size == key.page_size && p.max_pages_per_seq == key.max_pages_per_seq &&
                std::memcmp(&p.scale, &key.scale, sizeof p.scale) == 0 &&
                (key.ragged || p.num_tokens == p.num_seqs))
      << "cuDNN attention: the call (" << p.num_seqs << " sequences, " << p.num_tokens
      << " tokens, " << p.num_q_heads << "/" << p.num_kv_heads << " heads, head_dim "
      << p.head_dim << ", page size " << p.page_size << ", " << p.max_pages_per_seq
      << " pages per sequence) does not match the forward's plan " << key.describe();
  auto it = m.plans.find(FullKey{key, m.num_pages});
  Plan* plan_entry = it != m.plans.end() && it->second.graph ? &it->second : nullptr;
  if (plan_entry == nullptr) {
    PAGELLM_CHECK(!capturing(stream))
        << "cuDNN attention: no plan for " << key.describe()
        << " was built before graph capture (build it at warm-up)";
    plan_entry = &m.build(key);
  }
  void* seq_len_q = m.ones.ptr;
  void* offsets = nullptr;
  if (key.ragged) {
    PAGELLM_CHECK(m.uploaded_epoch == plan.epoch && m.uploaded_seqs == key.num_seqs)
        << "cuDNN attention: upload(plan) must be called once per forward before run()";
    seq_len_q = m.meta.ptr;
    offsets = static_cast<int32_t*>(m.meta.ptr) + key.num_seqs;
  }
  auto& pack = plan_entry->pack;
  pack[kQ] = const_cast<void*>(p.q);
  pack[kK] = const_cast<void*>(p.k_pool);
  pack[kV] = const_cast<void*>(p.v_pool);
  pack[kO] = p.out;
  pack[kSeqLenQ] = seq_len_q;
  pack[kSeqLenKv] = const_cast<int32_t*>(p.kv_lens);
  pack[kPageTableK] = const_cast<int32_t*>(p.page_table);
  pack[kPageTableV] = const_cast<int32_t*>(p.page_table);
  if (key.ragged) {
    pack[kQOffsets] = offsets;
    pack[kOOffsets] = offsets;
  }
  const cudnnStatus_t set = fe::detail::set_stream(m.handle, stream);
  PAGELLM_CHECK(set == CUDNN_STATUS_SUCCESS)
      << "cuDNN attention: cudnnSetStream failed with status " << static_cast<int>(set);
  fe::error_t st;
  try {
    st = plan_entry->graph->execute(m.handle, pack, m.workspace.ptr);
  } catch (const std::exception& e) {
    PAGELLM_FAIL() << "cuDNN attention " << key.describe() << " failed: " << e.what();
  }
  PAGELLM_CHECK(st.is_good()) << "cuDNN attention " << key.describe()
                              << " failed: " << fe_message(st);
}

size_t CudnnPlanCache::num_plans() const {
  size_t n = 0;
  for (const auto& [k, plan] : impl_->plans) n += plan.graph ? 1 : 0;
  return n;
}

size_t CudnnPlanCache::device_bytes() const {
  size_t n = impl_->workspace.bytes + impl_->ones.bytes + impl_->meta.bytes;
  for (const DeviceBuffer& b : impl_->retired) n += b.bytes;
  return n;
}

size_t CudnnPlanCache::workspace_bytes() const { return impl_->workspace.bytes; }

void cudnn_paged_attention(const PagedAttentionParams& p, const AttentionPlan& plan,
                           CudnnPlanCache& cache, cudaStream_t stream) {
  cache.run(p, plan, stream);
}

}  // namespace pagellm::cuda
