#include "pagellm/engine/sequence.h"

namespace pagellm {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContextLimit: return "context_limit";
    case FinishReason::kAborted: return "aborted";
    case FinishReason::kError: return "error";
  }
  return "?";
}

}  // namespace pagellm
