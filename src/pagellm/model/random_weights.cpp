#include "pagellm/model/random_weights.h"

#include <map>
#include <memory>
#include <vector>

#include "pagellm/model/make_model.h"

namespace pagellm {

RandomInit random_init_for(WeightKind kind) {
  return kind == WeightKind::kNorm ? RandomInit{1.0f, 0.1f} : RandomInit{0.0f, 0.02f};
}

WeightLookup random_weight_lookup(const Qwen3Config& config, uint64_t seed, DType dtype) {
  auto expected = std::make_shared<std::map<std::string, ExpectedWeight>>();
  for (const ExpectedWeight& w : expected_qwen3_weights(config)) (*expected)[w.name] = w;
  auto buffer = std::make_shared<std::vector<char>>();
  return [expected, buffer, seed, dtype](const std::string& name) {
    auto it = expected->find(name);
    PAGELLM_CHECK(it != expected->end()) << "random weights: no tensor named " << name;
    const ExpectedWeight& w = it->second;
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    buffer->resize(static_cast<size_t>(n) * dtype_size(dtype));
    const RandomInit init = random_init_for(w.kind);
    fill_random_normal(random_tensor_key(seed, name), 0, n, init.mean, init.stddev, dtype,
                       buffer->data());
    return WeightView{buffer->data(), dtype, w.shape};
  };
}

}  // namespace pagellm
