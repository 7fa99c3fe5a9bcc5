#include "common/config/yaml_reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dflash::config {
namespace {

// Levenshtein distance, for "did you mean" hints on unknown keys.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    default:
      return "nothing";
  }
}

bool ParseBool(const std::string& s, bool* out) {
  if (s == "true" || s == "True" || s == "TRUE") {
    *out = true;
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    *out = false;
    return true;
  }
  return false;
}

}  // namespace

void ConfigErrors::Add(absl::string_view path, absl::string_view message) {
  errors_.push_back(path.empty() ? std::string(message) : absl::StrCat(path, ": ", message));
}

absl::Status ConfigErrors::ToStatus(absl::string_view source) const {
  if (errors_.empty()) return absl::OkStatus();
  std::string joined = absl::StrJoin(errors_, "\n");
  if (!source.empty()) {
    std::vector<std::string> prefixed;
    for (const auto& e : errors_) prefixed.push_back(absl::StrCat(source, ": ", e));
    joined = absl::StrJoin(prefixed, "\n");
  }
  return absl::InvalidArgumentError(joined);
}

std::string JoinPath(absl::string_view parent, absl::string_view key) {
  if (parent.empty()) return std::string(key);
  return absl::StrCat(parent, ".", key);
}

MapReader::MapReader(const YAML::Node& node, std::string path, ConfigErrors* errors)
    : node_(node), path_(std::move(path)), errors_(errors) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    errors_->Add(path_.empty() ? "(document)" : path_,
                 absl::StrCat("must be a mapping of fields, got ", Describe(node_)));
    valid_ = false;
    return;
  }
  // yaml-cpp keeps repeated keys; a strict reader refuses them instead of taking one silently.
  if (!node_.IsMap()) return;
  std::map<std::string, int> first_line;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) continue;
    const int line = kv.first.Mark().line + 1;
    auto [it, inserted] = first_line.emplace(kv.first.Scalar(), line);
    if (!inserted) {
      errors_->Add(FieldPath(kv.first.Scalar()), absl::StrCat("duplicate field (line ", line,
                                                              "; first on line ", it->second, ")"));
    }
  }
}

YAML::Node MapReader::Lookup(absl::string_view key) {
  known_.insert(std::string(key));
  if (!valid_ || !node_.IsMap()) return YAML::Node();
  for (const auto& kv : node_) {
    if (kv.first.IsScalar() && kv.first.Scalar() == key) return kv.second;
  }
  return YAML::Node();
}

bool MapReader::Has(absl::string_view key) const {
  if (!valid_ || !node_.IsMap()) return false;
  for (const auto& kv : node_) {
    if (kv.first.IsScalar() && kv.first.Scalar() == key) return !kv.second.IsNull();
  }
  return false;
}

bool MapReader::ScalarOrError(absl::string_view key, const YAML::Node& node,
                              absl::string_view expected) {
  if (node.IsScalar()) return true;
  errors_->Add(FieldPath(key), absl::StrCat("must be ", expected, ", got ", Describe(node)));
  return false;
}

void MapReader::Get(absl::string_view key, std::string* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (ScalarOrError(key, n, "a string")) *out = n.Scalar();
}

void MapReader::Get(absl::string_view key, int64_t* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!ScalarOrError(key, n, "an integer")) return;
  int64_t v;
  if (!absl::SimpleAtoi(n.Scalar(), &v)) {
    errors_->Add(FieldPath(key), absl::StrCat("must be an integer, got ", Describe(n)));
    return;
  }
  *out = v;
}

void MapReader::Get(absl::string_view key, int32_t* out) {
  int64_t v = *out;
  size_t before = errors_->errors().size();
  Get(key, &v);
  if (errors_->errors().size() != before) return;
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    errors_->Add(FieldPath(key), absl::StrCat("must fit in 32 bits, got ", v));
    return;
  }
  *out = static_cast<int32_t>(v);
}

void MapReader::Get(absl::string_view key, double* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!ScalarOrError(key, n, "a number")) return;
  double v;
  if (!absl::SimpleAtod(n.Scalar(), &v) || !std::isfinite(v)) {
    errors_->Add(FieldPath(key), absl::StrCat("must be a finite number, got ", Describe(n)));
    return;
  }
  *out = v;
}

void MapReader::Get(absl::string_view key, bool* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!ScalarOrError(key, n, "true or false")) return;
  if (!ParseBool(n.Scalar(), out)) {
    errors_->Add(FieldPath(key), absl::StrCat("must be true or false, got ", Describe(n)));
  }
}

void MapReader::Get(absl::string_view key, std::vector<int64_t>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!n.IsSequence()) {
    errors_->Add(FieldPath(key), absl::StrCat("must be a list of integers, got ", Describe(n)));
    return;
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < n.size(); ++i) {
    int64_t v;
    if (!n[i].IsScalar() || !absl::SimpleAtoi(n[i].Scalar(), &v)) {
      errors_->Add(absl::StrCat(FieldPath(key), "[", i, "]"),
                   absl::StrCat("must be an integer, got ", Describe(n[i])));
      return;
    }
    values.push_back(v);
  }
  *out = std::move(values);
}

void MapReader::Get(absl::string_view key, std::vector<double>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!n.IsSequence()) {
    errors_->Add(FieldPath(key), absl::StrCat("must be a list of numbers, got ", Describe(n)));
    return;
  }
  std::vector<double> values;
  for (size_t i = 0; i < n.size(); ++i) {
    double v;
    if (!n[i].IsScalar() || !absl::SimpleAtod(n[i].Scalar(), &v) || !std::isfinite(v)) {
      errors_->Add(absl::StrCat(FieldPath(key), "[", i, "]"),
                   absl::StrCat("must be a finite number, got ", Describe(n[i])));
      return;
    }
    values.push_back(v);
  }
  *out = std::move(values);
}

void MapReader::Get(absl::string_view key, std::vector<std::string>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!n.IsSequence()) {
    errors_->Add(FieldPath(key), absl::StrCat("must be a list of strings, got ", Describe(n)));
    return;
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) {
      errors_->Add(absl::StrCat(FieldPath(key), "[", i, "]"),
                   absl::StrCat("must be a string, got ", Describe(n[i])));
      return;
    }
    values.push_back(n[i].Scalar());
  }
  *out = std::move(values);
}

void MapReader::GetAutoInt(absl::string_view key, std::optional<int64_t>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!ScalarOrError(key, n, "'auto' or an integer")) return;
  if (n.Scalar() == "auto") {
    out->reset();
    return;
  }
  int64_t v;
  if (!absl::SimpleAtoi(n.Scalar(), &v)) {
    errors_->Add(FieldPath(key), absl::StrCat("must be 'auto' or an integer, got ", Describe(n)));
    return;
  }
  *out = v;
}

void MapReader::GetAutoDouble(absl::string_view key, std::optional<double>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!ScalarOrError(key, n, "'auto' or a number")) return;
  if (n.Scalar() == "auto") {
    out->reset();
    return;
  }
  double v;
  if (!absl::SimpleAtod(n.Scalar(), &v) || !std::isfinite(v)) {
    errors_->Add(FieldPath(key),
                 absl::StrCat("must be 'auto' or a finite number, got ", Describe(n)));
    return;
  }
  *out = v;
}

void MapReader::GetAutoIntList(absl::string_view key, std::optional<std::vector<int64_t>>* out) {
  YAML::Node n = Lookup(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (n.IsScalar() && n.Scalar() == "auto") {
    out->reset();
    return;
  }
  if (!n.IsSequence()) {
    errors_->Add(FieldPath(key),
                 absl::StrCat("must be 'auto' or a list of integers, got ", Describe(n)));
    return;
  }
  std::vector<int64_t> values;
  Get(key, &values);
  *out = std::move(values);
}

void MapReader::Require(absl::string_view key) {
  if (!valid_) return;
  if (!Has(key)) {
    errors_->Add(FieldPath(key), "required field is missing");
    return;
  }
  for (const auto& kv : node_) {
    if (kv.first.IsScalar() && kv.first.Scalar() == key && kv.second.IsScalar() &&
        kv.second.Scalar().empty()) {
      errors_->Add(FieldPath(key), "required field is empty");
      return;
    }
  }
}

MapReader MapReader::Child(absl::string_view key) {
  YAML::Node n = Lookup(key);
  if (!valid_) {
    MapReader silent(YAML::Node(), FieldPath(key), errors_);
    silent.valid_ = false;
    return silent;
  }
  return MapReader(n, FieldPath(key), errors_);
}

void MapReader::Finish() {
  if (!valid_ || !node_.IsMap()) return;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) {
      errors_->Add(path_.empty() ? "(document)" : path_, "keys must be plain strings");
      continue;
    }
    const std::string& key = kv.first.Scalar();
    if (known_.count(key)) continue;
    std::string hint;
    size_t best = 3;
    for (const auto& k : known_) {
      size_t d = EditDistance(key, k);
      if (d < best) {
        best = d;
        hint = k;
      }
    }
    errors_->Add(FieldPath(key), hint.empty()
                                     ? "unknown field"
                                     : absl::StrCat("unknown field (did you mean '", hint, "'?)"));
  }
}

absl::Status ParseYamlText(absl::string_view text, absl::string_view source, YAML::Node* out) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(text));
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.empty() ? "yaml" : source, ": holds ", docs.size(),
                       " YAML documents (separated by ---); it must hold exactly one"));
    }
    *out = docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source.empty() ? "yaml" : source, ":",
                                                   e.mark.line + 1, ":", e.mark.column + 1,
                                                   ": malformed YAML: ", e.msg));
  }
  return absl::OkStatus();
}

void CheckMin(ConfigErrors* errors, absl::string_view path, int64_t value, int64_t min) {
  if (value < min) errors->Add(path, absl::StrCat("must be >= ", min, ", got ", value));
}

void CheckRange(ConfigErrors* errors, absl::string_view path, int64_t value, int64_t min,
                int64_t max) {
  if (value < min)
    errors->Add(path, absl::StrCat("must be >= ", min, ", got ", value));
  else if (value > max)
    errors->Add(path, absl::StrCat("must be <= ", max, ", got ", value));
}

void CheckRange(ConfigErrors* errors, absl::string_view path, double value, double min, double max,
                bool min_exclusive) {
  if (min_exclusive ? !(value > min) : !(value >= min)) {
    errors->Add(path, absl::StrCat("must be ", min_exclusive ? "> " : ">= ", min, ", got ", value));
  } else if (!(value <= max)) {
    errors->Add(path, absl::StrCat("must be <= ", max, ", got ", value));
  }
}

void CheckOneOf(ConfigErrors* errors, absl::string_view path, const std::string& value,
                const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
  errors->Add(path,
              absl::StrCat("must be one of ", absl::StrJoin(allowed, "|"), ", got '", value, "'"));
}

}  // namespace dflash::config
