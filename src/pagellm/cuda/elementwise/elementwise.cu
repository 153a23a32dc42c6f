// Memory-bound kernels: fill, row gather (embedding, logits rows), RMSNorm, fused
// residual-add + RMSNorm, SiLU-and-multiply, and dtype conversion (weight updates from
// device memory of another dtype).
//
// Every kernel here reads and writes each element once (RMSNorm reads its row twice; the
// second read hits L1/L2), so the roofline is HBM bandwidth: on an H200 (4.8 TB/s) a decode
// step's add_rms_norm over [64, 4096] bf16 moves 1.5 MB and should take ~1 µs plus launch.
// The inner loops use 16-byte vectors (8 bf16) whenever the row length and the pointers
// allow it, and fall back to scalar code otherwise, so any shape is correct and the common
// shapes (hidden 1024..5120, intermediate 3072..17408) are fast.
//
// Arithmetic is float32 with one rounding to bf16 per stored value.
//
// Every kernel is launched with programmatic dependent launch (pdl.cuh): it waits for the
// kernel before it (pdl_wait) before touching activations and then lets the kernel after it
// launch at once (pdl_launch_dependents), since its grid is one wave at decode sizes. The
// norm kernels differ: at 17 rows or more they let the kernel after them launch before
// their wait (pdl.cuh, rule 3), and the block-per-row kernel also loads its weight vector
// before the wait (the warp-per-row kernel of prefill-sized batches reads it after).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/support/pdl.cuh"

namespace pagellm::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kNormThreads = 256;
constexpr int kVec = 8;  // bf16 per 16-byte vector

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Grid size for a grid-stride loop over n items: enough blocks to fill the GPU, never more
// than the items need.
unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

// ---- fill -------------------------------------------------------------------------------

template <class T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) { return v; }
template <>
__device__ bf16 from_float<bf16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __half from_float<__half>(float v) { return __float2half(v); }
template <>
__device__ int32_t from_float<int32_t>(float v) { return static_cast<int32_t>(v); }

template <class T>
__global__ void fill_kernel(T* data, int64_t n, float value) {
  pdl_wait();  // the kernel before may still read or write `data`
  pdl_launch_dependents();
  const T v = from_float<T>(value);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] = v;
  }
}

// ---- gather rows ------------------------------------------------------------------------

// One block per output row; Unit is the copy granularity (uint4, uint32_t or uint8_t).
template <class Unit>
__global__ void gather_rows_kernel(const Unit* __restrict__ src, int64_t src_rows,
                                   const int32_t* __restrict__ indices, Unit* __restrict__ dst,
                                   int64_t units_per_row) {
  pdl_wait();  // indices and src may come from the kernel before (sampled ids, logits)
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int32_t index = indices[r];
  Unit* out = dst + r * units_per_row;
  if (index < 0 || index >= src_rows) {
    for (int64_t i = threadIdx.x; i < units_per_row; i += blockDim.x) out[i] = Unit{};
    return;
  }
  const Unit* in = src + index * units_per_row;
  for (int64_t i = threadIdx.x; i < units_per_row; i += blockDim.x) out[i] = in[i];
}

template <class Unit>
void gather_as(const void* src, int64_t src_rows, const int32_t* indices, void* dst,
               int64_t num_rows, int64_t row_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, units)));
  launch_kernel(gather_rows_kernel<Unit>, dim3(static_cast<unsigned>(num_rows)),
                dim3(static_cast<unsigned>(threads)), 0, stream, 1,
                static_cast<const Unit*>(src), src_rows, indices, static_cast<Unit*>(dst), units);
}

// ---- RMSNorm ------------------------------------------------------------------------------

// Sum over the block; every thread gets the result. `scratch` holds one float per warp.
__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}

// The float32 head's norm (launch_rms_norm_f32_out): one block per row, scalar loads (a
// handful of rows a forward), every value kept in float32.
__global__ void rms_norm_f32_out_kernel(const bf16* __restrict__ x,
                                        const float* __restrict__ weight,
                                        float* __restrict__ out, int64_t hidden, float eps) {
  __shared__ float scratch[kNormThreads / 32];
  const bf16* row = x + blockIdx.x * hidden;
  float* dst = out + blockIdx.x * hidden;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    dst[i] = (__bfloat162float(row[i]) * inv) * weight[i];
  }
}

// Eight bf16 loaded as one 16-byte vector, converted to float.
struct Vec8 {
  float v[kVec];
};

__device__ Vec8 unpack_vec8(const uint4& raw) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Vec8 out;
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out.v[2 * i] = f.x;
    out.v[2 * i + 1] = f.y;
  }
  return out;
}

__device__ Vec8 load_vec8(const bf16* p) { return unpack_vec8(*reinterpret_cast<const uint4*>(p)); }

__device__ void store_vec8(bf16* p, const Vec8& x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) h[i] = __floats2bfloat162_rn(x.v[2 * i], x.v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Weight vectors (8 bf16 each) a thread of the vectorised norm loads into registers before
// its PDL wait: the whole weight for hidden <= 8 * kNormThreads * kCachedWeightVecs = 8192;
// longer rows read the rest after the wait.
constexpr int kCachedWeightVecs = 4;

// Rows from which a norm lets the next kernel launch before its own wait (pdl.cuh, rule 3's
// exception): the decode products' 32-token tiles (17-32 rows) and up. Measured on the H200
// (session (g), run 4; early against late, decode tok/s): batch 4 1,398 against 1,487
// (-6 %), batch 8 2,714 against 2,840 (-4.5 %), batch 16 5,259 against 5,339 (-1.5 %), W1's
// 32 rows 9,285 / 9,254 against 9,199 / 9,135 (+1 %), batch 1 and 64 no difference; on an
// H100 (2026-12-06, `pagellm bench --batch B --output-len 256`): batch 8 -1.3 %, 16 -1.2 %,
// 20 +1.2 %, 24 +2.0 % (two rounds), 28 even (why the small tiles lose was not traced;
// docs/PERFORMANCE.md).
constexpr int64_t kNormEarlyTriggerMinRows = 17;

// One block of kNormThreads per row. With kAdd, `x` is the residual, updated in place with
// delta and rounded to bf16 before the norm. Pass 1 accumulates the sum of squares, pass 2
// writes the normalised output from the values pass 1 kept in registers (up to 8192
// elements; the rest of a longer row is reread).
// PDL: the weight is a model parameter that no kernel of the step writes, so the vectorised
// variant loads (its share of) it while the kernel before is still running; x and delta
// are read only after pdl_wait(). `early`: rows >= kNormEarlyTriggerMinRows.
template <bool kAdd, bool kVectorised>
__global__ void __launch_bounds__(kNormThreads)
    norm_kernel(bf16* x, const bf16* __restrict__ delta, const bf16* __restrict__ weight,
                bf16* out, int64_t hidden, float eps, bool early) {
  __shared__ float scratch[kNormThreads / 32];
  // The one exception to pdl.cuh's "trigger after the wait", for batches of at least
  // kNormEarlyTriggerMinRows rows: the next product may launch before this kernel's own
  // wait, so its CTAs prefetch weights into free SM slots while the product before this
  // norm still drains.
  if (early) pdl_launch_dependents();
  uint4 weight_cache[kVectorised ? kCachedWeightVecs : 1];
  if constexpr (kVectorised) {
    const int64_t nvec = hidden / kVec;
#pragma unroll
    for (int k = 0; k < kCachedWeightVecs; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kNormThreads;
      weight_cache[k] = i < nvec ? *reinterpret_cast<const uint4*>(weight + i * kVec)
                                 : make_uint4(0, 0, 0, 0);
    }
  }
  pdl_wait();  // x and delta come from the kernels before
  if (!early) pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  bf16* xr = x + row * hidden;
  bf16* orow = out + row * hidden;
  float sum_sq = 0.0f;
  if constexpr (kVectorised) {
    // The first kCachedWeightVecs vectors of this thread stay in registers between the two
    // passes (the whole row for hidden <= 8192): pass 2 needs no second round trip to
    // memory. All their loads go out before any is used.
    const int64_t nvec = hidden / kVec;
    Vec8 cached[kCachedWeightVecs];
    uint4 raw_x[kCachedWeightVecs], raw_d[kCachedWeightVecs] = {};
#pragma unroll
    for (int k = 0; k < kCachedWeightVecs; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kNormThreads;
      raw_x[k] = i < nvec ? *reinterpret_cast<const uint4*>(xr + i * kVec) : make_uint4(0, 0, 0, 0);
      if constexpr (kAdd) {
        raw_d[k] = i < nvec ? *reinterpret_cast<const uint4*>(delta + row * hidden + i * kVec)
                            : make_uint4(0, 0, 0, 0);
      }
    }
    auto add_and_square = [&](int64_t i, Vec8& a, const Vec8& d) {
      if constexpr (kAdd) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) a.v[j] = __bfloat162float(__float2bfloat16(a.v[j] + d.v[j]));
        store_vec8(xr + i * kVec, a);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum_sq += a.v[j] * a.v[j];
    };
#pragma unroll
    for (int k = 0; k < kCachedWeightVecs; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kNormThreads;
      cached[k] = unpack_vec8(raw_x[k]);
      if (i < nvec) add_and_square(i, cached[k], kAdd ? unpack_vec8(raw_d[k]) : cached[k]);
    }
    for (int64_t i = threadIdx.x + int64_t{kCachedWeightVecs} * kNormThreads; i < nvec;
         i += kNormThreads) {
      Vec8 a = load_vec8(xr + i * kVec);
      add_and_square(i, a, kAdd ? load_vec8(delta + row * hidden + i * kVec) : a);
    }
    const float total = block_sum(sum_sq, scratch);
    const float inv = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
    auto normalise = [&](int64_t i, Vec8 a, const Vec8& w) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) a.v[j] = w.v[j] * (a.v[j] * inv);
      store_vec8(orow + i * kVec, a);
    };
#pragma unroll
    for (int k = 0; k < kCachedWeightVecs; ++k) {
      const int64_t i = threadIdx.x + int64_t{k} * kNormThreads;
      if (i < nvec) normalise(i, cached[k], unpack_vec8(weight_cache[k]));
    }
    for (int64_t i = threadIdx.x + int64_t{kCachedWeightVecs} * kNormThreads; i < nvec;
         i += kNormThreads) {
      normalise(i, load_vec8(xr + i * kVec), load_vec8(weight + i * kVec));
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      float a = __bfloat162float(xr[i]);
      if constexpr (kAdd) {
        bf16 s = __float2bfloat16(a + __bfloat162float(delta[row * hidden + i]));
        xr[i] = s;
        a = __bfloat162float(s);
      }
      sum_sq += a * a;
    }
    const float total = block_sum(sum_sq, scratch);
    const float inv = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      orow[i] = __float2bfloat16(__bfloat162float(weight[i]) * (__bfloat162float(xr[i]) * inv));
    }
  }
}

// Rows from which the plain norm runs one warp per row (norm_rows_kernel) instead of one
// block: prefill chunks, where a block per 5 KB row left the kernel at ~2.3 TB/s (36 us for
// 8,192 Qwen3-4B rows, 2026-12-04 trace). The two give the same bits, so where a row's
// batch puts the switch does not change it.
constexpr int64_t kNormWarpRowsMinRows = 1024;
// Vectors of 8 a thread of the block kernel handles at most for the warp kernel to take
// the row (its lanes keep 8x that many in registers): hidden <= 6,144.
constexpr int kNormWarpMaxK = 3;

// The plain norm (kAdd false, vectorised) for many rows: each warp one row, with bit for
// bit norm_kernel's result. Lane l plays norm_kernel's threads l + 32 w (w = 0..7): it sums
// each one's squares over that thread's vectors (i = l + 32 w + 256 k) in that thread's
// order, reduces each w over the 32 lanes with the same butterfly, and adds the eight warp
// sums in order from 0.0f as block_sum does; the normalisation is the same expression. All
// of a row's loads go out before the first is used (up to 8 kMaxK 16-byte vectors a lane).
// PDL as norm_kernel with `early` (rows >= kNormWarpRowsMinRows > kNormEarlyTriggerMinRows):
// the next kernel may launch at once; the weight is read after the wait (from L1/L2, shared
// by the block's rows). x and out may be the same rows (in place): every store follows the
// row's sum, which needs every load.
template <int kMaxK>
__global__ void __launch_bounds__(kNormThreads)
    norm_rows_kernel(const bf16* x, const bf16* __restrict__ weight, bf16* out, int64_t rows,
                     int64_t hidden, float eps) {
  constexpr int kWarps = kNormThreads / 32;
  pdl_launch_dependents();
  pdl_wait();  // x comes from the kernel before
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (row >= rows) return;
  const bf16* xr = x + row * hidden;
  bf16* orow = out + row * hidden;
  const int nvec = static_cast<int>(hidden / kVec);
  uint4 raw[kWarps][kMaxK];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      const int i = lane + 32 * w + kNormThreads * k;
      raw[w][k] = i < nvec ? *reinterpret_cast<const uint4*>(xr + int64_t{i} * kVec)
                           : make_uint4(0, 0, 0, 0);
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      if (lane + 32 * w + kNormThreads * k < nvec) {
        const Vec8 a = unpack_vec8(raw[w][k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum_sq += a.v[j] * a.v[j];
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1)
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
    total += sum_sq;
  }
  const float inv = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      const int i = lane + 32 * w + kNormThreads * k;
      if (i < nvec) {
        Vec8 a = unpack_vec8(raw[w][k]);
        const Vec8 g = load_vec8(weight + int64_t{i} * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) a.v[j] = g.v[j] * (a.v[j] * inv);
        store_vec8(orow + int64_t{i} * kVec, a);
      }
    }
  }
}

template <bool kAdd>
void launch_norm(void* x, const void* delta, const void* weight, void* out, int64_t rows,
                 int64_t hidden, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = hidden % kVec == 0 && aligned16(x) && aligned16(weight) && aligned16(out) &&
                   (!kAdd || aligned16(delta));
  const int64_t k_max = (hidden / kVec + kNormThreads - 1) / kNormThreads;
  if (!kAdd && vec && rows >= kNormWarpRowsMinRows && k_max >= 1 && k_max <= kNormWarpMaxK) {
    constexpr int kRowsPerBlock = kNormThreads / 32;
    const dim3 grid(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
    auto* kernel = k_max == 1 ? norm_rows_kernel<1>
                   : k_max == 2 ? norm_rows_kernel<2>
                                : norm_rows_kernel<kNormWarpMaxK>;
    launch_kernel(kernel, grid, dim3(kNormThreads), 0, stream, 1,
                  static_cast<const bf16*>(x), static_cast<const bf16*>(weight),
                  static_cast<bf16*>(out), rows, hidden, eps);
    return;
  }
  auto* xp = static_cast<bf16*>(x);
  auto* dp = static_cast<const bf16*>(delta);
  auto* wp = static_cast<const bf16*>(weight);
  auto* op = static_cast<bf16*>(out);
  const unsigned grid = static_cast<unsigned>(rows);
  auto* kernel = vec ? norm_kernel<kAdd, true> : norm_kernel<kAdd, false>;
  launch_kernel(kernel, dim3(grid), dim3(kNormThreads), 0, stream, 1, xp, dp, wp, op, hidden,
                eps, rows >= kNormEarlyTriggerMinRows);
}

// ---- SiLU and multiply ----------------------------------------------------------------------

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Index is uint32_t whenever rows x width fits (every prefill chunk): the 64-bit division
// that splits an item into row and column cost more instructions than the item's math
// (4.5 % of a 16 x 2,048 prefill at 3.5 TB/s, 2026-12-04 trace).
template <bool kVectorised, class Index>
__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                int64_t rows, int64_t inter) {
  pdl_wait();  // gate_up comes from the matrix product before; out may still be read
  pdl_launch_dependents();
  const Index width = static_cast<Index>(kVectorised ? inter / kVec : inter);
  const Index n = static_cast<Index>(rows) * width;
  for (Index idx = blockIdx.x * Index{blockDim.x} + threadIdx.x; idx < n;
       idx += Index{gridDim.x} * blockDim.x) {
    const int64_t t = idx / width, i = idx % width;
    const bf16* g = gate_up + t * 2 * inter;
    if constexpr (kVectorised) {
      const Vec8 a = load_vec8(g + i * kVec);
      const Vec8 b = load_vec8(g + inter + i * kVec);
      Vec8 r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) r.v[j] = silu(a.v[j]) * b.v[j];
      store_vec8(out + t * inter + i * kVec, r);
    } else {
      out[t * inter + i] =
          __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(g[inter + i]));
    }
  }
}

// ---- convert (weight updates from device memory) ----------------------------------------

template <class T>
__device__ float to_float(T v);
template <>
__device__ float to_float<float>(float v) { return v; }
template <>
__device__ float to_float<bf16>(bf16 v) { return __bfloat162float(v); }
template <>
__device__ float to_float<__half>(__half v) { return __half2float(v); }

// One rounding per element (float -> Out, round to nearest even), as the host's convert.
template <class In, class Out>
__global__ void convert_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  pdl_wait();  // the source may come from the kernel before
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = from_float<Out>(to_float<In>(src[i]));
  }
  pdl_launch_dependents();
}

template <class In>
void convert_from(const void* src, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  constexpr int threads = 256;
  const dim3 grid(grid_for(n, threads));
  const In* in = static_cast<const In*>(src);
  switch (dst_dtype) {
    case DType::F32:
      launch_kernel(convert_kernel<In, float>, grid, dim3(threads), 0, stream, 1, in,
                    static_cast<float*>(dst), n);
      break;
    case DType::BF16:
      launch_kernel(convert_kernel<In, bf16>, grid, dim3(threads), 0, stream, 1, in,
                    static_cast<bf16*>(dst), n);
      break;
    case DType::F16:
      launch_kernel(convert_kernel<In, __half>, grid, dim3(threads), 0, stream, 1, in,
                    static_cast<__half*>(dst), n);
      break;
    default:
      PAGELLM_FAIL() << "cuda convert: unsupported destination dtype " << dtype_name(dst_dtype)
                     << " (float32, bfloat16 or float16)";
  }
}

}  // namespace

void launch_fill(void* data, DType dtype, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int threads = 256;
  const unsigned grid = grid_for(n, threads);
  switch (dtype) {
    case DType::F32:
      launch_kernel(fill_kernel<float>, dim3(grid), dim3(threads), 0, stream, 1,
                    static_cast<float*>(data), n, value);
      break;
    case DType::BF16:
      launch_kernel(fill_kernel<bf16>, dim3(grid), dim3(threads), 0, stream, 1,
                    static_cast<bf16*>(data), n, value);
      break;
    case DType::F16:
      launch_kernel(fill_kernel<__half>, dim3(grid), dim3(threads), 0, stream, 1,
                    static_cast<__half*>(data), n, value);
      break;
    case DType::I32:
      launch_kernel(fill_kernel<int32_t>, dim3(grid), dim3(threads), 0, stream, 1,
                    static_cast<int32_t*>(data), n, value);
      break;
    default:
      PAGELLM_FAIL() << "cuda fill: unsupported dtype " << dtype_name(dtype)
                     << " (float32, bfloat16, float16 or int32)";
  }
}

void launch_gather_rows(const void* src, int64_t src_rows, const int32_t* indices, void* dst,
                        int64_t num_rows, int64_t row_bytes, cudaStream_t stream) {
  if (num_rows == 0 || row_bytes == 0) return;
  PAGELLM_CHECK(num_rows <= 0x7fffffff) << "cuda gather_rows: " << num_rows << " rows";
  if (row_bytes % 16 == 0 && aligned16(src) && aligned16(dst)) {
    gather_as<uint4>(src, src_rows, indices, dst, num_rows, row_bytes, stream);
  } else if (row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
             reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
    gather_as<uint32_t>(src, src_rows, indices, dst, num_rows, row_bytes, stream);
  } else {
    gather_as<uint8_t>(src, src_rows, indices, dst, num_rows, row_bytes, stream);
  }
}

void launch_rms_norm(const void* x, const void* weight, void* out, int64_t rows, int64_t hidden,
                     float eps, cudaStream_t stream) {
  // The plain norm never writes x; the const_cast only lets both variants share a kernel.
  launch_norm<false>(const_cast<void*>(x), nullptr, weight, out, rows, hidden, eps, stream);
}

void launch_rms_norm_f32_out(const void* x, const float* weight, float* out, int64_t rows,
                             int64_t hidden, float eps, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  PAGELLM_CHECK(rows <= 0x7fffffff) << "cuda rms_norm_f32_out: " << rows << " rows";
  rms_norm_f32_out_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(
      static_cast<const bf16*>(x), weight, out, hidden, eps);
  PAGELLM_CUDA_CHECK(cudaGetLastError());
}

void launch_add_rms_norm(void* residual, const void* delta, const void* weight, void* out,
                         int64_t rows, int64_t hidden, float eps, cudaStream_t stream) {
  launch_norm<true>(residual, delta, weight, out, rows, hidden, eps, stream);
}

void launch_silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter,
                     cudaStream_t stream) {
  if (rows == 0 || inter == 0) return;
  constexpr int threads = 256;
  const bool vec = inter % kVec == 0 && aligned16(gate_up) && aligned16(out);
  const int64_t n = rows * (vec ? inter / kVec : inter);
  const unsigned grid = grid_for(n, threads);
  auto* in = static_cast<const bf16*>(gate_up);
  auto* o = static_cast<bf16*>(out);
  // 32-bit items while the grid-stride loop's last step stays below 2^32.
  const bool narrow = n + int64_t{grid} * threads < (int64_t{1} << 32);
  auto* kernel = vec ? (narrow ? silu_mul_kernel<true, uint32_t>
                               : silu_mul_kernel<true, int64_t>)
                     : (narrow ? silu_mul_kernel<false, uint32_t>
                               : silu_mul_kernel<false, int64_t>);
  launch_kernel(kernel, dim3(grid), dim3(threads), 0, stream, 1, in, o, rows, inter);
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attrs;
  cudaError_t err = cudaFuncGetAttributes(&attrs, fill_kernel<float>);
  if (err != cudaSuccess) cudaGetLastError();  // clear it so later checks don't see it
  return err;
}

void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  switch (src_dtype) {
    case DType::F32: convert_from<float>(src, dst, dst_dtype, n, stream); break;
    case DType::BF16: convert_from<bf16>(src, dst, dst_dtype, n, stream); break;
    case DType::F16: convert_from<__half>(src, dst, dst_dtype, n, stream); break;
    default:
      PAGELLM_FAIL() << "cuda convert: unsupported source dtype " << dtype_name(src_dtype)
                     << " (float32, bfloat16 or float16)";
  }
}

}  // namespace pagellm::cuda
