// Jinja evaluation: scopes, statements, operators, filters, tests, methods, globals.
// Semantics follow Jinja 3.1's ImmutableSandboxedEnvironment over Python values; where a
// Python operation raises, we throw Error with the same kind of message.
#include <utf8proc.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/jinja_ast.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm::jinja {
namespace {

// ---- small helpers ------------------------------------------------------------------

[[noreturn]] void fail(int line, const std::string& message) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

// Resource limits: a chat template comes with the model, and rendering must neither hang
// nor exhaust memory whatever it says.
constexpr size_t kMaxStringBytes = kMaxTextBytes;  // any string the template builds
constexpr int64_t kMaxSteps = 20'000'000;             // evaluated expressions and statements

void check_size(size_t size, int line) {
  if (size > kMaxStringBytes) {
    fail(line, "the template builds a value larger than " + std::to_string(kMaxStringBytes >> 20) + " MiB");
  }
}

void check_items(size_t count, int line) {
  if (count > kMaxListItems) {
    fail(line, "the template builds a list longer than " + std::to_string(kMaxListItems) + " items");
  }
}

std::string undefined_message(const Value& v) {
  return v.undefined_hint().empty() ? "a value is undefined" : v.undefined_hint();
}

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out.push_back(utf8::next_code_point(s, pos));
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) utf8::append_code_point(out, cp);
  return out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

char32_t to_upper(char32_t cp) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))); }
char32_t to_lower(char32_t cp) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }

bool is_cased_upper(char32_t cp) { return to_lower(cp) != cp; }
bool is_cased_lower(char32_t cp) { return to_upper(cp) != cp; }

bool is_alpha(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool is_digit(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ND; }
bool is_numeric(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) utf8::append_code_point(out, f(utf8::next_code_point(s, pos)));
  return out;
}

// Python str.strip family. `chars` null: whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string text = to_u32(s);
  std::u32string set;
  const bool whitespace = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!whitespace) {
    PAGELLM_CHECK(chars->is_string()) << "strip arg must be None or str, not " << chars->type_name();
    set = to_u32(chars->as_string());
  }
  auto strippable = [&](char32_t cp) {
    return whitespace ? utf8::is_python_space(cp) : set.find(cp) != std::u32string::npos;
  };
  size_t begin = 0, end = text.size();
  if (left) while (begin < end && strippable(text[begin])) ++begin;
  if (right) while (end > begin && strippable(text[end - 1])) --end;
  return from_u32(text.substr(begin, end - begin));
}

// Python str.split / rsplit.
std::vector<Value> split(const std::string& s, const Value* sep_value, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep_value == nullptr || sep_value->is_none()) {
    // Whitespace split: runs of whitespace separate, leading/trailing ignored.
    std::u32string text = to_u32(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (i < text.size()) {
        while (i < text.size() && utf8::is_python_space(text[i])) ++i;
        if (i >= text.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(text.substr(i));  // the rest keeps its trailing whitespace
          break;
        }
        size_t j = i;
        while (j < text.size() && !utf8::is_python_space(text[j])) ++j;
        words.push_back(text.substr(i, j - i));
        i = j;
      }
    } else {
      size_t i = text.size();
      while (i > 0) {
        while (i > 0 && utf8::is_python_space(text[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(text.substr(0, i));  // the rest keeps its leading whitespace
          break;
        }
        size_t j = i;
        while (j > 0 && !utf8::is_python_space(text[j - 1])) --j;
        words.push_back(text.substr(j, i - j));
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    std::vector<Value> out;
    for (auto& w : words) out.emplace_back(from_u32(w));
    return out;
  }
  PAGELLM_CHECK(sep_value->is_string()) << "must be str or None, not " << sep_value->type_name();
  const std::string& sep = sep_value->as_string();
  PAGELLM_CHECK(!sep.empty()) << "empty separator";
  if (!from_right) {
    size_t start = 0;
    int64_t splits = 0;
    for (;;) {
      const size_t at = (maxsplit < 0 || splits < maxsplit) ? s.find(sep, start) : std::string::npos;
      if (at == std::string::npos) {
        parts.push_back(s.substr(start));
        break;
      }
      parts.push_back(s.substr(start, at - start));
      start = at + sep.size();
      ++splits;
    }
  } else {
    size_t end = s.size();
    int64_t splits = 0;
    for (;;) {
      size_t at = std::string::npos;
      if ((maxsplit < 0 || splits < maxsplit) && end >= sep.size()) at = s.rfind(sep, end - sep.size());
      if (at == std::string::npos) {
        parts.push_back(s.substr(0, end));
        break;
      }
      parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
      end = at;
      ++splits;
    }
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::string replace_all(const std::string& s, const std::string& old_text, const std::string& new_text,
                        int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts the replacement between every code point (and at both ends).
    std::u32string text = to_u32(s);
    int64_t done = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (i < text.size()) utf8::append_code_point(out, text[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (;;) {
    const size_t at = (count < 0 || done < count) ? s.find(old_text, start) : std::string::npos;
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += new_text;
    start = at + old_text.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python's str.title(): a cased character after an uncased one is uppercased, others lowered.
std::string python_title(const std::string& s) {
  std::string out;
  size_t pos = 0;
  bool previous_cased = false;
  while (pos < s.size()) {
    const char32_t cp = utf8::next_code_point(s, pos);
    const bool cased = is_cased_upper(cp) || is_cased_lower(cp) ||
                       utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_LT;
    utf8::append_code_point(out, previous_cased ? to_lower(cp) : to_upper(cp));
    previous_cased = cased;
  }
  return out;
}

std::string python_capitalize(const std::string& s) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    const char32_t cp = utf8::next_code_point(s, pos);
    utf8::append_code_point(out, first ? to_upper(cp) : to_lower(cp));
    first = false;
  }
  return out;
}

// Python slice index adjustment (PySlice_Unpack + PySlice_AdjustIndices).
std::vector<int64_t> slice_indices(int64_t length, const Value& start_v, const Value& stop_v,
                                   const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    PAGELLM_CHECK(v.is_int() || v.is_bool())
        << "slice " << what << " must be an integer or None, not " << v.type_name();
    return v.as_int();
  };
  const int64_t step = as_index(step_v, "step").value_or(1);
  PAGELLM_CHECK(step != 0) << "slice step cannot be zero";
  auto adjust = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t i = *index;
    if (i < 0) {
      i += length;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= length) {
      i = step < 0 ? length - 1 : length;
    }
    return i;
  };
  const int64_t start = adjust(as_index(start_v, "start"), step < 0 ? length - 1 : 0);
  const int64_t stop = adjust(as_index(stop_v, "stop"), step < 0 ? -1 : length);
  std::vector<int64_t> indices;
  // A step that takes the index past int64 ends the slice (the index is past it anyway).
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    indices.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return indices;
}

// Iteration as Python's iter() does it (an undefined value iterates as empty).
std::vector<Value> iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.list_data().items;
    case Value::Kind::kDict: {
      if (v.is_namespace()) fail(line, "'Namespace' object is not iterable");
      std::vector<Value> keys;
      for (const auto& item : v.dict_data().items) keys.emplace_back(item.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::string& s = v.as_string();
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t start = pos;
        utf8::next_code_point(s, pos);
        chars.emplace_back(s.substr(start, pos - start));
      }
      return chars;
    }
    default: fail(line, "'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length_of(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(code_point_count(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.list_data().items.size());
    case Value::Kind::kDict:
      if (!v.is_namespace()) return static_cast<int64_t>(v.dict_data().items.size());
      [[fallthrough]];
    default: fail(line, "object of type '" + v.type_name() + "' has no len()");
  }
}

// Python ordering for sort/min/max and < <= > >=.
int compare_values(const Value& a, const Value& b, int line) {
  if (a.is_undefined()) fail(line, undefined_message(a));
  if (b.is_undefined()) fail(line, undefined_message(b));
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float();
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list() && a.list_data().is_tuple == b.list_data().is_tuple) {
    const auto& x = a.list_data().items;
    const auto& y = b.list_data().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare_values(x[i], y[i], line);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  fail(line, "'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) fail(line, undefined_message(item));
        fail(line, "'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list_data().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (container.is_namespace()) fail(line, "argument of type 'Namespace' is not iterable");
      return item.is_string() && container.dict_data().find(item.as_string()) != nullptr;
    default: fail(line, "argument of type '" + container.type_name() + "' is not iterable");
  }
}

// Python float -> int conversion with range check.
int64_t float_to_int(double f, int line) {
  if (!std::isfinite(f) || f >= 9.2233720368547758e18 || f < -9.2233720368547758e18) {
    fail(line, "cannot convert float " + float_repr(f) + " to an integer");
  }
  return static_cast<int64_t>(f);
}

// Python's ints have no bound; this interpreter's are 64-bit, and a result past them is an
// error naming the operator rather than a wrapped (and undefined) value. Call with the
// overflow flag computed first: the result is written by the same builtin.
int64_t checked_int(bool overflowed, int64_t value, const std::string& op, int line) {
  if (overflowed) fail(line, "integer result of '" + op + "' overflows 64 bits");
  return value;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) fail(line, undefined_message(a));
  if (b.is_undefined()) fail(line, undefined_message(b));
  auto unsupported = [&]() -> Value {
    fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  const bool both_int = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size(), line);
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.list_data().is_tuple == b.list_data().is_tuple) {
      check_items(a.list_data().items.size() + b.list_data().items.size(), line);
      std::vector<Value> items = a.list_data().items;
      items.insert(items.end(), b.list_data().items.begin(), b.list_data().items.end());
      return Value::list(std::move(items), a.list_data().is_tuple);
    }
    if (a.is_string() || b.is_string()) {
      const Value& other = a.is_string() ? b : a;
      fail(line, "can only concatenate str (not \"" + other.type_name() + "\") to str");
    }
    if (both_int) {
      int64_t sum = 0;
      const bool overflowed = __builtin_add_overflow(a.as_int(), b.as_int(), &sum);
      return Value(checked_int(overflowed, sum, op, line));
    }
    if (a.is_number() && b.is_number()) return Value(a.as_float() + b.as_float());
    return unsupported();
  }
  if (op == "*") {
    auto repeat = [&](const Value& seq, int64_t n) -> Value {
      const size_t unit = seq.is_string() ? seq.as_string().size() : seq.list_data().items.size();
      const size_t limit = seq.is_string() ? kMaxStringBytes : kMaxListItems;
      // Nothing to repeat: the result is empty whatever the count (no loop over it).
      if (unit == 0) n = 0;
      if (n > 0 && static_cast<uint64_t>(n) > limit / unit) {
        if (seq.is_string()) check_size(kMaxStringBytes + 1, line);
        check_items(kMaxListItems + 1, line);
      }
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value(out);
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq.list_data().items.begin(), seq.list_data().items.end());
      }
      return Value::list(std::move(items), seq.list_data().is_tuple);
    };
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
    if (both_int) {
      int64_t product = 0;
      const bool overflowed = __builtin_mul_overflow(a.as_int(), b.as_int(), &product);
      return Value(checked_int(overflowed, product, op, line));
    }
    if (a.is_number() && b.is_number()) return Value(a.as_float() * b.as_float());
    return unsupported();
  }
  if (op == "%" && a.is_string()) fail(line, "unsupported Jinja construct: printf-style '%' string formatting");
  if (!a.is_number() || !b.is_number()) return unsupported();
  if (op == "-") {
    if (both_int) {
      int64_t difference = 0;
      const bool overflowed = __builtin_sub_overflow(a.as_int(), b.as_int(), &difference);
      return Value(checked_int(overflowed, difference, op, line));
    }
    return Value(a.as_float() - b.as_float());
  }
  if (op == "/") {
    if (b.as_float() == 0) fail(line, "division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (both_int) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) fail(line, "integer division or modulo by zero");
      if (y == -1) {  // x / -1 overflows for the smallest x; the remainder is 0
        int64_t negated = 0;
        const bool overflowed = __builtin_sub_overflow(int64_t{0}, x, &negated);
        return op == "//" ? Value(checked_int(overflowed, negated, op, line)) : Value(int64_t{0});
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return op == "//" ? Value(q) : Value(r);
    }
    // CPython's float_divmod.
    const double x = a.as_float(), y = b.as_float();
    if (y == 0) fail(line, "float division by zero");
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value(mod);
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, x / y);
    }
    return Value(floordiv);
  }
  if (op == "**") {
    if (both_int && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {  // square and multiply
        if (e & 1) {
          const bool overflowed = __builtin_mul_overflow(result, base, &result);
          result = checked_int(overflowed, result, op, line);
        }
        if (e > 1) {
          // A square past 64 bits is always multiplied in later (a higher bit of e is set)
          // into a result that is then past 64 bits too.
          const bool overflowed = __builtin_mul_overflow(base, base, &base);
          base = checked_int(overflowed, base, op, line);
        }
      }
      return Value(result);
    }
    return Value(std::pow(a.as_float(), b.as_float()));
  }
  return unsupported();
}

// ---- arguments ----------------------------------------------------------------------

// Binds call arguments to a Python-style signature.
class Args {
 public:
  Args(CallArgs& args, std::vector<std::string> names, const std::string& what, int line)
      : args_(args), names_(std::move(names)), what_(what), line_(line) {
    if (args.positional.size() > names_.size()) {
      fail(line, what + " takes at most " + std::to_string(names_.size()) + " argument(s), got " +
                     std::to_string(args.positional.size()));
    }
    for (const auto& [key, value] : args.keyword) {
      if (std::find(names_.begin(), names_.end(), key) == names_.end()) {
        fail(line, what + " got an unexpected keyword argument '" + key + "'");
      }
    }
  }
  const Value* get(size_t index) const {
    if (index < args_.positional.size()) return &args_.positional[index];
    for (const auto& [key, value] : args_.keyword) {
      if (key == names_[index]) return &value;
    }
    return nullptr;
  }
  Value get_or(size_t index, Value fallback) const {
    const Value* v = get(index);
    return v ? *v : fallback;
  }
  const Value& require(size_t index) const {
    const Value* v = get(index);
    if (v == nullptr) fail(line_, what_ + " missing required argument '" + names_[index] + "'");
    return *v;
  }
  std::string string_arg(size_t index, const std::string& fallback) const {
    const Value* v = get(index);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(line_, what_ + " argument '" + names_[index] + "' must be a string");
    return v->as_string();
  }
  int64_t int_arg(size_t index, int64_t fallback) const {
    const Value* v = get(index);
    if (v == nullptr || v->is_none()) return fallback;
    if (!v->is_int() && !v->is_bool()) fail(line_, what_ + " argument '" + names_[index] + "' must be an integer");
    return v->as_int();
  }

 private:
  CallArgs& args_;
  std::vector<std::string> names_;
  std::string what_;
  int line_;
};

// ---- attribute access ---------------------------------------------------------------

Value get_attribute(const Value& obj, const std::string& name, int line);

Value method(const Value& self, const std::string& name, int line) {
  const std::string what = self.type_name() + "." + name + "()";
  if (self.is_string()) {
    const std::string s = self.as_string();
    static const char* const kStringMethods[] = {
        "startswith", "endswith", "split", "rsplit", "splitlines", "strip", "lstrip", "rstrip",
        "upper", "lower", "title", "capitalize", "swapcase", "replace", "find", "rfind", "index",
        "count", "join", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower",
        "isnumeric", "isdecimal", "removeprefix", "removesuffix", "zfill", "format"};
    if (std::find_if(std::begin(kStringMethods), std::end(kStringMethods),
                     [&](const char* m) { return name == m; }) == std::end(kStringMethods)) {
      return Value::undefined("'str object' has no attribute '" + name + "'");
    }
    return Value::function(what, [s, name, what, line](CallArgs& call) -> Value {
      if (name == "startswith" || name == "endswith") {
        Args a(call, {"prefix", "start", "end"}, what, line);
        std::string text = s;
        if (a.get(1) || a.get(2)) {
          const std::u32string u = to_u32(s);
          const auto idx = slice_indices(static_cast<int64_t>(u.size()), a.get_or(1, Value::none()),
                                         a.get_or(2, Value::none()), Value::none());
          std::u32string part;
          for (int64_t i : idx) part.push_back(u[i]);
          text = from_u32(part);
        }
        const Value& prefix = a.require(0);
        std::vector<std::string> options;
        if (prefix.is_string()) {
          options.push_back(prefix.as_string());
        } else if (prefix.is_list() && prefix.list_data().is_tuple) {
          for (const Value& p : prefix.list_data().items) {
            if (!p.is_string()) fail(line, what + ": tuple items must be str");
            options.push_back(p.as_string());
          }
        } else {
          fail(line, what + " first arg must be str or a tuple of str, not " + prefix.type_name());
        }
        for (const std::string& o : options) {
          if (o.size() > text.size()) continue;
          if (name == "startswith" ? text.compare(0, o.size(), o) == 0
                                   : text.compare(text.size() - o.size(), o.size(), o) == 0) {
            return Value(true);
          }
        }
        return Value(false);
      }
      if (name == "split" || name == "rsplit") {
        Args a(call, {"sep", "maxsplit"}, what, line);
        return Value::list(split(s, a.get(0), a.int_arg(1, -1), name == "rsplit"));
      }
      if (name == "splitlines") {
        Args a(call, {"keepends"}, what, line);
        const bool keep = a.get_or(0, Value(false)).truthy();
        std::vector<Value> lines;
        const std::u32string u = to_u32(s);
        size_t start = 0, i = 0;
        auto is_break = [](char32_t c) {
          return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                 c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
        };
        while (i < u.size()) {
          if (is_break(u[i])) {
            size_t end = i + 1;
            if (u[i] == '\r' && end < u.size() && u[end] == '\n') ++end;
            lines.emplace_back(from_u32(u.substr(start, (keep ? end : i) - start)));
            start = i = end;
          } else {
            ++i;
          }
        }
        if (start < u.size()) lines.emplace_back(from_u32(u.substr(start)));
        return Value::list(std::move(lines));
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        Args a(call, {"chars"}, what, line);
        return Value(strip(s, a.get(0), name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
        Args a(call, {}, what, line);
        if (name == "upper") return Value(map_case(s, to_upper));
        if (name == "lower") return Value(map_case(s, to_lower));
        if (name == "title") return Value(python_title(s));
        if (name == "capitalize") return Value(python_capitalize(s));
        return Value(map_case(s, [](char32_t c) { return is_cased_upper(c) ? to_lower(c) : to_upper(c); }));
      }
      if (name == "replace") {
        Args a(call, {"old", "new", "count"}, what, line);
        const Value& old_v = a.require(0);
        const Value& new_v = a.require(1);
        if (!old_v.is_string() || !new_v.is_string()) fail(line, what + " arguments must be str");
        std::string replaced = replace_all(s, old_v.as_string(), new_v.as_string(), a.int_arg(2, -1));
        check_size(replaced.size(), line);
        return Value(std::move(replaced));
      }
      if (name == "find" || name == "rfind" || name == "index" || name == "count") {
        Args a(call, {"sub", "start", "end"}, what, line);
        const Value& sub_v = a.require(0);
        if (!sub_v.is_string()) fail(line, what + " argument must be str, not " + sub_v.type_name());
        const std::u32string u = to_u32(s);
        const std::u32string sub = to_u32(sub_v.as_string());
        const auto idx = slice_indices(static_cast<int64_t>(u.size()), a.get_or(1, Value::none()),
                                       a.get_or(2, Value::none()), Value::none());
        const size_t begin = idx.empty() ? u.size() : static_cast<size_t>(idx.front());
        const size_t end = idx.empty() ? begin : static_cast<size_t>(idx.back()) + 1;
        const std::u32string window = u.substr(std::min(begin, u.size()), end - std::min(begin, end));
        if (name == "count") {
          if (sub.empty()) return Value(static_cast<int64_t>(window.size() + 1));
          int64_t n = 0;
          for (size_t at = window.find(sub); at != std::u32string::npos; at = window.find(sub, at + sub.size())) ++n;
          return Value(n);
        }
        const size_t at = name == "rfind" ? window.rfind(sub) : window.find(sub);
        if (at == std::u32string::npos) {
          if (name == "index") fail(line, "substring not found");
          return Value(int64_t{-1});
        }
        return Value(static_cast<int64_t>(begin + at));
      }
      if (name == "join") {
        Args a(call, {"iterable"}, what, line);
        std::string out;
        bool first = true;
        for (const Value& item : iterate(a.require(0), line)) {
          if (!item.is_string()) fail(line, "sequence item: expected str instance, " + item.type_name() + " found");
          if (!first) out += s;
          out += item.as_string();
          first = false;
        }
        return Value(out);
      }
      if (name == "removeprefix" || name == "removesuffix") {
        Args a(call, {"affix"}, what, line);
        const std::string affix = a.string_arg(0, "");
        if (name == "removeprefix") {
          return Value(s.compare(0, affix.size(), affix) == 0 ? s.substr(affix.size()) : s);
        }
        if (s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
          return Value(s.substr(0, s.size() - affix.size()));
        }
        return Value(s);
      }
      if (name == "zfill") {
        Args a(call, {"width"}, what, line);
        const int64_t width = a.int_arg(0, 0);
        const int64_t n = static_cast<int64_t>(code_point_count(s));
        if (n >= width) return Value(s);
        check_size(static_cast<size_t>(width), line);
        const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
        return Value(s.substr(0, sign) + std::string(static_cast<size_t>(width - n), '0') + s.substr(sign));
      }
      if (name == "format") fail(line, "unsupported Jinja construct: str.format()");
      // Predicates.
      Args a(call, {}, what, line);
      const std::u32string u = to_u32(s);
      if (u.empty()) return Value(false);
      if (name == "isupper" || name == "islower") {
        bool any_cased = false;
        for (char32_t c : u) {
          if (name == "isupper" ? is_cased_lower(c) : is_cased_upper(c)) return Value(false);
          any_cased = any_cased || is_cased_upper(c) || is_cased_lower(c);
        }
        return Value(any_cased);
      }
      for (char32_t c : u) {
        bool ok = false;
        if (name == "isdigit" || name == "isdecimal") ok = is_digit(c);
        else if (name == "isnumeric") ok = is_numeric(c);
        else if (name == "isalpha") ok = is_alpha(c);
        else if (name == "isalnum") ok = is_alpha(c) || is_numeric(c);
        else if (name == "isspace") ok = utf8::is_python_space(c);
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  if (self.is_dict() && !self.is_namespace()) {
    static const char* const kMutating[] = {"pop", "popitem", "setdefault", "update", "clear"};
    for (const char* m : kMutating) {
      if (name == m) fail(line, "access to attribute '" + name + "' of 'dict' object is unsafe (sandbox)");
    }
    if (name != "items" && name != "keys" && name != "values" && name != "get" && name != "copy") {
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    return Value::function(what, [self, name, what, line](CallArgs& call) -> Value {
      if (name == "get") {
        Args a(call, {"key", "default"}, what, line);
        const Value& key = a.require(0);
        const Value* found = key.is_string() ? self.dict_data().find(key.as_string()) : nullptr;
        return found ? *found : a.get_or(1, Value::none());
      }
      Args a(call, {}, what, line);
      if (name == "copy") return Value::dict(self.dict_data().items);
      std::vector<Value> out;
      for (const auto& [key, value] : self.dict_data().items) {
        if (name == "items") out.push_back(Value::list({Value(key), value}, true));
        else if (name == "keys") out.emplace_back(key);
        else out.push_back(value);
      }
      return Value::list(std::move(out));
    });
  }
  if (self.is_list()) {
    static const char* const kMutating[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
    for (const char* m : kMutating) {
      if (name == m) fail(line, "access to attribute '" + name + "' of 'list' object is unsafe (sandbox)");
    }
    if (name != "index" && name != "count") {
      return Value::undefined("'" + self.type_name() + " object' has no attribute '" + name + "'");
    }
    return Value::function(what, [self, name, what, line](CallArgs& call) -> Value {
      Args a(call, {"value"}, what, line);
      const Value& x = a.require(0);
      const auto& items = self.list_data().items;
      if (name == "count") {
        return Value(static_cast<int64_t>(std::count_if(items.begin(), items.end(),
                                                        [&](const Value& v) { return equals(v, x); })));
      }
      for (size_t i = 0; i < items.size(); ++i) {
        if (equals(items[i], x)) return Value(static_cast<int64_t>(i));
      }
      fail(line, to_repr(x) + " is not in list");
    });
  }
  return Value::undefined("'" + self.type_name() + " object' has no attribute '" + name + "'");
}

// obj.name: Python attribute first, then item (Jinja's Environment.getattr).
Value get_attribute(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail(line, undefined_message(obj));
  if (obj.is_namespace()) {
    const Value* v = obj.dict_data().find(name);
    return v ? *v : Value::undefined("'Namespace object' has no attribute '" + name + "'");
  }
  if (obj.is_dict()) {
    Value m = method(obj, name, line);
    if (!m.is_undefined()) return m;
    const Value* v = obj.dict_data().find(name);
    return v ? *v : Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return method(obj, name, line);
}

// obj[key]: item first, then attribute (Jinja's Environment.getitem).
Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail(line, undefined_message(obj));
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_data().find(key.as_string())) return *v;
      if (!obj.is_namespace()) {
        Value m = method(obj, key.as_string(), line);
        if (!m.is_undefined()) return m;
      }
    }
    return Value::undefined("'dict object' has no attribute " + to_repr(key));
  }
  if (obj.is_list() || obj.is_string()) {
    if (key.is_int() || key.is_bool()) {
      const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list_data().items.size())
                                      : static_cast<int64_t>(code_point_count(obj.as_string()));
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return Value::undefined("'" + obj.type_name() + " object' has no element " + std::to_string(key.as_int()));
      }
      if (obj.is_list()) return obj.list_data().items[i];
      return Value(from_u32(std::u32string(1, to_u32(obj.as_string())[i])));
    }
    if (key.is_string()) return method(obj, key.as_string(), line);
    return Value::undefined("'" + obj.type_name() + " object' has no element " + to_repr(key));
  }
  return Value::undefined("'" + obj.type_name() + " object' has no attribute " + to_repr(key));
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (obj.is_undefined()) fail(line, undefined_message(obj));
  if (obj.is_list()) {
    const auto& items = obj.list_data().items;
    std::vector<Value> out;
    for (int64_t i : slice_indices(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[i]);
    return Value::list(std::move(out), obj.list_data().is_tuple);
  }
  if (obj.is_string()) {
    const std::u32string u = to_u32(obj.as_string());
    std::u32string out;
    for (int64_t i : slice_indices(static_cast<int64_t>(u.size()), start, stop, step)) out.push_back(u[i]);
    return Value(from_u32(out));
  }
  fail(line, "'" + obj.type_name() + "' object is not subscriptable");
}

// ---- tests --------------------------------------------------------------------------

using TestFn = bool (*)(const Value&, CallArgs&, int);

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = [] {
    std::unordered_map<std::string, TestFn> t;
    t["defined"] = [](const Value& v, CallArgs&, int) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, CallArgs&, int) { return v.is_undefined(); };
    t["none"] = [](const Value& v, CallArgs&, int) { return v.is_none(); };
    t["boolean"] = [](const Value& v, CallArgs&, int) { return v.is_bool(); };
    t["true"] = [](const Value& v, CallArgs&, int) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](const Value& v, CallArgs&, int) { return v.is_bool() && !v.as_bool(); };
    t["integer"] = [](const Value& v, CallArgs&, int) { return v.is_int(); };
    t["float"] = [](const Value& v, CallArgs&, int) { return v.is_float(); };
    t["number"] = [](const Value& v, CallArgs&, int) { return v.is_number(); };
    t["string"] = [](const Value& v, CallArgs&, int) { return v.is_string(); };
    t["mapping"] = [](const Value& v, CallArgs&, int) { return v.is_dict() && !v.is_namespace(); };
    t["iterable"] = [](const Value& v, CallArgs&, int) {
      return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
    };
    t["sequence"] = [](const Value& v, CallArgs&, int) {
      return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
    };
    t["callable"] = [](const Value& v, CallArgs&, int) { return v.is_function(); };
    t["sameas"] = [](const Value& v, CallArgs& args, int line) {
      const Value& other = Args(args, {"other"}, "sameas", line).require(0);
      if (v.identity() != nullptr || other.identity() != nullptr) return v.identity() == other.identity();
      // Python singletons (None, True, False) and small values compare by identity.
      return v.kind() == other.kind() && equals(v, other) && !v.is_string() && !v.is_float();
    };
    t["odd"] = [](const Value& v, CallArgs&, int line) {
      if (!v.is_int() && !v.is_bool()) fail(line, "the 'odd' test needs an integer");
      return (v.as_int() % 2) != 0;
    };
    t["even"] = [](const Value& v, CallArgs&, int line) {
      if (!v.is_int() && !v.is_bool()) fail(line, "the 'even' test needs an integer");
      return (v.as_int() % 2) == 0;
    };
    t["divisibleby"] = [](const Value& v, CallArgs& args, int line) {
      const Value& n = Args(args, {"num"}, "divisibleby", line).require(0);
      return arithmetic("%", v, n, line).as_float() == 0;
    };
    t["eq"] = t["equalto"] = [](const Value& v, CallArgs& args, int line) {
      return equals(v, Args(args, {"other"}, "eq", line).require(0));
    };
    t["ne"] = [](const Value& v, CallArgs& args, int line) {
      return !equals(v, Args(args, {"other"}, "ne", line).require(0));
    };
    t["lt"] = t["lessthan"] = [](const Value& v, CallArgs& args, int line) {
      return compare_values(v, Args(args, {"other"}, "lt", line).require(0), line) < 0;
    };
    t["le"] = [](const Value& v, CallArgs& args, int line) {
      return compare_values(v, Args(args, {"other"}, "le", line).require(0), line) <= 0;
    };
    t["gt"] = t["greaterthan"] = [](const Value& v, CallArgs& args, int line) {
      return compare_values(v, Args(args, {"other"}, "gt", line).require(0), line) > 0;
    };
    t["ge"] = [](const Value& v, CallArgs& args, int line) {
      return compare_values(v, Args(args, {"other"}, "ge", line).require(0), line) >= 0;
    };
    t["in"] = [](const Value& v, CallArgs& args, int line) {
      return contains(Args(args, {"seq"}, "in", line).require(0), v, line);
    };
    t["lower"] = [](const Value& v, CallArgs&, int) {
      const std::string s = to_str(v);
      return map_case(s, to_lower) == s;
    };
    t["upper"] = [](const Value& v, CallArgs&, int) {
      const std::string s = to_str(v);
      return map_case(s, to_upper) == s;
    };
    return t;
  }();
  return table;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(name) > 0; }

namespace {

// ---- the renderer -------------------------------------------------------------------

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Renderer;
Value apply_filter(Renderer& r, const std::string& name, const Value& input, CallArgs& args, int line);

class Renderer {
 public:
  explicit Renderer(const std::vector<std::pair<std::string, Value>>& variables) {
    install_globals();
    variables_.parent = &globals_;
    for (const auto& [name, value] : variables) variables_.vars[name] = value;
    root_.parent = &variables_;
  }

  // A namespace is the one mutable object a template has, so it can come to hold itself
  // (`{% set ns.x = ns %}`, or through a list, dict or bound method stored in it): a cycle
  // of shared references that would never be freed. Emptying every namespace the render
  // made breaks them all.
  ~Renderer() {
    for (const Value& ns : namespaces_) ns.mutable_dict_data().items.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string render(const Body& body) {
    std::string out;
    exec(body, root_, out);
    return out;
  }

  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = exec_node(*node, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  void step(int line) {
    if (++steps_ > kMaxSteps) fail(line, "the template ran too long (more than 20 million steps)");
  }

  Value eval(const Expr& e, Scope& scope) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const auto& c : e.children) items.push_back(eval(*c, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value key = eval(*e.children[i], scope);
          if (!key.is_string()) fail(e.line, "dict literal keys must be strings here, got " + key.type_name());
          d.mutable_dict_data().set(key.as_string(), eval(*e.children[i + 1], scope));
        }
        return d;
      }
      case Expr::Kind::kGetAttr: return get_attribute(eval(*e.children[0], scope), e.name, e.line);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.children[0], scope), eval(*e.children[1], scope), e.line);
      case Expr::Kind::kSlice: {
        auto part = [&](size_t i) { return e.children[i] ? eval(*e.children[i], scope) : Value::none(); };
        return slice_value(eval(*e.children[0], scope), part(1), part(2), part(3), e.line);
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.children[0], scope);
        CallArgs args = eval_args(e, scope);
        if (callee.is_undefined()) fail(e.line, undefined_message(callee));
        if (!callee.is_function()) fail(e.line, "'" + callee.type_name() + "' object is not callable");
        return callee.function_data().call(args);
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.children[0], scope);
        CallArgs args = eval_args(e, scope);
        return apply_filter(*this, e.name, input, args, e.line);
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.children[0], scope);
        CallArgs args = eval_args(e, scope);
        return Value(tests().at(e.name)(input, args, e.line));
      }
      case Expr::Kind::kNot: return Value(!eval(*e.children[0], scope).truthy());
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = eval(*e.children[0], scope);
        if (v.is_undefined()) fail(e.line, undefined_message(v));
        if (!v.is_number()) fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.kind == Expr::Kind::kPos) return v.is_float() ? v : Value(v.as_int());
        if (v.is_float()) return Value(-v.as_float());
        int64_t negated = 0;
        const bool overflowed = __builtin_sub_overflow(int64_t{0}, v.as_int(), &negated);
        return Value(checked_int(overflowed, negated, "-", e.line));
      }
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.children[0], scope);
        const Value b = eval(*e.children[1], scope);
        if (e.name == "~") {
          std::string joined = to_str(a) + to_str(b);
          check_size(joined.size(), e.line);
          return Value(std::move(joined));
        }
        return arithmetic(e.name, a, b, e.line);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.children[0], scope);
        return a.truthy() ? eval(*e.children[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.children[0], scope);
        return a.truthy() ? a : eval(*e.children[1], scope);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], scope);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") ok = equals(left, right);
          else if (op == "!=") ok = !equals(left, right);
          else if (op == "in") ok = contains(right, left, e.line);
          else if (op == "not in") ok = !contains(right, left, e.line);
          else {
            const int c = compare_values(left, right, e.line);
            ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondExpr: {
        if (eval(*e.children[0], scope).truthy()) return eval(*e.children[1], scope);
        if (e.children[2]) return eval(*e.children[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and has no else section");
      }
    }
    fail(e.line, "internal error: unknown expression");
  }

  CallArgs eval_args(const Expr& e, Scope& scope) {
    CallArgs args;
    const size_t first = 1;  // children[0] is the callee / filter input / test input
    for (size_t i = first; i < e.children.size(); ++i) args.positional.push_back(eval(*e.children[i], scope));
    for (const auto& [key, expr] : e.keyword) args.keyword.emplace_back(key, eval(*expr, scope));
    return args;
  }

  // Calls a filter by name on behalf of map/select (which take filter or test names).
  Value call_filter(const std::string& name, const Value& input, CallArgs& args, int line) {
    return apply_filter(*this, name, input, args, line);
  }

 private:
  void assign(Scope& scope, const std::vector<std::string>& targets, const Value& value, int line) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = value;
      return;
    }
    std::vector<Value> items = iterate(value, line);
    if (items.size() != targets.size()) {
      fail(line, (items.size() > targets.size() ? "too many values to unpack (expected " : "not enough values to unpack (expected ") +
                     std::to_string(targets.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow exec_node(const Node& node, Scope& scope, std::string& out) {
    step(node.line);
    switch (node.kind) {
      case Node::Kind::kText:
        out += node.text;
        check_size(out.size(), node.line);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += to_str(eval(*node.expr, scope));
        check_size(out.size(), node.line);
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.conditions.size(); ++i) {
          if (eval(*node.conditions[i], scope).truthy()) return exec(node.bodies[i], scope, out);
        }
        return exec(node.else_body, scope, out);
      case Node::Kind::kFor: return exec_for(node, scope, out);
      case Node::Kind::kSet: {
        Value value = eval(*node.expr, scope);
        if (!node.attr.empty()) {
          const Value* target = scope.find(node.targets[0]);
          if (target == nullptr || !target->is_namespace()) {
            fail(node.line, "cannot assign attribute on non-namespace object '" + node.targets[0] + "'");
          }
          if (!node.attr.empty() && node.attr[0] == '_') {
            fail(node.line, "cannot store underscore-prefixed attributes on a namespace");
          }
          target->mutable_dict_data().set(node.attr, std::move(value));
        } else {
          assign(scope, node.targets, value, node.line);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Scope inner;
        inner.parent = &scope;
        exec(node.body, inner, captured);
        scope.vars[node.targets[0]] = Value(std::move(captured));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        scope.vars[node.name] = make_macro(node, scope);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kScope: {
        Scope inner;
        inner.parent = &scope;
        for (const auto& [name, expr] : node.params) inner.vars[name] = eval(*expr, scope);
        return exec(node.body, inner, out);
      }
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& node, Scope& scope, std::string& out) {
    const std::vector<Value> all = iterate(eval(*node.expr, scope), node.line);
    std::vector<Value> items;
    if (node.filter) {
      for (const Value& item : all) {
        Scope probe;
        probe.parent = &scope;
        assign(probe, node.targets, item, node.line);
        if (eval(*node.filter, probe).truthy()) items.push_back(item);
      }
    } else {
      items = all;
    }
    if (items.empty()) {
      Scope inner;
      inner.parent = &scope;
      exec(node.else_body, inner, out);
      return Flow::kNormal;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope inner;  // a fresh scope per iteration: {% set %} inside does not outlive it
      inner.parent = &scope;
      assign(inner, node.targets, items[i], node.line);
      Value loop = Value::dict({
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(int64_t{1})},
          {"depth0", Value(int64_t{0})},
          {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
      });
      const int line = node.line;
      loop.mutable_dict_data().set("cycle", Value::function("loop.cycle", [i, line](CallArgs& args) -> Value {
        if (args.positional.empty()) fail(line, "no items for cycling given");
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }));
      inner.vars["loop"] = loop;
      const Flow flow = exec(node.body, inner, out);
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Node& node, Scope& defining_scope) {
    const Node* macro = &node;
    // A macro sees the template's top-level names. (One defined inside a loop or another
    // macro would outlive that scope, so it gets the top level too.)
    Scope* closure = &root_;
    (void)defining_scope;
    return Value::function(node.name, [this, macro, closure](CallArgs& args) -> Value {
      if (args.positional.size() > macro->params.size()) {
        fail(macro->line, "macro '" + macro->name + "' takes not more than " +
                              std::to_string(macro->params.size()) + " argument(s)");
      }
      if (++depth_ > 64) fail(macro->line, "macro recursion is too deep");
      Scope frame;
      frame.parent = closure;
      for (size_t i = 0; i < macro->params.size(); ++i) {
        const auto& [param, default_expr] = macro->params[i];
        const Value* given = i < args.positional.size() ? &args.positional[i] : nullptr;
        for (const auto& [key, value] : args.keyword) {
          if (key == param) given = &value;
        }
        if (given) {
          frame.vars[param] = *given;
        } else if (default_expr) {
          frame.vars[param] = eval(*default_expr, frame);
        } else {
          frame.vars[param] = Value::undefined("parameter '" + param + "' was not provided");
        }
      }
      for (const auto& keyword : args.keyword) {
        const std::string& key = keyword.first;
        const bool known = std::any_of(macro->params.begin(), macro->params.end(),
                                       [&key](const auto& p) { return p.first == key; });
        if (!known) fail(macro->line, "macro '" + macro->name + "' takes no keyword argument '" + key + "'");
      }
      std::string out;
      exec(macro->body, frame, out);
      --depth_;
      return Value(std::move(out));
    });
  }

  void install_globals() {
    auto& g = globals_.vars;
    g["range"] = Value::function("range", [](CallArgs& args) -> Value {
      std::vector<int64_t> a;
      for (const Value& v : args.positional) {
        PAGELLM_CHECK(v.is_int() || v.is_bool()) << "range() arguments must be integers, not " << v.type_name();
        a.push_back(v.as_int());
      }
      PAGELLM_CHECK(!a.empty() && a.size() <= 3 && args.keyword.empty())
          << "range() takes 1 to 3 positional integer arguments";
      const int64_t start = a.size() == 1 ? 0 : a[0];
      const int64_t stop = a.size() == 1 ? a[0] : a[1];
      const int64_t step = a.size() == 3 ? a[2] : 1;
      PAGELLM_CHECK(step != 0) << "range() arg 3 must not be zero";
      std::vector<Value> out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        PAGELLM_CHECK(out.size() < 100000) << "range too big (the sandbox allows 100000 items)";
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;  // the next item is past int64
      }
      return Value::list(std::move(out));
    });
    auto kwargs_dict = [](CallArgs& args, bool is_namespace) -> Value {
      Value d = is_namespace ? Value::namespace_() : Value::dict();
      for (const Value& p : args.positional) {
        PAGELLM_CHECK(p.is_dict() && !p.is_namespace()) << "expected a mapping as positional argument";
        for (const auto& [k, v] : p.dict_data().items) d.mutable_dict_data().set(k, v);
      }
      for (const auto& [k, v] : args.keyword) {
        PAGELLM_CHECK(!is_namespace || k.empty() || k[0] != '_')
            << "chat templates cannot store underscore-prefixed attributes on a namespace";
        d.mutable_dict_data().set(k, v);
      }
      return d;
    };
    g["dict"] = Value::function("dict", [kwargs_dict](CallArgs& args) { return kwargs_dict(args, false); });
    g["namespace"] = Value::function("namespace", [this, kwargs_dict](CallArgs& args) {
      Value ns = kwargs_dict(args, true);
      namespaces_.push_back(ns);  // shares the object: ~Renderer breaks its cycles
      return ns;
    });
    g["raise_exception"] = Value::function("raise_exception", [](CallArgs& args) -> Value {
      const std::string message = args.positional.empty() ? std::string() : to_str(args.positional[0]);
      PAGELLM_FAIL() << "chat template raised an exception: " << message;
    });
    g["strftime_now"] = Value::function("strftime_now", [](CallArgs& args) -> Value {
      PAGELLM_CHECK(args.positional.size() == 1 && args.positional[0].is_string())
          << "strftime_now() takes one format string";
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[512];
      const size_t n = std::strftime(buffer, sizeof(buffer), args.positional[0].as_string().c_str(), &local);
      return Value(std::string(buffer, n));
    });
  }

  Scope globals_;
  Scope variables_;
  Scope root_;
  std::vector<Value> namespaces_;  // every namespace() this render made
  int depth_ = 0;
  int64_t steps_ = 0;
};

// ---- filters ------------------------------------------------------------------------

Value attribute_path(const Value& item, const Value& attribute, int line) {
  if (attribute.is_int()) return get_item(item, attribute, line);
  Value current = item;
  const std::string path = to_str(attribute);
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::strtoll(part.c_str(), nullptr, 10))), line)
                      : get_item(current, Value(part), line);
    if (dot == std::string::npos) return current;
    if (current.is_undefined()) return current;
    start = dot + 1;
  }
}

std::string sort_key_string(const Value& v, bool case_sensitive) {
  return case_sensitive ? v.as_string() : map_case(v.as_string(), to_lower);
}

Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value(sort_key_string(v, false)) : v;
}

const std::vector<std::string>& filter_names() {
  static const std::vector<std::string> names = {
      "length", "count", "tojson", "string", "int", "float", "lower", "upper", "title",
      "capitalize", "trim", "default", "d", "first", "last", "join", "list", "items", "replace",
      "reverse", "sort", "map", "selectattr", "rejectattr", "select", "reject", "abs", "round",
      "indent", "safe", "unique", "min", "max", "sum", "dictsort", "wordcount", "center", "e",
      "escape"};
  return names;
}

Value apply_filter(Renderer& r, const std::string& name, const Value& input, CallArgs& call, int line) {
  const std::string what = "filter '" + name + "'";
  if (name == "length" || name == "count") {
    Args(call, {}, what, line);
    return Value(length_of(input, line));
  }
  if (name == "tojson") {
    Args a(call, {"ensure_ascii", "indent", "separators", "sort_keys"}, what, line);
    JsonOptions options;
    options.ensure_ascii = a.get_or(0, Value(false)).truthy();
    const Value indent = a.get_or(1, Value::none());
    if (!indent.is_none()) {
      options.indent_set = true;
      if (indent.is_string()) {
        options.indent = indent.as_string();
      } else if (indent.is_int() || indent.is_bool()) {
        check_size(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), line);
        options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
      } else {
        fail(line, "tojson indent must be an integer or a string");
      }
      options.item_separator = ",";
    }
    const Value separators = a.get_or(2, Value::none());
    if (!separators.is_none()) {
      if (!separators.is_list() || separators.list_data().items.size() != 2 ||
          !separators.list_data().items[0].is_string() || !separators.list_data().items[1].is_string()) {
        fail(line, "tojson separators must be a pair of strings");
      }
      options.item_separator = separators.list_data().items[0].as_string();
      options.key_separator = separators.list_data().items[1].as_string();
    }
    options.sort_keys = a.get_or(3, Value(false)).truthy();
    try {
      std::string json = to_json(input, options);
      check_size(json.size(), line);
      return Value(std::move(json));
    } catch (const Error& e) {
      fail(line, e.what());
    }
  }
  if (name == "string") {
    Args(call, {}, what, line);
    return Value(to_str(input));
  }
  if (name == "safe") {
    Args(call, {}, what, line);
    return input;
  }
  if (name == "e" || name == "escape") {
    Args(call, {}, what, line);
    std::string out;
    for (char c : to_str(input)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out.push_back(c);
      }
    }
    return Value(out);
  }
  if (name == "int") {
    Args a(call, {"default", "base"}, what, line);
    const Value fallback = a.get_or(0, Value(int64_t{0}));
    const int base = static_cast<int>(a.int_arg(1, 10));
    if (input.is_int() || input.is_bool()) return Value(input.as_int());
    if (input.is_float()) return std::isfinite(input.as_float()) ? Value(float_to_int(input.as_float(), line)) : fallback;
    if (input.is_string()) {
      const std::string s = strip(input.as_string(), nullptr, true, true);
      try {
        size_t used = 0;
        const int64_t v = std::stoll(s, &used, base);
        if (used == s.size()) return Value(v);
      } catch (const std::exception&) {
      }
      try {
        size_t used = 0;
        const double f = std::stod(s, &used);
        if (used == s.size() && std::isfinite(f)) return Value(float_to_int(f, line));
      } catch (const std::exception&) {
      }
    }
    return fallback;
  }
  if (name == "float") {
    Args a(call, {"default"}, what, line);
    const Value fallback = a.get_or(0, Value(0.0));
    if (input.is_number()) return Value(input.as_float());
    if (input.is_string()) {
      const std::string s = strip(input.as_string(), nullptr, true, true);
      try {
        size_t used = 0;
        const double f = std::stod(s, &used);
        if (used == s.size()) return Value(f);
      } catch (const std::exception&) {
      }
    }
    return fallback;
  }
  if (name == "lower" || name == "upper" || name == "capitalize") {
    Args(call, {}, what, line);
    const std::string s = to_str(input);
    if (name == "lower") return Value(map_case(s, to_lower));
    if (name == "upper") return Value(map_case(s, to_upper));
    return Value(python_capitalize(s));
  }
  if (name == "title") {
    // Jinja: each word (split at whitespace, '-', brackets) gets its first letter upper-cased.
    Args(call, {}, what, line);
    const std::u32string u = to_u32(to_str(input));
    std::u32string out;
    bool word_start = true;
    for (char32_t c : u) {
      const bool separator = utf8::is_python_space(c) || c == '-' || c == '(' || c == ')' ||
                             c == '[' || c == ']' || c == '{' || c == '}';
      out.push_back(separator ? c : (word_start ? to_upper(c) : to_lower(c)));
      word_start = separator;
    }
    return Value(from_u32(out));
  }
  if (name == "trim") {
    Args a(call, {"chars"}, what, line);
    return Value(strip(to_str(input), a.get(0), true, true));
  }
  if (name == "default" || name == "d") {
    Args a(call, {"default_value", "boolean"}, what, line);
    const bool boolean = a.get_or(1, Value(false)).truthy();
    if (input.is_undefined() || (boolean && !input.truthy())) return a.get_or(0, Value(""));
    return input;
  }
  if (name == "first" || name == "last") {
    Args(call, {}, what, line);
    std::vector<Value> items = iterate(input, line);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Args a(call, {"d", "attribute"}, what, line);
    const std::string separator = a.string_arg(0, "");
    const Value* attribute = a.get(1);
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input, line)) {
      if (!first) out += separator;
      out += to_str(attribute && !attribute->is_none() ? attribute_path(item, *attribute, line) : item);
      check_size(out.size(), line);
      first = false;
    }
    return Value(out);
  }
  if (name == "list") {
    Args(call, {}, what, line);
    return Value::list(iterate(input, line));
  }
  if (name == "items") {
    Args(call, {}, what, line);
    if (input.is_undefined()) return Value::list({});
    if (!input.is_dict() || input.is_namespace()) fail(line, "can only get item pairs from a mapping");
    std::vector<Value> out;
    for (const auto& [k, v] : input.dict_data().items) out.push_back(Value::list({Value(k), v}, true));
    return Value::list(std::move(out));
  }
  if (name == "replace") {
    Args a(call, {"old", "new", "count"}, what, line);
    const Value& old_v = a.require(0);
    const Value& new_v = a.require(1);
    std::string replaced = replace_all(to_str(input), to_str(old_v), to_str(new_v), a.int_arg(2, -1));
    check_size(replaced.size(), line);
    return Value(std::move(replaced));
  }
  if (name == "reverse") {
    Args(call, {}, what, line);
    if (input.is_string()) {
      std::u32string u = to_u32(input.as_string());
      std::reverse(u.begin(), u.end());
      return Value(from_u32(u));
    }
    std::vector<Value> items = iterate(input, line);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool is_sort = name == "sort";
    Args a(call, is_sort ? std::vector<std::string>{"reverse", "case_sensitive", "attribute"}
                         : std::vector<std::string>{"case_sensitive", "attribute"},
           what, line);
    const bool reverse = is_sort && a.get_or(0, Value(false)).truthy();
    const bool case_sensitive = a.get_or(is_sort ? 1 : 0, Value(false)).truthy();
    const Value* attribute = a.get(is_sort ? 2 : 1);
    std::vector<Value> items = iterate(input, line);
    auto key = [&](const Value& item) {
      return sort_key(attribute && !attribute->is_none() ? attribute_path(item, *attribute, line) : item,
                      case_sensitive);
    };
    if (name == "unique") {
      std::vector<Value> out, seen;
      for (const Value& item : items) {
        const Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::list(std::move(out));
    }
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      for (size_t i = 1; i < items.size(); ++i) {
        const int c = compare_values(key(items[i]), key(items[best]), line);
        if (name == "min" ? c < 0 : c > 0) best = i;
      }
      return items[best];
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = compare_values(key(x), key(y), line);
      return reverse ? c > 0 : c < 0;
    });
    return Value::list(std::move(items));
  }
  if (name == "dictsort") {
    Args a(call, {"case_sensitive", "by", "reverse"}, what, line);
    if (!input.is_dict() || input.is_namespace()) fail(line, "dictsort needs a mapping");
    const bool case_sensitive = a.get_or(0, Value(false)).truthy();
    const std::string by = a.string_arg(1, "key");
    const bool reverse = a.get_or(2, Value(false)).truthy();
    std::vector<Value> items;
    for (const auto& [k, v] : input.dict_data().items) items.push_back(Value::list({Value(k), v}, true));
    const size_t index = by == "value" ? 1 : 0;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = compare_values(sort_key(x.list_data().items[index], case_sensitive),
                                   sort_key(y.list_data().items[index], case_sensitive), line);
      return reverse ? c > 0 : c < 0;
    });
    return Value::list(std::move(items));
  }
  if (name == "map") {
    std::vector<Value> out;
    const std::vector<Value> items = iterate(input, line);
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [k, v] : call.keyword) {
      if (k == "attribute") attribute = &v;
      else if (k == "default") fallback = &v;
      else fail(line, "filter 'map' got an unexpected keyword argument '" + k + "'");
    }
    if (attribute != nullptr) {
      for (const Value& item : items) {
        Value v = attribute_path(item, *attribute, line);
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      }
      return Value::list(std::move(out));
    }
    if (call.positional.empty() || !call.positional[0].is_string()) {
      fail(line, "filter 'map' needs a filter name or attribute=");
    }
    const std::string filter = call.positional[0].as_string();
    if (!has_filter(filter)) fail(line, "unsupported Jinja filter '" + filter + "' in map()");
    for (const Value& item : items) {
      CallArgs rest;
      rest.positional.assign(call.positional.begin() + 1, call.positional.end());
      out.push_back(r.call_filter(filter, item, rest, line));
    }
    return Value::list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attribute = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "select" || name == "selectattr";
    if (!call.keyword.empty()) fail(line, what + " takes no keyword arguments");
    size_t next = 0;
    Value attribute;
    if (by_attribute) {
      if (call.positional.empty()) fail(line, what + " needs an attribute name");
      attribute = call.positional[next++];
    }
    std::string test;
    if (next < call.positional.size()) {
      if (!call.positional[next].is_string()) fail(line, what + " test name must be a string");
      test = call.positional[next++].as_string();
      if (!has_test(test)) fail(line, "unsupported Jinja test '" + test + "' in " + name + "()");
    }
    std::vector<Value> out;
    for (const Value& item : iterate(input, line)) {
      const Value subject = by_attribute ? attribute_path(item, attribute, line) : item;
      bool result;
      if (test.empty()) {
        result = subject.truthy();
      } else {
        CallArgs rest;
        rest.positional.assign(call.positional.begin() + static_cast<std::ptrdiff_t>(next), call.positional.end());
        result = tests().at(test)(subject, rest, line);
      }
      if (result == keep_when) out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "abs") {
    Args(call, {}, what, line);
    if (!input.is_number()) fail(line, "bad operand type for abs(): '" + input.type_name() + "'");
    return input.is_float() ? Value(std::fabs(input.as_float())) : Value(static_cast<int64_t>(std::llabs(input.as_int())));
  }
  if (name == "round") {
    Args a(call, {"precision", "method"}, what, line);
    if (!input.is_number()) fail(line, "round() needs a number, not " + input.type_name());
    const int64_t precision = a.int_arg(0, 0);
    const std::string method = a.string_arg(1, "common");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = input.as_float() * scale;
    double rounded;
    if (method == "common") {
      const int saved = std::fegetround();
      std::fesetround(FE_TONEAREST);
      rounded = std::nearbyint(x);  // Python's round() rounds half to even
      std::fesetround(saved);
    } else if (method == "ceil") {
      rounded = std::ceil(x);
    } else if (method == "floor") {
      rounded = std::floor(x);
    } else {
      fail(line, "round method must be 'common', 'ceil' or 'floor'");
    }
    return Value(rounded / scale);
  }
  if (name == "indent") {
    Args a(call, {"width", "first", "blank"}, what, line);
    const Value width = a.get_or(0, Value(int64_t{4}));
    if (!width.is_string() && !width.is_int() && !width.is_bool()) fail(line, "indent width must be an integer or a string");
    if (!width.is_string()) check_size(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), line);
    const std::string indention = width.is_string() ? width.as_string()
                                                    : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
    const bool first = a.get_or(1, Value(false)).truthy();
    const bool blank = a.get_or(2, Value(false)).truthy();
    CallArgs none;
    const Value lines_value = method(Value(to_str(input) + "\n"), "splitlines", line).function_data().call(none);
    const auto& lines = lines_value.list_data().items;
    std::string out;
    if (blank) {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) out += "\n" + indention;
        out += lines[i].as_string();
      }
    } else if (!lines.empty()) {
      out = lines[0].as_string();
      for (size_t i = 1; i < lines.size(); ++i) {
        out += "\n";
        if (!lines[i].as_string().empty()) out += indention;
        out += lines[i].as_string();
      }
    }
    if (first) out = indention + out;
    return Value(out);
  }
  if (name == "sum") {
    Args a(call, {"attribute", "start"}, what, line);
    const Value* attribute = a.get(0);
    Value total = a.get_or(1, Value(int64_t{0}));
    for (const Value& item : iterate(input, line)) {
      total = arithmetic("+", total, attribute && !attribute->is_none() ? attribute_path(item, *attribute, line) : item, line);
    }
    return total;
  }
  if (name == "wordcount") {
    Args(call, {}, what, line);
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : to_u32(to_str(input))) {
      const bool word = is_alpha(c) || is_numeric(c) || c == '_';
      if (word && !in_word) ++words;
      in_word = word;
    }
    return Value(words);
  }
  if (name == "center") {
    Args a(call, {"width"}, what, line);
    const std::string s = to_str(input);
    const int64_t width = a.int_arg(0, 80);
    const int64_t n = static_cast<int64_t>(code_point_count(s));
    if (n >= width) return Value(s);
    check_size(static_cast<size_t>(width), line);
    const int64_t pad = width - n;
    const int64_t left = pad / 2 + (pad & width & 1);  // CPython's centering rule
    return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
  }
  fail(line, "unsupported Jinja filter '" + name + "'");
}

}  // namespace

bool has_filter(const std::string& name) {
  const auto& names = filter_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

Template::Template(std::string_view source) : body_(parse_template(source)) {}
Template::~Template() = default;

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  Renderer renderer(variables);
  return renderer.render(body_);
}

}  // namespace pagellm::jinja
