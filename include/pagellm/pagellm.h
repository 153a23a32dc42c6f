// pagellm's public API in one include. Link pagellm::pagellm (find_package(pagellm)).
//
//   pagellm::LLM llm("/models/Qwen3-0.6B");
//   pagellm::SamplingParams p;
//   p.temperature = 0;
//   for (const auto& out : llm.generate({"The paged KV cache is"}, p))
//     std::cout << out.outputs[0].text << "\n";
#pragma once

#include "pagellm/async_engine.h"
#include "pagellm/batch_request.h"
#include "pagellm/engine_options.h"
#include "pagellm/error.h"
#include "pagellm/llm.h"
#include "pagellm/lora_request.h"
#include "pagellm/outputs.h"
#include "pagellm/weight_update.h"
#include "pagellm/prefix_cache_stats.h"
#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"
#include "pagellm/version.h"
