#include "common/jinja/interpreter.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/jinja/builtins.h"
#include "common/jinja/lexer.h"
#include "common/jinja/py_string.h"

namespace dflash::jinja {
namespace {

constexpr int kMaxMacroDepth = 64;

bool IsIntLike(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool;
}

}  // namespace

Interpreter::Interpreter(std::string name, std::shared_ptr<const std::string> source,
                         const ValueDict& variables)
    : name_(std::move(name)), source_(std::move(source)) {
  auto globals = std::make_shared<Frame>();
  for (auto& [k, v] : GlobalFunctions()) (*globals)[k] = v;
  auto vars = std::make_shared<Frame>();
  for (const auto& [k, v] : variables) (*vars)[k] = v;
  scopes_ = {globals, vars, std::make_shared<Frame>()};
}

absl::Status Interpreter::Exec(const Body& body, std::string* out) {
  ASSIGN_OR_RETURN(Flow flow, Run(body, out));
  (void)flow;  // break/continue outside a loop are refused by jinja2's parser; ignored here
  return absl::OkStatus();
}

absl::Status Interpreter::Fail(size_t pos, absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(Where(name_, *source_, pos), ": ", what));
}

absl::Status Interpreter::Locate(size_t pos, const absl::Status& status) const {
  if (absl::StartsWith(status.message(), absl::StrCat(name_, ":"))) return status;
  return absl::Status(status.code(),
                      absl::StrCat(Where(name_, *source_, pos), ": ", status.message()));
}

absl::StatusOr<Interpreter::Flow> Interpreter::Run(const Body& body, std::string* out) {
  for (const Node& n : body) {
    ASSIGN_OR_RETURN(Flow flow, RunNode(n, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::RunNode(const Node& n, std::string* out) {
  switch (n.kind) {
    case Node::Kind::kText:
      *out += n.text;
      return Flow::kNormal;
    case Node::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      *out += v.ToString();
      return Flow::kNormal;
    }
    case Node::Kind::kIf:
      return RunIf(n, out);
    case Node::Kind::kFor:
      return RunFor(n, out);
    case Node::Kind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      RETURN_IF_ERROR(RunSet(n, v));
      return Flow::kNormal;
    }
    case Node::Kind::kSetBlock: {
      std::string text;
      ASSIGN_OR_RETURN(Flow flow, Run(n.body, &text));
      (void)flow;
      RETURN_IF_ERROR(RunSet(n, Value(std::move(text))));
      return Flow::kNormal;
    }
    case Node::Kind::kMacro:
      DefineMacro(n);
      return Flow::kNormal;
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
    case Node::Kind::kGeneration:
      return Run(n.body, out);
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::RunIf(const Node& n, std::string* out) {
  for (const auto& [cond, body] : n.branches) {
    ASSIGN_OR_RETURN(Value c, Eval(*cond));
    if (c.Truthy()) return Run(body, out);
  }
  return Run(n.else_body, out);
}

absl::StatusOr<Interpreter::Flow> Interpreter::RunFor(const Node& n, std::string* out) {
  ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
  absl::StatusOr<ValueList> all = Iterate(seq);
  if (!all.ok()) return Locate(n.expr->pos, all.status());
  // Binds the loop targets of `item` into `frame`.
  auto bind = [&](const Value& item, Frame* frame) -> absl::Status {
    if (n.targets.size() == 1) {
      (*frame)[n.targets[0]] = item;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(ValueList parts, Iterate(item));
    if (parts.size() != n.targets.size()) {
      return Fail(n.pos, absl::StrCat("cannot unpack ", parts.size(), " values into ",
                                      n.targets.size(), " loop variables"));
    }
    for (size_t k = 0; k < parts.size(); ++k) (*frame)[n.targets[k]] = parts[k];
    return absl::OkStatus();
  };
  ValueList items;
  if (n.cond) {  // the inline filter sees only the targets
    for (const Value& item : *all) {
      auto frame = std::make_shared<Frame>();
      RETURN_IF_ERROR(bind(item, frame.get()));
      scopes_.push_back(frame);
      absl::StatusOr<Value> keep = Eval(*n.cond);
      scopes_.pop_back();
      if (!keep.ok()) return keep.status();
      if (keep->Truthy()) items.push_back(item);
    }
  } else {
    items = *std::move(all);
  }
  if (items.empty()) return Run(n.else_body, out);
  const auto len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    auto frame = std::make_shared<Frame>();
    RETURN_IF_ERROR(bind(items[i], frame.get()));
    ValueDict loop = {{"index", Value(i + 1)},      {"index0", Value(i)},
                      {"revindex", Value(len - i)}, {"revindex0", Value(len - i - 1)},
                      {"first", Value(i == 0)},     {"last", Value(i == len - 1)},
                      {"length", Value(len)},       {"depth", Value(int64_t{1})},
                      {"depth0", Value(int64_t{0})}};
    if (i > 0) loop.emplace_back("previtem", items[i - 1]);
    if (i + 1 < len) loop.emplace_back("nextitem", items[i + 1]);
    (*frame)["loop"] = Value::Dict(std::move(loop));
    scopes_.push_back(frame);
    absl::StatusOr<Flow> flow = Run(n.body, out);
    scopes_.pop_back();
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::Status Interpreter::RunSet(const Node& n, const Value& value) {
  Frame& top = *scopes_.back();
  if (!n.attr_of.empty()) {
    ASSIGN_OR_RETURN(Value ns, Lookup(n.attr_of));
    if (ns.kind() != Value::Kind::kNamespace) {
      return Fail(
          n.pos, absl::StrCat("cannot assign attribute on non-namespace object '", n.attr_of, "'"));
    }
    for (auto& [k, v] : ns.mutable_namespace()) {
      if (k == n.name) {
        v = value;
        return absl::OkStatus();
      }
    }
    ns.mutable_namespace().emplace_back(n.name, value);
    return absl::OkStatus();
  }
  if (n.targets.size() == 1) {
    top[n.targets[0]] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<ValueList> parts = Iterate(value);
  if (!parts.ok() || parts->size() != n.targets.size()) {
    return Fail(n.pos, absl::StrCat("cannot unpack the value into ", n.targets.size(), " names"));
  }
  for (size_t k = 0; k < parts->size(); ++k) top[n.targets[k]] = (*parts)[k];
  return absl::OkStatus();
}

void Interpreter::DefineMacro(const Node& n) {
  const Node* node = &n;
  (*scopes_.back())[n.name] =
      Value::Func([this, node](const CallArgs& args) -> absl::StatusOr<Value> {
        return CallMacro(*node, args);
      });
}

absl::StatusOr<Value> Interpreter::CallMacro(const Node& n, const CallArgs& args) {
  if (depth_ >= kMaxMacroDepth) return Fail(n.pos, "macro recursion too deep");
  if (args.positional.size() > n.params.size()) {
    return Fail(n.pos, absl::StrCat("macro '", n.name, "' takes ", n.params.size(), " arguments"));
  }
  // A macro sees the globals, the render variables and the template's top level, not the
  // caller's loop frames.
  std::vector<std::shared_ptr<Frame>> saved = scopes_;
  scopes_.resize(3);
  auto frame = std::make_shared<Frame>();
  scopes_.push_back(frame);
  absl::Status status;
  for (size_t k = 0; k < n.params.size() && status.ok(); ++k) {
    const auto& [pname, dflt] = n.params[k];
    const Value* given = k < args.positional.size() ? &args.positional[k] : nullptr;
    for (const auto& [key, v] : args.keyword) {
      if (key == pname) given = &v;
    }
    if (given) {
      (*frame)[pname] = *given;
    } else if (dflt) {
      absl::StatusOr<Value> v = Eval(*dflt);
      if (v.ok()) {
        (*frame)[pname] = *v;
      } else {
        status = v.status();
      }
    }
  }
  std::string text;
  if (status.ok()) {
    ++depth_;
    status = Exec(n.body, &text);
    --depth_;
  }
  scopes_ = std::move(saved);
  if (!status.ok()) return status;
  return Value(std::move(text));
}

absl::StatusOr<Value> Interpreter::Lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto found = (*it)->find(name);
    if (found != (*it)->end()) return found->second;
  }
  return Value();
}

absl::StatusOr<Value> Interpreter::Eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const ExprPtr& a : e.args) {
        ASSIGN_OR_RETURN(Value v, Eval(*a));
        items.push_back(std::move(v));
      }
      if (e.kind == Expr::Kind::kTuple) return Value::Tuple(std::move(items));
      return Value::List(std::move(items));
    }
    case Expr::Kind::kDict: {
      ValueDict items;
      for (size_t k = 0; k < e.args.size(); ++k) {
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[k]));
        if (!key.is_string()) return Fail(e.args[k]->pos, "dict keys must be strings");
        ASSIGN_OR_RETURN(Value v, Eval(*e.kwargs[k].second));
        bool replaced = false;
        for (auto& [ek, ev] : items) {
          if (ek == key.str()) {
            ev = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(key.str(), std::move(v));
      }
      return Value::Dict(std::move(items));
    }
    case Expr::Kind::kGetAttr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      return GetAttr(e, obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      return GetItem(e, obj, key);
    }
    case Expr::Kind::kSlice:
      return Slice(e);
    case Expr::Kind::kCall:
      return Call(e);
    case Expr::Kind::kFilter: {
      ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      absl::StatusOr<Value> v = ApplyFilter(e.name, subject, args);
      if (!v.ok()) return Locate(e.pos, v.status());
      return v;
    }
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      absl::StatusOr<bool> r = ApplyTest(e.name, subject, args);
      if (!r.ok()) return Locate(e.pos, r.status());
      return Value(*r != e.negated);
    }
    case Expr::Kind::kUnary:
      return Unary(e);
    case Expr::Kind::kBinary:
      return Binary(e);
    case Expr::Kind::kCompare:
      return Compare(e);
    case Expr::Kind::kCondition: {
      ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
      if (c.Truthy()) return Eval(*e.args[1]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value();
    }
  }
  return Fail(e.pos, "unknown expression");
}

absl::StatusOr<Value> Interpreter::GetAttr(const Expr& e, const Value& obj,
                                           const std::string& attr) {
  if (obj.is_undefined()) {
    return Fail(e.pos, absl::StrCat("cannot read attribute '", attr, "' of an undefined value"));
  }
  if (obj.is_none()) return Fail(e.pos, absl::StrCat("'None' has no attribute '", attr, "'"));
  const Value* v = obj.Find(attr);
  return v ? *v : Value();
}

absl::StatusOr<Value> Interpreter::GetItem(const Expr& e, const Value& obj, const Value& key) {
  if (obj.is_undefined()) return Fail(e.pos, "cannot index an undefined value");
  if (obj.is_none()) return Fail(e.pos, "'None' is not subscriptable");
  if (obj.is_mapping()) {
    const Value* v = key.is_string() ? obj.Find(key.str()) : nullptr;
    return v ? *v : Value();
  }
  if (obj.is_list() || obj.is_string()) {
    if (key.is_string()) return GetAttr(e, obj, key.str());
    if (!IsIntLike(key)) return Fail(e.pos, "indices must be integers");
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list().size());
      const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      return i >= 0 && i < n ? obj.list()[i] : Value();
    }
    const std::vector<char32_t> cps = py::Decode(obj.str());
    const auto n = static_cast<int64_t>(cps.size());
    const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    return i >= 0 && i < n ? Value(py::Encode({cps[i]})) : Value();
  }
  return Fail(e.pos, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
}

absl::StatusOr<Value> Interpreter::Slice(const Expr& e) {
  ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
  std::optional<int64_t> bounds[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.args[k + 1]) continue;
    ASSIGN_OR_RETURN(Value b, Eval(*e.args[k + 1]));
    if (b.is_none()) continue;
    if (!IsIntLike(b)) return Fail(e.args[k + 1]->pos, "slice indices must be integers");
    bounds[k] = b.as_int();
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return Fail(e.pos, "slice step cannot be zero");
  if (obj.is_list()) {
    ValueList out;
    for (int64_t i :
         py::SliceIndices(static_cast<int64_t>(obj.list().size()), bounds[0], bounds[1], step)) {
      out.push_back(obj.list()[i]);
    }
    return Value::List(std::move(out));
  }
  if (obj.is_string()) {
    const std::vector<char32_t> cps = py::Decode(obj.str());
    std::vector<char32_t> out;
    for (int64_t i :
         py::SliceIndices(static_cast<int64_t>(cps.size()), bounds[0], bounds[1], step)) {
      out.push_back(cps[i]);
    }
    return Value(py::Encode(out));
  }
  return Fail(e.pos, absl::StrCat("cannot slice a value of type ", obj.TypeName()));
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t k = first; k < e.args.size(); ++k) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.keyword.emplace_back(key, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Interpreter::Call(const Expr& e) {
  const Expr& callee = *e.args[0];
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
  Value fn;
  if (callee.kind == Expr::Kind::kGetAttr) {
    ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
    absl::StatusOr<Value> method = CallMethod(obj, callee.name, args);
    if (method.ok()) return method;
    if (!absl::IsNotFound(method.status())) return Locate(callee.pos, method.status());
    ASSIGN_OR_RETURN(fn, GetAttr(callee, obj, callee.name));
    if (fn.kind() != Value::Kind::kFunction) {
      return Fail(callee.pos,
                  absl::StrCat("'", obj.TypeName(), "' object has no method '", callee.name, "'"));
    }
  } else {
    ASSIGN_OR_RETURN(fn, Eval(callee));
  }
  if (fn.kind() != Value::Kind::kFunction) {
    return Fail(callee.pos, fn.is_undefined()
                                ? (callee.kind == Expr::Kind::kName
                                       ? absl::StrCat("'", callee.name, "' is undefined")
                                       : std::string("calling an undefined value"))
                                : absl::StrCat("'", fn.TypeName(), "' object is not callable"));
  }
  absl::StatusOr<Value> result = fn.func()(args);
  if (!result.ok()) return Locate(e.pos, result.status());
  return result;
}

absl::StatusOr<Value> Interpreter::Unary(const Expr& e) {
  ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
  if (e.name == "not") return Value(!v.Truthy());
  if (!v.is_number() && v.kind() != Value::Kind::kBool) {
    return Fail(e.pos,
                absl::StrCat("bad operand type for unary ", e.name, ": '", v.TypeName(), "'"));
  }
  if (e.name == "+") return v.kind() == Value::Kind::kFloat ? v : Value(v.as_int());
  return v.kind() == Value::Kind::kFloat ? Value(-v.as_float()) : Value(-v.as_int());
}

absl::StatusOr<Value> Interpreter::Binary(const Expr& e) {
  ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
  if (e.name == "or") return a.Truthy() ? a : Eval(*e.args[1]);
  if (e.name == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
  ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
  if (e.name == "~") return Value(a.ToString() + b.ToString());
  return Arith(e, e.name, a, b);
}

absl::StatusOr<Value> Interpreter::Arith(const Expr& e, const std::string& op, const Value& a,
                                         const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    return Fail(e.pos, absl::StrCat("an undefined value in '", op, "'"));
  }
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.str() + b.str());
  if (op == "+" && a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    ValueList out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return a.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
  }
  if (op == "*" && a.is_string() && IsIntLike(b)) {
    std::string out;
    for (int64_t k = 0; k < b.as_int(); ++k) out += a.str();
    return Value(std::move(out));
  }
  const bool numeric = (a.is_number() || IsIntLike(a)) && (b.is_number() || IsIntLike(b));
  if (!numeric) {
    return Fail(e.pos, absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(),
                                    "' and '", b.TypeName(), "'"));
  }
  const bool ints = IsIntLike(a) && IsIntLike(b);
  const double x = a.as_float(), y = b.as_float();
  if ((op == "/" || op == "//" || op == "%") && y == 0) return Fail(e.pos, "division by zero");
  if (op == "+") return ints ? Value(a.as_int() + b.as_int()) : Value(x + y);
  if (op == "-") return ints ? Value(a.as_int() - b.as_int()) : Value(x - y);
  if (op == "*") return ints ? Value(a.as_int() * b.as_int()) : Value(x * y);
  if (op == "/") return Value(x / y);
  if (op == "//") {
    if (ints) {
      const int64_t q = a.as_int() / b.as_int();
      return Value((a.as_int() % b.as_int() != 0 && ((a.as_int() < 0) != (b.as_int() < 0))) ? q - 1
                                                                                            : q);
    }
    return Value(std::floor(x / y));
  }
  if (op == "%") {
    if (ints) {
      const int64_t r = a.as_int() % b.as_int();
      return Value(r != 0 && ((r < 0) != (b.as_int() < 0)) ? r + b.as_int() : r);
    }
    const double r = std::fmod(x, y);
    return Value(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < b.as_int(); ++k) r *= a.as_int();
      return Value(r);
    }
    return Value(std::pow(x, y));
  }
  return Fail(e.pos, absl::StrCat("unsupported operator '", op, "'"));
}

absl::StatusOr<Value> Interpreter::Compare(const Expr& e) {
  ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
  for (size_t k = 0; k < e.ops.size(); ++k) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.args[k + 1]));
    const std::string& op = e.ops[k];
    bool r = false;
    if (op == "==" || op == "!=") {
      r = left.Equals(right) == (op == "==");
    } else if (op == "in" || op == "not in") {
      CallArgs args;
      args.positional.push_back(right);
      absl::StatusOr<bool> in = ApplyTest("in", left, args);
      if (!in.ok()) return Locate(e.pos, in.status());
      r = *in == (op == "in");
    } else {
      int c = 0;
      if ((left.is_number() || IsIntLike(left)) && (right.is_number() || IsIntLike(right))) {
        c = left.as_float() < right.as_float() ? -1 : left.as_float() > right.as_float() ? 1 : 0;
      } else if (left.is_string() && right.is_string()) {
        c = left.str().compare(right.str());  // UTF-8 byte order = code point order
      } else {
        return Fail(e.pos, absl::StrCat("'", op, "' not supported between '", left.TypeName(),
                                        "' and '", right.TypeName(), "'"));
      }
      r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace dflash::jinja
