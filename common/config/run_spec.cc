#include "common/config/run_spec.h"

#include <yaml-cpp/yaml.h>

#include <type_traits>
#include <variant>

#include "common/base/status.h"
#include "common/config/run_fields.h"
#include "common/config/yaml_reader.h"

namespace dflash::config {
namespace {

// Reads one field with the MapReader call of its type.
void ReadField(MapReader& m, const RunField& f, RunSpec* spec) {
  if (f.required) m.Require(f.key);
  const absl::string_view key = f.key;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          m.GetAutoInt(key, p);
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          m.GetAutoDouble(key, p);
        } else if constexpr (std::is_same_v<T, std::optional<std::vector<int64_t>>>) {
          m.GetAutoIntList(key, p);
        } else {
          m.Get(key, p);
        }
      },
      f.at(*spec));
}

// Checks one field by its rule (an optional field only when set).
void ValidateField(const RunField& f, const RunSpecOptions& opt, RunSpec* spec, ConfigErrors* e) {
  const FieldRule& r = f.rule;
  if (r.kind == FieldRule::kCustom) {
    r.custom(opt, spec, e);
    return;
  }
  if (r.kind == FieldRule::kNone) return;
  const std::string path = f.path();
  const FieldPtr p = f.at(*spec);
  std::optional<int64_t> int_value;
  if (auto* v = std::get_if<int64_t*>(&p)) int_value = **v;
  if (auto* v = std::get_if<std::optional<int64_t>*>(&p)) int_value = **v;
  switch (r.kind) {
    case FieldRule::kIntRange:
      if (int_value) CheckRange(e, path, *int_value, r.int_min, r.int_max);
      break;
    case FieldRule::kIntMin:
      if (int_value) CheckMin(e, path, *int_value, r.int_min);
      break;
    case FieldRule::kDoubleRange:
      CheckRange(e, path, *std::get<double*>(p), r.min, r.max, r.min_exclusive);
      break;
    case FieldRule::kOneOf:
      CheckOneOf(e, path, *std::get<std::string*>(p), r.choices);
      break;
    default:
      break;
  }
}

}  // namespace

const std::vector<std::string>& BuiltinTargets() {
  static const std::vector<std::string> names = {"tiny-qwen3", "qwen3-8b-random",
                                                 "qwen3.5-27b-random"};
  return names;
}

const std::vector<std::string>& RecomputeModes() {
  static const std::vector<std::string> names = {"none", "mlp", "layers"};
  return names;
}

const std::vector<std::string>& BuiltinDatasets() {
  static const std::vector<std::string> names = {"tiny-chat", "long-synthetic"};
  return names;
}

Dflash2Settings ResolvedDflash2(const DrafterSpec& d) {
  if (d.kind != "dflash2") return {};
  return {d.conv_kernel_size.value_or(2), d.conv_group_size.value_or(16),
          d.selector_rank.value_or(256), d.selector_top_k.value_or(16)};
}

std::optional<double> DefaultGamma(int64_t block_size) {
  switch (block_size) {
    case 16:
      return 7.0;
    case 10:
      return 5.0;
    case 8:
      return 4.0;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<RunSpec> ParseRunSpec(absl::string_view yaml_text, absl::string_view source_name,
                                     const RunSpecOptions& options) {
  YAML::Node root;
  RETURN_IF_ERROR(ParseYamlText(yaml_text, source_name, &root));
  ConfigErrors errors;
  if (!root.IsDefined() || root.IsNull()) {
    errors.Add("(document)", "is empty; a run needs at least name, target.path and data.train");
    return errors.ToStatus(source_name);
  }
  RunSpec spec;
  MapReader top(root, "", &errors);
  const std::vector<RunField>& fields = RunFields();
  for (const RunField& f : fields) {
    if (f.section.empty()) ReadField(top, f, &spec);
  }
  for (absl::string_view section : RunSections()) {
    if (SectionRequired(section)) top.Require(section);
  }
  for (absl::string_view section : RunSections()) {
    MapReader m = top.Child(section);
    for (const RunField& f : fields) {
      if (f.section == section) ReadField(m, f, &spec);
    }
    m.Finish();
  }
  top.Finish();
  // Type errors first: range checks on half-read values would only add noise.
  if (!errors.empty()) return errors.ToStatus(source_name);
  for (const RunField& f : fields) ValidateField(f, options, &spec, &errors);
  if (!errors.empty()) return errors.ToStatus(source_name);
  return spec;
}

std::string EmitRunSpec(const RunSpec& s) {
  YAML::Emitter out;
  RunSpec& spec = const_cast<RunSpec&>(s);  // the table's accessors point into it; only read
  const auto emit = [&](const RunField& f) {
    out << YAML::Key << std::string(f.key) << YAML::Value;
    const FieldPtr p = f.at(spec);
    if (auto* v = std::get_if<std::optional<std::vector<int64_t>>*>(&p); v && (*v)->has_value()) {
      out << YAML::Flow << YAML::BeginSeq;
      for (int64_t id : ***v) out << id;
      out << YAML::EndSeq;
    } else if (auto* l = std::get_if<std::vector<double>*>(&p)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (double d : **l) out << YamlDouble(d);
      out << YAML::EndSeq;
    } else if (auto* str = std::get_if<std::string*>(&p);
               str && (*str)->empty() && f.null_when_empty) {
      out << YAML::Null;
    } else if (auto* i = std::get_if<int64_t*>(&p)) {
      out << **i;
    } else {
      out << FieldValueText(f, s);
    }
  };
  out << YAML::BeginMap;
  const std::vector<RunField>& fields = RunFields();
  for (const RunField& f : fields) {
    if (f.section.empty()) emit(f);
  }
  for (absl::string_view section : RunSections()) {
    out << YAML::Key << std::string(section) << YAML::Value << YAML::BeginMap;
    for (const RunField& f : fields) {
      if (f.section == section) emit(f);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace dflash::config
