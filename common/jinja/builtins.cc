#include "common/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/jinja/py_string.h"

namespace dflash::jinja {
namespace {

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

// Positional argument `index` or keyword `name`; nullptr when neither was given.
const Value* Arg(const CallArgs& args, size_t index, absl::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<std::string> StrArg(const CallArgs& args, size_t index, absl::string_view name,
                                   absl::string_view what) {
  const Value* v = Arg(args, index, name);
  if (v == nullptr || !v->is_string()) {
    return Bad(absl::StrCat(what, ": argument '", name, "' must be a string"));
  }
  return v->str();
}

std::optional<std::string> OptStr(const CallArgs& args, size_t index, absl::string_view name) {
  const Value* v = Arg(args, index, name);
  if (v == nullptr || v->is_none() || !v->is_string()) return std::nullopt;
  return v->str();
}

absl::StatusOr<std::string> CaseMap(const std::string& s, absl::string_view how) {
  if (!py::IsAscii(s)) {
    return Bad(absl::StrCat(how, "() of non-ASCII text is not supported (Unicode case mapping)"));
  }
  std::string out = s;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (how == "upper") {
      out[i] = static_cast<char>(std::toupper(c));
    } else if (how == "lower") {
      out[i] = static_cast<char>(std::tolower(c));
    } else if (how == "capitalize") {
      out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
    } else {  // title
      out[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
      word_start = !std::isalpha(c);
    }
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  if (old.empty()) return s;  // Python inserts between characters; no template does that
  std::string out;
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start).append(repl);
    start = at + old.size();
  }
  return out.append(s, start, std::string::npos);
}

absl::StatusOr<Value> Attribute(const Value& item, const std::string& attr) {
  const Value* v = item.Find(attr);
  return v ? *v : Value();
}

absl::StatusOr<Value> ToJsonFilter(const Value& subject, const CallArgs& args) {
  const Value* indent = Arg(args, 0, "indent");
  const Value* sort_keys = Arg(args, 3, "sort_keys");
  const Value* ensure_ascii = Arg(args, 1, "ensure_ascii");
  const Value* separators = Arg(args, 2, "separators");
  if ((ensure_ascii && ensure_ascii->Truthy()) || (separators && !separators->is_none())) {
    return Bad("tojson: ensure_ascii=True and separators are not supported");
  }
  int n = -1;
  if (indent != nullptr && !indent->is_none()) {
    if (indent->kind() != Value::Kind::kInt) return Bad("tojson: indent must be an integer");
    n = static_cast<int>(indent->as_int());
  }
  ASSIGN_OR_RETURN(std::string json, subject.ToJson(n, sort_keys && sort_keys->Truthy()));
  return Value(std::move(json));
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectFilter(absl::string_view name, const Value& subject,
                                   const CallArgs& args) {
  const bool attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  size_t next = 0;
  std::string attribute;
  if (attr) {
    ASSIGN_OR_RETURN(attribute, StrArg(args, next++, "attribute", name));
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return Bad(absl::StrCat(name, ": test name"));
    test = args.positional[next++].str();
    test_args.positional.assign(args.positional.begin() + next, args.positional.end());
  }
  ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
  ValueList out;
  for (const Value& item : items) {
    Value probe = item;
    if (attr) {
      ASSIGN_OR_RETURN(probe, Attribute(item, attribute));
    }
    bool pass = probe.Truthy();
    if (!test.empty()) {
      ASSIGN_OR_RETURN(pass, ApplyTest(test, probe, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& subject, const CallArgs& args) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
  ValueList out;
  if (const Value* attribute = Arg(args, 99, "attribute")) {
    const Value* dflt = Arg(args, 99, "default");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, Attribute(item, attribute->ToString()));
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Bad("map: expects a filter name or attribute=");
  }
  const std::string filter = args.positional[0].str();
  if (!IsFilter(filter)) return Bad(absl::StrCat("map: unknown filter '", filter, "'"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, rest));
    out.push_back(v);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> StrMethod(const std::string& s, absl::string_view name,
                                const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value(py::Strip(s, OptStr(args, 0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    const Value* max = Arg(args, 1, "maxsplit");
    std::vector<std::string> parts;
    if (!py::Split(s, OptStr(args, 0, "sep"), max ? max->as_int() : -1, &parts)) {
      return Bad("split: empty separator");
    }
    ValueList out(parts.begin(), parts.end());
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* a = Arg(args, 0, "prefix");
    if (a == nullptr) return Bad(absl::StrCat(name, "() takes an argument"));
    ValueList options = a->is_list() ? a->list() : ValueList{*a};
    for (const Value& o : options) {
      if (!o.is_string()) return Bad(absl::StrCat(name, "(): the argument must be a str"));
      const std::string& p = o.str();
      if (p.size() <= s.size() &&
          (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
        return Value(true);
      }
    }
    return Value(false);
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    ASSIGN_OR_RETURN(std::string mapped, CaseMap(s, name));
    return Value(std::move(mapped));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string old, StrArg(args, 0, "old", name));
    ASSIGN_OR_RETURN(std::string repl, StrArg(args, 1, "new", name));
    const Value* count = Arg(args, 2, "count");
    return Value(Replace(s, old, repl, count ? count->as_int() : -1));
  }
  if (name == "find" || name == "count") {
    ASSIGN_OR_RETURN(std::string sub, StrArg(args, 0, "sub", name));
    if (name == "find") {
      const size_t at = s.find(sub);
      return Value(at == std::string::npos ? int64_t{-1}
                                           : py::Length(absl::string_view(s).substr(0, at)));
    }
    if (sub.empty()) return Value(py::Length(s) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    const Value* items = Arg(args, 0, "iterable");
    if (items == nullptr) return Bad("join() takes an argument");
    ASSIGN_OR_RETURN(ValueList list, Iterate(*items));
    std::vector<std::string> parts;
    for (const Value& v : list) {
      if (!v.is_string()) return Bad("join(): sequence items must be str");
      parts.push_back(v.str());
    }
    return Value(absl::StrJoin(parts, s));
  }
  return absl::NotFoundError(name);
}

absl::StatusOr<Value> DictMethod(const Value& d, absl::string_view name, const CallArgs& args) {
  if (name == "items" || name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : d.dict()) {
      if (name == "items") {
        out.push_back(Value::Tuple({Value(k), v}));
      } else {
        out.push_back(name == "keys" ? Value(k) : v);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "get") {
    const Value* key = Arg(args, 0, "key");
    if (key == nullptr) return Bad("get() takes a key");
    const Value* found = key->is_string() ? d.Find(key->str()) : nullptr;
    if (found) return *found;
    const Value* dflt = Arg(args, 1, "default");
    return dflt ? *dflt : Value::None();
  }
  return absl::NotFoundError(name);
}

std::string StrftimeNow(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
  return std::string(buf, n);
}

}  // namespace

bool IsFilter(absl::string_view name) {
  static const std::set<absl::string_view> kNames = {
      "trim",       "length", "count", "tojson",  "default",    "d",      "join",
      "first",      "last",   "list",  "items",   "reject",     "select", "rejectattr",
      "selectattr", "map",    "upper", "lower",   "capitalize", "title",  "string",
      "int",        "float",  "abs",   "replace", "reverse",    "safe"};
  return kNames.count(name) > 0;
}

bool IsTest(absl::string_view name) {
  static const std::set<absl::string_view> kNames = {
      "defined",  "undefined",   "none",    "string", "number",  "integer",
      "float",    "boolean",     "true",    "false",  "mapping", "iterable",
      "sequence", "callable",    "equalto", "eq",     "ne",      "odd",
      "even",     "divisibleby", "in",      "lower",  "upper",   "sameas"};
  return kNames.count(name) > 0;
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& subject,
                                  const CallArgs& args) {
  if (name == "safe") return subject;
  if (name == "trim")
    return Value(py::Strip(subject.ToString(), OptStr(args, 0, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (subject.is_undefined()) return Value(int64_t{0});
    if (subject.is_string()) return Value(py::Length(subject.str()));
    if (subject.is_list()) return Value(static_cast<int64_t>(subject.list().size()));
    if (subject.is_mapping()) return Value(static_cast<int64_t>(subject.dict().size()));
    return Bad(absl::StrCat("object of type '", subject.TypeName(), "' has no len()"));
  }
  if (name == "tojson") return ToJsonFilter(subject, args);
  if (name == "default" || name == "d") {
    const Value* dflt = Arg(args, 0, "default_value");
    const Value* boolean = Arg(args, 1, "boolean");
    const bool use = subject.is_undefined() || (boolean && boolean->Truthy() && !subject.Truthy());
    return use ? (dflt ? *dflt : Value(std::string())) : subject;
  }
  if (name == "join") {
    const Value* sep = Arg(args, 0, "d");
    const Value* attribute = Arg(args, 1, "attribute");
    ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = items[i];
      if (attribute) {
        ASSIGN_OR_RETURN(item, Attribute(item, attribute->ToString()));
      }
      absl::StrAppend(&out, i && sep ? sep->ToString() : "", item.ToString());
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last" || name == "list" || name == "reverse") {
    if (name == "reverse" && subject.is_string()) {
      std::vector<char32_t> cps = py::Decode(subject.str());
      std::reverse(cps.begin(), cps.end());
      return Value(py::Encode(cps));
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
    if (name == "list") return Value::List(std::move(items));
    if (name == "reverse") return Value::List(ValueList(items.rbegin(), items.rend()));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    if (subject.is_undefined()) return Value::List({});
    if (!subject.is_mapping()) return Bad("items: expects a mapping");
    return DictMethod(subject, "items", {});
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectFilter(name, subject, args);
  }
  if (name == "map") return MapFilter(subject, args);
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    ASSIGN_OR_RETURN(std::string mapped, CaseMap(subject.ToString(), name));
    return Value(std::move(mapped));
  }
  if (name == "string") return Value(subject.ToString());
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string old, StrArg(args, 0, "old", name));
    ASSIGN_OR_RETURN(std::string repl, StrArg(args, 1, "new", name));
    const Value* count = Arg(args, 2, "count");
    return Value(
        Replace(subject.ToString(), old, repl, count && !count->is_none() ? count->as_int() : -1));
  }
  if (name == "int" || name == "float") {
    double x = 0;
    if (subject.is_number() || subject.kind() == Value::Kind::kBool) {
      x = subject.as_float();
    } else if (subject.is_string()) {
      char* end = nullptr;
      x = std::strtod(subject.str().c_str(), &end);
      if (end == subject.str().c_str()) x = 0;
    }
    if (name == "int") return Value(static_cast<int64_t>(x));
    return Value(x);
  }
  if (name == "abs") {
    if (subject.kind() == Value::Kind::kInt)
      return Value(static_cast<int64_t>(std::llabs(subject.as_int())));
    if (subject.kind() == Value::Kind::kFloat) return Value(std::fabs(subject.as_float()));
    return Bad(absl::StrCat("bad operand type for abs(): '", subject.TypeName(), "'"));
  }
  return Bad(absl::StrCat("unknown filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_mapping();
  if (name == "callable") return v.kind() == K::kFunction;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    ASSIGN_OR_RETURN(std::string mapped, CaseMap(v.str(), name));
    return mapped == v.str();
  }
  const Value* other = Arg(args, 0, "value");
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::kInt) return Bad(absl::StrCat("test '", name, "' needs an integer"));
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    if (other == nullptr || other->kind() != K::kInt || other->as_int() == 0) {
      return Bad("divisibleby needs a non-zero integer");
    }
    return v.as_int() % other->as_int() == 0;
  }
  if (other == nullptr) return Bad(absl::StrCat("test '", name, "' needs an argument"));
  if (name == "equalto" || name == "eq") return v.Equals(*other);
  if (name == "ne") return !v.Equals(*other);
  if (name == "sameas") return v.kind() == other->kind() && v.Equals(*other);
  if (name == "in") {
    if (other->is_string() && v.is_string()) {
      return other->str().find(v.str()) != std::string::npos;
    }
    if (other->is_mapping()) return v.is_string() && other->Find(v.str()) != nullptr;
    ASSIGN_OR_RETURN(ValueList items, Iterate(*other));
    return std::any_of(items.begin(), items.end(), [&](const Value& x) { return x.Equals(v); });
  }
  return Bad(absl::StrCat("unknown test '", name, "'"));
}

absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, const CallArgs& args) {
  if (obj.is_string()) return StrMethod(obj.str(), name, args);
  if (obj.is_mapping()) return DictMethod(obj, name, args);
  return absl::NotFoundError(name);
}

ValueDict GlobalFunctions() {
  ValueDict g;
  g.emplace_back("range", Value::Func([](const CallArgs& a) -> absl::StatusOr<Value> {
                   int64_t start = 0, stop = 0, step = 1;
                   for (const Value& v : a.positional) {
                     if (v.kind() != Value::Kind::kInt) return Bad("range() takes integers");
                   }
                   if (a.positional.size() == 1) {
                     stop = a.positional[0].as_int();
                   } else if (a.positional.size() >= 2) {
                     start = a.positional[0].as_int();
                     stop = a.positional[1].as_int();
                     if (a.positional.size() == 3) step = a.positional[2].as_int();
                   } else {
                     return Bad("range() takes 1 to 3 arguments");
                   }
                   if (step == 0) return Bad("range() step must not be zero");
                   ValueList out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
                     out.push_back(Value(i));
                   if (out.size() > 1000000) return Bad("range() too long");
                   return Value::List(std::move(out));
                 }));
  auto make_dict = [](bool ns) {
    return [ns](const CallArgs& a) -> absl::StatusOr<Value> {
      ValueDict items;
      for (const Value& p : a.positional) {
        if (!p.is_mapping()) return Bad("namespace() / dict() positional argument must be a dict");
        items.insert(items.end(), p.dict().begin(), p.dict().end());
      }
      for (const auto& kv : a.keyword) items.push_back(kv);
      return ns ? Value::Namespace(std::move(items)) : Value::Dict(std::move(items));
    };
  };
  g.emplace_back("namespace", Value::Func(make_dict(true)));
  g.emplace_back("dict", Value::Func(make_dict(false)));
  g.emplace_back("raise_exception", Value::Func([](const CallArgs& a) -> absl::StatusOr<Value> {
                   return absl::FailedPreconditionError(
                       absl::StrCat("the template raised an exception: ",
                                    a.positional.empty() ? "" : a.positional[0].ToString()));
                 }));
  g.emplace_back("strftime_now", Value::Func([](const CallArgs& a) -> absl::StatusOr<Value> {
                   if (a.positional.size() != 1 || !a.positional[0].is_string()) {
                     return Bad("strftime_now() takes a format string");
                   }
                   return Value(StrftimeNow(a.positional[0].str()));
                 }));
  return g;
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.dict()) keys.push_back(Value(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t c : py::Decode(v.str())) chars.push_back(Value(py::Encode({c})));
      return chars;
    }
    default:
      return Bad(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

}  // namespace dflash::jinja
