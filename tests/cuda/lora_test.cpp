// Backend::lora_add on the cuda backend against the CPU backend, on fresh random inputs:
// groups of 1 to 3 modules (the q/k/v, o, gate/up and down layouts, and odd widths),
// several slots with their own ranks (1..64) and scales, some slots empty, each token row
// naming a random slot (0: no adapter) in runs and alone, 1..300 rows (several row blocks of
// one slot) and 1,500 (a prefill chunk: the planned path, rows grouped by slot on the
// device; run both as cuBLASLt products and with the shrink and expand kernels), deltas
// landing at a column offset inside a wider output.
//
// Poison: the input rows of slot 0 (and of empty slots) are NaN, so a kernel that touches a
// row it should skip writes NaN into it; the rows and columns the group must not write keep
// their values bit for bit. Bound: the deltas (output minus its old value) within relative
// L2 2e-2 of the float32 CPU reference (bf16 factors and inputs are exact in both; the CUDA
// output rounds once to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/reference_qwen3.h"
#include "cuda/cuda_test_util.h"
#include "model/model_test_util.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/lora.h"

namespace pagellm {
namespace {

using test::bf16_ulp;
using test::relative_close;

class LoraAddTest : public test::CudaOpTest {
 protected:
  cuda::CudaBackend& cuda() { return dynamic_cast<cuda::CudaBackend&>(gpu()); }
  // One group's slot tables on both backends, from the same random factors.
  struct Tables {
    LoraGroup gpu, cpu;
    std::vector<int> rank;  // by slot; 0: empty
  };
  // `paired`: the group is a gated product's gate/up (pack_lora_b's layout).
  // `max_rank`: the group's bound (LoraGroup::max_rank); slot ranks are drawn below it.
  Tables make_tables(int64_t in, const std::vector<int64_t>& widths, int num_slots,
                     int64_t col_offset, bool paired = false, int max_rank = 64) {
    Tables t;
    LoraGroup g;
    g.num_slots = num_slots;
    g.num_modules = static_cast<int32_t>(widths.size());
    g.in = in;
    for (size_t m = 0; m < widths.size(); ++m) g.width[m] = widths[m];
    g.col_offset = col_offset;
    g.max_rank = max_rank;
    const int64_t W = g.width_total();
    std::vector<LoraSlotFactors> gtab(static_cast<size_t>(num_slots)), ctab(gtab.size());
    t.rank.assign(static_cast<size_t>(num_slots), 0);
    for (int q = 1; q < num_slots; ++q) {
      if (q == 2) continue;  // an empty slot that rows still name
      const int r = std::min(
          max_rank, std::vector<int>{1, 8, 32, 64, 16, 3}[static_cast<size_t>(uniform_int(0, 5))]);
      t.rank[static_cast<size_t>(q)] = r;
      const int64_t M = g.num_modules;
      const std::vector<float> a = randn_bf16(static_cast<size_t>(M * r * in),
                                              1.0f / std::sqrt(static_cast<float>(in)));
      const std::vector<float> bt = randn_bf16(static_cast<size_t>(r * W));
      const float scale = static_cast<float>(uniform_int(1, 8)) / 4.0f;
      Tensor ga = put(gpu(), DType::BF16, {M * r, in}, a), gb = put(gpu(), DType::BF16, {r, W}, bt);
      Tensor ca = put(cpu(), DType::F32, {M * r, in}, a), cb = put(cpu(), DType::F32, {r, W}, bt);
      gtab[static_cast<size_t>(q)] = {ga.data, gb.data, r, scale};
      // The fused products stream A and read B packed (what Qwen3Model::set_lora makes).
      const size_t packed = gpu().lora_packed_a_bytes(M * r, in);
      if (packed > 0) {
        Tensor pa = alloc(gpu(), DType::I64, {static_cast<int64_t>(packed / 8)});
        gpu().pack_lora_a(ga.data, M * r, in, pa.data);
        gtab[static_cast<size_t>(q)].a_packed = pa.data;
        const size_t packed_b = gpu().lora_packed_b_bytes(r, W);
        Tensor pb = alloc(gpu(), DType::F32, {static_cast<int64_t>((packed_b + 3) / 4)});
        poison(gpu(), pb);  // pack_lora_b writes every byte, zeros included
        gpu().pack_lora_b(gb.data, r, W, paired, pb.data);
        gtab[static_cast<size_t>(q)].b_packed = pb.data;
      }
      ctab[static_cast<size_t>(q)] = {ca.data, cb.data, r, scale};
    }
    const int64_t bytes = static_cast<int64_t>(gtab.size() * sizeof(LoraSlotFactors));
    static_assert(sizeof(LoraSlotFactors) % 8 == 0, "tables are held as int64 tensors");
    Tensor gt = alloc(gpu(), DType::I64, {bytes / 8}), ct = alloc(cpu(), DType::I64, {bytes / 8});
    gpu().copy_to_device(gt.data, gtab.data(), static_cast<size_t>(bytes));
    cpu().copy_to_device(ct.data, ctab.data(), static_cast<size_t>(bytes));
    t.gpu = g;
    t.gpu.slots = static_cast<const LoraSlotFactors*>(gt.data);
    t.cpu = g;
    t.cpu.slots = static_cast<const LoraSlotFactors*>(ct.data);
    return t;
  }

  // Random inputs for `rows` rows of `in` columns, NaN on the rows whose slot holds no
  // adapter (a kernel that reads them writes NaN).
  std::vector<float> poisoned_inputs(const Tables& tab, const std::vector<int32_t>& row_slot,
                                     int64_t in) {
    const int64_t rows = static_cast<int64_t>(row_slot.size());
    std::vector<float> x = randn_bf16(static_cast<size_t>(rows * in));
    for (int64_t t = 0; t < rows; ++t) {
      if (tab.rank[static_cast<size_t>(row_slot[static_cast<size_t>(t)])] != 0) continue;
      for (int64_t k = 0; k < in; ++k) x[static_cast<size_t>(t * in + k)] = NAN;
    }
    return x;
  }

  // A product's operands on both backends for the row slots' rows: x [rows, in] and
  // w [W, in] (scaled so that outputs stay near 1), the row slots, gate|up's scratch and
  // the output's width (W, or W / 2 for a gated product).
  struct Operands {
    Tensor gx, cx, gw, cw, gscratch, cscratch;
    BatchTensors gb, cb;
    int64_t out_cols = 0;
  };
  Operands make_operands(int64_t in, int64_t W, bool gated, const std::vector<int32_t>& slots) {
    const int64_t rows = static_cast<int64_t>(slots.size());
    const std::vector<float> x = randn_bf16(static_cast<size_t>(rows * in));
    const float w_scale = 0.25f / std::sqrt(static_cast<float>(in));
    const std::vector<float> w = randn_bf16(static_cast<size_t>(W * in), w_scale);
    Operands o;
    o.gx = put(gpu(), DType::BF16, {rows, in}, x);
    o.cx = put(cpu(), DType::F32, {rows, in}, x);
    o.gw = put(gpu(), DType::BF16, {W, in}, w);
    o.cw = put(cpu(), DType::F32, {W, in}, w);
    o.gscratch = alloc(gpu(), DType::BF16, {rows, W});
    o.cscratch = alloc(cpu(), DType::F32, {rows, W});
    o.gb.lora_slots = alloc_i32(gpu(), slots);
    o.cb.lora_slots = alloc_i32(cpu(), slots);
    o.out_cols = gated ? W / 2 : W;
    return o;
  }

  // Row slots: runs of one slot and single rows, any of the slots (0 and the empty 2 too).
  std::vector<int32_t> random_row_slots(int64_t rows, int num_slots) {
    std::vector<int32_t> row_slot;
    while (static_cast<int64_t>(row_slot.size()) < rows) {
      const int32_t q = uniform_int(0, num_slots - 1);
      const int len = uniform_int(0, 1) ? 1 : uniform_int(1, 80);
      for (int i = 0; i < len && static_cast<int64_t>(row_slot.size()) < rows; ++i) row_slot.push_back(q);
    }
    return row_slot;
  }
};

TEST_F(LoraAddTest, GroupsMatchCpuAndLeaveOtherRowsAlone) {
  struct Shape {
    int64_t in;
    std::vector<int64_t> widths;
    int64_t extra_cols;
  };
  const std::vector<Shape> shapes = {{64, {32}, 0},
                                     {256, {256, 64, 64}, 0},
                                     {1000, {200, 136}, 96},
                                     {4096, {1024}, 2048},
                                     {96, {4096}, 128},
                                     {2560, {4096, 1024, 1024}, 0}};
  for (const Shape& sh : shapes) {
    for (int64_t rows : {1, 7, 64, 300, 1500}) {
      const int num_slots = 5;
      const int64_t W = [&] {
        int64_t w = 0;
        for (int64_t x : sh.widths) w += x;
        return w;
      }();
      const int64_t N = W + sh.extra_cols;
      const int64_t col_offset =
          sh.extra_cols == 0 ? 0 : uniform_int(0, static_cast<int>(sh.extra_cols));
      const Tables tab = make_tables(sh.in, sh.widths, num_slots, col_offset);
      std::string what = "lora_add in " + std::to_string(sh.in) + " modules " +
                         std::to_string(sh.widths.size()) + " width " + std::to_string(W) +
                         " of " + std::to_string(N) + " at " + std::to_string(col_offset) +
                         " rows " + std::to_string(rows) + " ranks";
      for (int r : tab.rank) what += " " + std::to_string(r);
      const std::vector<int32_t> row_slot = random_row_slots(rows, num_slots);
      const std::vector<float> x = poisoned_inputs(tab, row_slot, sh.in);
      const std::vector<float> base = randn_bf16(static_cast<size_t>(rows * N), 0.25f);
      Tensor gx = put(gpu(), DType::BF16, {rows, sh.in}, x);
      Tensor cx = put(cpu(), DType::F32, {rows, sh.in}, x);
      Tensor cout = put(cpu(), DType::F32, {rows, N}, base);
      BatchTensors gb, cb;
      gb.lora_slots = alloc_i32(gpu(), row_slot);
      cb.lora_slots = alloc_i32(cpu(), row_slot);
      cpu().lora_add(cx, tab.cpu, cb, cout);
      const std::vector<float> ref = cpu().download_f32(cout);
      // A prefill chunk runs twice: as cuBLASLt products and with the shrink and expand
      // kernels (PAGELLM_DISABLE_LORA_DENSE).
      for (const bool dense : rows >= 1024 ? std::vector<bool>{true, false}
                                            : std::vector<bool>{true}) {
        cuda().set_lora_dense(dense);
        Tensor gout = put(gpu(), DType::BF16, {rows, N}, base);
        gpu().lora_add(gx, tab.gpu, gb, gout);
        const std::vector<float> got = gpu().download_f32(gout);
        const std::string how = what + (dense ? "" : " (kernels)");
        std::vector<float> dgot, dref, rounding;
        int64_t changed_outside = 0, nan_rows = 0;
        for (int64_t t = 0; t < rows; ++t) {
          const bool active =
              tab.rank[static_cast<size_t>(row_slot[static_cast<size_t>(t)])] != 0;
          for (int64_t j = 0; j < N; ++j) {
            const size_t i = static_cast<size_t>(t * N + j);
            const bool inside = active && j >= col_offset && j < col_offset + W;
            if (!inside) {
              // Untouched: the bf16 value put there, bit for bit.
              if (!(got[i] == base[i])) ++changed_outside;
              continue;
            }
            if (std::isnan(got[i])) ++nan_rows;
            dgot.push_back(got[i] - base[i]);
            dref.push_back(ref[i] - base[i]);
            rounding.push_back(0.5f * bf16_ulp(got[i]));  // the output is bf16, base exact
          }
        }
        EXPECT_EQ(changed_outside, 0) << how << ", " << seed_note();
        EXPECT_EQ(nan_rows, 0) << how << ", " << seed_note();
        if (!dref.empty()) {
          EXPECT_TRUE(relative_close(dgot, dref, 2e-2, how, seed_note(), rounding));
        }
      }
      cuda().set_lora_dense(true);
    }
  }
  // The 1,500-row steps above made the dense products' scratch.
  EXPECT_GT(cuda().lora_dense_scratch_bytes(), 0u);
}

// Backend::lora_matmul / lora_matmul_silu_mul on the cuda backend at decode sizes (the
// skinny product with the shrink as extra tiles and the expand as extra wgmma steps into its
// accumulators, in batches of slots when they do not all fit in shared memory at once):
// rows without an adapter are the plain product bit for bit, adapter rows' deltas track the
// float32 CPU backend, the one-launch path (with counters) and the two-launch path (without)
// give the same bits, and the counters are left zero. Outputs and packed B poisoned (NaN)
// before each run.
TEST_F(LoraAddTest, FusedProductsMatchProductPlusLoraAdd) {
  struct Shape {
    int64_t in;
    std::vector<int64_t> widths;
    bool gated;  // widths {I, I}: lora_matmul_silu_mul
  };
  // {384, {320, 40, 40}}: widths that are not multiples of 64 take the product + lora_add.
  const std::vector<Shape> shapes = {{256, {256, 64, 64}, false},
                                     {512, {384}, false},
                                     {384, {320, 40, 40}, false},
                                     {2560, {4096, 1024, 1024}, false},
                                     {4096, {2560}, false},
                                     {1024, {512, 512}, true},
                                     {2560, {1536, 1536}, true},
                                     // Qwen3-4B's gate|up: 152 row tiles, no split at 32
                                     // rows (one-warpgroup LoRA tiles over all of K).
                                     {2560, {9728, 9728}, true}};
  Tensor counters = alloc(gpu(), DType::I32, {2});
  const std::vector<int32_t> zeros = {0, 0};
  gpu().upload(counters, 0, zeros.data(), DType::I32, 2);
  // max_rank 32: every slot's B is one block (more slots per batch); 64: up to two.
  for (const int max_rank : {32, 64})
  for (const Shape& sh : shapes) {
    for (int64_t rows : {1, 5, 16, 32, 64, 130}) {
      // 7 adapters of ranks up to 64 (and an empty slot): more than one batch of slots.
      const int num_slots = 9;
      int64_t W = 0;
      for (int64_t w : sh.widths) W += w;
      const Tables tab = make_tables(sh.in, sh.widths, num_slots, 0, sh.gated, max_rank);
      std::string what = "max rank " + std::to_string(max_rank) + ", " +
                         std::string(sh.gated ? "gated " : "") + "lora product in " +
                         std::to_string(sh.in) + " width " + std::to_string(W) + " rows " +
                         std::to_string(rows) + " ranks";
      for (int r : tab.rank) what += " " + std::to_string(r);
      // 64 rows: every slot in the one token tile (so several batches of slots); 130: three
      // token tiles in one launch.
      std::vector<int32_t> row_slot = random_row_slots(rows, num_slots);
      if (rows == 64) {
        for (int64_t t = 0; t < rows; ++t) row_slot[static_cast<size_t>(t)] = static_cast<int32_t>(t % num_slots);
      }
      Operands o = make_operands(sh.in, W, sh.gated, row_slot);
      Tensor &gx = o.gx, &cx = o.cx, &gw = o.gw, &cw = o.cw;
      Tensor &gscratch = o.gscratch, &cscratch = o.cscratch;
      BatchTensors &gb = o.gb, &cb = o.cb;
      const int64_t out_cols = o.out_cols;
      auto run_gpu = [&](const LoraGroup* group) {
        Tensor out = alloc(gpu(), DType::BF16, {rows, out_cols});
        poison(gpu(), out);
        if (group == nullptr && sh.gated) {
          gpu().matmul_silu_mul(gx, gw, gscratch, out);
        } else if (group == nullptr) {
          gpu().matmul(gx, gw, out);
        } else if (sh.gated) {
          gpu().lora_matmul_silu_mul(gx, gw, *group, gb, gscratch, out);
        } else {
          gpu().lora_matmul(gx, gw, *group, gb, out);
        }
        return gpu().download_f32(out);
      };
      auto run_cpu = [&](const LoraGroup* group) {
        Tensor out = alloc(cpu(), DType::F32, {rows, out_cols});
        if (group == nullptr && sh.gated) {
          cpu().matmul_silu_mul(cx, cw, cscratch, out);
        } else if (group == nullptr) {
          cpu().matmul(cx, cw, out);
        } else if (sh.gated) {
          cpu().lora_matmul_silu_mul(cx, cw, *group, cb, cscratch, out);
        } else {
          cpu().lora_matmul(cx, cw, *group, cb, out);
        }
        return cpu().download_f32(out);
      };
      LoraGroup one_launch = tab.gpu;
      one_launch.counters = static_cast<uint32_t*>(counters.data);
      const std::vector<float> plain = run_gpu(nullptr);
      const std::vector<float> fused = run_gpu(&one_launch);
      const std::vector<float> two = run_gpu(&tab.gpu);  // no counters: two launches
      const std::vector<float> cplain = run_cpu(nullptr), cfused = run_cpu(&tab.cpu);
      const auto same_bits = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
      int64_t differ_two = 0, plain_rows_changed = 0, nans = 0;
      std::vector<float> dgot, dref, rounding;
      for (int64_t t = 0; t < rows; ++t) {
        const bool active = tab.rank[static_cast<size_t>(row_slot[static_cast<size_t>(t)])] != 0;
        for (int64_t j = 0; j < out_cols; ++j) {
          const size_t i = static_cast<size_t>(t * out_cols + j);
          if (!same_bits(fused[i], two[i])) ++differ_two;
          if (std::isnan(fused[i])) ++nans;
          if (!active) {
            if (!same_bits(fused[i], plain[i])) ++plain_rows_changed;
            continue;
          }
          dgot.push_back(fused[i] - plain[i]);
          dref.push_back(cfused[i] - cplain[i]);
          // Both outputs are rounded to bf16: a small delta (rank 1, scale 1/4) is a few
          // steps of them, and its error is then mostly their rounding.
          rounding.push_back(0.5f * (bf16_ulp(fused[i]) + bf16_ulp(plain[i])));
        }
      }
      EXPECT_EQ(differ_two, 0) << what << ": one launch and two launches differ, " << seed_note();
      EXPECT_EQ(plain_rows_changed, 0) << what << ": rows without an adapter, " << seed_note();
      EXPECT_EQ(nans, 0) << what << ", " << seed_note();
      if (!dref.empty()) {
        // Gated outputs pass the delta through SiLU · up: compare them whole, not as deltas.
        EXPECT_TRUE(
            relative_close(dgot, dref, sh.gated ? 4e-2 : 2e-2, what, seed_note(), rounding));
      }
      std::vector<int32_t> left(2, -1);
      gpu().copy_to_host(left.data(), counters.data, 2 * sizeof(int32_t));
      EXPECT_EQ(left, zeros) << what << ": the launch must leave its counters zero";
    }
  }
}

// Steps of 1,024 rows or more take the planned path (a plan kernel groups the rows by slot;
// a reduce kernel sums the shrink's partials once per row), smaller ones the scanning path.
// A row's delta is the same arithmetic on both: rows of a 6,000-row step (two windows of
// the scratch with these shapes) equal, bit for bit, the same rows run as steps of 300.
TEST_F(LoraAddTest, PlannedStepsGiveTheBitsOfSmallSteps) {
  cuda().set_lora_dense(false);  // the kernels on both (the dense products below)
  const int64_t in = 4096, rows = 6000;
  const std::vector<int64_t> widths = {256, 128, 128};
  const int64_t W = 512, N = W + 64;
  const int num_slots = 7;
  const Tables tab = make_tables(in, widths, num_slots, /*col_offset=*/32);
  const std::vector<int32_t> row_slot = random_row_slots(rows, num_slots);
  const std::vector<float> x = randn_bf16(static_cast<size_t>(rows * in));
  const std::vector<float> base = randn_bf16(static_cast<size_t>(rows * N), 0.25f);
  const auto run = [&](int64_t first, int64_t count) {
    const auto from = [&](const std::vector<float>& v, int64_t cols) {
      return std::vector<float>(v.begin() + first * cols, v.begin() + (first + count) * cols);
    };
    Tensor gx = put(gpu(), DType::BF16, {count, in}, from(x, in));
    Tensor gout = put(gpu(), DType::BF16, {count, N}, from(base, N));
    BatchTensors b;
    b.lora_slots = alloc_i32(gpu(), std::vector<int32_t>(row_slot.begin() + first,
                                                         row_slot.begin() + first + count));
    gpu().lora_add(gx, tab.gpu, b, gout);
    return gpu().download_f32(gout);
  };
  const std::vector<float> whole = run(0, rows);
  int64_t moved = 0;
  for (size_t i = 0; i < whole.size(); ++i) moved += whole[i] != base[i] ? 1 : 0;
  EXPECT_GT(moved, rows * W / 4) << "the adapters must change most of their rows' outputs";
  for (int64_t first = 0; first < rows; first += 300) {
    const std::vector<float> part = run(first, 300);
    int64_t differ = 0;
    for (size_t i = 0; i < part.size(); ++i) {
      differ += part[i] == whole[static_cast<size_t>(first * N) + i] ? 0 : 1;
    }
    ASSERT_EQ(differ, 0) << "rows [" << first << ", " << first + 300 << ") of a " << rows
                         << "-row step against the same rows as a step of 300, " << seed_note();
  }
}

// The dense products (prefill chunks, docs/design.md "The CUDA kernels" of "LoRA"): steps
// of 6,000 and 9,000 rows (the latter two windows) through cuBLASLt, against the float32
// CPU backend and the shrink and expand kernels: deltas within the bound of the small
// steps, columns outside the group and rows without an adapter (NaN inputs) untouched bit
// for bit; the products round the scaled shrink to bf16 where the kernels keep it float32,
// so the two paths agree closely but not bit for bit. Groups whose slots · rank exceed 512
// keep the kernels: bit for bit the same with the switch on or off.
TEST_F(LoraAddTest, DenseProductsMatchCpuAndTheKernels) {
  struct Case {
    int64_t in;
    std::vector<int64_t> widths;
    int64_t extra_cols;
    int num_slots, max_rank;
    bool dense;  // whether (num_slots - 1) · round_up(max_rank, 8) <= 512
    int64_t rows;
  };
  const std::vector<Case> cases = {{4096, {256, 128, 128}, 96, 10, 64, false, 6000},
                                   {4096, {256, 128, 128}, 96, 9, 32, true, 6000},
                                   {2560, {1024}, 0, 5, 64, true, 9000},
                                   {1000, {200, 136}, 40, 3, 20, true, 6000}};
  for (const Case& c : cases) {
    const int64_t rows = c.rows;
    int64_t W = 0;
    for (int64_t w : c.widths) W += w;
    const int64_t N = W + c.extra_cols, col_offset = c.extra_cols / 2;
    const Tables tab = make_tables(c.in, c.widths, c.num_slots, col_offset, false, c.max_rank);
    const std::vector<int32_t> row_slot = random_row_slots(rows, c.num_slots);
    const std::vector<float> x = poisoned_inputs(tab, row_slot, c.in);
    const std::vector<float> base = randn_bf16(static_cast<size_t>(rows * N), 0.25f);
    Tensor gx = put(gpu(), DType::BF16, {rows, c.in}, x);
    Tensor cx = put(cpu(), DType::F32, {rows, c.in}, x);
    BatchTensors gb, cb;
    gb.lora_slots = alloc_i32(gpu(), row_slot);
    cb.lora_slots = alloc_i32(cpu(), row_slot);
    Tensor cout = put(cpu(), DType::F32, {rows, N}, base);
    cpu().lora_add(cx, tab.cpu, cb, cout);
    const std::vector<float> ref = cpu().download_f32(cout);
    const auto run = [&](bool dense) {
      cuda().set_lora_dense(dense);
      Tensor gout = put(gpu(), DType::BF16, {rows, N}, base);
      gpu().lora_add(gx, tab.gpu, gb, gout);
      cuda().set_lora_dense(true);
      return gpu().download_f32(gout);
    };
    const size_t scratch_before = cuda().lora_dense_scratch_bytes();
    const std::vector<float> dense = run(true);
    EXPECT_EQ(cuda().lora_dense_scratch_bytes() > scratch_before, c.dense && scratch_before == 0)
        << "the first dense step makes the scratch; a step that keeps the kernel does not";
    const std::vector<float> kernel = run(false);
    const std::string what = std::to_string(rows) + " rows, in " + std::to_string(c.in) +
                             " width " + std::to_string(W) +
                             " of " + std::to_string(N) + ", " + std::to_string(c.num_slots) +
                             " slots, max rank " + std::to_string(c.max_rank);
    std::vector<float> dgot, dref, dkernel, rounding;
    int64_t changed_outside = 0, nan_out = 0, differ = 0;
    for (int64_t t = 0; t < rows; ++t) {
      const bool active = tab.rank[static_cast<size_t>(row_slot[static_cast<size_t>(t)])] != 0;
      for (int64_t j = 0; j < N; ++j) {
        const size_t i = static_cast<size_t>(t * N + j);
        differ += dense[i] == kernel[i] ? 0 : 1;
        if (!(active && j >= col_offset && j < col_offset + W)) {
          if (!(dense[i] == base[i])) ++changed_outside;
          continue;
        }
        if (std::isnan(dense[i])) ++nan_out;
        dgot.push_back(dense[i] - base[i]);
        dref.push_back(ref[i] - base[i]);
        dkernel.push_back(kernel[i] - base[i]);
        rounding.push_back(0.5f * bf16_ulp(dense[i]));
      }
    }
    EXPECT_EQ(changed_outside, 0) << what << ", " << seed_note();
    EXPECT_EQ(nan_out, 0) << what << ", " << seed_note();
    ASSERT_FALSE(dref.empty()) << what;
    EXPECT_TRUE(relative_close(dgot, dref, 2e-2, what, seed_note(), rounding));
    EXPECT_TRUE(relative_close(dgot, dkernel, 2e-2, what + " against the kernels",
                               seed_note(), rounding));
    if (!c.dense) {
      EXPECT_EQ(differ, 0) << what << ": the kernels either way, " << seed_note();
    } else {
      EXPECT_GT(differ, 0) << what << ": the products must have run (their rounding differs)";
    }
  }
}

// Backend::lora_matmul / lora_matmul_silu_mul on prefill chunks (1,500 and 3,000 rows):
// where the group fills the output, the CUDA backend writes the delta with the dense
// products and then accumulates the product onto it (lora_matmul_dense); with
// PAGELLM_DISABLE_LORA_DENSE, the product then the shrink and expand kernels. Outputs
// poisoned (NaN) before each run: both must write every element. Against the float32 CPU
// backend: the adapter rows' deltas (over each backend's plain product) within the bound
// of the decode test, and the rows without an adapter within 1e-2 of the plain product.
TEST_F(LoraAddTest, PrefillProductsTrackCpuOnBothPaths) {
  struct Shape {
    int64_t in;
    std::vector<int64_t> widths;
    bool gated;
  };
  const std::vector<Shape> shapes = {
      {2560, {1024, 256, 256}, false}, {4096, {2560}, false}, {1024, {1536, 1536}, true}};
  for (const Shape& sh : shapes) {
    for (const int64_t rows : {1500, 3000}) {
      const int num_slots = 9;
      int64_t W = 0;
      for (int64_t w : sh.widths) W += w;
      const Tables tab = make_tables(sh.in, sh.widths, num_slots, 0, sh.gated, 32);
      const std::string what = std::string(sh.gated ? "gated " : "") + "product in " +
                               std::to_string(sh.in) + " width " + std::to_string(W) +
                               " rows " + std::to_string(rows);
      const std::vector<int32_t> row_slot = random_row_slots(rows, num_slots);
      Operands o = make_operands(sh.in, W, sh.gated, row_slot);
      Tensor &gx = o.gx, &cx = o.cx, &gw = o.gw, &cw = o.cw;
      Tensor &gscratch = o.gscratch, &cscratch = o.cscratch;
      BatchTensors &gb = o.gb, &cb = o.cb;
      const int64_t out_cols = o.out_cols;
      auto run = [&](Backend& b, Tensor& bx, Tensor& bw, Tensor& scratch, BatchTensors& batch,
                     const LoraGroup* group) {
        Tensor out = alloc(b, &b == &gpu() ? DType::BF16 : DType::F32, {rows, out_cols});
        poison(b, out);
        poison(b, scratch);
        if (group == nullptr && sh.gated) {
          b.matmul_silu_mul(bx, bw, scratch, out);
        } else if (group == nullptr) {
          b.matmul(bx, bw, out);
        } else if (sh.gated) {
          b.lora_matmul_silu_mul(bx, bw, *group, batch, scratch, out);
        } else {
          b.lora_matmul(bx, bw, *group, batch, out);
        }
        return b.download_f32(out);
      };
      const std::vector<float> plain = run(gpu(), gx, gw, gscratch, gb, nullptr);
      const std::vector<float> cplain = run(cpu(), cx, cw, cscratch, cb, nullptr);
      const std::vector<float> cref = run(cpu(), cx, cw, cscratch, cb, &tab.cpu);
      for (const bool dense : {true, false}) {
        cuda().set_lora_dense(dense);
        const std::vector<float> got = run(gpu(), gx, gw, gscratch, gb, &tab.gpu);
        cuda().set_lora_dense(true);
        const std::string how = what + (dense ? "" : " (kernels)");
        std::vector<float> dgot, dref, rounding, idle_got, idle_ref;
        int64_t nans = 0;
        for (int64_t t = 0; t < rows; ++t) {
          const bool active =
              tab.rank[static_cast<size_t>(row_slot[static_cast<size_t>(t)])] != 0;
          for (int64_t j = 0; j < out_cols; ++j) {
            const size_t i = static_cast<size_t>(t * out_cols + j);
            if (std::isnan(got[i])) ++nans;
            if (!active) {
              idle_got.push_back(got[i]);
              idle_ref.push_back(cplain[i]);
              continue;
            }
            dgot.push_back(got[i] - plain[i]);
            dref.push_back(cref[i] - cplain[i]);
            rounding.push_back(0.5f * (bf16_ulp(got[i]) + bf16_ulp(plain[i])));
          }
        }
        EXPECT_EQ(nans, 0) << how << ", " << seed_note();
        ASSERT_FALSE(dref.empty() || idle_ref.empty()) << how;
        EXPECT_TRUE(relative_close(dgot, dref, sh.gated ? 4e-2 : 2e-2, how, seed_note(),
                                   rounding));
        EXPECT_TRUE(relative_close(idle_got, idle_ref, 1e-2, how + ", rows without an adapter",
                                   seed_note()));
      }
    }
  }
}

TEST_F(LoraAddTest, RejectsShapesItCannotRun) {
  Tensor x = alloc(gpu(), DType::BF16, {4, 64});
  Tensor out = alloc(gpu(), DType::BF16, {4, 96});
  BatchTensors b;
  b.lora_slots = alloc_i32(gpu(), {1, 1, 0, 1});
  LoraGroup g;
  g.num_slots = 2;
  g.num_modules = 1;
  g.in = 64;
  g.width[0] = 64;
  g.col_offset = 40;  // [40, 104) leaves the 96 columns
  Tensor table = alloc(gpu(), DType::I64, {static_cast<int64_t>(2 * sizeof(LoraSlotFactors) / 8)});
  const std::vector<LoraSlotFactors> empty(2);
  gpu().copy_to_device(table.data, empty.data(), 2 * sizeof(LoraSlotFactors));
  g.slots = static_cast<const LoraSlotFactors*>(table.data);
  EXPECT_THROW(gpu().lora_add(x, g, b, out), Error);
  g.col_offset = 0;
  g.in = 72;  // not x's width
  EXPECT_THROW(gpu().lora_add(x, g, b, out), Error);
  g.in = 64;
  g.num_modules = 4;
  EXPECT_THROW(gpu().lora_add(x, g, b, out), Error);
  g.num_modules = 1;
  Tensor x_odd = alloc(gpu(), DType::BF16, {4, 60});  // not a multiple of 8
  g.in = 60;
  EXPECT_THROW(gpu().lora_add(x_odd, g, b, out), Error);
  g.in = 64;
  BatchTensors short_rows;
  short_rows.lora_slots = alloc_i32(gpu(), {1, 1});
  EXPECT_THROW(gpu().lora_add(x, g, short_rows, out), Error);
  // All entries empty: a no-op.
  gpu().fill(out, 1.0f);
  gpu().lora_add(x, g, b, out);
  for (float v : gpu().download_f32(out)) ASSERT_EQ(v, 1.0f);
}

// The engine end to end: a mixed batch (two adapters on all seven modules, rows without one)
// on the cuda backend, with decode graphs on, against the CPU backend. The prefill row of
// every request sees the same history on both, so its logits are compared (relative L2,
// within MixedLora::bound); and an adapter must move the logits far more than that error.
struct LoraEngineRun {
  std::map<int64_t, std::vector<float>> first_logits;  // by request id
  int64_t graph_steps = 0;
  int64_t steps = 0;
};

LoraEngineRun run_lora_engine(const std::string& backend_name, const Qwen3Config& c,
                              const testing::HostWeights& w,
                              const std::vector<std::string>& adapter_dirs,
                              const std::vector<std::string>& loras,
                              size_t staging_chunk_bytes = 0, int prompt_scale = 1) {
  auto backend = create_backend(backend_name);
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  if (staging_chunk_bytes > 0) model->set_lora_staging_chunk_bytes(staging_chunk_bytes);
  EngineConfig ec;
  ec.backend = backend_name;
  ec.page_size = 16;
  ec.num_pages = 64 * prompt_scale;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 256 * prompt_scale;
  ec.max_model_len = 256 * prompt_scale;
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
    const size_t len = (5 + 11 * (i % 3)) * static_cast<size_t>(prompt_scale);
    for (size_t j = 0; j < len; ++j) prompt.push_back(static_cast<int32_t>((j * 37 + i * 5) % 383 + 1));
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

// The engine tests' model and adapters: random weights rounded to bf16 (the same numbers
// on both backends), two adapters on all seven modules (r = 32 and r = 8), and a batch
// mixing them with requests that have none.
struct MixedLora {
  Qwen3Config c = testing::small_gpu_config();
  testing::HostWeights w;
  testing::TempDir d0, d1;
  std::vector<std::string> dirs;
  std::vector<std::string> loras = {"a0", "", "a1", "a1", "", "a0"};
  std::vector<std::string> none = std::vector<std::string>(6, "");
  MixedLora(uint64_t seed, uint64_t adapter_seed) : w(testing::random_weights(c, seed)) {
    for (auto& [name, values] : w.data)
      for (float& v : values) v = bf16_to_f32(f32_to_bf16(v));
    LoraConfig cfg = testing::all_modules_lora_config(32);
    make_lora_adapter(d0.path(), c, cfg, adapter_seed, DType::BF16, 0.05f);
    cfg.rank = 8;
    make_lora_adapter(d1.path(), c, cfg, adapter_seed + 1, DType::BF16, 0.05f);
    dirs = {d0.path(), d1.path()};
  }
  // The bound on an adapter run's error against the CPU backend: 0.05 (as the base
  // model's float32-head test), or 1.5 x the base model's own CUDA-vs-CPU error if larger.
  double bound(const LoraEngineRun& gpu_base, const LoraEngineRun& cpu_base) const {
    double base_err = 0.0;
    for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
      base_err = std::max(base_err, logits_error(gpu_base, cpu_base, id));
    }
    return std::max(0.05, 1.5 * base_err);
  }
};

TEST(CudaLora, MixedAdapterBatchTracksTheCpuBackend) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const uint64_t seed = test::test_seed();
  const MixedLora m(seed, seed + 1);
  const auto& [c, w, dirs, loras, none] = std::tie(m.c, m.w, m.dirs, m.loras, m.none);
  const LoraEngineRun cpu = run_lora_engine("cpu", c, w, dirs, loras);
  const LoraEngineRun gpu = run_lora_engine("cuda", c, w, dirs, loras);
  const LoraEngineRun gpu_base = run_lora_engine("cuda", c, w, {}, none);
  const LoraEngineRun cpu_base = run_lora_engine("cpu", c, w, {}, none);
  const double bound = m.bound(gpu_base, cpu_base);
  for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
    const double err = logits_error(gpu, cpu, id);
    EXPECT_LT(err, bound) << "request " << id << " (" << loras[id - 1] << "), seed " << seed;
    if (!loras[id - 1].empty()) {
      EXPECT_GT(logits_error(gpu_base, gpu, id), 5 * err)
          << "the adapter barely moved request " << id << "'s logits; seed " << seed;
    }
  }
  // Decode steps with adapters replay LoRA graphs, as the base model's replay its graphs.
  EXPECT_GT(gpu.graph_steps, 0);
  EXPECT_GT(gpu_base.graph_steps, 0);
}

// Prompts of 320 to 1,728 tokens, prefilled in one step of 6,144 rows: the CUDA backend's
// LoRA on that step runs as cuBLASLt products (lora_add_dense), and with
// PAGELLM_DISABLE_LORA_DENSE=1 as the shrink and expand kernels. Both track the CPU backend
// within the mixed-batch test's bound, the adapters move the logits far more than that, and
// the two CUDA paths differ (their roundings do), which shows the products ran.
TEST(CudaLora, LongPromptsTrackTheCpuBackendOnBothPrefillPaths) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const uint64_t seed = test::test_seed();
  const MixedLora m(seed, seed + 5);
  const auto& [c, w, dirs, loras, none] = std::tie(m.c, m.w, m.dirs, m.loras, m.none);
  constexpr int kScale = 64;  // prompts of 320, 1,024 and 1,728 tokens, steps up to 16,384
  const LoraEngineRun cpu = run_lora_engine("cpu", c, w, dirs, loras, 0, kScale);
  const LoraEngineRun cpu_base = run_lora_engine("cpu", c, w, {}, none, 0, kScale);
  const LoraEngineRun gpu_base = run_lora_engine("cuda", c, w, {}, none, 0, kScale);
  const LoraEngineRun dense = run_lora_engine("cuda", c, w, dirs, loras, 0, kScale);
  setenv("PAGELLM_DISABLE_LORA_DENSE", "1", 1);
  const LoraEngineRun kernels = run_lora_engine("cuda", c, w, dirs, loras, 0, kScale);
  unsetenv("PAGELLM_DISABLE_LORA_DENSE");
  const double bound = m.bound(gpu_base, cpu_base);
  double paths_apart = 0.0;
  for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
    for (const auto* run : {&dense, &kernels}) {
      const double err = logits_error(*run, cpu, id);
      EXPECT_LT(err, bound) << "request " << id << " (" << loras[id - 1] << "), "
                            << (run == &dense ? "products" : "kernels") << ", seed " << seed;
      if (!loras[id - 1].empty()) {
        EXPECT_GT(logits_error(gpu_base, *run, id), 5 * err)
            << "the adapter barely moved request " << id << "'s logits; seed " << seed;
      }
    }
    if (!loras[id - 1].empty()) paths_apart += logits_error(dense, kernels, id);
  }
  EXPECT_GT(paths_apart, 0.0) << "the products and the kernels gave the same logits: the "
                                 "prefill steps did not take the products; seed "
                              << seed;
}

// set_lora's staged upload in several runs (4 KiB halves grow to the largest block, so
// each adapter's image, 8 blocks of up to ~147 KB, goes up in at least 2 runs through both
// halves) lands the same factors as in one run (16 MiB halves): the logits agree far
// more closely than the adapter moves them. A half rewritten before its copy finished, or
// a run copied to the wrong offset, would corrupt the factors.
TEST(CudaLora, StagedUploadInSeveralRunsEqualsOneRun) {
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const uint64_t seed = test::test_seed();
  const Qwen3Config c = testing::small_gpu_config();
  const testing::HostWeights w = testing::random_weights(c, seed);
  testing::TempDir d0, d1;
  LoraConfig cfg = testing::all_modules_lora_config(32);
  make_lora_adapter(d0.path(), c, cfg, seed + 3, DType::BF16, 0.05f);
  cfg.rank = 16;
  cfg.target_modules = {LoraModule::kV, LoraModule::kUp, LoraModule::kDown};
  make_lora_adapter(d1.path(), c, cfg, seed + 4, DType::F32, 0.05f);
  const std::vector<std::string> dirs = {d0.path(), d1.path()};
  const std::vector<std::string> loras = {"a0", "a1", "a0", "a1"};
  const LoraEngineRun one_run = run_lora_engine("cuda", c, w, dirs, loras);
  const LoraEngineRun runs = run_lora_engine("cuda", c, w, dirs, loras, 4 << 10);
  const LoraEngineRun base = run_lora_engine("cuda", c, w, {}, std::vector<std::string>(4, ""));
  for (int64_t id = 1; id <= static_cast<int64_t>(loras.size()); ++id) {
    const double err = logits_error(runs, one_run, id);
    EXPECT_LT(err, 1e-3) << "request " << id << " (" << loras[id - 1] << "), seed " << seed;
    EXPECT_GT(logits_error(base, one_run, id), 10 * std::max(err, 1e-4))
        << "the adapter barely moved request " << id << "'s logits; seed " << seed;
  }
}

}  // namespace
}  // namespace pagellm
