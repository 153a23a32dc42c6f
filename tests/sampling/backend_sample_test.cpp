// Backend::sample: the default downloads the logits and runs the host sampler; any
// backend's sample() must give the host sampler's tokens for the same rows.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/common/check.h"
#include "pagellm/sampling/sampler.h"

namespace pagellm {
namespace {

TEST(BackendSample, CpuBackendMatchesTheHostSampler) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const int64_t rows = 5, vocab = 3001;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : logits) v = normal(rng);

  std::vector<SamplingParams> params(rows);
  params[0].temperature = 0.0f;
  params[1].top_p = 0.9f;
  params[2].top_k = 7;
  params[2].processed_logprobs = true;
  params[3].min_p = 0.05f;
  params[3].temperature = 1.7f;
  params[4].repetition_penalty = 1.3f;
  std::vector<int32_t> prompt = {1, 2, 3000};
  std::vector<int32_t> output = {5, 5};
  std::vector<SamplingRow> sampling_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    sampling_rows[r].params = &params[r];
    sampling_rows[r].seed = 100 + static_cast<uint64_t>(r);
    sampling_rows[r].output_index = 2 * r;
    sampling_rows[r].prompt_tokens = &prompt;
    sampling_rows[r].output_tokens = &output;
  }

  DeviceBuffer buffer(backend.get(), logits.size() * sizeof(float));
  Tensor device_logits = buffer.tensor(DType::F32, {rows, vocab});
  backend->copy_to_device(device_logits.data, logits.data(), device_logits.nbytes());
  const std::vector<SampledToken> got = backend->sample(device_logits, sampling_rows);
  const std::vector<SampledToken> want = sample_rows(logits.data(), rows, vocab, sampling_rows);
  ASSERT_EQ(got.size(), want.size());
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r].token, want[r].token) << r;
    EXPECT_EQ(got[r].logprob, want[r].logprob) << r;
    EXPECT_EQ(got[r].processed_logprob, want[r].processed_logprob) << r;
  }

  // Mismatched rows and a non-float32 or non-2-D tensor are errors.
  std::vector<SamplingRow> fewer(sampling_rows.begin(), sampling_rows.begin() + 2);
  EXPECT_THROW(backend->sample(device_logits, fewer), Error);
  Tensor flat = device_logits.view({rows * vocab});
  EXPECT_THROW(backend->sample(flat, sampling_rows), Error);
}

}  // namespace
}  // namespace pagellm
