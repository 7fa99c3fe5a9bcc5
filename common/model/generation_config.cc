#include "common/model/generation_config.h"

#include <cmath>
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
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {
    if (!j["repetition_penalty"].is_number()) return bad("repetition_penalty", "not a number");
    d.repetition_penalty = j["repetition_penalty"].get<double>();
    if (!(d.repetition_penalty > 0) || !std::isfinite(d.repetition_penalty)) {
      return bad("repetition_penalty", "not above 0");
    }
  }
  // transformers' other ways of choosing tokens, each at the value that leaves greedy decoding and
  // sampling with temperature / top_p / top_k as they are. A file that sets one otherwise asks for
  // answers that dflash's decoding would not give: refused rather than silently ignored.
  const struct {
    const char* key;
    double neutral;  // the key's no-op number; NaN: any value but null changes decoding
  } kOthers[] = {{"num_beams", 1.0},
                 {"typical_p", 1.0},
                 {"min_p", std::nan("")},
                 {"epsilon_cutoff", 0.0},
                 {"eta_cutoff", 0.0},
                 {"no_repeat_ngram_size", 0.0},
                 {"penalty_alpha", std::nan("")},
                 {"min_new_tokens", 0.0},
                 {"min_length", 0.0},
                 {"bad_words_ids", std::nan("")},
                 {"suppress_tokens", std::nan("")},
                 {"begin_suppress_tokens", std::nan("")},
                 {"sequence_bias", std::nan("")},
                 {"forced_bos_token_id", std::nan("")},
                 {"forced_eos_token_id", std::nan("")},
                 {"guidance_scale", std::nan("")}};
  for (const auto& other : kOthers) {
    if (!j.contains(other.key) || j[other.key].is_null()) continue;
    const nlohmann::json& v = j[other.key];
    if (!std::isnan(other.neutral) && v.is_number() && v.get<double>() == other.neutral) continue;
    return bad(
        other.key,
        absl::StrCat(v.dump(),
                     " changes how tokens are chosen, which dflash's decoding does not do "
                     "(it applies do_sample, temperature, top_p, top_k and repetition_penalty "
                     "only): remove "
                     "the key, or give --temperature / --top_p / --top_k instead of "
                     "--generation_config"));
  }
  return d;
}

}  // namespace dflash::model
