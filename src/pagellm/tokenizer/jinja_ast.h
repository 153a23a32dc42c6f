// The syntax tree of a Jinja template (internal to jinja_*.cpp).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/tokenizer/jinja.h"

namespace pagellm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // children: items
    kTuple,     // children: items
    kDict,      // keyword: (key expr in children[i], value) -> children pairs [k0, v0, k1, v1...]
    kGetAttr,   // children[0] . name
    kGetItem,   // children[0] [ children[1] ]
    kSlice,     // children[0] [ children[1] : children[2] : children[3] ] (null = omitted)
    kCall,      // children[0] ( children[1..], keyword )
    kFilter,    // children[0] | name ( children[1..], keyword )
    kTest,      // children[0] is [not] name ( children[1..], keyword ); negated
    kNot,       // not children[0]
    kNeg,       // - children[0]
    kPos,       // + children[0]
    kBinary,    // children[0] op children[1]: + - * / // % ** ~
    kAnd,       // children[0] and children[1]
    kOr,        // children[0] or children[1]
    kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...
    kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // height of this subtree (bounded by the parser)
  Value literal;
  std::string name;              // kName, kGetAttr, kFilter, kTest; op for kBinary
  std::vector<std::string> ops;  // kCompare
  bool negated = false;          // kTest
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // conditions[i] -> bodies[i]; else_body
    kFor,         // for targets in expr [if filter]: body; else_body
    kSet,         // set targets = expr; or set targets[0].attr = expr when attr non-empty
    kSetBlock,    // set targets[0] %}body{% endset
    kMacro,       // macro name(params) body
    kBreak,
    kContinue,
    kScope,       // with / generation: body in a new scope, after binding params
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro params / with bindings
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
};

/// Parses template source into a body (jinja_parser.cpp).
Body parse_template(std::string_view source);

/// True if a filter / test with this name exists (jinja_eval.cpp); the parser rejects
/// unknown ones up front, as Jinja does at compile time.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace pagellm::jinja
