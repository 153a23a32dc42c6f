#include "pagellm/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

namespace pagellm {
namespace {

void expect_f32(const Tensor& t, const char* what) {
  PAGELLM_CHECK(t.dtype == DType::F32)
      << "cpu backend: " << what << " must be float32, got " << dtype_name(t.dtype);
}

void expect_i32(const Tensor& t, const char* what) {
  PAGELLM_CHECK(t.dtype == DType::I32)
      << "cpu backend: " << what << " must be int32, got " << dtype_name(t.dtype);
}

// y[i] = x[i] * w[i] / rms(x), all length n.
inline void rms_norm_row(const float* x, const float* w, float eps, int64_t n, float* y) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * inv);
}

Tensor view_of(const std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(const_cast<int32_t*>(v.data()), DType::I32, dims);
}

}  // namespace

CpuBackend::CpuBackend() {
  // OpenBLAS spawns its own threads; keep them to the cores OpenMP would use.
  openblas_set_num_threads(omp_get_max_threads());
}

size_t CpuBackend::free_memory() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

void* CpuBackend::allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = nullptr;
  if (allocations_left_ != 0) {
    p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (allocations_left_ > 0) --allocations_left_;
  }
  PAGELLM_CHECK(p != nullptr) << "cpu backend: out of host memory allocating " << bytes
                              << " bytes";
  return p;
}

void CpuBackend::deallocate(void* ptr) {
  const auto mapping = kv_mappings_.find(ptr);
  if (mapping == kv_mappings_.end()) {
    std::free(ptr);
    return;
  }
  munmap(mapping->first, mapping->second);
  kv_mappings_.erase(mapping);
}

void* CpuBackend::allocate_as(MemoryRole role, size_t bytes) {
  if (role != MemoryRole::kKvCache) return allocate(bytes);
  PAGELLM_CHECK(!asleep_) << "cpu backend: cannot allocate a KV pool while asleep (wake first)";
  PAGELLM_CHECK(allocations_left_ != 0) << "cpu backend: out of host memory mapping a KV pool of "
                                        << bytes << " bytes";
  if (allocations_left_ > 0) --allocations_left_;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PAGELLM_CHECK(p != MAP_FAILED) << "cpu backend: out of host memory mapping a KV pool of "
                                 << bytes << " bytes";
  kv_mappings_[p] = mapped;
  return p;
}

BackendSleepResult CpuBackend::sleep(bool offload_weights) {
  (void)offload_weights;  // weights are host memory already
  PAGELLM_CHECK(!asleep_) << "cpu backend: sleep called while already asleep (call wake first)";
  BackendSleepResult result;
  for (const auto& [ptr, bytes] : kv_mappings_) {
    // Private anonymous memory: the pages go back to the system now and read as zeros
    // when next touched, at the same addresses.
    PAGELLM_CHECK(madvise(ptr, bytes, MADV_DONTNEED) == 0)
        << "cpu backend: madvise(MADV_DONTNEED) failed on a KV pool of " << bytes << " bytes";
    result.kv_bytes += bytes;
  }
  asleep_ = true;
  return result;
}

void CpuBackend::wake() {
  PAGELLM_CHECK(asleep_) << "cpu backend: wake called while awake (call sleep first)";
  // Nothing to map: the released pages come back zero-filled on first touch.
  asleep_ = false;
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype,
                        int64_t n) {
  PAGELLM_CHECK(dst_offset >= 0 && dst_offset + n <= dst.numel())
      << "cpu backend: upload of " << n << " elements at " << dst_offset
      << " overflows tensor " << dst.shape_string();
  if (dst.dtype == DType::I32 || src_dtype == DType::I32) {
    PAGELLM_CHECK(dst.dtype == src_dtype) << "cpu backend: cannot upload "
                                          << dtype_name(src_dtype) << " into "
                                          << dtype_name(dst.dtype);
    std::memcpy(dst.ptr<int32_t>() + dst_offset, src, static_cast<size_t>(n) * 4);
    return;
  }
  expect_f32(dst, "upload destination");
  float* out = dst.ptr<float>() + dst_offset;
  const size_t esize = dtype_size(src_dtype);
  constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    int64_t count = std::min(kChunk, n - begin);
    convert_to_f32(static_cast<const char*>(src) + begin * esize, src_dtype, out + begin,
                   static_cast<size_t>(count));
  }
}

std::vector<float> CpuBackend::download_f32(const Tensor& src) {
  std::vector<float> out(static_cast<size_t>(src.numel()));
  if (src.dtype == DType::I32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(src.ptr<int32_t>()[i]);
  } else {
    convert_to_f32(src.data, src.dtype, out.data(), out.size());
  }
  return out;
}

void CpuBackend::fill(Tensor& t, float value) {
  expect_f32(t, "fill target");
  std::fill_n(t.ptr<float>(), t.numel(), value);
}

void CpuBackend::copy_kv_pages(std::vector<LayerKv>& kv,
                               const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  if (src_dst.empty()) return;
  const size_t page_bytes = check_kv_page_copies(kv, src_dst, "cpu");
  // In order: a later pair may read a page an earlier one wrote.
  for (const auto& [src, dst] : src_dst) {
    for (LayerKv& layer : kv) {
      for (Tensor* pool : {&layer.k, &layer.v}) {
        char* base = static_cast<char*>(pool->data);
        std::memcpy(base + static_cast<size_t>(dst) * page_bytes,
                    base + static_cast<size_t>(src) * page_bytes, page_bytes);
      }
    }
  }
}

void CpuBackend::reserve_batch(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                               int32_t max_rows) {
  (void)max_tokens;
  (void)max_rows;
  PAGELLM_CHECK(max_seqs >= 0 && max_pages_per_seq >= 0)
      << "cpu backend: reserve_batch needs non-negative sizes";
  batch_rows_.reserve(static_cast<size_t>(max_seqs) * max_pages_per_seq);
}

void CpuBackend::update_persistent_table(const ForwardBatch& batch) {
  const int32_t rows = batch.page_table_rows, width = batch.max_pages_per_seq;
  if (table_.empty()) {
    PAGELLM_CHECK(rows >= 1 && width >= 1)
        << "cpu backend: a persistent page table needs at least 1 row and 1 entry per row, got "
        << rows << " x " << width;
    table_.assign(static_cast<size_t>(rows) * width, 0);
    table_rows_ = rows;
    table_width_ = width;
  }
  PAGELLM_CHECK(rows == table_rows_ && width == table_width_)
      << "cpu backend: the persistent page table is " << table_rows_ << " x " << table_width_
      << " but the batch describes " << rows << " x " << width
      << " (the table's shape is fixed by its first batch)";
  // Everything is checked before anything is written: a bad batch changes nothing.
  size_t values = 0;
  for (const PageTableUpdate& u : batch.page_table_updates) {
    PAGELLM_CHECK(u.row >= 1 && u.row < rows && u.begin >= 0 && u.begin < u.end &&
                  u.end <= width)
        << "cpu backend: page-table update of row " << u.row << " entries [" << u.begin << ", "
        << u.end << ") is outside rows 1.." << rows - 1 << " (row 0 stays zeros) x " << width
        << " entries";
    values += static_cast<size_t>(u.end - u.begin);
  }
  PAGELLM_CHECK(values == batch.page_table_values.size())
      << "cpu backend: page-table updates cover " << values << " entries but "
      << batch.page_table_values.size() << " values are given";
  for (int32_t slot : batch.seq_slots) {
    PAGELLM_CHECK(slot >= 0 && slot < rows)
        << "cpu backend: a sequence reads page-table row " << slot << " of rows 0.." << rows - 1;
  }
  auto value = batch.page_table_values.begin();
  for (const PageTableUpdate& u : batch.page_table_updates) {
    std::copy_n(value, u.end - u.begin,
                table_.begin() + static_cast<ptrdiff_t>(u.row) * width + u.begin);
    value += u.end - u.begin;
  }
  // clear() and insert() within the capacity reserve_batch() set keep the address that
  // recorded graphs read.
  batch_rows_.clear();
  for (int32_t slot : batch.seq_slots) {
    const auto row = table_.begin() + static_cast<ptrdiff_t>(slot) * width;
    batch_rows_.insert(batch_rows_.end(), row, row + width);
  }
}

BatchTensors CpuBackend::upload_batch(const ForwardBatch& batch) {
  BatchTensors bt;
  bt.host = &batch;
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  bt.token_ids = view_of(batch.token_ids, {T});
  bt.positions = view_of(batch.positions, {T});
  bt.slot_mapping = view_of(batch.slot_mapping, {T});
  bt.query_start = view_of(batch.query_start, {B + 1});
  bt.kv_lens = view_of(batch.kv_lens, {B});
  if (batch.persistent_page_table()) {
    update_persistent_table(batch);
    bt.page_table = view_of(batch_rows_, {B, batch.max_pages_per_seq});
  } else {
    bt.page_table = view_of(batch.page_table, {B, batch.max_pages_per_seq});
  }
  bt.logits_indices = view_of(batch.logits_indices,
                              {static_cast<int64_t>(batch.logits_indices.size())});
  if (!batch.lora_slots.empty()) {
    lora_rows_.resize(static_cast<size_t>(T));
    batch.lora_token_slots(lora_rows_.data());
    bt.lora_slots = view_of(lora_rows_, {T});
  }
  return bt;
}

void CpuBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  expect_f32(table, "embedding table");
  expect_i32(ids, "token ids");
  const int64_t T = ids.numel(), H = table.size(1), V = table.size(0);
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    PAGELLM_CHECK(id[t] >= 0 && id[t] < V)
        << "token id " << id[t] << " is outside the vocabulary [0, " << V << ")";
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out.ptr<float>() + t * H, table.ptr<float>() + id[t] * H, H * sizeof(float));
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t rows = x.size(0), n = x.row_elems();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    rms_norm_row(x.ptr<float>() + r * n, weight.ptr<float>(), eps, n, out.ptr<float>() + r * n);
  }
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight,
                              float eps, Tensor& out) {
  const int64_t rows = residual.size(0), n = residual.row_elems();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual.ptr<float>() + r * n;
    const float* d = delta.ptr<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) res[i] += d[i];
    rms_norm_row(res, weight.ptr<float>(), eps, n, out.ptr<float>() + r * n);
  }
}

void CpuBackend::matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  expect_f32(x, "matmul input");
  expect_f32(w, "matmul weight");
  expect_f32(out, "matmul output");
  const int64_t M = x.size(0), K = x.row_elems(), N = w.size(0);
  PAGELLM_CHECK(w.row_elems() == K) << "matmul: input has " << K << " columns, weight "
                                    << w.shape_string();
  PAGELLM_CHECK(out.size(0) == M && out.row_elems() == N)
      << "matmul: output " << out.shape_string() << " is not [" << M << ", " << N << "]";
  if (M == 0) return;
  if (batch_invariant_) {
    matmul_fixed_order(x.ptr<float>(), w.ptr<float>(), M, N, K, out.ptr<float>());
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), 1.0f, x.ptr<float>(),
              static_cast<int>(K), w.ptr<float>(), static_cast<int>(K), 0.0f,
              out.ptr<float>(), static_cast<int>(N));
}

void CpuBackend::lora_add(const Tensor& x, const LoraGroup& group, const BatchTensors& batch,
                          Tensor& out) {
  expect_f32(x, "lora_add input");
  expect_f32(out, "lora_add output");
  const int64_t T = x.size(0), K = x.row_elems(), N = out.row_elems();
  const int64_t W = group.width_total();
  PAGELLM_CHECK(out.size(0) == T && K == group.in && group.num_modules >= 1 &&
                group.num_modules <= LoraGroup::kMaxModules && group.col_offset >= 0 &&
                group.col_offset + W <= N)
      << "lora_add: input " << x.shape_string() << " and output " << out.shape_string()
      << " do not fit a group of " << group.num_modules << " modules reading " << group.in
      << " and writing " << W << " columns at " << group.col_offset;
  if (batch.lora_slots.data == nullptr) return;
  PAGELLM_CHECK(batch.lora_slots.numel() == T)
      << "lora_add: " << batch.lora_slots.numel() << " row slots for " << T << " rows";
  const int32_t* row_slot = batch.lora_slots.ptr<int32_t>();
  // Module of each output column of the group, and where its columns start.
  std::array<int64_t, LoraGroup::kMaxModules + 1> start{};
  for (int m = 0; m < group.num_modules; ++m) start[m + 1] = start[m] + group.width[m];
  // Checked before the parallel loop (nothing may throw inside it).
  for (int64_t t = 0; t < T; ++t) {
    const int32_t q = row_slot[t];
    PAGELLM_CHECK(q >= 0 && q < group.num_slots)
        << "lora_add: row " << t << " names slot " << q << " of " << group.num_slots;
    const LoraSlotFactors& f = group.slots[q];
    PAGELLM_CHECK(q == 0 || f.a == nullptr || (f.rank >= 1 && f.rank <= LoraGroup::kMaxRank))
        << "lora_add: slot " << q << " has rank " << f.rank << ", outside 1.."
        << LoraGroup::kMaxRank;
  }
  // Threads over rows when there is work enough; each row's sums run in one fixed order.
  const int64_t work = T * K * 8;
#pragma omp parallel for schedule(static) if (work >= (int64_t{1} << 18))
  for (int64_t t = 0; t < T; ++t) {
    const int32_t q = row_slot[t];
    if (q == 0) continue;
    const LoraSlotFactors& f = group.slots[q];
    if (f.a == nullptr) continue;
    const int64_t r = f.rank;
    const float* a = static_cast<const float*>(f.a);
    const float* bt = static_cast<const float*>(f.bt);
    const float* xr = x.ptr<float>() + t * K;
    float* orow = out.ptr<float>() + t * N + group.col_offset;
    std::array<float, LoraGroup::kMaxModules * LoraGroup::kMaxRank> s{};
    for (int64_t i = 0; i < group.num_modules * r; ++i) {
      const float* ar = a + i * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * ar[k];
      s[static_cast<size_t>(i)] = acc;
    }
    for (int m = 0; m < group.num_modules; ++m) {
      for (int64_t j = start[m]; j < start[m + 1]; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < r; ++i) acc += s[static_cast<size_t>(m * r + i)] * bt[i * W + j];
        orow[j] += f.scale * acc;
      }
    }
  }
}

void matmul_fixed_order(const float* x, const float* w, int64_t M, int64_t N, int64_t K,
                        float* out) {
  // Columns in blocks of 16 so that a thread reuses its x row from L1 across them; the
  // block split only assigns work, each output is one dot product.
  constexpr int64_t kColBlock = 16;
  const int64_t col_blocks = (N + kColBlock - 1) / kColBlock;
  const int64_t K8 = K / 8 * 8;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      const float* xr = x + m * K;
      const int64_t n_end = std::min(N, (cb + 1) * kColBlock);
      for (int64_t n = cb * kColBlock; n < n_end; ++n) {
        const float* wr = w + n * K;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t k = 0; k < K8; k += 8) {
          for (int j = 0; j < 8; ++j) acc[j] += xr[k + j] * wr[k + j];
        }
        float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (int64_t k = K8; k < K; ++k) sum += xr[k] * wr[k];
        out[m * N + n] = sum;
      }
    }
  }
}

std::vector<float> rope_inv_freq(double theta, int64_t head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float power = std::pow(static_cast<float>(theta), exponent);
    inv[static_cast<size_t>(i)] = 1.0f / power;
  }
  return inv;
}

void apply_rope(float* x, int64_t head_dim, const float* inv_freq, int32_t position) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float angle = static_cast<float>(position) * inv_freq[i];
    float c = std::cos(angle), s = std::sin(angle);
    float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

void CpuBackend::qk_norm_rope_store_kv(const Tensor& qkv, const Tensor& q_norm,
                                       const Tensor& k_norm, float eps, const RopeParams& rope,
                                       const AttentionShape& shape, const BatchTensors& batch,
                                       Tensor& q_out, LayerKv& kv) {
  const int64_t T = qkv.size(0), Hq = shape.num_q_heads, Hkv = shape.num_kv_heads;
  const int64_t D = shape.head_dim, P = shape.page_size;
  const int64_t num_pages = kv.k.size(0);
  const std::vector<float> inv_freq = rope_inv_freq(rope.theta, D);
  const int32_t* positions = batch.positions.ptr<int32_t>();
  const int32_t* slots = batch.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    PAGELLM_CHECK(slots[t] >= 0 && slots[t] / P < num_pages)
        << "slot " << slots[t] << " of token " << t << " is outside the KV pool";
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv.ptr<float>() + t * (Hq + 2 * Hkv) * D;
    for (int64_t h = 0; h < Hq; ++h) {
      float* q = q_out.ptr<float>() + (t * Hq + h) * D;
      rms_norm_row(row + h * D, q_norm.ptr<float>(), eps, D, q);
      apply_rope(q, D, inv_freq.data(), positions[t]);
    }
    const int64_t page = slots[t] / P, offset = slots[t] % P;
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t dst = ((page * Hkv + h) * P + offset) * D;
      float* k = kv.k.ptr<float>() + dst;
      rms_norm_row(row + (Hq + h) * D, k_norm.ptr<float>(), eps, D, k);
      apply_rope(k, D, inv_freq.data(), positions[t]);
      std::memcpy(kv.v.ptr<float>() + dst, row + (Hq + Hkv + h) * D, D * sizeof(float));
    }
  }
}

void CpuBackend::attention(const Tensor& q, const LayerKv& kv, const AttentionShape& shape,
                           const BatchTensors& batch, const AttentionPlanRef& plan,
                           Tensor& out) {
  PAGELLM_CHECK(plan.serial != 0)
      << "cpu backend: attention needs this forward's plan (call plan_attention once per "
         "forward, before the first layer)";
  const ForwardBatch& fb = *batch.host;
  const int64_t Hq = shape.num_q_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int64_t P = shape.page_size, group = Hq / Hkv;
  const int64_t T = fb.num_tokens();
  // Map each token to its sequence once.
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int32_t b = 0; b < fb.num_seqs(); ++b) {
    for (int32_t t = fb.query_start[b]; t < fb.query_start[b + 1]; ++t) seq_of[t] = b;
  }
  const float* kp = kv.k.ptr<float>();
  const float* vp = kv.v.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<double> acc(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int32_t b = seq_of[t];
        const int32_t q_len = fb.query_len(b), kv_len = fb.kv_lens[b];
        const int32_t i = static_cast<int32_t>(t) - fb.query_start[b];
        const int32_t visible = kv_len - q_len + i + 1;  // keys 0 .. position
        const int32_t* pages = batch.page_table.ptr<int32_t>() + b * fb.max_pages_per_seq;
        const int64_t kvh = h / group;
        const float* qv = q.ptr<float>() + (t * Hq + h) * D;
        scores.resize(static_cast<size_t>(std::max(visible, 0)));
        float max_score = -std::numeric_limits<float>::infinity();
        for (int32_t j = 0; j < visible; ++j) {
          const float* k = kp + ((pages[j / P] * Hkv + kvh) * P + j % P) * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qv[d] * k[d];
          scores[j] = dot * shape.scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int32_t j = 0; j < visible; ++j) {
          double p = std::exp(static_cast<double>(scores[j] - max_score));
          denom += p;
          const float* v = vp + ((pages[j / P] * Hkv + kvh) * P + j % P) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += p * v[d];
        }
        float* o = out.ptr<float>() + (t * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          o[d] = visible > 0 ? static_cast<float>(acc[d] / denom) : 0.0f;
        }
      }
    }
  }
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t T = gate_up.size(0), I = out.row_elems();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up.ptr<float>() + t * 2 * I;
    const float* u = g + I;
    float* o = out.ptr<float>() + t * I;
    for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  const int64_t R = indices.numel(), n = x.row_elems();
  const int32_t* idx = indices.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    PAGELLM_CHECK(idx[r] >= 0 && idx[r] < x.size(0))
        << "gather_rows: row " << idx[r] << " outside [0, " << x.size(0) << ")";
    std::memcpy(out.ptr<float>() + r * n, x.ptr<float>() + idx[r] * n, n * sizeof(float));
  }
}

}  // namespace pagellm
