// Qwen3Model::load: a Hugging Face folder through WeightStore, validated before upload.
#include "pagellm/model/qwen3.h"
#include "pagellm/model/qwen3_weights.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {

std::unique_ptr<Qwen3Model> Qwen3Model::load(Backend& backend, const std::string& model_dir,
                                             const ProgressFn& progress,
                                             const TensorParallel* parallel) {
  const Qwen3Config config = load_qwen3_config(model_dir);
  const WeightStore store = WeightStore::open(model_dir);
  validate_qwen3_weights(store, config);
  WeightLookup lookup = [&store](const std::string& name) {
    const HostTensor& t = store.get(name);
    store.prefetch(t);
    return WeightView{t.data, t.dtype, t.shape};
  };
  return std::make_unique<Qwen3Model>(backend, config, lookup, progress, parallel);
}

}  // namespace pagellm
