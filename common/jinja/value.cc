#include "common/jinja/value.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/jinja/py_string.h"

namespace dflash::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Func(Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.func_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJson(*it));
      return Dict(std::move(items));
    }
    default:
      return Value();
  }
}

const Value* Value::Find(absl::string_view key) const {
  if (kind_ != Kind::kDict && kind_ != Kind::kNamespace) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

bool Value::Equals(const Value& o) const {
  if (is_number() || kind_ == Kind::kBool) {
    if (!(o.is_number() || o.kind_ == Kind::kBool)) return false;
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_float() == o.as_float();
    return int_ == o.int_;
  }
  if (kind_ != o.kind_ || tuple_ != o.tuple_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return str_ == o.str_;
    case Kind::kList:
      return std::equal(list_->begin(), list_->end(), o.list_->begin(), o.list_->end(),
                        [](const Value& a, const Value& b) { return a.Equals(b); });
    case Kind::kDict: {
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* other = o.Find(k);
        if (other == nullptr || !v.Equals(*other)) return false;
      }
      return true;
    }
    default:
      return dict_ == o.dict_ && func_ == o.func_;  // identity
  }
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return int_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(int_);
    case Kind::kFloat:
      return py::FloatRepr(float_);
    case Kind::kString:
      return py::StrRepr(str_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        absl::StrAppend(&out, i ? ", " : "", (*list_)[i].Repr());
      }
      if (tuple_) return out + (list_->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        absl::StrAppend(&out, i ? ", " : "", py::StrRepr((*dict_)[i].first), ": ",
                        (*dict_)[i].second.Repr());
      }
      return out + "}";
    }
    case Kind::kNamespace:
      return "<Namespace>";
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

namespace {

absl::Status JsonAppend(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  const std::string nl = indent >= 0 ? "\n" + std::string((depth + 1) * indent, ' ') : "";
  const std::string nl_end = indent >= 0 ? "\n" + std::string(depth * indent, ' ') : "";
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double x = v.as_float();
      *out += std::isnan(x)   ? "NaN"
              : std::isinf(x) ? (x > 0 ? "Infinity" : "-Infinity")
                              : py::FloatRepr(x);
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      *out += py::JsonString(v.str());
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        absl::StrAppend(out, i ? item_sep : "", nl);
        if (absl::Status s = JsonAppend(v.list()[i], indent, sort_keys, depth + 1, out); !s.ok()) {
          return s;
        }
      }
      absl::StrAppend(out, nl_end, "]");
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        absl::StrAppend(out, i ? item_sep : "", nl, py::JsonString(items[i]->first), ": ");
        if (absl::Status s = JsonAppend(items[i]->second, indent, sort_keys, depth + 1, out);
            !s.ok()) {
          return s;
        }
      }
      absl::StrAppend(out, nl_end, "}");
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  if (absl::Status s = JsonAppend(*this, indent, sort_keys, 0, &out); !s.ok()) return s;
  return out;
}

absl::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

}  // namespace dflash::jinja
