// Strict reading of YAML into typed structs. Every error names the full field path, e.g.
//   batching.token_budget: must be >= 256, got 0
// Unknown keys are errors (with a "did you mean" hint), wrong types are errors, and all errors of
// a document are collected so a user fixes them in one pass.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dflash::config {

class ConfigErrors {
 public:
  void Add(absl::string_view path, absl::string_view message);
  bool empty() const { return errors_.empty(); }
  const std::vector<std::string>& errors() const { return errors_; }
  // InvalidArgument with one error per line, prefixed by `source` (a file name) when given.
  absl::Status ToStatus(absl::string_view source) const;

 private:
  std::vector<std::string> errors_;
};

// Joins a parent path and a key: ("batching", "token_budget") -> "batching.token_budget".
std::string JoinPath(absl::string_view parent, absl::string_view key);

// A view of one YAML mapping at `path`. Reading a key marks it known; Finish() reports the rest.
class MapReader {
 public:
  // A null or missing node reads as an empty mapping; a non-mapping node is an error.
  MapReader(const YAML::Node& node, std::string path, ConfigErrors* errors);

  bool Has(absl::string_view key) const;
  // Each Get leaves *out unchanged (the default) when the key is absent or null.
  void Get(absl::string_view key, std::string* out);
  void Get(absl::string_view key, int64_t* out);
  void Get(absl::string_view key, int32_t* out);
  void Get(absl::string_view key, double* out);
  void Get(absl::string_view key, bool* out);
  void Get(absl::string_view key, std::vector<int64_t>* out);
  void Get(absl::string_view key, std::vector<double>* out);
  void Get(absl::string_view key, std::vector<std::string>* out);
  // For fields that take either the word "auto" or an integer: returns nullopt for auto.
  void GetAutoInt(absl::string_view key, std::optional<int64_t>* out);
  void GetAutoDouble(absl::string_view key, std::optional<double>* out);
  void GetAutoIntList(absl::string_view key, std::optional<std::vector<int64_t>>* out);
  // Reports an error unless the key is present, not null and not the empty string.
  void Require(absl::string_view key);
  // The child mapping; marks the key known. The child of a reader whose node was not a mapping
  // reports nothing (its parent already did).
  MapReader Child(absl::string_view key);
  // Reports every key that was never read as unknown. Call after all Gets.
  void Finish();

  const std::string& path() const { return path_; }
  ConfigErrors* errors() const { return errors_; }
  std::string FieldPath(absl::string_view key) const { return JoinPath(path_, key); }

 private:
  YAML::Node Lookup(absl::string_view key);
  bool ScalarOrError(absl::string_view key, const YAML::Node& node, absl::string_view expected);

  YAML::Node node_;
  std::string path_;
  ConfigErrors* errors_;
  std::set<std::string> known_;
  bool valid_ = true;
};

// Parses YAML text; a syntax error becomes an error naming the line and column.
absl::Status ParseYamlText(absl::string_view text, absl::string_view source, YAML::Node* out);

// Range helpers that report "<path>: must be >= lo, got v".
void CheckMin(ConfigErrors* errors, absl::string_view path, int64_t value, int64_t min);
void CheckRange(ConfigErrors* errors, absl::string_view path, int64_t value, int64_t min,
                int64_t max);
void CheckRange(ConfigErrors* errors, absl::string_view path, double value, double min, double max,
                bool min_exclusive = false);
void CheckOneOf(ConfigErrors* errors, absl::string_view path, const std::string& value,
                const std::vector<std::string>& allowed);

}  // namespace dflash::config
