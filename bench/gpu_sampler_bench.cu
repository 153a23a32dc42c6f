// GPU sampler (launch_sample_rows) at Qwen3's vocabulary, V = 151,936 float32 logits a row:
// microseconds per launch and per row by row count, sampling parameters and logits shape,
// and the fraction of the copy rate that reading the logits once would take.
//
//   gpu_sampler_bench [--quick]
//
// Kinds: greedy (W1's rows), plain temperature 1 without processed log-probabilities
// (W2's rows: the race over the whole row), the same with the processed normaliser,
// min-p 0.05, top-p 0.8 alone (temperature 0.7), and Qwen3's recommended temperature 0.6 +
// top-k 20 + top-p 0.95. Shapes:
// "flat" logits N(0, 0.05), what a random-weight model gives (the race prunes almost
// nothing), and "peaked" N(0, 2.5) with a few tokens 8-15 above the rest, like a trained
// model's. Each launch is captured 20 times into a graph and replayed; the logits are the
// same every launch, so rows of up to about 64 (under the L2's 50 MB) read them from L2 as
// the engine does right after the lm_head product, and more rows read them from HBM. The
// limit column is R x V x 4 bytes at the copy rate measured in the same run: one read of
// the logits, the floor of any sampler that looks at every token.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "pagellm/common/random.h"
#include "pagellm/cuda/sampling/sampling.h"

using namespace pagellm_bench;
using pagellm::cuda::GpuSampledToken;
using pagellm::cuda::GpuSamplingRow;

namespace {

constexpr int32_t kVocab = 151936;

struct Kind {
  const char* name;
  GpuSamplingRow row;
};

std::vector<Kind> kinds() {
  std::vector<Kind> k;
  GpuSamplingRow greedy;
  greedy.temperature = 0.0f;
  greedy.flags = pagellm::cuda::kSampleGreedy;
  k.push_back({"greedy", greedy});
  GpuSamplingRow plain;
  k.push_back({"T 1 (W2)", plain});
  GpuSamplingRow processed = plain;
  processed.flags = pagellm::cuda::kSampleProcessedLogprobs;
  k.push_back({"T 1 + processed", processed});
  GpuSamplingRow min_p = plain;
  min_p.min_p = 0.05f;
  k.push_back({"min-p 0.05", min_p});
  GpuSamplingRow top_p = plain;
  top_p.temperature = 0.7f;
  top_p.top_p = 0.8f;
  k.push_back({"T .7 p .8", top_p});
  GpuSamplingRow qwen;
  qwen.temperature = 0.6f;
  qwen.top_k = 20;
  qwen.top_p = 0.95f;
  qwen.flags = pagellm::cuda::kSampleProcessedLogprobs;
  k.push_back({"T .6 k 20 p .95", qwen});
  return k;
}

std::vector<float> make_logits(int32_t rows, bool flat, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> body(0.0f, flat ? 0.05f : 2.5f);
  std::uniform_int_distribution<int32_t> pick(0, kVocab - 1);
  std::uniform_real_distribution<float> lift(8.0f, 15.0f);
  std::vector<float> x(static_cast<size_t>(rows) * kVocab);
  for (float& v : x) v = body(rng);
  if (!flat) {
    for (int32_t r = 0; r < rows; ++r) {
      for (int i = 0; i < 4; ++i) x[static_cast<size_t>(r) * kVocab + pick(rng)] += lift(rng);
    }
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const CopyBandwidth copy = copy_bandwidth(stream, prop);
  std::printf("%s, %d SMs; copy rate %.0f GB/s (memcpy %.0f, kernel %.0f)\n", prop.name,
              prop.multiProcessorCount, copy.best(), copy.memcpy_gbs, copy.kernel_gbs);

  const std::vector<int32_t> row_counts =
      quick ? std::vector<int32_t>{8, 64, 512} : std::vector<int32_t>{1, 8, 32, 64, 128, 256, 512};
  const int32_t max_rows = row_counts.back();
  float* logits = nullptr;
  GpuSamplingRow* rows = nullptr;
  GpuSampledToken* out = nullptr;
  uint64_t* prune = nullptr;
  CHECK_CUDA(cudaMalloc(&logits, sizeof(float) * static_cast<size_t>(max_rows) * kVocab));
  CHECK_CUDA(cudaMalloc(&rows, sizeof(GpuSamplingRow) * max_rows));
  CHECK_CUDA(cudaMalloc(&out, sizeof(GpuSampledToken) * max_rows));
  CHECK_CUDA(cudaMalloc(&prune, sizeof(uint64_t) * pagellm::kPruneTableSize));
  std::vector<uint64_t> table(pagellm::kPruneTableSize);
  pagellm::cuda::fill_prune_table(table.data());
  CHECK_CUDA(cudaMemcpy(prune, table.data(), sizeof(uint64_t) * table.size(),
                        cudaMemcpyHostToDevice));

  std::printf("\n%-7s %-16s %5s %10s %9s %9s %7s\n", "logits", "kind", "rows", "us/launch",
              "us/row", "limit us", "limit");
  for (const bool flat : {true, false}) {
    const std::vector<float> host = make_logits(max_rows, flat, flat ? 1 : 2);
    CHECK_CUDA(cudaMemcpy(logits, host.data(), sizeof(float) * host.size(),
                          cudaMemcpyHostToDevice));
    for (const Kind& kind : kinds()) {
      std::vector<GpuSamplingRow> params(static_cast<size_t>(max_rows), kind.row);
      for (int32_t r = 0; r < max_rows; ++r) {
        params[static_cast<size_t>(r)].stream_key =
            pagellm::sampling_stream_key(1000 + static_cast<uint64_t>(r), 17);
      }
      CHECK_CUDA(cudaMemcpy(rows, params.data(), sizeof(GpuSamplingRow) * params.size(),
                            cudaMemcpyHostToDevice));
      for (const int32_t R : row_counts) {
        const double ms = time_launches(
            [&](int) {
              pagellm::cuda::launch_sample_rows(logits, R, kVocab, rows, nullptr, nullptr, prune,
                                                out, stream);
            },
            20, stream, quick ? 3 : 5);
        std::vector<GpuSampledToken> got(static_cast<size_t>(R));
        CHECK_CUDA(cudaMemcpy(got.data(), out, sizeof(GpuSampledToken) * R,
                              cudaMemcpyDeviceToHost));
        for (const GpuSampledToken& t : got) {
          if (t.status != pagellm::cuda::kSampleOk || t.token < 0 || t.token >= kVocab) {
            std::fprintf(stderr, "bad result: status %d token %d\n", t.status, t.token);
            return 1;
          }
        }
        const double us = ms * 1e3;
        const double limit_us = 4.0 * R * kVocab / (copy.best() * 1e9) * 1e6;
        std::printf("%-7s %-16s %5d %10.1f %9.2f %9.1f %6.1f%%\n", flat ? "flat" : "peaked",
                    kind.name, R, us, us / R, limit_us, 100.0 * limit_us / us);
      }
    }
  }
  CHECK_CUDA(cudaFree(logits));
  CHECK_CUDA(cudaFree(rows));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(prune));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
