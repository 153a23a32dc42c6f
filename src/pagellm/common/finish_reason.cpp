// Names of the public FinishReason (pagellm/outputs.h), defined in the lowest layer so that
// the engine and the text API print the same names.
#include "pagellm/outputs.h"

namespace pagellm {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kLength: return "length";
    case FinishReason::kContextLimit: return "context_limit";
    case FinishReason::kAborted: return "aborted";
    case FinishReason::kError: return "error";
  }
  return "?";
}

const char* finish_reason_openai(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kEos:
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kLength:
    case FinishReason::kContextLimit: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

}  // namespace pagellm
