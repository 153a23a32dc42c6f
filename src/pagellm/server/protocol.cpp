#include "pagellm/server/protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagellm::server {

using nlohmann::json;

namespace {

const char* status_code_name(int status) {
  switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 413: return "payload_too_large";
    case 501: return "not_implemented";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "internal_error" : "error";
  }
}

/// A short JSON rendering of a bad value for an error message.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

[[noreturn]] void bad_field(const std::string& field, const std::string& what) {
  throw HttpError(400, field + ": " + what, field);
}

json parse_object(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw HttpError(400, "the request body is not valid JSON; a JSON object is expected");
  }
  if (!j.is_object()) {
    throw HttpError(400, "the request body must be a JSON object, got " + shown(j));
  }
  return j;
}

/// The field's value, or nullptr when it is absent or null (OpenAI clients send null for
/// "not given").
const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> get_int(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    bad_field(name, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], got " + shown(*v));
  }
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    value = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                ? std::numeric_limits<int64_t>::max()
                : static_cast<int64_t>(u);
  } else {
    value = v->get<int64_t>();
  }
  if (value < lo || value > hi) {
    bad_field(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        shown(*v));
  }
  return value;
}

std::optional<float> get_float(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, "must be a number, got " + shown(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d)) bad_field(name, "must be a finite number, got " + shown(*v));
  return static_cast<float>(d);
}

std::optional<bool> get_bool(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_field(name, "must be true or false, got " + shown(*v));
  return v->get<bool>();
}

std::vector<int32_t> token_list(const json& v, const std::string& name) {
  if (!v.is_array()) bad_field(name, "must be a list of token ids, got " + shown(v));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      bad_field(name, "element " + std::to_string(i) + " must be a token id (an integer >= 0), got " +
                          shown(e));
    }
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

/// The sampling fields every endpoint shares (vLLM's names); `max_tokens_fields` lists the
/// names accepted for the token limit, first one preferred.
void read_sampling(const json& j, SamplingParams& p,
                   const std::vector<const char*>& max_tokens_fields) {
  if (auto v = get_int(j, "n", 1, 1024)) p.n = static_cast<int>(*v);
  for (const char* name : max_tokens_fields) {
    if (auto v = get_int(j, name, 1, std::numeric_limits<int32_t>::max())) {
      p.max_tokens = static_cast<int>(*v);
      break;
    }
  }
  if (auto v = get_float(j, "temperature")) p.temperature = *v;
  if (auto v = get_float(j, "top_p")) p.top_p = *v;
  if (auto v = get_int(j, "top_k", -1, std::numeric_limits<int32_t>::max())) {
    p.top_k = static_cast<int>(*v);
  }
  if (auto v = get_float(j, "min_p")) p.min_p = *v;
  if (auto v = get_float(j, "repetition_penalty")) p.repetition_penalty = *v;
  if (auto v = get_float(j, "presence_penalty")) p.presence_penalty = *v;
  if (auto v = get_float(j, "frequency_penalty")) p.frequency_penalty = *v;
  if (const json* v = field(j, "seed")) {
    if (!v->is_number_integer() || (v->is_number_integer() && !v->is_number_unsigned() &&
                                    v->get<int64_t>() < 0)) {
      bad_field("seed", "must be an integer in [0, 2^64 - 1], got " + shown(*v));
    }
    p.seed = v->get<uint64_t>();
  }
  if (const json* v = field(j, "stop")) {
    p.stop.clear();
    if (v->is_string()) {
      p.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& s : *v) {
        if (!s.is_string()) bad_field("stop", "must be a string or a list of strings, got " + shown(*v));
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      bad_field("stop", "must be a string or a list of strings, got " + shown(*v));
    }
    for (const std::string& s : p.stop) {
      if (s.empty()) bad_field("stop", "stop strings must not be empty");
    }
  }
  if (const json* v = field(j, "stop_token_ids")) p.stop_token_ids = token_list(*v, "stop_token_ids");
  if (auto v = get_bool(j, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = get_bool(j, "skip_special_tokens")) p.skip_special_tokens = *v;
}

void reject_unsupported(const json& j) {
  if (const json* v = field(j, "logit_bias"); v && !(v->is_object() && v->empty())) {
    bad_field("logit_bias", "is not supported; leave it out");
  }
  if (const json* v = field(j, "suffix"); v && !(v->is_string() && v->get<std::string>().empty())) {
    bad_field("suffix", "is not supported; leave it out");
  }
  if (const json* v = field(j, "best_of")) {
    const json* n = field(j, "n");
    const int64_t want = n && n->is_number_integer() ? n->get<int64_t>() : 1;
    if (!v->is_number_integer() || v->get<int64_t>() != want) {
      bad_field("best_of", "is not supported except equal to n; leave it out");
    }
  }
}

void read_common(const json& j, const ProtocolContext& ctx, OpenAiRequest& r) {
  if (const json* v = field(j, "model")) {
    if (!v->is_string()) bad_field("model", "must be a string, got " + shown(*v));
    const std::string name = v->get<std::string>();
    if (ctx.has_adapter && name != ctx.model_name && ctx.has_adapter(name)) {
      r.lora = name;
    } else if (!ctx.model_name.empty() && name != ctx.model_name) {
      throw HttpError(404, "The model `" + name + "` does not exist; this server serves `" +
                               ctx.model_name +
                               "` and the LoRA adapters it has loaded (GET /v1/models)",
                      "model", "NotFoundError");
    }
  }
  reject_unsupported(j);
  if (auto v = get_bool(j, "stream")) r.stream = *v;
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad_field("stream_options", "must be an object, got " + shown(*v));
    if (!r.stream) bad_field("stream_options", "is only allowed with stream: true");
    if (auto u = get_bool(*v, "include_usage")) r.include_usage = *u;
  }
  if (auto v = get_bool(j, "return_token_ids")) r.return_token_ids = *v;
}

/// tool_choice: "auto" (the default with tools) parses tool calls when the server was
/// started to (otherwise an explicit "auto" is refused, as vLLM refuses it); "none" leaves
/// the text as generated; "required" and named functions would need guided decoding.
void read_tool_choice(const json& j, const ProtocolContext& ctx, bool has_tools,
                      OpenAiRequest& r) {
  const bool server_parses = ctx.tool_call_parser == "hermes" && ctx.enable_auto_tool_choice;
  bool parse = has_tools && server_parses;
  if (const json* v = field(j, "tool_choice")) {
    if (!has_tools) bad_field("tool_choice", "is only allowed when tools are given");
    const std::string choice = v->is_string() ? v->get<std::string>() : "";
    if (choice == "none") {
      parse = false;
    } else if (choice == "auto") {
      if (!server_parses) {
        bad_field("tool_choice", "\"auto\" needs the server started with "
                                 "--enable-auto-tool-choice --tool-call-parser hermes");
      }
    } else if (choice == "required" || v->is_object()) {
      bad_field("tool_choice", "\"required\" and a named function are not supported (they "
                               "need guided decoding); use \"auto\" or \"none\"");
    } else {
      bad_field("tool_choice", "must be \"auto\", \"none\", \"required\" or an object, got " +
                                   shown(*v));
    }
  }
  r.parse_tool_calls = parse;
}

}  // namespace

std::optional<int> OpenAiRequest::prompt_score_top_k() const {
  std::optional<int> k;
  if (echo && logprobs) k = *logprobs;
  if (prompt_logprobs) k = std::max(k.value_or(0), *prompt_logprobs);
  return k;
}

std::string error_body(const HttpError& e) {
  json err = {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", status_code_name(e.status)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

OpenAiRequest parse_completion_request(const std::string& body, const ProtocolContext& ctx) {
  const json j = parse_object(body);
  OpenAiRequest r;
  read_common(j, ctx, r);
  const json* prompt = field(j, "prompt");
  if (!prompt) bad_field("prompt", "is required: a string, a list of strings, a list of token ids or a list of lists of token ids");
  if (prompt->is_string()) {
    r.prompts.push_back(Prompt::from_text(prompt->get<std::string>()));
  } else if (prompt->is_array()) {
    if (prompt->empty()) bad_field("prompt", "must not be an empty list");
    const json& first = (*prompt)[0];
    if (first.is_string()) {
      for (const json& p : *prompt) {
        if (!p.is_string()) bad_field("prompt", "a list of prompts must hold only strings, got " + shown(p));
        r.prompts.push_back(Prompt::from_text(p.get<std::string>()));
      }
    } else if (first.is_number()) {
      r.prompts.push_back(Prompt::from_token_ids(token_list(*prompt, "prompt")));
    } else if (first.is_array()) {
      for (const json& p : *prompt) r.prompts.push_back(Prompt::from_token_ids(token_list(p, "prompt")));
    } else {
      bad_field("prompt", "must be a string, a list of strings, a list of token ids or a list of lists of token ids, got " + shown(*prompt));
    }
  } else {
    bad_field("prompt", "must be a string, a list of strings, a list of token ids or a list of lists of token ids, got " + shown(*prompt));
  }
  r.params.max_tokens = 16;  // OpenAI's default for completions
  read_sampling(j, r.params, {"max_tokens"});
  if (auto v = get_int(j, "logprobs", 0, SamplingParams::kMaxLogprobs)) {
    r.logprobs = static_cast<int>(*v);
    r.params.logprobs = static_cast<int>(*v);
  }
  if (auto v = get_int(j, "prompt_logprobs", 0, SamplingParams::kMaxLogprobs)) {
    r.prompt_logprobs = static_cast<int>(*v);
  }
  if (auto v = get_bool(j, "echo")) r.echo = *v;
  return r;
}

namespace {

/// A chat body's prompt: its messages through the chat template with the template's
/// arguments (tools, add_generation_prompt, continue_final_message, chat_template_kwargs).
/// Messages and tools keep the client's key order (ordered_json; `json` sorts keys): the
/// template writes tools with tojson, so the order is part of the prompt, as in vLLM.
Prompt read_chat_prompt(const json& j, const std::string& body) {
  const json* messages = field(j, "messages");
  if (!messages || !messages->is_array() || messages->empty()) {
    bad_field("messages", "is required: a non-empty list of {\"role\", \"content\"} objects");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_field("messages", where + " must be an object, got " + shown(m));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      bad_field("messages", where + ".role must be a string (system, user, assistant, tool)");
    }
  }
  json kwargs = json::object();
  if (const json* v = field(j, "chat_template_kwargs")) {
    if (!v->is_object()) bad_field("chat_template_kwargs", "must be an object, got " + shown(*v));
    kwargs = *v;
  }
  const nlohmann::ordered_json in_order = nlohmann::ordered_json::parse(body);
  nlohmann::ordered_json request = {{"messages", in_order["messages"]}};
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) bad_field("tools", "must be a list, got " + shown(*tools));
    request["tools"] = in_order["tools"];
  }
  const std::optional<bool> open_turn = get_bool(j, "add_generation_prompt");
  const std::optional<bool> continue_final = get_bool(j, "continue_final_message");
  if (continue_final.value_or(false) && open_turn.value_or(false)) {
    bad_field("continue_final_message", "and add_generation_prompt cannot both be true: one "
                                        "continues the final message, the other opens a new "
                                        "assistant message");
  }
  if (open_turn) request["add_generation_prompt"] = *open_turn;
  if (continue_final) request["continue_final_message"] = *continue_final;
  const std::string messages_json =
      request.size() == 1 ? request["messages"].dump() : request.dump();
  return Prompt::from_messages_json(messages_json, kwargs.empty() ? "" : kwargs.dump());
}

}  // namespace

OpenAiRequest parse_chat_request(const std::string& body, const ProtocolContext& ctx) {
  const json j = parse_object(body);
  OpenAiRequest r;
  r.chat = true;
  read_common(j, ctx, r);
  if (field(j, "prompt_logprobs")) {
    bad_field("prompt_logprobs", "is supported on /v1/completions only");
  }
  r.prompts.push_back(read_chat_prompt(j, body));
  read_tool_choice(j, ctx, field(j, "tools") != nullptr, r);
  r.parse_reasoning = ctx.reasoning_parser == "qwen3";
  // Unset: until the context is full (the engine ends the sample at max_model_len).
  r.params.max_tokens = ctx.max_model_len > 0 ? ctx.max_model_len : 16;
  read_sampling(j, r.params, {"max_completion_tokens", "max_tokens"});
  const std::optional<bool> logprobs = get_bool(j, "logprobs");
  const std::optional<int64_t> top = get_int(j, "top_logprobs", 0, SamplingParams::kMaxLogprobs);
  if (top && !logprobs.value_or(false)) bad_field("top_logprobs", "needs logprobs: true");
  if (logprobs.value_or(false)) {
    r.logprobs = static_cast<int>(top.value_or(0));
    r.params.logprobs = *r.logprobs;
  }
  return r;
}

Prompt parse_tokenize_request(const std::string& body) {
  const json j = parse_object(body);
  const json* prompt = field(j, "prompt");
  const json* messages = field(j, "messages");
  if ((prompt != nullptr) == (messages != nullptr)) {
    bad_field(prompt ? "prompt" : "messages",
              "give exactly one of \"prompt\" (a string) and \"messages\" (a chat)");
  }
  // add_special_tokens: Qwen3's tokenizer adds none either way.
  (void)get_bool(j, "add_special_tokens");
  if (auto strs = get_bool(j, "return_token_strs"); strs.value_or(false)) {
    bad_field("return_token_strs", "is not supported; /detokenize gives a token's text");
  }
  if (prompt) {
    if (!prompt->is_string()) bad_field("prompt", "must be a string, got " + shown(*prompt));
    return Prompt::from_text(prompt->get<std::string>());
  }
  return read_chat_prompt(j, body);
}

std::vector<int32_t> parse_detokenize_request(const std::string& body) {
  const json j = parse_object(body);
  const json* tokens = field(j, "tokens");
  if (!tokens) bad_field("tokens", "is required: a list of token ids");
  return token_list(*tokens, "tokens");
}

GenerateRequest parse_generate_request(const std::string& body) {
  const json j = parse_object(body);
  GenerateRequest g;
  const json* ids = field(j, "prompt_token_ids");
  if (!ids) ids = field(j, "input_ids");
  if (!ids) bad_field("prompt_token_ids", "is required: a list of token ids");
  g.prompt_token_ids = token_list(*ids, "prompt_token_ids");
  if (auto v = get_bool(j, "stream")) g.stream = *v;
  if (const json* v = field(j, "lora_name")) {
    if (!v->is_null()) {
      if (!v->is_string()) bad_field("lora_name", "must be a string (a loaded adapter's name) or null, got " + shown(*v));
      g.lora_name = v->get<std::string>();
    }
  }
  const json* sp = field(j, "sampling_params");
  json empty = json::object();
  if (sp && !sp->is_object()) bad_field("sampling_params", "must be an object, got " + shown(*sp));
  const json& s = sp ? *sp : empty;
  try {
    read_sampling(s, g.params, {"max_tokens", "max_new_tokens"});
    if (auto v = get_int(s, "logprobs", 0, SamplingParams::kMaxLogprobs)) {
      g.params.logprobs = static_cast<int>(*v);
    }
    if (auto v = get_bool(s, "processed_logprobs")) g.params.processed_logprobs = *v;
  } catch (const HttpError& e) {
    throw HttpError(400, std::string("sampling_params.") + e.what(), "sampling_params." + e.param);
  }
  return g;
}

namespace {

/// The non-empty string field `name` of a LoRA control body.
std::string required_name(const json& j, const char* name, const char* what) {
  const json* v = field(j, name);
  if (!v || v->is_null()) bad_field(name, std::string("is required: ") + what);
  if (!v->is_string() || v->get<std::string>().empty()) {
    bad_field(name, std::string("must be a non-empty string (") + what + "), got " + shown(*v));
  }
  return v->get<std::string>();
}

}  // namespace

LoadLoraRequest parse_load_lora_request(const std::string& body) {
  const json j = parse_object(body);
  LoadLoraRequest r;
  r.name = required_name(j, "lora_name", "the adapter's name, used as \"model\" in requests");
  r.path = required_name(j, "lora_path", "a PEFT adapter folder on the server's machine");
  if (const json* v = field(j, "lora_int_id"); v && !v->is_null()) {
    if (!v->is_number_integer()) bad_field("lora_int_id", "must be an integer, got " + shown(*v));
    r.id = v->get<int64_t>();
  }
  return r;
}

std::string parse_unload_lora_request(const std::string& body) {
  return required_name(parse_object(body), "lora_name", "the name of a loaded adapter");
}

std::optional<std::string> decode_base64(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '=' && text.size() - end < 2) --end;
  if (end % 4 == 1) return std::nullopt;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < end; ++i) {
    const int v = value(text[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

namespace {

// A weight tensor's "dtype" ("bfloat16", "float16", "float32") in the object at `at`.
TensorDType tensor_dtype_field(const json& t, const std::string& at) {
  auto dtype = t.find("dtype");
  const std::string d = dtype != t.end() && dtype->is_string() ? dtype->get<std::string>() : "";
  if (d == "bfloat16") return TensorDType::kBFloat16;
  if (d == "float16") return TensorDType::kFloat16;
  if (d == "float32") return TensorDType::kFloat32;
  bad_field(at + ".dtype", "must be \"bfloat16\", \"float16\" or \"float32\"");
}

// A tensor's "shape" (sizes >= 0) in the object at `at`.
std::vector<int64_t> shape_field(const json& t, const std::string& at) {
  auto shape = t.find("shape");
  if (shape == t.end() || !shape->is_array()) bad_field(at + ".shape", "must be a list of sizes");
  std::vector<int64_t> out;
  for (const json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      bad_field(at + ".shape", "must be a list of sizes (integers >= 0), got " + shown(*shape));
    }
    out.push_back(dim.get<int64_t>());
  }
  return out;
}

// A non-empty string field `name` of `j`, or nullopt when absent or null.
std::optional<std::string> get_string(const json& j, const char* name, const std::string& at) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_field(at, "must be a string, got " + shown(*v));
  return v->get<std::string>();
}

}  // namespace

WeightGroupSpec parse_init_weights_group(const json& body, int engine_ranks) {
  WeightGroupSpec spec;
  const std::string transport = get_string(body, "backend", "backend").value_or("nccl");
  if (transport != "nccl" && transport != "tcp") {
    bad_field("backend", "must be \"nccl\" or \"tcp\", got \"" + transport + "\"");
  }
  spec.transport = transport;
  if (transport == "nccl") {
    const std::optional<std::string> id = get_string(body, "unique_id", "unique_id");
    std::optional<std::string> bytes;
    if (id) bytes = decode_base64(*id);
    if (!bytes || bytes->size() != 128) {
      bad_field("unique_id", "must be the base64 of ncclGetUniqueId's 128 bytes (backend nccl)");
    }
    spec.nccl_unique_id.assign(bytes->begin(), bytes->end());
  } else {
    const std::optional<std::string> host = get_string(body, "master_address", "master_address");
    if (!host || host->empty()) {
      bad_field("master_address", "the host where the trainer listens is required (backend tcp)");
    }
    const std::optional<int64_t> port = get_int(body, "master_port", 1, 65535);
    if (!port) bad_field("master_port", "the port where the trainer listens is required (backend tcp)");
    const bool v6 = host->find(':') != std::string::npos;
    spec.address = (v6 ? "[" + *host + "]" : *host) + ":" + std::to_string(*port);
    if (std::optional<float> t = get_float(body, "timeout_seconds")) {
      if (*t <= 0) bad_field("timeout_seconds", "must be > 0");
      spec.timeout_seconds = *t;
    }
  }
  spec.rank = static_cast<int>(get_int(body, "rank_offset", 1, 1 << 20).value_or(1));
  spec.world_size = static_cast<int>(
      get_int(body, "world_size", 2, 1 << 20).value_or(spec.rank + engine_ranks));
  if (int64_t{spec.rank} + engine_ranks > spec.world_size) {
    bad_field("rank_offset",
              engine_ranks == 1
                  ? "must be below world_size (" + std::to_string(spec.world_size) +
                        "; the trainer is rank 0), got " + std::to_string(spec.rank)
                  : "the engine's " + std::to_string(engine_ranks) +
                        " tensor-parallel ranks join as rank_offset .. rank_offset + " +
                        std::to_string(engine_ranks - 1) + ", which must lie below world_size (" +
                        std::to_string(spec.world_size) + "; the trainer is rank 0), got " +
                        std::to_string(spec.rank));
  }
  spec.name = get_string(body, "group_name", "group_name").value_or("");
  return spec;
}

BroadcastUpdateRequest parse_broadcast_update(const json& broadcast) {
  if (!broadcast.is_object()) {
    bad_field("broadcast", "must be an object {tensors, bucket_bytes, group_name}, got " +
                               shown(broadcast));
  }
  BroadcastUpdateRequest out;
  const json* list = field(broadcast, "tensors");
  if (!list || !list->is_array() || list->empty()) {
    bad_field("broadcast.tensors", "must be a non-empty list of {name, dtype, shape}");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const json& t = (*list)[i];
    const std::string at = "broadcast.tensors[" + std::to_string(i) + "]";
    if (!t.is_object()) bad_field(at, "must be an object, got " + shown(t));
    BroadcastTensor b;
    const std::optional<std::string> name = get_string(t, "name", at + ".name");
    if (!name || name->empty()) bad_field(at + ".name", "must be a parameter's name (a non-empty string)");
    b.name = *name;
    b.dtype = tensor_dtype_field(t, at);
    b.shape = shape_field(t, at);
    out.tensors.push_back(std::move(b));
  }
  const std::optional<int64_t> bucket =
      get_int(broadcast, "bucket_bytes", 1, std::numeric_limits<int64_t>::max());
  if (!bucket) bad_field("broadcast.bucket_bytes", "the trainer's bucket size in bytes is required");
  out.bucket_bytes = static_cast<uint64_t>(*bucket);
  out.group_name = get_string(broadcast, "group_name", "broadcast.group_name").value_or("");
  // Sizes too large to pack are the engine's to refuse (plan_broadcast_buckets, a 400).
  return out;
}

std::vector<IpcTensor> parse_ipc_tensors(const json& list) {
  if (!list.is_array() || list.empty()) {
    bad_field("ipc_tensors", "must be a non-empty list of {name, handle, offset, dtype, shape}");
  }
  std::vector<IpcTensor> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string at = "ipc_tensors[" + std::to_string(i) + "]";
    if (!t.is_object()) bad_field(at, "must be an object, got " + shown(t));
    IpcTensor ipc;
    auto name = t.find("name");
    if (name == t.end() || !name->is_string() || name->get<std::string>().empty()) {
      bad_field(at + ".name", "must be a parameter's name (a non-empty string)");
    }
    ipc.name = name->get<std::string>();
    auto handle = t.find("handle");
    std::optional<std::string> bytes;
    if (handle != t.end() && handle->is_string()) bytes = decode_base64(handle->get<std::string>());
    if (!bytes || bytes->size() != ipc.handle.size()) {
      bad_field(at + ".handle", "must be the base64 of a 64-byte cudaIpcMemHandle_t");
    }
    std::copy(bytes->begin(), bytes->end(), ipc.handle.begin());
    if (auto v = get_int(t, "offset", 0, std::numeric_limits<int64_t>::max())) {
      ipc.offset = static_cast<uint64_t>(*v);
    }
    ipc.dtype = tensor_dtype_field(t, at);
    ipc.shape = shape_field(t, at);
    out.push_back(std::move(ipc));
  }
  return out;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json finish_json(const CompletionOutput& o) {
  return o.finished() ? json(finish_reason_openai(o.finish_reason)) : json(nullptr);
}

std::string token_text(int32_t id, const DecodeFn& decode) { return decode({id}, false); }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

/// Completions' legacy logprobs object for the tokens of `o`; offset: the text length
/// before them (for text_offset). With `prompt` (echo with logprobs), the prompt's tokens
/// come first, from offset 0: the first with null logprobs (nothing precedes it).
json completion_logprobs(const CompletionOutput& o, int k, size_t offset, const DecodeFn& decode,
                         const std::vector<int32_t>& prompt_ids, const ScoreOutput* prompt) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  auto top_object = [&](const std::vector<TokenLogprob>& alts) {
    json top = json::object();
    for (const TokenLogprob& alt : alts) top[token_text(alt.token_id, decode)] = alt.logprob;
    return top;
  };
  if (prompt) {
    size_t at = 0;
    for (size_t t = 0; t < prompt_ids.size(); ++t) {
      const std::string text = token_text(prompt_ids[t], decode);
      tokens.push_back(text);
      offsets.push_back(at);
      at += text.size();
      const bool scored = t > 0 && t - 1 < prompt->logprobs.size();
      lps.push_back(scored ? json(prompt->logprobs[t - 1]) : json(nullptr));
      tops.push_back(scored && k > 0 && t - 1 < prompt->top_logprobs.size()
                         ? top_object(prompt->top_logprobs[t - 1])
                         : json(nullptr));
    }
  }
  for (size_t t = 0; t < o.token_ids.size(); ++t) {
    const std::string text = token_text(o.token_ids[t], decode);
    tokens.push_back(text);
    lps.push_back(t < o.logprobs.size() ? o.logprobs[t] : 0.0f);
    offsets.push_back(offset);
    offset += text.size();
    tops.push_back(k > 0 && t < o.top_logprobs.size() ? top_object(o.top_logprobs[t])
                                                      : json(nullptr));
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

/// vLLM's prompt_logprobs: null for the first token, then per token {"<id>": {"logprob",
/// "rank", "decoded_token"}} for the token itself and the k most likely at its position.
json vllm_prompt_logprobs(const std::vector<int32_t>& ids, const ScoreOutput& s, int k,
                          const DecodeFn& decode) {
  json out = json::array({nullptr});
  for (size_t t = 1; t < ids.size() && t - 1 < s.logprobs.size(); ++t) {
    json entry = json::object();
    if (k > 0 && t - 1 < s.top_logprobs.size()) {
      const std::vector<TokenLogprob>& alts = s.top_logprobs[t - 1];
      for (size_t i = 0; i < alts.size() && i < static_cast<size_t>(k); ++i) {
        entry[std::to_string(alts[i].token_id)] = {
            {"logprob", alts[i].logprob},
            {"rank", static_cast<int>(i) + 1},
            {"decoded_token", token_text(alts[i].token_id, decode)}};
      }
    }
    entry[std::to_string(ids[t])] = {{"logprob", s.logprobs[t - 1]},
                                     {"rank", t - 1 < s.ranks.size() ? s.ranks[t - 1] : 0},
                                     {"decoded_token", token_text(ids[t], decode)}};
    out.push_back(std::move(entry));
  }
  return out;
}

json chat_logprobs(const CompletionOutput& o, int k, const DecodeFn& decode) {
  json content = json::array();
  for (size_t t = 0; t < o.token_ids.size(); ++t) {
    const std::string text = token_text(o.token_ids[t], decode);
    json top = json::array();
    if (k > 0 && t < o.top_logprobs.size()) {
      for (const TokenLogprob& alt : o.top_logprobs[t]) {
        const std::string alt_text = token_text(alt.token_id, decode);
        top.push_back({{"token", alt_text}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt_text)}});
      }
    }
    content.push_back({{"token", text},
                       {"logprob", t < o.logprobs.size() ? o.logprobs[t] : 0.0f},
                       {"bytes", bytes_of(text)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool stream) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    json call = {{"id", c.id},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (stream) call["index"] = c.index;
    out.push_back(std::move(call));
  }
  return out;
}

/// A chat choice's message (or a stream's delta) from its parsed pieces. A whole message
/// has content null when it holds only reasoning or tool calls, and reasoning_content
/// whenever the request parses reasoning; a delta says only what it adds.
json parsed_message(const OpenAiRequest& r, const ChatPieces& p, bool first) {
  json m = json::object();
  if (!r.stream) {
    const bool other = !p.reasoning.empty() || !p.tool_calls.empty();
    m["content"] = p.content.empty() && other ? json(nullptr) : json(p.content);
    if (r.parse_reasoning) {
      m["reasoning_content"] = p.reasoning.empty() ? json(nullptr) : json(p.reasoning);
    }
    if (!p.tool_calls.empty()) m["tool_calls"] = tool_calls_json(p.tool_calls, false);
    return m;
  }
  if (!p.reasoning.empty()) m["reasoning_content"] = p.reasoning;
  if (!p.content.empty() || (first && p.empty())) m["content"] = p.content;
  if (!p.tool_calls.empty()) m["tool_calls"] = tool_calls_json(p.tool_calls, true);
  return m;
}

json choice_json(const OpenAiRequest& r, int index, const CompletionOutput& o,
                 const std::vector<int32_t>& prompt_ids, const std::string& prompt_text,
                 bool streamed_first, const DecodeFn& decode, const ChunkExtras& extras) {
  json c = {{"index", index}, {"finish_reason", finish_json(o)}};
  if (extras.called_tools && o.finished() && c["finish_reason"] == "stop") {
    c["finish_reason"] = "tool_calls";
  }
  const bool first = !r.stream || streamed_first;
  if (r.chat) {
    json message = extras.pieces ? parsed_message(r, *extras.pieces, first)
                                 : json{{"content", o.text}};
    if (first) message["role"] = "assistant";
    c[r.stream ? "delta" : "message"] = message;
    c["logprobs"] = r.logprobs ? chat_logprobs(o, *r.logprobs, decode) : json(nullptr);
  } else {
    const std::string before = (r.echo && first) ? prompt_text : "";
    const ScoreOutput* prompt = r.echo && first ? extras.prompt_score : nullptr;
    c["text"] = before + o.text;
    c["logprobs"] = r.logprobs ? completion_logprobs(o, *r.logprobs, before.size(), decode,
                                                     prompt_ids, prompt)
                               : json(nullptr);
    if (r.prompt_logprobs && first && extras.prompt_score) {
      c["prompt_logprobs"] =
          vllm_prompt_logprobs(prompt_ids, *extras.prompt_score, *r.prompt_logprobs, decode);
    }
  }
  if (r.return_token_ids) {
    if (first) c["prompt_token_ids"] = prompt_ids;
    c["token_ids"] = o.token_ids;
  }
  if (r.stream && o.finished() && !r.chat) c["stop_reason"] = nullptr;
  return c;
}

json envelope(const OpenAiRequest& r, const ResponseMeta& meta, bool chunk) {
  const char* object = r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                              : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

std::string tool_call_id_prefix(const ResponseMeta& meta, int choice_index) {
  return "call-" + meta.id + "-" + std::to_string(choice_index) + "-";
}

json format_response(const OpenAiRequest& r, const ResponseMeta& meta,
                     const std::vector<RequestOutput>& outputs, const DecodeFn& decode,
                     const std::vector<ScoreOutput>& prompt_scores) {
  json out = envelope(r, meta, false);
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t p = 0; p < outputs.size(); ++p) {
    const RequestOutput& ro = outputs[p];
    prompt_tokens += static_cast<int64_t>(ro.prompt_token_ids.size());
    const std::string prompt_text =
        r.echo ? (ro.prompt.empty() ? decode(ro.prompt_token_ids, true) : ro.prompt) : "";
    for (const CompletionOutput& o : ro.outputs) {
      completion_tokens += static_cast<int64_t>(o.token_ids.size());
      const int index = static_cast<int>(p) * r.params.n + o.index;
      ChunkExtras extras;
      if (p < prompt_scores.size()) extras.prompt_score = &prompt_scores[p];
      ChatPieces pieces;
      if (r.chat && (r.parse_reasoning || r.parse_tool_calls)) {
        ChatOutputParser parser(r.parse_reasoning, r.parse_tool_calls,
                                prompt_opens_thinking(ro.prompt),
                                tool_call_id_prefix(meta, index));
        pieces = parser.feed(o.text);
        pieces.append(parser.finish());
        extras.pieces = &pieces;
        extras.called_tools = parser.tool_calls() > 0;
      }
      choices.push_back(
          choice_json(r, index, o, ro.prompt_token_ids, prompt_text, false, decode, extras));
    }
  }
  // Choices in index order (samples of a request may arrive in any order).
  std::sort(choices.begin(), choices.end(),
            [](const json& a, const json& b) { return a["index"] < b["index"]; });
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(prompt_tokens, completion_tokens);
  return out;
}

json format_chunk(const OpenAiRequest& r, const ResponseMeta& meta, int choice_index,
                  const CompletionOutput& delta, const std::vector<int32_t>& prompt_token_ids,
                  bool first, const std::string& prompt_text, const DecodeFn& decode,
                  const ChunkExtras& extras) {
  json out = envelope(r, meta, true);
  out["choices"] = json::array({choice_json(r, choice_index, delta, prompt_token_ids,
                                            prompt_text, first, decode, extras)});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json format_usage_chunk(const OpenAiRequest& r, const ResponseMeta& meta, int64_t prompt_tokens,
                        int64_t completion_tokens) {
  json out = envelope(r, meta, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(prompt_tokens, completion_tokens);
  return out;
}

json format_generate(const RequestOutput& output, const SamplingParams& params) {
  json outs = json::array();
  for (const CompletionOutput& o : output.outputs) {
    json j = {{"index", o.index},
              {"token_ids", o.token_ids},
              {"logprobs", o.logprobs},
              {"cumulative_logprob", o.cumulative_logprob},
              {"weights_versions", o.weights_versions},
              {"finish_reason", o.finished() ? json(finish_reason_name(o.finish_reason)) : json(nullptr)}};
    if (params.processed_logprobs) j["processed_logprobs"] = o.processed_logprobs;
    if (params.logprobs > 0) {
      auto pairs = [](const std::vector<std::vector<TokenLogprob>>& lists) {
        json all = json::array();
        for (const auto& list : lists) {
          json one = json::array();
          for (const TokenLogprob& t : list) one.push_back({t.token_id, t.logprob});
          all.push_back(std::move(one));
        }
        return all;
      };
      j["top_logprobs"] = pairs(o.top_logprobs);
      j["logprob_ranks"] = o.logprob_ranks;
      if (params.processed_logprobs) j["processed_top_logprobs"] = pairs(o.processed_top_logprobs);
    }
    if (!o.error.empty()) j["error"] = o.error;
    outs.push_back(std::move(j));
  }
  json j = {{"request_id", output.request_id},
            {"weights_version", output.weights_version},
            {"finished", output.finished},
            {"outputs", outs}};
  if (!output.prompt_token_ids.empty()) j["prompt_token_ids"] = output.prompt_token_ids;
  return j;
}

std::string sse_event(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace pagellm::server
