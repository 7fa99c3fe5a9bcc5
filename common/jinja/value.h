// The values a Jinja template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a chat template: undefined (jinja2's default Undefined), None, bool, int,
// float, str, list, dict (insertion-ordered, string keys), namespace() and callables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace dflash::jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // Python dict order

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(const CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;                                   // undefined
  Value(bool b) : kind_(Kind::kBool), int_(b) {}       // NOLINT: implicit like Python literals
  Value(int v) : kind_(Kind::kInt), int_(v) {}         // NOLINT
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}     // NOLINT
  Value(double v) : kind_(Kind::kFloat), float_(v) {}  // NOLINT
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                     // NOLINT
  static Value None();
  static Value List(ValueList items);
  // A Python tuple: a list that prints as (a, b) and differs from a list in ==.
  static Value Tuple(ValueList items);
  static Value Dict(ValueDict items);
  // A namespace() object: attributes assignable with {% set ns.x = ... %}, shared by reference.
  static Value Namespace(ValueDict items);
  static Value Func(Function fn);
  // JSON -> Python objects as json.loads makes them (object keys keep their order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const { return tuple_; }
  bool is_mapping() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }  // dict or namespace
  ValueDict& mutable_namespace() const { return *dict_; }
  const Function& func() const { return *func_; }

  // Key lookup in a dict or namespace; nullptr when absent (or not a mapping).
  const Value* Find(absl::string_view key) const;

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // Python == between values (1 == 1.0; containers element-wise).
  bool Equals(const Value& other) const;
  // str(x) as {{ x }} prints it ("" for undefined, "None", "True", reprs inside containers).
  std::string ToString() const;
  // repr(x).
  std::string Repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent (<0: None), sort_keys=sort_keys).
  absl::StatusOr<std::string> ToJson(int indent, bool sort_keys) const;
  // "str", "int", "list", ... (error messages).
  absl::string_view TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> func_;
};

}  // namespace dflash::jinja
