// The Qwen3 dense decoder, written once against the Backend interface.
//
// Shapes (T tokens in the step, H hidden, Hq/Hkv heads, D head_dim, I intermediate,
// V vocab, R logits rows):
//   embed [T,H] -> 28-36 x { rms_norm -> qkv [T,(Hq+2Hkv)D] -> q/k norm + RoPE, K/V to pages
//   -> paged attention [T,Hq D] -> o_proj [T,H] -> +residual, rms_norm -> gate_up [T,2I]
//   -> silu*mul [T,I] -> down [T,H] } -> +residual, final norm -> rows [R,H] -> logits [R,V].
// q/k/v and gate/up are stored fused, so each is one matrix product.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/model/config.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/tensor_parallel.h"
#include "pagellm/model/weight_store.h"
#include "pagellm/weight_update.h"

namespace pagellm {

/// A host-resident weight as read from a file: data of some float dtype and its shape.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};
/// Returns the weight with a Hugging Face name (e.g. "model.norm.weight"); throws if absent.
using WeightLookup = std::function<WeightView(const std::string& name)>;
/// Called with (bytes done, bytes total) while weights are uploaded.
using ProgressFn = std::function<void(size_t done, size_t total)>;

/// One decoder layer's weights on the backend.
struct Qwen3LayerWeights {
  Tensor input_norm;  // [H]
  Tensor qkv;         // [(Hq + 2 Hkv) D, H]: rows of q_proj, then k_proj, then v_proj
  Tensor q_norm;      // [D]
  Tensor k_norm;      // [D]
  Tensor o_proj;      // [H, Hq D]
  Tensor post_norm;   // [H]
  Tensor gate_up;     // [2 I, H]: rows of gate_proj, then up_proj
  Tensor down;        // [H, I]
};

/// Every tensor of `store` as a NamedTensor in (pageable) host memory, valid while the
/// store lives: the input of a weight update from a safetensors folder or file.
std::vector<NamedTensor> named_tensors_of(const WeightStore& store);

/// What Qwen3Model::update_weights wrote.
struct WeightWriteStats {
  /// Tensors written (a tied model's lm_head.weight, checked but not written, excluded).
  int64_t tensors = 0;
  /// Bytes of the tensors as given (their own dtype).
  uint64_t bytes = 0;
};

class Qwen3Model {
 public:
  /// Uploads the weights named by `lookup` (transformers names) to the backend. With
  /// `parallel` (a rank of a tensor-parallel group, docs/design.md "Tensor parallelism"),
  /// only the rank's share of each weight: `lookup` still serves the whole model's tensors,
  /// and the forward all-reduces o_proj's and down's partial sums and gathers the
  /// vocabulary-split logits through parallel->comm. LoRA, weight updates and the float32
  /// head are refused at TP > 1 (not built yet).
  Qwen3Model(Backend& backend, const Qwen3Config& config, const WeightLookup& lookup,
             const ProgressFn& progress = nullptr, const TensorParallel* parallel = nullptr);
  /// Loads a Hugging Face folder (config.json + safetensors), validating every weight;
  /// with `parallel`, the rank's share (as the constructor).
  static std::unique_ptr<Qwen3Model> load(Backend& backend, const std::string& model_dir,
                                          const ProgressFn& progress = nullptr,
                                          const TensorParallel* parallel = nullptr);

  const Qwen3Config& config() const { return config_; }
  /// This rank's share (the whole model for one rank).
  const TpShard& shard() const { return shard_; }
  Backend& backend() const { return backend_; }
  AttentionShape attention_shape(int64_t page_size) const;
  /// Bytes of weights on the backend.
  size_t weight_bytes() const { return weight_bytes_; }
  /// Bytes the backend holds beside them in decode layouts (Backend::prepare_matrix).
  size_t prepared_bytes() const { return prepared_bytes_; }

  /// Rewrites the named weights in place (Hugging Face names, as vLLM's load_weights): any
  /// subset of the checkpoint's tensors. q/k/v go into their rows of the fused qkv matrix
  /// and gate/up into gate_up; with tied embeddings, model.embed_tokens.weight is also the
  /// output projection, and an lm_head.weight (which a state_dict may carry) is checked but
  /// not written. Every write goes into the buffer allocated at load (same addresses, so
  /// captured graphs stay valid), then the rewritten matrices get Backend::prepare_matrix
  /// and the backend is synchronised once.
  /// Atomic: every name, dtype (F32/BF16/F16), shape, memory kind and pointer
  /// (Backend::check_weight_source) is checked first; any problem throws Error listing
  /// each one (and what is accepted), and nothing is written. Call between forwards.
  WeightWriteStats update_weights(const std::vector<NamedTensor>& tensors);
  /// The checks of update_weights alone (throws the same Error; writes nothing).
  void check_weights_update(const std::vector<NamedTensor>& tensors) const;
  /// update_weights from a safetensors folder or file (WeightStore::open; host memory).
  WeightWriteStats update_weights_from(const std::string& path);
  /// An update whose tensors arrive in parts (a trainer's broadcast buckets): begin, write
  /// each part (checked as update_weights checks it, then written; it synchronises before
  /// returning, so the part's memory may be reused at once), then finish: the decode
  /// copies of every matrix a part rewrote, and the float32 head, are refreshed once. A
  /// part that fails its checks writes nothing, but the parts before it stay written.
  struct PartialUpdate {
    std::vector<bool> touched;  // per prepared matrix
    WeightWriteStats stats;
  };
  PartialUpdate begin_weights_update() const;
  void write_weights_part(const std::vector<NamedTensor>& part, PartialUpdate& update);
  WeightWriteStats finish_weights_update(PartialUpdate& update);

  /// The float32 head (EngineOptions::float32_head): from now on the final RMSNorm and
  /// lm_head run in float32 (Backend::float32_head) on float32 copies of their weights,
  /// made here from the loaded ones (exact: a widening). A no-op on a backend whose
  /// activations and weights are float32 already (the CPU's): nothing is copied and the
  /// forward is unchanged. First call before reserve(); call again after a weight update to
  /// rewrite the copies in place (same addresses: captured graphs stay valid). Returns the
  /// bytes newly allocated for the copies.
  size_t enable_float32_head();
  /// Whether the forward runs the float32 head.
  bool float32_head() const { return float32_head_; }

  // ---- LoRA (docs/design.md "LoRA") ----------------------------------------------------
  /// Makes the slot tables for adapter slots 1..max_slots (the engine's max_loras), in
  /// backend memory the forward (and graphs captured over it) read. Once, before the first
  /// set_lora; throws Error when called again with another count or on a backend without
  /// LoRA kernels. No adapter of rank above `max_rank` (1..kMaxLoraRank) is accepted
  /// (LoraGroup::max_rank carries it to the backend).
  void enable_lora(int32_t max_slots, int32_t max_rank = kMaxLoraRank);
  /// The slots enable_lora made (0 before it).
  int32_t max_lora_slots() const { return lora_num_slots_ == 0 ? 0 : lora_num_slots_ - 1; }
  /// Puts `adapter` (read for this model's config) into slot `slot` (1..max_lora_slots();
  /// 0 means "no adapter" in ForwardBatch::lora_slots), replacing the adapter it held: its
  /// factors are uploaded in the backend's weight dtype, then the slot's table entries
  /// point at them. Between forwards. Throws Error for a slot outside 1..max_lora_slots()
  /// or an adapter whose layers or shapes do not match the model (nothing changes then).
  void set_lora(int32_t slot, const LoraAdapter& adapter);
  /// Empties a slot (its memory goes back to the backend); a no-op for an empty one.
  void clear_lora(int32_t slot);
  /// Whether slot `slot` holds an adapter.
  bool has_lora(int32_t slot) const;
  /// Bytes of backend memory slot `slot`'s factors take (0 for an empty slot).
  size_t lora_bytes(int32_t slot) const;
  /// Where the last set_lora's time went, in seconds. staging: pinning the staging buffer
  /// (only the first staged load, or one with a block larger than a half; 0 in place).
  /// image: building the image on the host (write_lora_image, every run). upload: waiting
  /// for copies to the backend, the part of the upload not hidden behind building the next
  /// run (at least the last run's copy; 0 in place).
  struct LoraLoadTimes {
    double staging_seconds = 0.0;
    double image_seconds = 0.0;
    double upload_seconds = 0.0;
  };
  const LoraLoadTimes& last_lora_load() const { return last_lora_load_; }
  /// The default bytes of each half of set_lora's pinned staging buffer (see lora_staging_).
  static constexpr size_t kLoraStagingChunkBytes = size_t{16} << 20;
  /// Sets the bytes of each staging half for the next staged load (the kept buffer is
  /// released; the next load pins anew); a half still grows to the largest block. Tests use
  /// small halves to make a small model's image go up in several runs. Between loads.
  void set_lora_staging_chunk_bytes(size_t bytes);

  /// Allocates activations for steps of up to max_tokens tokens and max_rows logits rows.
  /// forward() never allocates; views into this workspace are stable (CUDA graphs).
  void reserve(int32_t max_tokens, int32_t max_rows);
  int32_t max_tokens() const { return max_tokens_; }

  /// Runs one step: writes the batch's K/V into `kv` (one LayerKv per layer) and returns
  /// logits [R, V] float32 for the batch's logits rows (a view into the workspace).
  Tensor forward(const BatchTensors& batch, std::vector<LayerKv>& kv);

 private:
  Tensor alloc(DType dtype, std::initializer_list<int64_t> dims);
  Tensor upload_weight(const WeightLookup& lookup, const std::string& name,
                       std::initializer_list<int64_t> dims, const ProgressFn& progress);
  void upload_rows_into(Tensor& dst, int64_t row_offset, const WeightLookup& lookup,
                        const std::string& name, int64_t rows, int64_t cols,
                        const ProgressFn& progress);

  /// Where one Hugging Face tensor goes: elements [offset, offset + numel(shape)) of dst.
  /// One write of an update's tensor: the rank's share of it, rows [row_begin, + rows) and
  /// columns [col_begin, + cols) of the full row-major tensor (a 1-D tensor is one row),
  /// into dst from element `offset`, contiguously.
  struct WeightWrite {
    Tensor dst;
    int64_t offset = 0;
    int64_t row_begin = 0, rows = 0;
    int64_t col_begin = 0, cols = 0;
  };
  struct WeightTarget {
    std::vector<int64_t> shape;       // the full (Hugging Face) shape the update must give
    std::vector<WeightWrite> writes;  // none: checked, not written (a tied lm_head.weight)
    int32_t matrix = -1;  // index into prepared_matrices(), or -1 when not prepared
  };
  /// Every name update_weights accepts.
  std::vector<std::pair<std::string, WeightTarget>> weight_targets() const;
  /// check_weights_update, then the writes of `tensors` (asynchronous), recorded in `update`.
  void write_checked(const std::vector<NamedTensor>& tensors, PartialUpdate& update);
  /// The matrices given to prepare_matrix, with their gated_inter.
  std::vector<std::pair<Tensor, int64_t>> prepared_matrices() const;

  Backend& backend_;
  Qwen3Config config_;
  TpShard shard_;                // the whole model when comm_ is null
  Communicator* comm_ = nullptr;  // tensor parallel: this rank's end of the group
  /// Refuses what is not built for tensor parallelism yet, naming `what`.
  void check_single_rank(const char* what) const;
  std::vector<DeviceBuffer> storage_;
  size_t weight_bytes_ = 0;
  size_t prepared_bytes_ = 0;
  size_t bytes_done_ = 0;
  size_t bytes_total_ = 0;

  Tensor embed_;       // [V, H]
  Tensor final_norm_;  // [H]
  Tensor lm_head_;     // [V, H] (aliases embed_ when tied); a rank's [V / size, H] rows in TP
  std::vector<Qwen3LayerWeights> layers_;
  // The float32 head's weights (enable_float32_head): float32 copies of final_norm_ [H]
  // and lm_head_ [V, H].
  bool float32_head_ = false;
  std::vector<DeviceBuffer> head_storage_;
  Tensor final_norm_f32_;
  Tensor lm_head_f32_;

  /// LoRA's groups: the modules of a layer that read one input and write side by side.
  enum LoraGroupId : int { kLoraQkv, kLoraO, kLoraGateUp, kLoraDown };
  static constexpr int kNumLoraGroups = 4;
  /// Group g of layer l as Backend::lora_add takes it (slots from the device table).
  LoraGroup lora_group(size_t layer, int group) const;
  /// Index of (layer, group, slot) in the slot table.
  size_t lora_entry(size_t layer, int group, int32_t slot) const;
  /// Copies the host table to its backend copy (a copy that completes before it returns).
  void upload_lora_table();
  /// One slot's factors: one backend allocation holding, per layer and group, the
  /// modules' A rows stacked and their Bᵀ side by side (LoraSlotFactors' layout).
  struct LoraSlot {
    bool loaded = false;
    DeviceBuffer storage;
  };
  std::vector<LoraSlot> lora_slots_;  // by slot number; [0] is never used
  /// Where set_lora builds a slot's image on a backend whose memory is not the host's, run
  /// by run (lora_image_runs): its two halves (size() / 2 each) used alternately,
  /// so that the host builds run i in one half while run i-1's copy (no conversion) reads
  /// the other. Page-locked and bounded (32 MiB, not the whole image: ~132 MB for r = 32 on
  /// Qwen3-4B, whose pinning cost 50-80 ms), pinned on the first staged load and kept;
  /// re-pinned only when an adapter has a block larger than a half.
  PinnedHostBuffer lora_staging_;
  size_t lora_staging_chunk_bytes_ = kLoraStagingChunkBytes;  // the default half
  LoraLoadTimes last_lora_load_;
  int32_t lora_num_slots_ = 0;        // max_slots + 1 once enable_lora ran
  int32_t lora_max_rank_ = 0;         // enable_lora's max_rank
  /// [layers][group][slot] entries, on the host and (lora_table_) in backend memory.
  std::vector<LoraSlotFactors> lora_table_host_;
  DeviceBuffer lora_table_;
  /// [layers][group][2] uint32, zeros: LoraGroup::counters of each (layer, group).
  DeviceBuffer lora_counters_;

  struct Workspace {
    Tensor residual, hidden, qkv, q, attn, proj, gate_up, act, rows, logits;
    Tensor logits_part;  // tensor parallel: [max_rows, V / size], this rank's columns
    Tensor rows_f32;  // [max_rows, H] float32: the float32 head's normalised rows
  };
  std::vector<DeviceBuffer> workspace_storage_;
  Workspace ws_;
  int32_t max_tokens_ = 0;
  int32_t max_rows_ = 0;
};

}  // namespace pagellm
