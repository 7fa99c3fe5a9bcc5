// The parsed form of a Jinja template: expression and statement nodes, each with its source offset
// so that a render error can name the line and column.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/value.h"

namespace dflash::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // args: items
    kTuple,      // args: items
    kDict,       // kwargs: literal string keys; args: key expressions when not plain strings
    kGetAttr,    // args[0].name
    kGetItem,    // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..])
    kUnary,      // name (not, -, +) args[0]
    kBinary,     // args[0] name args[1]: or and + - * / // % ** ~
    kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ...
    kCondition,  // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  size_t pos = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: ==, !=, <, >, <=, >=, in, not in
  bool negated = false;          // kTest: "is not"
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (cond, body); else_body
    kFor,       // targets in expr [if cond]; body; else_body
    kSet,       // targets = expr, or attr_of.name = expr
    kSetBlock,  // {% set targets[0] %}body{% endset %}
    kMacro,     // name(params) body
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}body{% endgeneration %} (transformers' assistant tracker)
  };
  Kind kind;
  size_t pos = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string attr_of;  // kSet on a namespace attribute: the namespace variable
  std::string name;     // kMacro name; kSet attribute name
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
};

}  // namespace dflash::jinja
