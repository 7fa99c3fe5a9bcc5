#include "common/model/generation_config.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dflash::model {

absl::StatusOr<GenerationDefaults> ReadGenerationConfig(const std::string& dir) {
  GenerationDefaults d;
  d.path = (std::filesystem::path(dir) / "generation_config.json").string();
  std::ifstream in(d.path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(d.path,
                                            ": no such file (the checkpoint has no "
                                            "generation config)"));
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(d.path, ": not a JSON object"));
  }
  const auto bad = [&](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(d.path, ": ", key, ": ", why));
  };
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    if (!j["do_sample"].is_boolean()) return bad("do_sample", "not true or false");
    d.do_sample = j["do_sample"].get<bool>();
  }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    if (!j["temperature"].is_number()) return bad("temperature", "not a number");
    d.temperature = j["temperature"].get<double>();
    if (d.temperature < 0) return bad("temperature", "below 0");
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    if (!j["top_p"].is_number()) return bad("top_p", "not a number");
    d.top_p = j["top_p"].get<double>();
    if (!(d.top_p > 0 && d.top_p <= 1)) return bad("top_p", "outside (0, 1]");
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer()) return bad("top_k", "not an integer");
    d.top_k = j["top_k"].get<int64_t>();
    if (d.top_k < 0) return bad("top_k", "below 0");
  }
  return d;
}

}  // namespace dflash::model
