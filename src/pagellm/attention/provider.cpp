#include "pagellm/attention/provider.h"

#include "pagellm/common/check.h"

namespace pagellm {

const char* provider_name(AttentionProvider p) {
  return p == AttentionProvider::kCudnn ? "cudnn" : "native";
}

const char* choice_name(AttentionBackendChoice c) {
  switch (c) {
    case AttentionBackendChoice::kAuto: return "auto";
    case AttentionBackendChoice::kNative: return "native";
    case AttentionBackendChoice::kCudnn: return "cudnn";
  }
  return "?";
}

const char* mode_name(LaunchMode m) { return m == LaunchMode::kGraph ? "graph" : "eager"; }

const char* phase_name(AttentionPhase p) {
  return p == AttentionPhase::kDecode ? "decode" : "prefill";
}

AttentionBackendChoice parse_attention_backend(const std::string& text) {
  if (text == "auto") return AttentionBackendChoice::kAuto;
  if (text == "native") return AttentionBackendChoice::kNative;
  if (text == "cudnn") return AttentionBackendChoice::kCudnn;
  PAGELLM_FAIL() << "unknown attention backend '" << text
                 << "' (expected auto, native or cudnn)";
}

LaunchMode parse_launch_mode(const std::string& text) {
  if (text == "eager") return LaunchMode::kEager;
  if (text == "graph") return LaunchMode::kGraph;
  PAGELLM_FAIL() << "unknown launch mode '" << text << "' (expected eager or graph)";
}

AttentionPhase parse_attention_phase(const std::string& text) {
  if (text == "prefill") return AttentionPhase::kPrefill;
  if (text == "decode") return AttentionPhase::kDecode;
  PAGELLM_FAIL() << "unknown attention phase '" << text << "' (expected prefill or decode)";
}

}  // namespace pagellm
