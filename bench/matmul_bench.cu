// Decode matrix products: cuBLASLt against the skinny weight-streaming kernel, each against
// the device-to-device copy bandwidth this run measures.
//
//   matmul_bench [--quick] [--out FILE.csv]
//
// For each Qwen3-4B and Qwen3-0.6B product (q|k|v, o_proj, gate|up, down, lm_head with
// float32 logits) and M in {1, 8, 32, 64, 128, 256}: time = median over graph replays of a
// graph of 20 launches that rotate over enough weight copies to exceed 4x the L2, divided
// by 20; bytes = weights + x + out; printed as µs, GB/s and % of the copy bandwidth (bytes
// read + bytes written over a 2 GB cudaMemcpyAsync), with the path the automatic rule picks
// and the relative difference between the two paths' outputs (a sanity check; the test
// checks correctness). Last, a "full decode step" line: Qwen3-4B's four layer products x 36
// + lm_head at M = 32, summed per path, against the copy bandwidth.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/cuda/matmul.h"
#include "pagellm/cuda/skinny_gemm.h"

namespace {

using pagellm::cuda::LtMatmul;
using pagellm::cuda::MatmulPath;

#define CHECK_CUDA(expr)                                                                      \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err_), #expr, \
                   __FILE__, __LINE__);                                                       \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

/// n bf16 values from a hash of their index, uniform in [-1, 1) (never zeros: zeros can
/// run faster than real data).
__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

void fill_random(void* p, size_t n, uint32_t seed) {
  fill_random_bf16<<<2048, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CHECK_CUDA(cudaGetLastError());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Median milliseconds of one replay of `exec` over `reps` replays (after one warm-up).
double time_graph(cudaGraphExec_t exec, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return median(ms);
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median of 10.
double copy_bandwidth_gbs(cudaStream_t stream) {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  fill_random(a, bytes / 2, 1);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_graph(exec, stream, 10);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

struct Shape {
  const char* model;
  const char* name;
  int64_t N, K;
  bool f32_out;
};

struct Result {
  double us = 0, gbs = 0, frac = 0;
};

/// Relative L2 difference of two outputs (float32 view).
double rel_diff(const void* a, const void* b, size_t count, bool f32) {
  std::vector<float> fa(count), fb(count);
  if (f32) {
    CHECK_CUDA(cudaMemcpy(fa.data(), a, count * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(fb.data(), b, count * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<__nv_bfloat16> ha(count), hb(count);
    CHECK_CUDA(cudaMemcpy(ha.data(), a, count * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hb.data(), b, count * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      fa[i] = __bfloat162float(ha[i]);
      fb[i] = __bfloat162float(hb[i]);
    }
  }
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < count; ++i) {
    const double d = static_cast<double>(fa[i]) - fb[i];
    d2 += std::isfinite(d) ? d * d : 1e30;
    r2 += static_cast<double>(fb[i]) * fb[i];
  }
  return std::sqrt(d2) / std::max(std::sqrt(r2), 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--out FILE.csv]\n", argv[0]);
      return 2;
    }
  }
  try {
    int device = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double copy_gbs = copy_bandwidth_gbs(stream);
    std::printf("%s: %d SMs, L2 %.0f MB; copy bandwidth %.0f GB/s (read + write)\n", prop.name,
                prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy_gbs);

    void* lt_workspace = nullptr;
    const size_t lt_workspace_bytes = size_t{32} << 20;
    CHECK_CUDA(cudaMalloc(&lt_workspace, lt_workspace_bytes));
    LtMatmul matmul(lt_workspace, lt_workspace_bytes);

    const std::vector<Shape> shapes = {
        {"4B", "qkv", 6144, 2560, false},       {"4B", "o_proj", 2560, 4096, false},
        {"4B", "gate_up", 19456, 2560, false},  {"4B", "down", 2560, 9728, false},
        {"4B", "lm_head", 151936, 2560, true},  {"0.6B", "qkv", 4096, 1024, false},
        {"0.6B", "o_proj", 1024, 2048, false},  {"0.6B", "gate_up", 6144, 1024, false},
        {"0.6B", "down", 1024, 3072, false},    {"0.6B", "lm_head", 151936, 1024, true}};
    const std::vector<int64_t> ms =
        quick ? std::vector<int64_t>{1, 32, 128} : std::vector<int64_t>{1, 8, 32, 64, 128, 256};
    const int reps = quick ? 5 : 15;
    const int launches = 20;
    const int64_t max_m = 256;

    FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
    if (!csv_path.empty() && !csv) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
    if (csv) {
      std::fprintf(csv,
                   "model,op,M,N,K,out,bytes,cublaslt_us,cublaslt_gbs,cublaslt_frac,skinny_us,"
                   "skinny_gbs,skinny_frac,auto,skinny_tokens,skinny_row_warps,skinny_splits,"
                   "rel_diff\n");
    }
    std::printf("\n%-5s %-8s %4s %7s %6s | %9s %7s %6s | %9s %7s %6s | %-8s %-14s %9s\n",
                "model", "op", "M", "N", "K", "cublas_us", "GB/s", "%copy", "skinny_us",
                "GB/s", "%copy", "auto", "plan t/rw/s", "rel_diff");

    // (model, op, M) -> times per path, for the decode-step line.
    std::map<std::string, std::pair<Result, Result>> table;
    for (const Shape& s : shapes) {
      const size_t weight_bytes = static_cast<size_t>(s.N * s.K) * 2;
      const int copies = static_cast<int>(std::max<size_t>(
          2, (4 * static_cast<size_t>(prop.l2CacheSize) + weight_bytes - 1) / weight_bytes));
      void *w = nullptr, *x = nullptr, *out_lt = nullptr, *out_sk = nullptr;
      const size_t out_elem = s.f32_out ? 4 : 2;
      CHECK_CUDA(cudaMalloc(&w, weight_bytes * copies));
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(max_m * s.K) * 2));
      CHECK_CUDA(cudaMalloc(&out_lt, static_cast<size_t>(max_m * s.N) * out_elem));
      CHECK_CUDA(cudaMalloc(&out_sk, static_cast<size_t>(max_m * s.N) * out_elem));
      fill_random(w, weight_bytes / 2 * copies, 7);
      fill_random(x, static_cast<size_t>(max_m * s.K), 11);
      CHECK_CUDA(cudaDeviceSynchronize());
      const cudaDataType_t out_type = s.f32_out ? CUDA_R_32F : CUDA_R_16BF;
      auto weight = [&](int i) { return static_cast<char*>(w) + (i % copies) * weight_bytes; };

      for (int64_t M : ms) {
        const double bytes = static_cast<double>(weight_bytes) + M * s.K * 2.0 +
                             M * static_cast<double>(s.N) * out_elem;
        Result res[2];
        const MatmulPath paths[2] = {MatmulPath::kCublasLt, MatmulPath::kSkinny};
        void* outs[2] = {out_lt, out_sk};
        for (int pi = 0; pi < 2; ++pi) {
          matmul.set_path(paths[pi]);
          matmul.run(x, weight(0), outs[pi], out_type, M, s.N, s.K, stream);  // plan, warm-up
          CHECK_CUDA(cudaStreamSynchronize(stream));
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < launches; ++i) {
            matmul.run(x, weight(i), outs[pi], out_type, M, s.N, s.K, stream);
          }
          CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
          CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
          const double ms_per = time_graph(exec, stream, reps) / launches;
          CHECK_CUDA(cudaGraphExecDestroy(exec));
          CHECK_CUDA(cudaGraphDestroy(graph));
          res[pi].us = ms_per * 1e3;
          res[pi].gbs = bytes / (ms_per * 1e-3) / 1e9;
          res[pi].frac = res[pi].gbs / copy_gbs;
        }
        // Both outputs were last written from weight copy (launches - 1) % copies.
        const double diff = rel_diff(out_sk, out_lt, static_cast<size_t>(M * s.N), s.f32_out);
        matmul.set_path(MatmulPath::kAuto);
        const MatmulPath pick = matmul.path_for(x, w, out_sk, out_type, M, s.N, s.K);
        const pagellm::cuda::SkinnyPlan plan =
            pagellm::cuda::skinny_gemm_plan(M, s.N, s.K, prop.multiProcessorCount);
        char plan_text[32];
        std::snprintf(plan_text, sizeof(plan_text), "%d/%d/%d", plan.tokens_per_tile,
                      plan.row_warps, plan.splits);
        std::printf("%-5s %-8s %4lld %7lld %6lld | %9.1f %7.0f %5.1f%% | %9.1f %7.0f %5.1f%% | %-8s "
                    "%-14s %9.2e%s\n",
                    s.model, s.name, static_cast<long long>(M), static_cast<long long>(s.N),
                    static_cast<long long>(s.K), res[0].us, res[0].gbs, 100 * res[0].frac,
                    res[1].us, res[1].gbs, 100 * res[1].frac, matmul_path_name(pick), plan_text,
                    diff, diff > 2e-2 ? "  <-- MISMATCH" : "");
        if (csv) {
          std::fprintf(csv, "%s,%s,%lld,%lld,%lld,%s,%.0f,%.3f,%.1f,%.4f,%.3f,%.1f,%.4f,%s,%d,%d,%d,%.3e\n",
                       s.model, s.name, static_cast<long long>(M), static_cast<long long>(s.N),
                       static_cast<long long>(s.K), s.f32_out ? "f32" : "bf16", bytes, res[0].us,
                       res[0].gbs, res[0].frac, res[1].us, res[1].gbs, res[1].frac,
                       matmul_path_name(pick), plan.tokens_per_tile, plan.row_warps, plan.splits,
                       diff);
        }
        table[std::string(s.model) + "/" + s.name + "/" + std::to_string(M)] = {res[0], res[1]};
      }
      CHECK_CUDA(cudaFree(w));
      CHECK_CUDA(cudaFree(x));
      CHECK_CUDA(cudaFree(out_lt));
      CHECK_CUDA(cudaFree(out_sk));
    }

    // Full decode step of Qwen3-4B at M = 32: 36 layers of the four products + lm_head.
    const int64_t step_m = 32;
    double t_lt = 0, t_sk = 0, t_auto = 0, step_bytes = 0;
    for (const Shape& s : shapes) {
      if (std::strcmp(s.model, "4B") != 0) continue;
      const auto it = table.find(std::string("4B/") + s.name + "/" + std::to_string(step_m));
      if (it == table.end()) continue;
      const int times = std::strcmp(s.name, "lm_head") == 0 ? 1 : 36;
      const bool skinny = pagellm::cuda::skinny_preferred(step_m, s.N, s.K);
      t_lt += times * it->second.first.us;
      t_sk += times * it->second.second.us;
      t_auto += times * (skinny ? it->second.second.us : it->second.first.us);
      step_bytes += times * (s.N * s.K * 2.0 + step_m * s.K * 2.0 +
                             step_m * static_cast<double>(s.N) * (s.f32_out ? 4 : 2));
    }
    const double floor_us = step_bytes / (copy_gbs * 1e9) * 1e6;
    std::printf("\nfull decode step, Qwen3-4B matrix products at M = %lld (%.2f GB; at copy "
                "bandwidth %.0f us):\n",
                static_cast<long long>(step_m), step_bytes / 1e9, floor_us);
    std::printf("  cublaslt %8.0f us  %5.1f%% of copy bandwidth\n", t_lt, 100 * floor_us / t_lt);
    std::printf("  skinny   %8.0f us  %5.1f%% of copy bandwidth\n", t_sk, 100 * floor_us / t_sk);
    std::printf("  auto     %8.0f us  %5.1f%% of copy bandwidth\n", t_auto,
                100 * floor_us / t_auto);
    if (csv) {
      std::fprintf(csv, "4B,decode_step,%lld,,,,%.0f,%.3f,,%.4f,%.3f,,%.4f,auto=%.3f,,,,\n",
                   static_cast<long long>(step_m), step_bytes, t_lt, floor_us / t_lt, t_sk,
                   floor_us / t_sk, t_auto);
      std::fclose(csv);
    }
    CHECK_CUDA(cudaFree(lt_workspace));
    CHECK_CUDA(cudaStreamDestroy(stream));
  } catch (const pagellm::Error& e) {
    std::fprintf(stderr, "matmul_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
