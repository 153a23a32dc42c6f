// JSON lines <-> requests and results (pagellm generate --input; the server will share it).
#include "pagellm/batch_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

using Json = nlohmann::ordered_json;

std::string type_of(const Json& v) { return v.type_name(); }

float as_float(const Json& v, const std::string& key) {
  PAGELLM_CHECK(v.is_number()) << "\"" << key << "\" must be a number, got " << type_of(v);
  return v.get<float>();
}

int64_t as_int(const Json& v, const std::string& key, int64_t lo, int64_t hi) {
  PAGELLM_CHECK(v.is_number_integer())
      << "\"" << key << "\" must be an integer, got " << (v.is_number() ? v.dump() : type_of(v));
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    PAGELLM_CHECK(u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo)))
        << "\"" << key << "\" must be in [" << lo << ", " << hi << "], got " << u;
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  PAGELLM_CHECK(i >= lo && i <= hi) << "\"" << key << "\" must be in [" << lo << ", " << hi
                                    << "], got " << i;
  return i;
}

bool as_bool(const Json& v, const std::string& key) {
  PAGELLM_CHECK(v.is_boolean()) << "\"" << key << "\" must be true or false, got " << v.dump();
  return v.get<bool>();
}

std::vector<int32_t> as_ids(const Json& v, const std::string& key) {
  PAGELLM_CHECK(v.is_array()) << "\"" << key << "\" must be an array of token ids, got "
                              << type_of(v);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    ids.push_back(static_cast<int32_t>(
        as_int(v[i], key + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

}  // namespace

BatchRequest parse_batch_request(std::string_view json_line, const SamplingParams& defaults) {
  Json j;
  try {
    j = Json::parse(json_line);
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << "not a JSON object: " << e.what();
  }
  PAGELLM_CHECK(j.is_object()) << "a request must be a JSON object, got " << type_of(j);
  BatchRequest r;
  r.params = defaults;
  SamplingParams& p = r.params;
  int prompts = 0;
  for (const auto& [key, v] : j.items()) {
    if (key == "id") {
      PAGELLM_CHECK(v.is_string() || v.is_number_integer())
          << "\"id\" must be a string or an integer, got " << type_of(v);
      r.id = v.is_string() ? v.get<std::string>() : v.dump();
    } else if (key == "prompt") {
      PAGELLM_CHECK(v.is_string()) << "\"prompt\" must be a string, got " << type_of(v);
      r.prompt = Prompt::from_text(v.get<std::string>());
      ++prompts;
    } else if (key == "prompt_token_ids") {
      r.prompt = Prompt::from_token_ids(as_ids(v, key));
      ++prompts;
    } else if (key == "messages") {
      PAGELLM_CHECK(v.is_array()) << "\"messages\" must be an array of messages, got "
                                  << type_of(v);
      r.prompt.kind = Prompt::Kind::kChat;
      r.prompt.messages_json = v.dump();
      ++prompts;
    } else if (key == "chat_template_kwargs") {
      PAGELLM_CHECK(v.is_object()) << "\"chat_template_kwargs\" must be an object, got "
                                   << type_of(v);
    } else if (key == "n") {
      p.n = static_cast<int>(as_int(v, key, 1, 1 << 16));
    } else if (key == "temperature") {
      p.temperature = as_float(v, key);
    } else if (key == "top_k") {
      p.top_k = static_cast<int>(as_int(v, key, -1, std::numeric_limits<int32_t>::max()));
    } else if (key == "top_p") {
      p.top_p = as_float(v, key);
    } else if (key == "min_p") {
      p.min_p = as_float(v, key);
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = as_float(v, key);
    } else if (key == "presence_penalty") {
      p.presence_penalty = as_float(v, key);
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = as_float(v, key);
    } else if (key == "seed") {
      PAGELLM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
          << "\"seed\" must be an integer in [0, 2^64 - 1], got " << v.dump();
      p.seed = v.get<uint64_t>();
    } else if (key == "max_tokens") {
      p.max_tokens = static_cast<int>(as_int(v, key, 1, std::numeric_limits<int32_t>::max()));
    } else if (key == "min_tokens") {
      p.min_tokens = static_cast<int>(as_int(v, key, 0, std::numeric_limits<int32_t>::max()));
    } else if (key == "stop") {
      p.stop.clear();
      if (v.is_string()) {
        p.stop.push_back(v.get<std::string>());
      } else {
        PAGELLM_CHECK(v.is_array()) << "\"stop\" must be a string or an array of strings, got "
                                    << type_of(v);
        for (const Json& s : v) {
          PAGELLM_CHECK(s.is_string()) << "\"stop\" must be a string or an array of strings, "
                                          "got an array holding a "
                                       << type_of(s);
          p.stop.push_back(s.get<std::string>());
        }
      }
    } else if (key == "stop_token_ids") {
      p.stop_token_ids = as_ids(v, key);
    } else if (key == "ignore_eos") {
      p.ignore_eos = as_bool(v, key);
    } else if (key == "skip_special_tokens") {
      p.skip_special_tokens = as_bool(v, key);
    } else if (key == "processed_logprobs") {
      p.processed_logprobs = as_bool(v, key);
    } else if (key == "logprobs") {
      PAGELLM_CHECK(v.is_number_integer()) << "\"logprobs\" must be an integer (top-k "
                                              "alternatives per token), got a "
                                           << type_of(v);
      const int64_t k = v.get<int64_t>();
      // Out of int's range: a value validate_sampling_params rejects, named as given.
      PAGELLM_CHECK(k >= 0 && k <= SamplingParams::kMaxLogprobs)
          << "\"logprobs\" must be in [0, " << SamplingParams::kMaxLogprobs
          << "] (top-k alternatives per token; 0: none), got " << k;
      p.logprobs = static_cast<int>(k);
    } else {
      PAGELLM_FAIL() << "unknown key \"" << key
                     << "\" (accepted: id, prompt, prompt_token_ids, messages, "
                        "chat_template_kwargs, n, temperature, top_k, top_p, min_p, "
                        "repetition_penalty, presence_penalty, frequency_penalty, seed, "
                        "max_tokens, min_tokens, stop, stop_token_ids, ignore_eos, skip_special_tokens, "
                        "processed_logprobs, logprobs)";
    }
  }
  PAGELLM_CHECK(prompts == 1) << "a request needs exactly one of \"prompt\" (text), "
                                 "\"prompt_token_ids\" or \"messages\", got "
                              << prompts;
  if (j.contains("chat_template_kwargs")) {
    PAGELLM_CHECK(r.prompt.kind == Prompt::Kind::kChat)
        << "\"chat_template_kwargs\" goes with \"messages\"";
    r.prompt.chat_template_kwargs_json = j["chat_template_kwargs"].dump();
  }
  validate_sampling_params(p);
  return r;
}

// Per token: [{"token_id", "logprob"}, ...], most likely first.
static Json top_logprobs_json(const std::vector<std::vector<TokenLogprob>>& per_token) {
  Json all = Json::array();
  for (const auto& list : per_token) {
    Json one = Json::array();
    for (const TokenLogprob& t : list) one.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}});
    all.push_back(std::move(one));
  }
  return all;
}

std::string format_batch_result(const RequestOutput& output, bool processed_logprobs) {
  Json j;
  j["id"] = output.request_id;
  j["prompt_token_ids"] = output.prompt_token_ids;
  Json outs = Json::array();
  for (const CompletionOutput& o : output.outputs) {
    Json c;
    c["index"] = o.index;
    c["text"] = o.text;
    c["token_ids"] = o.token_ids;
    c["logprobs"] = o.logprobs;
    if (processed_logprobs) c["processed_logprobs"] = o.processed_logprobs;
    if (!o.top_logprobs.empty()) {
      c["top_logprobs"] = top_logprobs_json(o.top_logprobs);
      c["logprob_ranks"] = o.logprob_ranks;
      if (!o.processed_top_logprobs.empty())
        c["processed_top_logprobs"] = top_logprobs_json(o.processed_top_logprobs);
    }
    c["cumulative_logprob"] = o.cumulative_logprob;
    c["finish_reason"] = finish_reason_openai(o.finish_reason);
    c["finish_detail"] = finish_reason_name(o.finish_reason);
    if (!o.error.empty()) c["error"] = o.error;
    outs.push_back(std::move(c));
  }
  j["outputs"] = std::move(outs);
  j["weights_version"] = output.weights_version;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string format_batch_error(const std::string& id, int line, const std::string& message) {
  Json j;
  j["id"] = id;
  j["error"] = {{"line", line}, {"message", message}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace pagellm
