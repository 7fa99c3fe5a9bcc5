// The run.yaml field table (common/config/run_fields.h) against RunSpec and docs/run-spec.md:
// every field of the table has its docs row with the table's default and rule, every documented
// field is in the table, the settings echo's documented lists are the table's, and the emitted
// YAML parses back to the same spec through the same table.
#include "common/config/run_fields.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/run/resolve.h"

namespace dflash::config {
namespace {

// docs/run-spec.md's field rows: path -> {type, default, allowed}, from "## Fields" to the next
// "## " heading.
std::map<std::string, std::vector<std::string>> DocRows() {
  std::ifstream in(DFLASH_SOURCE_DIR "/docs/run-spec.md");
  std::map<std::string, std::vector<std::string>> rows;
  bool in_fields = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_fields = line == "## Fields";
    if (!in_fields || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = absl::StrSplit(line, " | ");
    if (cells.size() < 5) continue;
    std::string path(absl::StripSuffix(absl::StripPrefix(cells[0], "| `"), "`"));
    rows[path] = {cells[1], cells[2], cells[3]};
  }
  return rows;
}

std::string Unquote(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '`'), s.end());
  return s;
}

// Equal as text, or as numbers ("6.0e-4" and "6.0e-04"), or as lists of numbers.
bool SameValue(const std::string& doc, const std::string& table) {
  if (doc == table) return true;
  auto numbers = [](std::string s) {
    std::vector<double> out;
    for (char& c : s) {
      if (c == '[' || c == ']' || c == ',') c = ' ';
    }
    std::istringstream in(s);
    double d;
    while (in >> d) out.push_back(d);
    return in.eof() ? out : std::vector<double>{};
  };
  const std::vector<double> a = numbers(doc), b = numbers(table);
  return !a.empty() && a == b;
}

TEST(RunFieldsTest, EveryFieldHasItsDocsRowWithTheTablesDefaultAndRule) {
  const auto rows = DocRows();
  ASSERT_GT(rows.size(), 30u) << "docs/run-spec.md's field tables were not found";
  const RunSpec defaults;
  std::set<std::string> in_table;
  for (const RunField& f : RunFields()) {
    const std::string path = f.path();
    in_table.insert(path);
    auto row = rows.find(path);
    ASSERT_NE(row, rows.end()) << path << " has no row in docs/run-spec.md";
    const std::string doc_default = Unquote(row->second[1]);
    if (f.required) {
      EXPECT_EQ(doc_default, "required") << path;
    } else {
      const std::string value = FieldValueText(f, defaults);
      EXPECT_TRUE(SameValue(doc_default, value))
          << path << ": docs say default " << doc_default << ", the table (RunSpec) " << value;
    }
    const std::string allowed = row->second[2];
    switch (f.rule.kind) {
      case FieldRule::kOneOf:
        for (const std::string& c : f.rule.choices) {
          EXPECT_NE(allowed.find("`" + c + "`"), std::string::npos)
              << path << ": docs' allowed values lack " << c << ": " << allowed;
        }
        break;
      case FieldRule::kIntRange:
        EXPECT_NE(allowed.find(std::to_string(f.rule.int_min)), std::string::npos) << path;
        EXPECT_NE(allowed.find(std::to_string(f.rule.int_max)), std::string::npos) << path;
        break;
      case FieldRule::kIntMin:
        EXPECT_NE(allowed.find(">= " + std::to_string(f.rule.int_min)), std::string::npos)
            << path << ": " << allowed;
        break;
      default:
        break;
    }
  }
  for (const auto& [path, row] : rows) {
    EXPECT_TRUE(in_table.count(path))
        << "docs/run-spec.md documents " << path << ", which the field table does not define";
  }
}

TEST(RunFieldsTest, TheSettingsEchoListsAreTheTablesAndTheDocs) {
  EXPECT_EQ(run::TargetEchoKeys(0),
            (std::vector<std::string>{"target.path", "target.layer_ids", "target.dtype",
                                      "batching.token_budget", "placement.transport"}));
  EXPECT_EQ(run::TargetEchoKeys(1).size(), 4u);  // no channel on another rank
  const std::vector<std::string> drafter = run::DrafterEchoKeys(true);
  EXPECT_EQ(drafter.size(), 26u);
  EXPECT_EQ(run::DrafterEchoKeys(false).size(), 25u);
  // docs/run-spec.md's settings echo table names each field its role echoes.
  std::ifstream in(DFLASH_SOURCE_DIR "/docs/run-spec.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string docs = text.str();
  const size_t echo = docs.find("## Settings echo");
  ASSERT_NE(echo, std::string::npos);
  const std::string section = docs.substr(echo, docs.find("\n## ", echo + 1) - echo);
  for (const auto& keys : {run::TargetEchoKeys(0), drafter}) {
    for (const std::string& k : keys) {
      EXPECT_NE(section.find("`" + k + "`"), std::string::npos) << k << " not in the echo docs";
    }
  }
}

TEST(RunFieldsTest, EveryFieldIsEmittedAndReadBackThroughTheTable) {
  RunSpecOptions opt;
  opt.check_paths = false;
  absl::StatusOr<RunSpec> spec = ParseRunSpec(
      "name: t\ntarget: {path: /m, layer_ids: [1, 3]}\ndrafter: {mask_token_id: 7}\n"
      "data: {train: /d.jsonl}\nplacement: {pairs: 2}\nloss: {gamma: 6.5}\n"
      "optim: {betas: [0.8, 0.95], lr: 1.0e-3}\n",
      "t.yaml", opt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string yaml = EmitRunSpec(*spec);
  for (const RunField& f : RunFields()) {
    if (f.section.empty()) continue;
    EXPECT_NE(yaml.find("  " + std::string(f.key) + ": "), std::string::npos)
        << f.path() << " not emitted:\n"
        << yaml;
  }
  absl::StatusOr<RunSpec> again = ParseRunSpec(yaml, "emitted.yaml", opt);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(EmitRunSpec(*again), yaml);
}

}  // namespace
}  // namespace dflash::config
