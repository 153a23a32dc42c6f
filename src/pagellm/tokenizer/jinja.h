// A small Jinja2 interpreter for chat templates.
//
// It runs what chat templates (Qwen3's and its relatives) use, with the semantics of
// Jinja 3.1 as configured by transformers (trim_blocks, lstrip_blocks, loop controls, an
// immutable sandbox) and Python's behaviour for values (str(), repr(), ==, +, slicing,
// string methods). Supported:
//   tags      if/elif/else, for (with else, `if` filter, tuple targets, loop.*), set (to a
//             name, a tuple of names, namespace.attr, or a block), macro (positional and
//             keyword arguments with defaults), with, break, continue, raw, generation
//             (rendered as its body), comments, whitespace control (-, +)
//   operators and or not, == != < <= > >= in, not in, is [not] <test>, + - * / // % **, ~,
//             unary -, conditional `a if c else b`, literals (str, int, float, list, tuple,
//             dict, true/false/none), attribute and item access, slices, calls
//   filters   length count tojson string int float lower upper title capitalize trim
//             default d first last join list items replace reverse sort map selectattr
//             rejectattr select reject abs round indent safe unique min max sum dictsort
//             wordcount center
//   tests     defined undefined none boolean true false integer float number string
//             mapping iterable sequence callable sameas odd even divisibleby eq equalto ne
//             lt le gt ge in lower upper
//   methods   str: startswith endswith split rsplit splitlines strip lstrip rstrip upper
//             lower title capitalize replace find rfind index count join isdigit isalpha
//             isalnum isspace isupper islower removeprefix removesuffix zfill;
//             dict: items keys values get; list: index count
//   globals   range dict namespace raise_exception strftime_now (and what the caller adds)
// Anything else (include, extends, import, call blocks, filter blocks, an unknown filter
// or test) is a parse error naming the construct and its line.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace pagellm::jinja {

class Value;

/// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(CallArgs&)>;

/// A Jinja/Python value. Lists, dicts and functions are shared by reference (as in
/// Python); only namespaces are ever mutated.
class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  struct ListData {
    std::vector<Value> items;
    bool is_tuple = false;
  };
  struct DictData {
    std::vector<std::pair<std::string, Value>> items;  // insertion order, unique keys
    bool is_namespace = false;
    const Value* find(std::string_view key) const;
    void set(const std::string& key, Value value);
  };
  struct FunctionData {
    std::string name;
    Function call;
  };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::kBool), int_(b) {}
  Value(int v) : kind_(Kind::kInt), int_(v) {}
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}
  Value(double v) : kind_(Kind::kFloat), float_(v) {}
  Value(std::string s) : kind_(Kind::kString), string_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : kind_(Kind::kString), string_(std::make_shared<const std::string>(s)) {}

  /// An undefined value; `hint` says what was looked up (for error messages).
  static Value undefined(std::string hint);
  static Value none();
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<std::string, Value>> items = {});
  static Value namespace_(std::vector<std::pair<std::string, Value>> items = {});
  static Value function(std::string name, Function call);
  /// Converts JSON (objects keep their key order).
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && dict_->is_namespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // also for bool
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return string_ ? *string_ : empty_string(); }
  const std::string& undefined_hint() const { return as_string(); }
  const ListData& list_data() const { return *list_; }
  const DictData& dict_data() const { return *dict_; }
  DictData& mutable_dict_data() const { return *dict_; }
  const FunctionData& function_data() const { return *function_; }
  /// Identity of a shared object (for the `sameas` test).
  const void* identity() const;

  /// Python truthiness.
  bool truthy() const;
  /// Python's type name ("str", "int", "dict", "NoneType", ...), for error messages.
  std::string type_name() const;

 private:
  static const std::string& empty_string();

  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;  // shared: copying a Value is cheap
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<FunctionData> function_;
};

/// The largest string or printed value a template may build (bytes), and the longest
/// list; beyond them rendering fails with an Error instead of exhausting memory.
inline constexpr size_t kMaxTextBytes = size_t{64} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 20;

/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python str(): what {{ value }} prints (undefined prints nothing).
std::string to_str(const Value& value);
/// Python repr().
std::string to_repr(const Value& value);
/// Python repr() of a float ("1.0", "1e+16", "0.0001", "inf").
std::string float_repr(double value);

/// Options of Python's json.dumps as transformers' tojson passes them.
struct JsonOptions {
  bool ensure_ascii = false;
  bool indent_set = false;   // indent=None when false
  std::string indent;        // the indent unit when set
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
/// Python json.dumps(value, ...). Throws Error for values JSON cannot hold.
std::string to_json(const Value& value, const JsonOptions& options);

struct Node;

/// A parsed template. Immutable; render() may run on several threads at once.
class Template {
 public:
  /// Parses `source` with transformers' settings. Throws Error ("chat template line N:
  /// ...") for syntax errors and unsupported constructs.
  explicit Template(std::string_view source);
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  /// Renders with `variables` (name -> value) on top of the built-in globals.
  std::string render(const std::vector<std::pair<std::string, Value>>& variables) const;

 private:
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace pagellm::jinja
