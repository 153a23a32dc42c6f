// Jinja lexer and parser. Mirrors jinja2/lexer.py and jinja2/parser.py (Jinja 3.1) with
// trim_blocks=True and lstrip_blocks=True, so that whitespace comes out byte-identical.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/jinja_ast.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm::jinja {
namespace {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string value;  // text, name, string contents or operator
  int line;
  int64_t int_value = 0;
  double float_value = 0;
};

[[noreturn]] void fail_at(int line, const std::string& message) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

// Python's str.isspace() on the code point at s[pos]; sets `length` to its byte length.
bool space_at(std::string_view s, size_t pos, size_t& length) {
  size_t next = pos;
  const char32_t cp = utf8::next_code_point(s, next);
  length = next - pos;
  return utf8::is_python_space(cp);
}

// Python's str.rstrip().
std::string_view rstrip_python(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    size_t length;
    if (!space_at(s, start, length)) break;
    end = start;
  }
  return s.substr(0, end);
}

// Skips Python whitespace (regex \s) from pos.
size_t skip_space(std::string_view s, size_t pos) {
  size_t length;
  while (pos < s.size() && space_at(s, pos, length)) pos += length;
  return pos;
}

// True when s[from:] is non-empty and all whitespace (Jinja's whitespace_re.fullmatch).
bool all_space(std::string_view s, size_t from) {
  return from < s.size() && skip_space(s, from) == s.size();
}

bool starts_with(std::string_view s, size_t pos, std::string_view prefix) {
  return s.size() >= pos + prefix.size() && s.compare(pos, prefix.size(), prefix) == 0;
}

int count_lines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  auto hex = [&](size_t pos, size_t digits) -> char32_t {
    if (pos + digits > body.size()) fail_at(line, "truncated \\x/\\u escape in a string literal");
    char32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char c = body[pos + i];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= c - '0';
      else if (c >= 'a' && c <= 'f') value |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') value |= c - 'A' + 10;
      else fail_at(line, "invalid \\x/\\u escape in a string literal");
    }
    return value;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': utf8::append_code_point(out, hex(i + 1, 2)); i += 2; break;
      case 'u': utf8::append_code_point(out, hex(i + 1, 4)); i += 4; break;
      case 'U': {
        const char32_t cp = hex(i + 1, 8);
        if (cp > 0x10FFFF) fail_at(line, "\\U escape out of range in a string literal");
        utf8::append_code_point(out, cp);
        i += 8;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t value = 0;
          size_t n = 0;
          while (n < 3 && i < body.size() && body[i] >= '0' && body[i] <= '7') {
            value = value * 8 + (body[i] - '0');
            ++i;
            ++n;
          }
          --i;
          utf8::append_code_point(out, value);
        } else {
          out.push_back('\\');  // unknown escapes keep their backslash, as in Python
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    // Jinja normalizes \r\n and \r to \n and drops one trailing newline
    // (keep_trailing_newline=False).
    source_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        source_.push_back('\n');
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        source_.push_back(raw[i]);
      }
    }
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = source_;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t tag = pos;
      for (;;) {
        tag = s.find('{', tag);
        if (tag == std::string_view::npos || tag + 1 >= s.size()) {
          tag = std::string_view::npos;
          break;
        }
        const char k = s[tag + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++tag;
      }
      if (tag == std::string_view::npos) {
        emit_text(s.substr(pos));
        break;
      }
      const char kind = s[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];

      std::string_view text = s.substr(pos, tag - pos);
      const int text_lines = count_lines(text);
      if (sign == '-') {
        text = rstrip_python(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the indentation before a block or comment tag that starts
        // its line.
        const size_t newline = text.rfind('\n');
        const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
        if ((l_pos > 0 || line_starting_) && all_space(text, l_pos)) text = text.substr(0, l_pos);
      }
      emit_text(text);
      line_ += text_lines;

      if (kind == '#') {
        pos = lex_comment(after);
      } else if (kind == '%' && is_raw_begin(after, pos)) {
        // pos now points after the raw-begin tag
        pos = lex_raw(pos);
      } else {
        pos = lex_tag(kind, after);
      }
    }
    tokens_.push_back({Tok::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit_text(std::string_view text) {
    if (!text.empty()) tokens_.push_back({Tok::kText, std::string(text), line_});
  }

  size_t lex_comment(size_t pos) {
    const std::string_view s = source_;
    const size_t close = s.find("#}", pos);
    if (close == std::string_view::npos) fail_at(line_, "missing end of comment tag");
    line_ += count_lines(s.substr(pos, close - pos));
    size_t end = close + 2;
    if (close > pos && s[close - 1] == '-') {
      const size_t stripped = skip_space(s, end);
      line_ += count_lines(s.substr(end, stripped - end));
      end = stripped;
    } else if (!(close > pos && s[close - 1] == '+') && end < s.size() && s[end] == '\n') {
      ++end;  // trim_blocks
      ++line_;
    }
    line_starting_ = s[end - 1] == '\n';
    return end;
  }

  // `{%[-+]? raw [-]?%}`: on success moves `pos` after the tag (with its whitespace rule).
  bool is_raw_begin(size_t after_sign, size_t& pos) {
    const std::string_view s = source_;
    size_t p = skip_space(s, after_sign);
    if (!starts_with(s, p, "raw")) return false;
    p = skip_space(s, p + 3);
    if (starts_with(s, p, "-%}")) {
      const size_t end = skip_space(s, p + 3);
      line_ += count_lines(s.substr(after_sign, end - after_sign));
      pos = end;
      return true;
    }
    if (starts_with(s, p, "%}")) {
      line_ += count_lines(s.substr(after_sign, p + 2 - after_sign));
      pos = p + 2;  // raw_begin has no trim_blocks newline rule
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t pos) {
    const std::string_view s = source_;
    size_t search = pos;
    for (;;) {
      const size_t tag = s.find("{%", search);
      if (tag == std::string_view::npos) fail_at(line_, "missing end of raw directive");
      size_t p = tag + 2;
      char sign = 0;
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      p = skip_space(s, p);
      if (!starts_with(s, p, "endraw")) {
        search = tag + 2;
        continue;
      }
      p = skip_space(s, p + 6);
      size_t end;
      if (starts_with(s, p, "+%}")) {
        end = p + 3;
      } else if (starts_with(s, p, "-%}")) {
        end = skip_space(s, p + 3);
      } else if (starts_with(s, p, "%}")) {
        end = p + 2;
        if (end < s.size() && s[end] == '\n') ++end;
      } else {
        search = tag + 2;
        continue;
      }
      std::string_view text = s.substr(pos, tag - pos);
      const int lines = count_lines(s.substr(pos, end - pos));
      if (sign == '-') {
        text = rstrip_python(text);
      } else if (sign != '+') {
        const size_t newline = text.rfind('\n');
        const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
        if ((l_pos > 0 || line_starting_) && all_space(text, l_pos)) text = text.substr(0, l_pos);
      }
      emit_text(text);
      line_ += lines;
      line_starting_ = s[end - 1] == '\n';
      return end;
    }
  }

  size_t lex_tag(char kind, size_t pos) {
    const std::string_view s = source_;
    tokens_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line_});
    for (;;) {
      const size_t p = skip_space(s, pos);
      line_ += count_lines(s.substr(pos, p - pos));
      pos = p;
      if (pos >= s.size()) {
        fail_at(line_, kind == '{' ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'");
      }
      // End of the tag (checked before operators, as in Jinja's rule order).
      if (kind == '%') {
        if (starts_with(s, pos, "-%}")) return end_tag(Tok::kBlockEnd, pos, pos + 3, true);
        if (starts_with(s, pos, "+%}")) return end_tag(Tok::kBlockEnd, pos, pos + 3, false);
        if (starts_with(s, pos, "%}")) {
          size_t end = pos + 2;
          if (end < s.size() && s[end] == '\n') ++end;  // trim_blocks
          return end_tag(Tok::kBlockEnd, pos, end, false);
        }
      } else {
        if (starts_with(s, pos, "-}}")) return end_tag(Tok::kVarEnd, pos, pos + 3, true);
        if (starts_with(s, pos, "}}")) return end_tag(Tok::kVarEnd, pos, pos + 2, false);
      }
      pos = lex_token(pos);
    }
  }

  // Emits the end token of a tag whose end marker starts at `start`; `end` is after the
  // marker (and after a newline removed by trim_blocks).
  size_t end_tag(Tok type, size_t start, size_t end, bool strip_after) {
    const std::string_view s = source_;
    if (strip_after) end = skip_space(s, end);
    tokens_.push_back({type, "", line_});
    line_ += count_lines(s.substr(start, end - start));
    line_starting_ = end > 0 && s[end - 1] == '\n';
    return end;
  }

  size_t lex_token(size_t pos) {
    const std::string_view s = source_;
    const char c = s[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < s.size() && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
      tokens_.push_back({Tok::kName, std::string(s.substr(pos, end - pos)), line_});
      return end;
    }
    if (c == '\'' || c == '"') {
      size_t end = pos + 1;
      while (end < s.size() && s[end] != c) {
        if (s[end] == '\\') ++end;
        ++end;
      }
      if (end >= s.size()) fail_at(line_, "unterminated string literal");
      const std::string_view body = s.substr(pos + 1, end - pos - 1);
      tokens_.push_back({Tok::kString, unescape(body, line_), line_});
      line_ += count_lines(body);
      return end + 1;
    }
    static const char* const kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*",
                                             "%",  "~",  "[",  "]",  "(",  ")",  "{", "}", "<", ">",
                                             "=",  ".",  ":",  "|",  ",",  ";"};
    for (const char* op : kOperators) {
      if (starts_with(s, pos, op)) {
        tokens_.push_back({Tok::kOp, op, line_});
        return pos + std::strlen(op);
      }
    }
    size_t length;
    space_at(s, pos, length);
    fail_at(line_, "unexpected character '" + std::string(s.substr(pos, length)) + "'");
  }

  size_t lex_number(size_t pos) {
    const std::string_view s = source_;
    auto digits = [&](size_t p, auto is_digit) {
      while (p < s.size() && (is_digit(s[p]) || (s[p] == '_' && p + 1 < s.size() && is_digit(s[p + 1])))) ++p;
      return p;
    };
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::kOp && tokens_.back().value == ".";
    if (s[pos] == '0' && pos + 2 < s.size() && s[pos + 1] != 0 && std::strchr("xXoObB", s[pos + 1])) {
      const char base_char = static_cast<char>(std::tolower(s[pos + 1]));
      const int base = base_char == 'x' ? 16 : base_char == 'o' ? 8 : 2;
      auto is_digit = [base](char ch) {
        if (base == 16) return std::isxdigit(static_cast<unsigned char>(ch)) != 0;
        return ch >= '0' && ch < '0' + base;
      };
      size_t start = pos + 2;
      if (start < s.size() && s[start] == '_') ++start;
      if (start < s.size() && is_digit(s[start])) {  // otherwise it is just "0"
        const size_t end = digits(start, is_digit);
        std::string text;
        for (size_t i = start; i < end; ++i) if (s[i] != '_') text.push_back(s[i]);
        errno = 0;
        const unsigned long long value = std::strtoull(text.c_str(), nullptr, base);
        if (errno == ERANGE || value > static_cast<unsigned long long>(INT64_MAX)) {
          fail_at(line_, "integer literal " + std::string(s.substr(pos, end - pos)) + " is too large");
        }
        Token t{Tok::kInt, std::string(s.substr(pos, end - pos)), line_};
        t.int_value = static_cast<int64_t>(value);
        tokens_.push_back(t);
        return end;
      }
    }
    size_t end = digits(pos, dec);
    bool is_float = false;
    if (!after_dot) {
      if (end + 1 < s.size() && s[end] == '.' && dec(s[end + 1])) {
        end = digits(end + 1, dec);
        is_float = true;
      }
      if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
        size_t p = end + 1;
        if (p < s.size() && (s[p] == '+' || s[p] == '-')) ++p;
        if (p < s.size() && dec(s[p])) {
          end = digits(p, dec);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) if (s[i] != '_') text.push_back(s[i]);
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);  // overflow gives inf, as in Python
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail_at(line_, "integer literal " + text + " is too large");
    }
    tokens_.push_back(t);
    return end;
  }

  std::string source_;
  std::vector<Token> tokens_;
  int line_ = 1;
  bool line_starting_ = true;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return current().type == Tok::kOp && current().value == op; }
  bool is_name(const char* name) const { return current().type == Tok::kName && current().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kText: return "template text";
      case Tok::kVarBegin: return "'{{'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kName: return "'" + t.value + "'";
      case Tok::kString: return "string literal";
      case Tok::kInt:
      case Tok::kFloat: return "number " + t.value;
      case Tok::kOp: return "'" + t.value + "'";
      case Tok::kEof: return "end of template";
    }
    return "token";
  }
  [[noreturn]] void fail(const std::string& message) const { fail_at(current().line, message); }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().type != Tok::kName) fail("expected a name, got " + describe(current()));
    std::string name = current().value;
    advance();
    return name;
  }
  void expect_block_end() {
    if (current().type != Tok::kBlockEnd) fail("expected '%}', got " + describe(current()));
    advance();
  }

  // Left-deep chains (a + b + c ..., x.a.b ..., x|f|g ...) are built by loops, not
  // recursion, so their height is checked here: evaluating and freeing a tree recurses.
  static constexpr int kMaxExprDepth = 300;
  void check_depth(const Expr& e) const {
    if (e.depth > kMaxExprDepth) fail("an expression nests too deeply (limit " + std::to_string(kMaxExprDepth) + ")");
  }
  void adopt(Expr& parent, ExprPtr child) {
    if (child) {
      parent.depth = std::max(parent.depth, child->depth + 1);
      check_depth(parent);
    }
    parent.children.push_back(std::move(child));
  }

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements --------------------------------------------------------------------

  // Parses nodes until a {% <one of ends> %} tag; consumes '{%' and the end name and sets
  // `end` to it. With no ends, parses to the end of the template.
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    for (;;) {
      const Token& t = current();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) fail("unexpected end of template; expected {% " + ends.front() + " %}");
        return body;
      }
      if (t.type == Tok::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = t.line;
        node->text = t.value;
        body.push_back(std::move(node));
        advance();
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        const int line = t.line;
        advance();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = line;
        node->expr = parse_tuple(true, false);
        if (current().type != Tok::kVarEnd) fail("expected '}}', got " + describe(current()));
        advance();
        body.push_back(std::move(node));
        continue;
      }
      if (t.type == Tok::kBlockBegin) {
        advance();
        if (current().type != Tok::kName) fail("expected a tag name after '{%', got " + describe(current()));
        const std::string name = current().value;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          advance();
          end = name;
          return body;
        }
        body.push_back(parse_statement());
        continue;
      }
      fail("unexpected " + describe(t));
    }
  }

  NodePtr parse_statement() {
    DepthGuard guard(*this);
    const int line = current().line;
    const std::string tag = current().value;
    advance();
    auto node = std::make_unique<Node>();
    node->line = line;
    std::string end;
    if (tag == "if") {
      node->kind = Node::Kind::kIf;
      node->conditions.push_back(parse_tuple(false, false));
      expect_block_end();
      for (;;) {
        node->bodies.push_back(parse_body({"endif", "elif", "else"}, end));
        if (end == "elif") {
          node->conditions.push_back(parse_tuple(false, false));
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          node->else_body = parse_body({"endif"}, end);
        }
        expect_block_end();
        break;
      }
      return node;
    }
    if (tag == "for") {
      node->kind = Node::Kind::kFor;
      node->targets = parse_target_names();
      if (!skip_name("in")) fail("expected 'in' in for loop, got " + describe(current()));
      node->expr = parse_tuple(false, false);
      if (skip_name("if")) node->filter = parse_expression(true);
      if (is_name("recursive")) fail("unsupported Jinja construct: recursive for loops");
      expect_block_end();
      ++loop_depth_;
      node->body = parse_body({"endfor", "else"}, end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        node->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      return node;
    }
    if (tag == "set") {
      if (current().type == Tok::kName && look().type == Tok::kOp && look().value == ".") {
        node->targets.push_back(expect_name());
        advance();  // '.'
        node->attr = expect_name();
      } else {
        node->targets = parse_target_names();
      }
      if (skip_op("=")) {
        node->kind = Node::Kind::kSet;
        node->expr = parse_tuple(true, false);
        expect_block_end();
        return node;
      }
      if (is_op("|")) fail("unsupported Jinja construct: filtered {% set %} blocks");
      if (!node->attr.empty() || node->targets.size() != 1) {
        fail("a {% set %} block must assign to a single name");
      }
      node->kind = Node::Kind::kSetBlock;
      expect_block_end();
      node->body = parse_body({"endset"}, end);
      expect_block_end();
      return node;
    }
    if (tag == "macro") {
      node->kind = Node::Kind::kMacro;
      node->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!node->params.empty()) {
          expect_op(",");
          if (is_op(")")) break;
        }
        std::string param = expect_name();
        ExprPtr default_value;
        if (skip_op("=")) default_value = parse_expression(true);
        node->params.emplace_back(std::move(param), std::move(default_value));
      }
      expect_op(")");
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      node->body = parse_body({"endmacro"}, end);
      loop_depth_ = saved;
      if (current().type == Tok::kName) advance();  // {% endmacro name %}
      expect_block_end();
      return node;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside of a for loop");
      node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
      return node;
    }
    if (tag == "with") {
      node->kind = Node::Kind::kScope;
      while (current().type != Tok::kBlockEnd) {
        if (!node->params.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        node->params.emplace_back(std::move(name), parse_expression(true));
      }
      expect_block_end();
      node->body = parse_body({"endwith"}, end);
      expect_block_end();
      return node;
    }
    if (tag == "generation") {
      // transformers' assistant-mask extension: renders its body unchanged.
      node->kind = Node::Kind::kScope;
      expect_block_end();
      node->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return node;
    }
    static const std::set<std::string> kKnownUnsupported = {
        "include", "extends", "import", "from", "block", "call", "filter", "autoescape", "trans",
        "do", "pluralize", "endblock"};
    if (kKnownUnsupported.count(tag)) fail("unsupported Jinja construct: {% " + tag + " %}");
    fail("unknown or misplaced Jinja tag {% " + tag + " %}");
  }

  // for/set targets: name, or names separated by commas, optionally in parentheses.
  std::vector<std::string> parse_target_names() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (current().type != Tok::kName) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  // ---- expressions -------------------------------------------------------------------

  // Jinja's parse_tuple: a comma-separated list becomes a tuple.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parentheses) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      const Token& t = current();
      if (t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd || (t.type == Tok::kOp && t.value == ")") ||
          (t.type == Tok::kName && t.value == "recursive")) {
        break;
      }
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) fail("expected an expression, got " + describe(current()));
    }
    auto e = make(Expr::Kind::kTuple, line);
    for (auto& item : items) adopt(*e, std::move(item));
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    int line = current().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = make(Expr::Kind::kCondExpr, line);
      adopt(*e, std::move(expr2));
      adopt(*e, std::move(expr1));
      adopt(*e, std::move(expr3));
      expr1 = std::move(e);
      line = current().line;
    }
    return expr1;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr left, ExprPtr right, int line, const std::string& op = "") {
    auto e = make(kind, line);
    e->name = op;
    adopt(*e, std::move(left));
    adopt(*e, std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    const int line = current().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary(Expr::Kind::kOr, std::move(left), parse_and(), line);
    return left;
  }

  ExprPtr parse_and() {
    const int line = current().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary(Expr::Kind::kAnd, std::move(left), parse_not(), line);
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = current().line;
      advance();
      auto e = make(Expr::Kind::kNot, line);
      adopt(*e, parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = current().line;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    for (;;) {
      if (current().type == Tok::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        ops.push_back(current().value);
        advance();
      } else if (is_name("in")) {
        ops.push_back("in");
        advance();
      } else if (is_name("not") && look().type == Tok::kName && look().value == "in") {
        ops.push_back("not in");
        advance();
        advance();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto e = make(Expr::Kind::kCompare, line);
    e->ops = std::move(ops);
    adopt(*e, std::move(expr));
    for (auto& operand : operands) adopt(*e, std::move(operand));
    return e;
  }

  ExprPtr parse_math1() {
    const int line = current().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = current().value;
      advance();
      left = binary(Expr::Kind::kBinary, std::move(left), parse_concat(), line, op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = current().line;
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = binary(Expr::Kind::kBinary, std::move(left), parse_math2(), line, "~");
    return left;
  }

  ExprPtr parse_math2() {
    const int line = current().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = current().value;
      advance();
      left = binary(Expr::Kind::kBinary, std::move(left), parse_pow(), line, op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    const int line = current().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary(Expr::Kind::kBinary, std::move(left), parse_unary(true), line, "**");
    return left;
  }

  // Bounds recursion so that a hostile template cannot overflow the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth) parser.fail("the template nests too deeply (limit " + std::to_string(kMaxDepth) + ")");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };
  static constexpr int kMaxDepth = 200;

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const int line = current().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      advance();
      node = make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      adopt(*node, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    const int line = t.line;
    if (t.type == Tok::kName) {
      auto e = make(Expr::Kind::kLiteral, line);
      if (t.value == "true" || t.value == "True") {
        e->literal = Value(true);
      } else if (t.value == "false" || t.value == "False") {
        e->literal = Value(false);
      } else if (t.value == "none" || t.value == "None") {
        e->literal = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.value;
      }
      advance();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string value;
      while (current().type == Tok::kString) {  // adjacent literals concatenate
        value += current().value;
        advance();
      }
      auto e = make(Expr::Kind::kLiteral, line);
      e->literal = Value(std::move(value));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = make(Expr::Kind::kLiteral, line);
      e->literal = t.type == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
      advance();
      return e;
    }
    if (is_op("(")) {
      advance();
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      advance();
      auto e = make(Expr::Kind::kList, line);
      while (!is_op("]")) {
        if (!e->children.empty()) {
          expect_op(",");
          if (is_op("]")) break;
        }
        adopt(*e, parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      advance();
      auto e = make(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        if (!e->children.empty()) {
          expect_op(",");
          if (is_op("}")) break;
        }
        adopt(*e, parse_expression(true));
        expect_op(":");
        adopt(*e, parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      const int line = current().line;
      if (skip_op(".")) {
        if (current().type == Tok::kName) {
          auto e = make(Expr::Kind::kGetAttr, line);
          e->name = current().value;
          advance();
          adopt(*e, std::move(node));
          node = std::move(e);
        } else if (current().type == Tok::kInt) {
          auto e = make(Expr::Kind::kGetItem, line);
          auto index = make(Expr::Kind::kLiteral, line);
          index->literal = Value(current().int_value);
          advance();
          adopt(*e, std::move(node));
          adopt(*e, std::move(index));
          node = std::move(e);
        } else {
          fail("expected a name or number after '.', got " + describe(current()));
        }
      } else if (skip_op("[")) {
        std::vector<ExprPtr> args;
        while (!is_op("]")) {
          if (!args.empty()) expect_op(",");
          args.push_back(parse_subscribed());
        }
        expect_op("]");
        ExprPtr arg;
        if (args.size() == 1) {
          arg = std::move(args[0]);
        } else {
          for (const auto& a : args) {
            if (a->kind == Expr::Kind::kSlice) fail("unsupported Jinja construct: a slice inside a tuple subscript");
          }
          arg = make(Expr::Kind::kTuple, line);
          for (auto& a : args) adopt(*arg, std::move(a));
        }
        if (arg->kind == Expr::Kind::kSlice) {
          arg->depth = std::max(arg->depth, node->depth + 1);
          check_depth(*arg);
          arg->children.insert(arg->children.begin(), std::move(node));
          node = std::move(arg);
        } else {
          auto e = make(Expr::Kind::kGetItem, line);
          adopt(*e, std::move(node));
          adopt(*e, std::move(arg));
          node = std::move(e);
        }
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // One subscript: an expression or a slice (children: start, stop, step; null = omitted).
  ExprPtr parse_subscribed() {
    const int line = current().line;
    std::vector<ExprPtr> args;
    if (skip_op(":")) {
      args.emplace_back();
    } else {
      ExprPtr node = parse_expression(true);
      if (!skip_op(":")) return node;
      args.push_back(std::move(node));
    }
    if (is_op(":") || is_op("]") || is_op(",")) {
      args.emplace_back();
    } else {
      args.push_back(parse_expression(true));
    }
    if (skip_op(":")) {
      if (is_op("]") || is_op(",")) {
        args.emplace_back();
      } else {
        args.push_back(parse_expression(true));
      }
    } else {
      args.emplace_back();
    }
    auto e = make(Expr::Kind::kSlice, line);
    for (auto& a : args) adopt(*e, std::move(a));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("unsupported Jinja construct: *args/**kwargs in a call");
      if (current().type == Tok::kName && look().type == Tok::kOp && look().value == "=") {
        std::string key = current().value;
        advance();
        advance();
        ExprPtr value = parse_expression(true);
        e.depth = std::max(e.depth, value->depth + 1);
        check_depth(e);
        e.keyword.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e.keyword.empty()) fail("positional argument after a keyword argument");
        adopt(e, parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::kCall, current().line);
    adopt(*e, std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (is_op("|")) {
        const int line = current().line;
        advance();
        auto e = make(Expr::Kind::kFilter, line);
        e->name = expect_name();
        if (is_op(".")) fail("unsupported Jinja construct: dotted filter names");
        if (!has_filter(e->name)) fail_at(line, "unsupported Jinja filter '" + e->name + "'");
        adopt(*e, std::move(node));
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        const int line = current().line;
        advance();
        const bool negated = skip_name("not");
        auto e = make(Expr::Kind::kTest, line);
        e->name = expect_name();
        if (!has_test(e->name)) fail_at(line, "unsupported Jinja test '" + e->name + "'");
        adopt(*e, std::move(node));
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((current().type == Tok::kName || current().type == Tok::kString ||
                    current().type == Tok::kInt || current().type == Tok::kFloat || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("cannot chain multiple tests with 'is'");
          adopt(*e, parse_postfix(parse_primary()));
        }
        if (negated) {
          auto n = make(Expr::Kind::kNot, line);
          adopt(*n, std::move(e));
          node = std::move(n);
        } else {
          node = std::move(e);
        }
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) {
  PAGELLM_CHECK(utf8::is_valid(source)) << "chat template is not valid UTF-8";
  Lexer lexer(source);
  Parser parser(lexer.run());
  return parser.parse();
}

}  // namespace pagellm::jinja
