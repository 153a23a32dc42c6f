// pagellm score: the log-probabilities of given token sequences under the model, without
// sampling (LLM::score), one JSON line per input line.
//
// Input (--input FILE, JSON lines; blank lines skipped): a JSON array of token ids, or an
// object {"token_ids": [...], "prompt_length": N (optional, default 1), "id": string or
// integer (optional, default the line number)}. Output (stdout), per sequence in input
// order: {"id", "prompt_length", "logprobs", "ranks", ["top_logprobs": per scored token a
// list of [token_id, logprob]]}; logprobs[i] belongs to token_ids[prompt_length + i].
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/common/check.h"
#include "pagellm/llm.h"

namespace pagellm::cli {
namespace {

struct ScoreArgs {
  std::string model;
  std::string input_file;
  int top_k = 0;
  EngineSettings engine;
};

struct ScoreLine {
  std::string id;
  int line = 0;
  std::vector<int32_t> tokens;
  int32_t prompt_length = 1;
};

std::vector<int32_t> ids_of(const nlohmann::json& v, int line) {
  PAGELLM_CHECK(v.is_array()) << "line " << line << ": token ids must be a JSON array, got "
                              << v.type_name();
  std::vector<int32_t> ids;
  for (const auto& e : v) {
    PAGELLM_CHECK(e.is_number_integer())
        << "line " << line << ": token ids must be integers, got " << e.dump();
    const int64_t id = e.get<int64_t>();
    PAGELLM_CHECK(id >= INT32_MIN && id <= INT32_MAX)
        << "line " << line << ": token id " << id << " does not fit 32 bits";
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<ScoreLine> read_input(const std::string& path) {
  std::ifstream in(path);
  PAGELLM_CHECK(in.good()) << "cannot open --input " << path;
  std::vector<ScoreLine> lines;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      PAGELLM_FAIL() << path << " line " << line << ": not JSON (" << e.what() << ")";
    }
    ScoreLine s;
    s.line = line;
    s.id = std::to_string(line);
    if (j.is_array()) {
      s.tokens = ids_of(j, line);
    } else {
      PAGELLM_CHECK(j.is_object() && j.contains("token_ids"))
          << path << " line " << line
          << ": expected an array of token ids or an object with \"token_ids\"";
      for (const auto& [key, v] : j.items()) {
        if (key == "token_ids") {
          s.tokens = ids_of(v, line);
        } else if (key == "prompt_length") {
          PAGELLM_CHECK(v.is_number_integer())
              << path << " line " << line << ": \"prompt_length\" must be an integer";
          s.prompt_length = v.get<int32_t>();
        } else if (key == "id") {
          PAGELLM_CHECK(v.is_string() || v.is_number_integer())
              << path << " line " << line << ": \"id\" must be a string or an integer";
          s.id = v.is_string() ? v.get<std::string>() : v.dump();
        } else {
          PAGELLM_FAIL() << path << " line " << line << ": unknown key \"" << key
                         << "\" (accepted: token_ids, prompt_length, id)";
        }
      }
    }
    lines.push_back(std::move(s));
  }
  PAGELLM_CHECK(!lines.empty()) << "--input " << path << " holds no sequence";
  return lines;
}

void run_score(const ScoreArgs& args) {
  PAGELLM_CHECK(args.top_k >= 0 && args.top_k <= SamplingParams::kMaxLogprobs)
      << "--top-k must be in [0, " << SamplingParams::kMaxLogprobs << "], got " << args.top_k;
  const std::vector<ScoreLine> lines = read_input(args.input_file);  // before the weights load
  const std::string model_dir = args.model.empty() ? default_model_dir() : args.model;
  LLM llm(model_dir, engine_options(args.engine));
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> prompt_lengths;
  for (const ScoreLine& s : lines) {
    sequences.push_back(s.tokens);
    prompt_lengths.push_back(s.prompt_length);
  }
  std::vector<ScoreOutput> scored;
  try {
    scored = llm.score(sequences, prompt_lengths, args.top_k);
  } catch (const Error& e) {
    PAGELLM_FAIL() << e.what() << " (sequence i is the i-th sequence of " << args.input_file
                   << ", from 0, blank lines skipped)";
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j;
    j["id"] = lines[i].id;
    j["prompt_length"] = scored[i].prompt_length;
    j["logprobs"] = scored[i].logprobs;
    j["ranks"] = scored[i].ranks;
    if (args.top_k > 0) {
      nlohmann::json all = nlohmann::json::array();
      for (const auto& list : scored[i].top_logprobs) {
        nlohmann::json one = nlohmann::json::array();
        for (const TokenLogprob& t : list) one.push_back({t.token_id, t.logprob});
        all.push_back(std::move(one));
      }
      j["top_logprobs"] = std::move(all);
    }
    std::cout << j.dump() << "\n";
  }
  std::cout.flush();
}

}  // namespace

void register_score_command(CLI::App& app) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* cmd = app.add_subcommand(
      "score", "log-probabilities of given token sequences (no sampling), JSON lines");
  cmd->add_option("--model", args->model, "model folder (default: the embedded tiny model)");
  cmd->add_option("--input", args->input_file,
                  "JSON lines: [ids...] or {\"token_ids\": [...], \"prompt_length\": N, \"id\": ...}")
      ->required();
  cmd->add_option("--top-k", args->top_k, "top-k alternatives per scored token (0..20)")
      ->capture_default_str();
  args->engine.config.offline = true;  // whole outputs: the backend's throughput chunk
  add_engine_options(cmd, args->engine);
  cmd->callback([args] { run_score(*args); });
}

}  // namespace pagellm::cli
