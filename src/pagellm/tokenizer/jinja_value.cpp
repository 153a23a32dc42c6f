// Jinja values with Python semantics: equality, str(), repr(), json.dumps.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/jinja.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm::jinja {

const Value* Value::DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::DictData::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const std::string& Value::empty_string() {
  static const std::string empty;
  return empty;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.string_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->is_tuple = is_tuple;
  return v;
}

Value Value::dict(std::vector<std::pair<std::string, Value>> items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<DictData>();
  for (auto& [key, value] : items) v.dict_->set(key, std::move(value));
  return v;
}

Value Value::namespace_(std::vector<std::pair<std::string, Value>> items) {
  Value v = dict(std::move(items));
  v.dict_->is_namespace = true;
  return v;
}

Value Value::function(std::string name, Function call) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::make_shared<FunctionData>(FunctionData{std::move(name), std::move(call)});
  return v;
}

namespace {
constexpr int kMaxJsonDepth = 256;

Value from_json_at(const nlohmann::ordered_json& json, int depth);
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& json) { return from_json_at(json, 0); }

namespace {
Value from_json_at(const nlohmann::ordered_json& json, int depth) {
  PAGELLM_CHECK(depth < kMaxJsonDepth) << "chat template input nests deeper than " << kMaxJsonDepth << " levels";
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) items.emplace_back(it.key(), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(items));
    }
    default:
      PAGELLM_FAIL() << "unsupported JSON value in chat template input (binary or discarded)";
  }
}
}  // namespace

const void* Value::identity() const {
  switch (kind_) {
    case Kind::kList: return list_.get();
    case Kind::kDict: return dict_.get();
    case Kind::kFunction: return function_.get();
    default: return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !list_->items.empty();
    case Kind::kDict: return dict_->is_namespace || !dict_->items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return list_->is_tuple ? "tuple" : "list";
    case Kind::kDict: return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "object";
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() != K::kFloat && b.kind() != K::kFloat) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.as_string() == b.as_string();
    case K::kList: {
      const auto& x = a.list_data();
      const auto& y = b.list_data();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.is_namespace() || b.is_namespace()) return a.identity() == b.identity();
      const auto& x = a.dict_data();
      const auto& y = b.dict_data();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [key, value] : x.items) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    case K::kFunction: return a.identity() == b.identity();
    default: return false;
  }
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest digits that round-trip.
  char buffer[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  std::string text(buffer);
  std::string sign;
  if (text[0] == '-') {
    sign = "-";
    text.erase(0, 1);
  }
  const size_t e_pos = text.find('e');
  const int exponent = std::atoi(text.c_str() + e_pos + 1);
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exponent + 1;  // position of the decimal point relative to digits
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return sign + out;
}

namespace {

bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  char buffer[16];
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = utf8::next_code_point(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (is_printable(cp)) {
      out.append(s, start, pos - start);
    } else if (cp <= 0xFF) {
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", static_cast<unsigned>(cp));
      out += buffer;
    } else if (cp <= 0xFFFF) {
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(cp));
      out += buffer;
    } else {
      std::snprintf(buffer, sizeof(buffer), "\\U%08x", static_cast<unsigned>(cp));
      out += buffer;
    }
  }
  out.push_back(quote);
  return out;
}

void check_printed_size(const std::string& out) {
  PAGELLM_CHECK(out.size() <= kMaxTextBytes)
      << "a value printed by the template is larger than " << (kMaxTextBytes >> 20) << " MiB";
}

// The containers whose repr is being built on this thread, outermost first. A namespace
// can hold a value that holds the namespace ({% set ns.x = (ns, 1) %}): printed, such a
// value recurses back into itself. Python's repr prints the inner occurrence as "[...]"
// or "{...}"; without the guard the recursion would only end with the stack.
thread_local std::vector<const void*> containers_in_repr;

class ReprGuard {
 public:
  explicit ReprGuard(const void* container)
      : repeated_(std::find(containers_in_repr.begin(), containers_in_repr.end(), container) !=
                  containers_in_repr.end()) {
    if (!repeated_) containers_in_repr.push_back(container);
  }
  ~ReprGuard() {
    if (!repeated_) containers_in_repr.pop_back();
  }
  ReprGuard(const ReprGuard&) = delete;
  ReprGuard& operator=(const ReprGuard&) = delete;
  /// The container is already being printed further out: print its placeholder.
  bool repeated() const { return repeated_; }

 private:
  bool repeated_;
};

std::string container_repr(const Value& value) {
  if (value.is_list()) {
    const auto& data = value.list_data();
    const ReprGuard guard(&data);
    if (guard.repeated()) return data.is_tuple ? "(...)" : "[...]";
    std::string out = data.is_tuple ? "(" : "[";
    for (size_t i = 0; i < data.items.size(); ++i) {
      if (i > 0) out += ", ";
      out += to_repr(data.items[i]);
      check_printed_size(out);
    }
    if (data.is_tuple && data.items.size() == 1) out += ",";
    out += data.is_tuple ? ")" : "]";
    return out;
  }
  const auto& data = value.dict_data();
  const ReprGuard guard(&data);
  if (guard.repeated()) return data.is_namespace ? "<Namespace {...}>" : "{...}";
  std::string out = "{";
  for (size_t i = 0; i < data.items.size(); ++i) {
    if (i > 0) out += ", ";
    out += string_repr(data.items[i].first) + ": " + to_repr(data.items[i].second);
    check_printed_size(out);
  }
  out += "}";
  if (data.is_namespace) return "<Namespace " + out + ">";
  return out;
}

}  // namespace

std::string to_str(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return value.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(value.as_int());
    case Value::Kind::kFloat: return float_repr(value.as_float());
    case Value::Kind::kString: return value.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict: return container_repr(value);
    case Value::Kind::kFunction: return "<function " + value.function_data().name + ">";
  }
  return "";
}

std::string to_repr(const Value& value) {
  if (value.is_string()) return string_repr(value.as_string());
  if (value.is_undefined()) return "Undefined";
  return to_str(value);
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  size_t pos = 0;
  char buffer[16];
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = utf8::next_code_point(s, pos);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        std::snprintf(buffer, sizeof(buffer), "\\u%04x\\u%04x", 0xD800 + static_cast<unsigned>(v >> 10),
                      0xDC00 + static_cast<unsigned>(v & 0x3FF));
      } else {
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buffer;
    } else {
      out.append(s, start, pos - start);
    }
  }
  out.push_back('"');
}

void json_value(std::string& out, const Value& value, const JsonOptions& options, int level) {
  check_printed_size(out);
  auto newline = [&](int depth) {
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += options.indent;
  };
  switch (value.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += value.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(value.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = value.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(f);
      return;
    }
    case Value::Kind::kString: json_string(out, value.as_string(), options.ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = value.list_data().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += options.item_separator;
        if (options.indent_set) newline(level + 1);
        json_value(out, items[i], options, level + 1);
      }
      if (options.indent_set) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::kDict: {
      PAGELLM_CHECK(!value.is_namespace()) << "Object of type Namespace is not JSON serializable";
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : value.dict_data().items) items.push_back(&item);
      if (options.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      if (items.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += options.item_separator;
        if (options.indent_set) newline(level + 1);
        json_string(out, items[i]->first, options.ensure_ascii);
        out += options.key_separator;
        json_value(out, items[i]->second, options, level + 1);
      }
      if (options.indent_set) newline(level);
      out.push_back('}');
      return;
    }
    default:
      PAGELLM_FAIL() << "Object of type " << value.type_name() << " is not JSON serializable"
                     << (value.is_undefined() && !value.undefined_hint().empty()
                             ? " (" + value.undefined_hint() + ")"
                             : std::string());
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  json_value(out, value, options, 0);
  return out;
}

}  // namespace pagellm::jinja
