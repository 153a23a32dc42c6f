// Default graph capture: backends without graphs refuse clearly.
#include "pagellm/backend/backend.h"

namespace pagellm {

void Backend::begin_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

std::unique_ptr<RecordedGraph> Backend::end_capture() {
  PAGELLM_FAIL() << "the " << name() << " backend cannot capture graphs";
}

}  // namespace pagellm
