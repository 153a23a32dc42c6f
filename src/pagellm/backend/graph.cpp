// Default graph capture: backends without graphs refuse clearly.
#include "pagellm/backend/backend.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace pagellm {

double Backend::measure_copy_bandwidth() {
  // Generic: device-to-device copies through copy_to_device of a host staging buffer
  // would measure the wrong thing, so backends with device memory override this. Here
  // the "device" is host memory: time memcpy of 256 MiB, median of 5.
  const size_t bytes = size_t{256} << 20;
  DeviceBuffer a(this, bytes), b(this, bytes);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    copy_to_host(b.get(), a.get(), bytes);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin() + 1, times.end());
  return 2.0 * static_cast<double>(bytes) / times[3];
}

void Backend::begin_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

std::unique_ptr<RecordedGraph> Backend::end_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

}  // namespace pagellm
