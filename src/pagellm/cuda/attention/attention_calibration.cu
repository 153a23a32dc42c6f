// calibrate_attention (attention_calibration.h): the grid timed on both providers.
#include "pagellm/cuda/attention/attention_calibration.h"

#include "pagellm/common/check.h"

#if PAGELLM_HAVE_CUDNN

#include <algorithm>

#include "pagellm/cuda/attention/attention_timing.h"

namespace pagellm::cuda {

CrossoverTable calibrate_attention(const CalibrationOptions& options,
                                   const CalibrationObserver& observer) {
  options.validate();
  std::mt19937 rng(options.seed);
  const std::vector<AttentionCallShape> grid = calibration_grid(options, rng);
  // Pools for the shape with the most pages (at least 2^20 tokens), q/out for the most
  // query elements.
  int64_t pool_tokens = 0, max_q = 0;
  for (const AttentionCallShape& s : grid) {
    int64_t pages = 0;
    for (int32_t kv : s.kv) pages += (kv + s.page_size - 1) / s.page_size;
    pool_tokens = std::max(pool_tokens, pages * s.page_size);
    max_q = std::max<int64_t>(max_q, int64_t{s.num_tokens()} * s.num_q_heads * s.head_dim);
  }
  pool_tokens = std::max<int64_t>(pool_tokens + 1024, 1 << 20);
  AttentionTimer timer(options.device, pool_tokens, max_q, 8, 128);
  const DeviceProfile& device = timer.profile();
  PAGELLM_CHECK(device.cudnn_version > 0)
      << "attention calibration needs cuDNN 9: " << cudnn_library().error;
  if (observer.started) observer.started(device, grid.size());

  CrossoverTable table;
  table.device = device;
  table.measured_on = utc_date_today();
  table.margin = options.margin;
  table.source = options.source();
  for (const AttentionCallShape& shape : grid) {
    timer.load(shape, rng);
    const std::vector<LaunchMode> modes =
        shape.decode() ? std::vector<LaunchMode>{LaunchMode::kEager, LaunchMode::kGraph}
                       : std::vector<LaunchMode>{LaunchMode::kEager};
    for (LaunchMode mode : modes) {
      CrossoverMeasurement m;
      m.mode = mode;
      m.phase = shape.decode() ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
      m.head_dim = shape.head_dim;
      m.page_size = shape.page_size;
      m.num_q_heads = shape.num_q_heads;
      m.num_kv_heads = shape.num_kv_heads;
      m.num_seqs = static_cast<int32_t>(shape.q.size());
      m.num_tokens = shape.num_tokens();
      m.max_query_len = *std::max_element(shape.q.begin(), shape.q.end());
      m.max_kv_len = *std::max_element(shape.kv.begin(), shape.kv.end());
      m.ragged = shape.ragged;
      m.shape_class = shape.shape_class();
      m.work = shape.work();
      m.label = shape.label;
      m.native_us = timer.time_native(mode, options.iters, options.layers);
      std::string cudnn_error;
      m.cudnn_us = timer.time_cudnn(mode, options.iters, options.layers, &cudnn_error);
      if (observer.measured) observer.measured(m, cudnn_error);
      table.measurements.push_back(std::move(m));
    }
  }
  table.entries = derive_crossover_entries(table.measurements, options.margin);
  return table;
}

}  // namespace pagellm::cuda

#else  // no cuDNN route in this build

namespace pagellm::cuda {

CrossoverTable calibrate_attention(const CalibrationOptions& options, const CalibrationObserver&) {
  options.validate();
  PAGELLM_FAIL() << "attention calibration needs the cuDNN route, which this build lacks "
                    "(cudnn-frontend or cudnn.h was not found at configure time; see "
                    "src/CMakeLists.txt)";
}

}  // namespace pagellm::cuda

#endif
