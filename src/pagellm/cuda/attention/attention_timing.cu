// AttentionTimer (attention_timing.h): device state and CUDA-event timing of paged
// attention calls on the native kernels and on cuDNN.
#include "pagellm/cuda/attention/attention_timing.h"

#if PAGELLM_HAVE_CUDNN

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "pagellm/attention/planner.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

// Deterministic pseudo-random bf16 in [-1, 1): inputs need sane magnitudes, not a good RNG.
__global__ void fill_random_bf16(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
  }
}

void fill(void* p, size_t n, uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

AttentionTimer::AttentionTimer(int device, int64_t pool_tokens, int64_t max_q_elems,
                               int32_t max_kv_heads, int32_t head_dim)
    : device_(device), cache_(device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  PAGELLM_CHECK(e == cudaSuccess && count > device)
      << "no CUDA device " << device << " to time attention on ("
      << (e == cudaSuccess ? std::to_string(count) + " found" : cudaGetErrorString(e)) << ")";
  PAGELLM_CUDA_CHECK(cudaSetDevice(device));
  PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PAGELLM_CUDA_CHECK(cudaEventCreate(&start_));
  PAGELLM_CUDA_CHECK(cudaEventCreate(&stop_));
  profile_ = cuda_device_profile(device);
  // The pool bytes are the same for every page size; pages are shared out by index.
  pool_elems_ = pool_tokens * max_kv_heads * head_dim;
  pool_tokens_ = pool_tokens;
  PAGELLM_CUDA_CHECK(cudaMalloc(&k_, pool_elems_ * 2));
  PAGELLM_CUDA_CHECK(cudaMalloc(&v_, pool_elems_ * 2));
  PAGELLM_CUDA_CHECK(cudaMalloc(&q_, max_q_elems * 2));
  PAGELLM_CUDA_CHECK(cudaMalloc(&out_, max_q_elems * 2));
  fill(k_, pool_elems_, 11);
  fill(v_, pool_elems_, 12);
  fill(q_, max_q_elems, 13);
  // Native decode's split-KV partials for up to 1024 decode rows of 64 heads.
  ws_bytes_ = paged_attention_workspace_bytes(1024, 64, head_dim, 8);
  PAGELLM_CUDA_CHECK(cudaMalloc(&ws_, std::max<size_t>(ws_bytes_, 256)));
  PAGELLM_CUDA_CHECK(cudaMemset(ws_, 0, std::max<size_t>(ws_bytes_, 256)));  // split counters
  PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
}

AttentionTimer::~AttentionTimer() {
  for (void* p : {k_, v_, q_, out_, ws_, query_start_, kv_lens_, page_table_}) cudaFree(p);
  if (graph_) cudaGraphDestroy(graph_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cudaStreamDestroy(stream_);
}

void AttentionTimer::upload(void*& dst, const void* host, size_t bytes) {
  if (dst) PAGELLM_CUDA_CHECK(cudaFree(dst));
  dst = nullptr;
  PAGELLM_CUDA_CHECK(cudaMalloc(&dst, std::max<size_t>(bytes, 4)));
  if (bytes > 0) PAGELLM_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
}

void AttentionTimer::load(const AttentionCallShape& shape, std::mt19937& rng) {
  shape_ = shape;
  host_.page_size = shape.page_size;
  host_.query_start.assign(1, 0);
  host_.kv_lens = shape.kv;
  int32_t longest = 1;
  for (size_t b = 0; b < shape.q.size(); ++b) {
    host_.query_start.push_back(host_.query_start.back() + shape.q[b]);
    longest = std::max(longest, shape.kv[b]);
  }
  host_.token_ids.assign(host_.query_start.back(), 0);
  host_.max_pages_per_seq = (longest + shape.page_size - 1) / shape.page_size;
  host_.kv_len_capacity = 0;
  const int64_t pages = pool_tokens_ / shape.page_size;
  std::uniform_int_distribution<int64_t> u(1, pages - 1);
  host_.page_table.assign(shape.q.size() * static_cast<size_t>(host_.max_pages_per_seq), 0);
  for (int32_t& e : host_.page_table) e = static_cast<int32_t>(u(rng));
  upload(query_start_, host_.query_start.data(), host_.query_start.size() * sizeof(int32_t));
  upload(kv_lens_, host_.kv_lens.data(), host_.kv_lens.size() * sizeof(int32_t));
  upload(page_table_, host_.page_table.data(), host_.page_table.size() * sizeof(int32_t));
  mixed_run_ = find_mixed_decode_run(host_.num_seqs(), host_.query_start.data(),
                                     host_.kv_lens.data());
  num_pages_ = pages;
  // The pools hold pages of this size for up to pool_elems_ elements.
  if (cache_.num_pages() != num_pages_) cache_.set_num_pages(num_pages_);
}

AttentionDomain AttentionTimer::domain() const {
  AttentionDomain dom;
  dom.num_q_heads = shape_.num_q_heads;
  dom.num_kv_heads = shape_.num_kv_heads;
  dom.head_dim = shape_.head_dim;
  dom.page_size = shape_.page_size;
  dom.scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
  return dom;
}

PagedAttentionParams AttentionTimer::params() const {
  PagedAttentionParams p;
  p.q = q_;
  p.k_pool = k_;
  p.v_pool = v_;
  p.out = out_;
  p.query_start = static_cast<const int32_t*>(query_start_);
  p.kv_lens = static_cast<const int32_t*>(kv_lens_);
  p.page_table = static_cast<const int32_t*>(page_table_);
  p.num_seqs = static_cast<int32_t>(shape_.q.size());
  p.num_tokens = shape_.num_tokens();
  p.num_q_heads = shape_.num_q_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.page_size = shape_.page_size;
  p.max_pages_per_seq = host_.max_pages_per_seq;
  p.num_pages = static_cast<int32_t>(num_pages_);  // lets native decode run its TMA kernel
  p.max_query_len = host_.max_query_len();
  p.max_kv_len = std::max(host_.kv_len_capacity, host_.max_kv_len());
  p.scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
  p.workspace = ws_;
  p.workspace_bytes = ws_bytes_;
  return p;
}

void AttentionTimer::run_native(const PagedAttentionParams& p, bool replayable) {
  const NativeAttentionCalls calls =
      plan_native_attention(p, replayable ? MixedDecodeRun{} : mixed_run_);
  if (calls.run_decode) paged_decode_attention(calls.decode, stream_);
  if (calls.run_prefill) paged_prefill_attention(calls.prefill, stream_);
}

void AttentionTimer::start_timing() {
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PAGELLM_CUDA_CHECK(cudaEventRecord(start_, stream_));
}

double AttentionTimer::stop_timing_ms() {
  PAGELLM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return ms;
}

void AttentionTimer::begin_graph() {
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

void AttentionTimer::abandon_graph() {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph) cudaGraphDestroy(graph);
}

void AttentionTimer::end_graph_and_time(int replays, float* ms) {
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
  cudaGraphExec_t exec = nullptr;
  PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph_, 0));
  PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  PAGELLM_CUDA_CHECK(cudaEventRecord(start_, stream_));
  for (int i = 0; i < replays; ++i) PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  PAGELLM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop_));
  PAGELLM_CUDA_CHECK(cudaEventElapsedTime(ms, start_, stop_));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph_);
  graph_ = nullptr;
}

double AttentionTimer::time_native(LaunchMode mode, int iters, int layers) {
  const PagedAttentionParams p = params();
  return time([&] { run_native(p, mode == LaunchMode::kGraph); }, mode, iters, layers);
}

double AttentionTimer::time_cudnn(LaunchMode mode, int iters, int layers, std::string* error) {
  AttentionPlannerConfig config;
  config.choice = AttentionBackendChoice::kCudnn;
  config.device = profile_;
  config.registry = &cache_;
  AttentionPlanner planner(config);
  if (mode == LaunchMode::kGraph) host_.kv_len_capacity = host_.max_kv_len();
  try {
    const AttentionPlan& plan = planner.plan(domain(), batch_view(host_), mode);
    cache_.build(plan.cudnn_key);
    cache_.upload(plan, stream_);
    const PagedAttentionParams p = params();
    const double us = time([&] { cache_.run(p, plan, stream_); }, mode, iters, layers);
    host_.kv_len_capacity = 0;
    return us;
  } catch (const Error& e) {
    host_.kv_len_capacity = 0;
    if (error) *error = e.what();
    return -1.0;
  }
}

}  // namespace pagellm::cuda

#endif  // PAGELLM_HAVE_CUDNN
