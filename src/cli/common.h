// Pieces shared by the pagellm subcommands: engine options, the default model.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "pagellm/engine/engine.h"
#include "pagellm/engine_options.h"

namespace pagellm::cli {

/// Engine flags common to generate, bench and serve.
struct EngineSettings {
  EngineConfig config;
  double kv_cache_gb = 0.0;
};
void add_engine_options(CLI::App* cmd, EngineSettings& settings);

/// The settings generate and bench start from: offline (EngineOptions::offline: the
/// backend's throughput chunk) and pipelined decode on (8 steps a run). Nothing of theirs
/// streams, so tokens reaching the host up to 8 at a time cost nothing, and the host's work
/// overlaps the device's (docs/PERFORMANCE.md, 2026-12-05). serve and score start from the
/// library's default (1: off), so that streams get every token at once; score is offline
/// too.
EngineSettings offline_engine_settings();

/// The public API's engine options for the flags.
EngineOptions engine_options(const EngineSettings& settings);

/// Loads a model folder into an engine, with a progress bar for large models.
std::unique_ptr<Engine> load_engine(const std::string& model_dir, const EngineSettings& settings);

/// The embedded default: a tiny random-weight model (seed 0) with a tokenizer, made on
/// first use under $PAGELLM_CACHE or ~/.cache/pagellm. Returns its folder.
std::string default_model_dir();

}  // namespace pagellm::cli
