// A trainer's broadcast while an engine receives it, as over HTTP: the trainer
// (TcpWeightSender) sends on a thread while the engine's update_weights_from_broadcast runs.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "pagellm/engine/engine.h"
#include "pagellm/engine/weight_group.h"

namespace pagellm::testing {

/// The trainer sends `sent` (data[i]: tensor i's bytes) while the engine receives `told`
/// (the same list unless the test lies to one side); the trainer must not fail. Returns the
/// engine's report, or rethrows its Error once the trainer has finished.
inline WeightUpdateResult broadcast_update(Engine& engine, TcpWeightSender& sender,
                                           const std::vector<BroadcastTensor>& sent,
                                           const std::vector<const void*>& data,
                                           const std::vector<BroadcastTensor>& told,
                                           uint64_t bucket_bytes) {
  std::string trainer_error;
  std::thread trainer([&] {
    try {
      sender.send(sent, data, bucket_bytes);
    } catch (const Error& e) {
      trainer_error = e.what();
    }
  });
  WeightUpdateResult r;
  try {
    r = engine.update_weights_from_broadcast(told, bucket_bytes);
  } catch (...) {
    trainer.join();
    throw;
  }
  trainer.join();
  EXPECT_EQ(trainer_error, "");
  return r;
}

}  // namespace pagellm::testing
