// Backend::lora_add on the cuda backend against the CPU backend, on fresh random inputs:
// ragged segments of token rows (gaps between them: rows with no adapter), each segment its
// own A [r, in], B [n_out, r] and scale, deltas added into a column slice of a wider output
// (the fused q/k/v and gate/up layouts). Ranks 1..64, input widths that are and are not
// multiples of the warp, 1..300 rows.
//
// Poison: the input rows outside every segment are NaN, so a kernel that touches a row it
// should skip writes NaN into it; the rows and columns outside the segments and the slice
// must keep their values bit for bit; the shrink scratch is NaN (the CUDA kernel must not
// read it). Bound: the deltas (output minus its old value) within relative L2 2e-2 of the
// float32 CPU reference (bf16 factors and inputs are exact in both; the CUDA output rounds
// once to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "model/model_test_util.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/lora.h"

namespace pagellm {
namespace {

using test::relative_close;

class LoraAddTest : public test::CudaOpTest {};

TEST_F(LoraAddTest, SegmentsMatchCpuAndLeaveOtherRowsAlone) {
  struct Shape {
    int64_t in, n_out, extra_cols;
  };
  for (Shape sh : {Shape{64, 32, 0}, Shape{1000, 200, 96}, Shape{4096, 1024, 2048},
                   Shape{96, 4096, 128}}) {
    for (int64_t rank : {1, 8, 32, 64}) {
      for (int64_t rows : {1, 7, 64, 300}) {
        const int64_t N = sh.n_out + sh.extra_cols;
        const int64_t col_offset = sh.extra_cols == 0 ? 0 : uniform_int(0, static_cast<int>(sh.extra_cols));
        const std::string what = "lora_add in " + std::to_string(sh.in) + " out " +
                                 std::to_string(sh.n_out) + " of " + std::to_string(N) +
                                 " at " + std::to_string(col_offset) + " r " +
                                 std::to_string(rank) + " rows " + std::to_string(rows);
        // Segments: random runs, each followed by a random gap (rows with no adapter).
        std::vector<LoraSegment> gseg, cseg;
        std::vector<bool> covered(static_cast<size_t>(rows), false);
        for (int64_t r = uniform_int(0, 1); r < rows;) {
          const int64_t end = std::min<int64_t>(rows, r + uniform_int(1, 40));
          const std::vector<float> a = randn_bf16(static_cast<size_t>(rank * sh.in),
                                                  1.0f / std::sqrt(static_cast<float>(sh.in)));
          const std::vector<float> b = randn_bf16(static_cast<size_t>(sh.n_out * rank));
          const float scale = static_cast<float>(uniform_int(1, 8)) / 4.0f;
          gseg.push_back({r, end, put(gpu(), DType::BF16, {rank, sh.in}, a),
                          put(gpu(), DType::BF16, {sh.n_out, rank}, b), scale});
          cseg.push_back({r, end, put(cpu(), DType::F32, {rank, sh.in}, a),
                          put(cpu(), DType::F32, {sh.n_out, rank}, b), scale});
          for (int64_t t = r; t < end; ++t) covered[static_cast<size_t>(t)] = true;
          r = end + uniform_int(0, 5);
        }
        std::vector<float> x = randn_bf16(static_cast<size_t>(rows * sh.in));
        for (int64_t t = 0; t < rows; ++t) {
          if (covered[static_cast<size_t>(t)]) continue;
          for (int64_t k = 0; k < sh.in; ++k) x[static_cast<size_t>(t * sh.in + k)] = NAN;
        }
        const std::vector<float> base = randn_bf16(static_cast<size_t>(rows * N), 0.25f);
        Tensor gx = put(gpu(), DType::BF16, {rows, sh.in}, x);
        Tensor cx = put(cpu(), DType::F32, {rows, sh.in}, x);
        Tensor gout = put(gpu(), DType::BF16, {rows, N}, base);
        Tensor cout = put(cpu(), DType::F32, {rows, N}, base);
        Tensor gshrunk = alloc(gpu(), DType::BF16, {rows, 64});
        Tensor cshrunk = alloc(cpu(), DType::F32, {rows, 64});
        poison(gpu(), gshrunk);
        gpu().lora_add(gx, gseg, gshrunk, gout, col_offset);
        cpu().lora_add(cx, cseg, cshrunk, cout, col_offset);
        const std::vector<float> got = gpu().download_f32(gout);
        const std::vector<float> ref = cpu().download_f32(cout);
        std::vector<float> got_delta, ref_delta;
        for (int64_t t = 0; t < rows; ++t) {
          for (int64_t j = 0; j < N; ++j) {
            const size_t i = static_cast<size_t>(t * N + j);
            const bool in_slice = j >= col_offset && j < col_offset + sh.n_out;
            if (!covered[static_cast<size_t>(t)] || !in_slice) {
              ASSERT_EQ(got[i], base[i]) << what << ": row " << t << " column " << j
                                         << " is outside the segments or the slice; "
                                         << seed_note();
              continue;
            }
            got_delta.push_back(got[i] - base[i]);
            ref_delta.push_back(ref[i] - base[i]);
          }
        }
        ASSERT_TRUE(relative_close(got_delta, ref_delta, 2e-2, what, seed_note()));
      }
    }
  }
}

TEST_F(LoraAddTest, RejectsMismatchedFactors) {
  Tensor x = alloc(gpu(), DType::BF16, {4, 64});
  Tensor out = alloc(gpu(), DType::BF16, {4, 96});
  Tensor shrunk = alloc(gpu(), DType::BF16, {4, 64});
  Tensor a = alloc(gpu(), DType::BF16, {8, 64});
  Tensor b = alloc(gpu(), DType::BF16, {64, 8});
  // The slice [40, 104) leaves the 96 columns.
  EXPECT_THROW(gpu().lora_add(x, {LoraSegment{0, 4, a, b, 1.0f}}, shrunk, out, 40), Error);
  // Rows past the step.
  EXPECT_THROW(gpu().lora_add(x, {LoraSegment{2, 5, a, b, 1.0f}}, shrunk, out, 0), Error);
  // A of another width than x.
  Tensor a_wide = alloc(gpu(), DType::BF16, {8, 65});
  EXPECT_THROW(gpu().lora_add(x, {LoraSegment{0, 4, a_wide, b, 1.0f}}, shrunk, out, 0), Error);
}

// The engine end to end: a mixed batch (two adapters on all seven modules, rows without one)
// on the cuda backend, with decode graphs on, against the CPU backend. The prefill row of
// every request sees the same history on both, so its logits are compared (relative L2,
// bounded by 0.05 as the base model's float32-head test is, or 1.5 x the base model's own
// CUDA-vs-CPU error on these weights if that is larger); and an adapter must move the
// logits far more than that error.
struct LoraEngineRun {
  std::map<int64_t, std::vector<float>> first_logits;  // by request id
  int64_t graph_steps = 0;
  int64_t steps = 0;
};

LoraEngineRun run_lora_engine(const std::string& backend_name, const Qwen3Config& c,
                              const testing::HostWeights& w,
                              const std::vector<std::string>& adapter_dirs,
                              const std::vector<std::string>& loras) {
  auto backend = create_backend(backend_name);
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.backend = backend_name;
  ec.page_size = 16;
  ec.num_pages = 64;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 256;
  ec.max_model_len = 256;
  ec.float32_head = true;  // the head's bf16 rounding would hide the body's error
  Engine engine(std::move(backend), std::move(model), ec);
  for (size_t i = 0; i < adapter_dirs.size(); ++i) {
    engine.load_lora_adapter({"a" + std::to_string(i), static_cast<int64_t>(i), adapter_dirs[i]});
  }
  LoraEngineRun run;
  engine.set_logits_hook([&](int64_t id, int64_t index, const float* logits, int64_t vocab) {
    if (index == 0) run.first_logits[id] = std::vector<float>(logits, logits + vocab);
  });
  for (size_t i = 0; i < loras.size(); ++i) {
    std::vector<int32_t> prompt;
    for (size_t j = 0; j < 5 + 11 * (i % 3); ++j) prompt.push_back(static_cast<int32_t>((j * 37 + i * 5) % 383 + 1));
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 8;
    p.ignore_eos = true;
    engine.add_request(prompt, p, loras[i]);
  }
  while (engine.has_unfinished()) engine.step();
  run.graph_steps = engine.stats().graph_steps;
  run.steps = engine.stats().steps;
  return run;
}

double logits_error(const LoraEngineRun& got, const LoraEngineRun& ref, int64_t id) {
  const std::vector<float>& a = got.first_logits.at(id);
  const std::vector<float>& b = ref.first_logits.at(id);
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref2 += double(b[i]) * b[i];
  }
  return std::sqrt(diff2 / ref2);
}

TEST(CudaLora, MixedAdapterBatchTracksTheCpuBackend) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const uint64_t seed = test::test_seed();
  const Qwen3Config c = testing::small_gpu_config();
  testing::HostWeights w = testing::random_weights(c, seed);
  for (auto& [name, values] : w.data)
    for (float& v : values) v = bf16_to_f32(f32_to_bf16(v));  // the same numbers on both
  testing::TempDir d0, d1;
  LoraConfig cfg;
  cfg.rank = 32;
  cfg.alpha = 64;
  cfg.target_modules = {LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,   LoraModule::kO,
                        LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};
  make_lora_adapter(d0.path(), c, cfg, seed + 1, DType::BF16, 0.05f);
  cfg.rank = 8;
  make_lora_adapter(d1.path(), c, cfg, seed + 2, DType::BF16, 0.05f);
  const std::vector<std::string> dirs = {d0.path(), d1.path()};
  const std::vector<std::string> loras = {"a0", "", "a1", "a1", "", "a0"};
  const LoraEngineRun cpu = run_lora_engine("cpu", c, w, dirs, loras);
  const LoraEngineRun gpu = run_lora_engine("cuda", c, w, dirs, loras);
  const std::vector<std::string> none(loras.size(), "");
  const LoraEngineRun gpu_base = run_lora_engine("cuda", c, w, {}, none);
  const LoraEngineRun cpu_base = run_lora_engine("cpu", c, w, {}, none);
  double base_err = 0.0;
  for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
    base_err = std::max(base_err, logits_error(gpu_base, cpu_base, id));
  }
  const double bound = std::max(0.05, 1.5 * base_err);
  for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
    const double err = logits_error(gpu, cpu, id);
    EXPECT_LT(err, bound) << "request " << id << " (" << loras[id - 1] << "), seed " << seed;
    if (!loras[id - 1].empty()) {
      EXPECT_GT(logits_error(gpu_base, gpu, id), 5 * err)
          << "the adapter barely moved request " << id << "'s logits; seed " << seed;
    }
  }
  // Steps with an adapter run eagerly; the base-model run replays decode graphs.
  EXPECT_EQ(gpu.graph_steps, 0);
  EXPECT_GT(gpu_base.graph_steps, 0);
}

}  // namespace
}  // namespace pagellm
