// The run.yaml fields, each defined once: where it lives in RunSpec, its YAML type, its default
// (RunSpec's initializer), the rule it is validated by, and which workers echo it. ParseRunSpec
// reads and validates through this table, EmitRunSpec writes through it, the settings echo takes
// its keys from it (common/run/resolve.h), and a test holds docs/run-spec.md's field tables to it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/config/run_spec.h"

namespace dflash::config {

class ConfigErrors;

// Where a field's value lives in a RunSpec.
using FieldPtr =
    std::variant<std::string*, int64_t*, double*, std::optional<int64_t>*, std::optional<double>*,
                 std::optional<std::vector<int64_t>>*, std::vector<double>*>;

// How a field is checked after reading (a rule that depends on other fields, or that normalizes a
// path, is a `custom` check of its own).
struct FieldRule {
  enum Kind { kNone, kIntRange, kIntMin, kDoubleRange, kOneOf, kCustom } kind = kNone;
  int64_t int_min = 0, int_max = 0;
  double min = 0, max = 0;
  bool min_exclusive = false;
  std::vector<std::string> choices;
  // kCustom: the whole check of the field, in the table's order.
  void (*custom)(const RunSpecOptions&, RunSpec*, ConfigErrors*) = nullptr;
};

// Who reports the field back in the settings echo (docs/run-spec.md#settings-echo).
enum EchoBy : unsigned {
  kEchoNone = 0,
  kEchoTarget = 1,        // every target process
  kEchoTargetRank0 = 2,   // tensor-parallel rank 0 of the target only
  kEchoDrafter = 4,       // the drafter
  kEchoDrafterIfSet = 8,  // the drafter, when the resolved value is set (loss.gamma)
};

struct RunField {
  absl::string_view section;  // "" at the top level, else the mapping's key ("batching")
  absl::string_view key;      // "max_anchors"
  bool required = false;
  // Written as YAML null when empty (a path that may be absent): drafter.init_from, eval.prompts.
  bool null_when_empty = false;
  FieldPtr (*at)(RunSpec&) = nullptr;
  FieldRule rule;
  unsigned echo = kEchoNone;

  std::string path() const;  // "batching.max_anchors", "name"
};

// Every field, in the order of reading, validation, emitting and docs/run-spec.md.
const std::vector<RunField>& RunFields();

// The mappings of run.yaml in order ("target", "drafter", ...), and those a run must have.
const std::vector<absl::string_view>& RunSections();
bool SectionRequired(absl::string_view section);

// The field's value in `spec` as EmitRunSpec writes it (a YAML scalar or flow sequence).
std::string FieldValueText(const RunField& field, const RunSpec& spec);

// A number as EmitRunSpec writes it: always with a dot in the mantissa ("6.0", "6.0e-04").
std::string YamlDouble(double v);

// The run.yaml field paths a worker of that kind echoes, in table order.
std::vector<std::string> EchoedFields(unsigned echo_mask);

// The field's value in `spec` as the workers write the value they apply in the settings echo:
// strings as they are, integers in decimal, numbers by absl::StrCat, lists joined by commas,
// "auto" for an unset optional (the coordinator replaces those by the resolved value).
std::string EchoValueText(const RunField& field, const RunSpec& spec);

}  // namespace dflash::config
