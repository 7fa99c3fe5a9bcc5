// Evaluates a parsed template (template.h): scopes as jinja2 keeps them (globals, the render
// variables, the template's own top-level assignments, one frame per loop iteration and macro
// call), expressions with Python semantics and statements into an output string.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"
#include "common/jinja/value.h"

namespace dflash::jinja {

class Interpreter {
 public:
  Interpreter(std::string name, std::shared_ptr<const std::string> source,
              const ValueDict& variables);

  absl::Status Exec(const Body& body, std::string* out);

 private:
  using Frame = std::map<std::string, Value, std::less<>>;
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Fail(size_t pos, absl::string_view what) const;
  // Prefixes a builtin's error with the position (errors already located pass unchanged).
  absl::Status Locate(size_t pos, const absl::Status& status) const;

  absl::StatusOr<Flow> Run(const Body& body, std::string* out);
  absl::StatusOr<Flow> RunNode(const Node& n, std::string* out);
  absl::StatusOr<Flow> RunIf(const Node& n, std::string* out);
  absl::StatusOr<Flow> RunFor(const Node& n, std::string* out);
  absl::Status RunSet(const Node& n, const Value& value);
  void DefineMacro(const Node& n);
  absl::StatusOr<Value> CallMacro(const Node& n, const CallArgs& args);

  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> Lookup(const std::string& name) const;
  absl::StatusOr<Value> GetAttr(const Expr& e, const Value& obj, const std::string& attr);
  absl::StatusOr<Value> GetItem(const Expr& e, const Value& obj, const Value& key);
  absl::StatusOr<Value> Slice(const Expr& e);
  absl::StatusOr<Value> Call(const Expr& e);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first);
  absl::StatusOr<Value> Unary(const Expr& e);
  absl::StatusOr<Value> Binary(const Expr& e);
  absl::StatusOr<Value> Arith(const Expr& e, const std::string& op, const Value& a, const Value& b);
  absl::StatusOr<Value> Compare(const Expr& e);

  std::string name_;
  std::shared_ptr<const std::string> source_;
  // scopes_[0] globals, [1] render variables, [2] the template's top level, then loop / macro
  // frames; lookups go from the top down, assignments go to the top frame.
  std::vector<std::shared_ptr<Frame>> scopes_;
  int depth_ = 0;  // macro recursion guard
};

}  // namespace dflash::jinja
