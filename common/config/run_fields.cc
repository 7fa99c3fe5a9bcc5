// The run.yaml field table (run_fields.h) and the checks that are more than a range or a choice.
#include "common/config/run_fields.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/yaml_reader.h"
#include "common/transport/transport.h"

namespace dflash::config {
namespace {

namespace fs = std::filesystem;
constexpr absl::string_view kBuiltinPrefix = "builtin:";

bool IsBuiltin(const std::string& path) { return absl::StartsWith(path, kBuiltinPrefix); }

// Resolves a relative path against base_dir and, when asked, checks that it exists.
void NormalizePath(const RunSpecOptions& opt, ConfigErrors* errors, absl::string_view field,
                   std::string* path, bool want_dir, const std::vector<std::string>* builtins) {
  if (path->empty()) return;
  if (IsBuiltin(*path)) {
    std::string name = path->substr(kBuiltinPrefix.size());
    if (builtins == nullptr) {
      errors->Add(field, "builtin: names are not accepted here");
    } else if (std::find(builtins->begin(), builtins->end(), name) == builtins->end()) {
      errors->Add(field, absl::StrCat("unknown builtin '", name,
                                      "' (known: ", absl::StrJoin(*builtins, ", "), ")"));
    }
    return;
  }
  fs::path p(*path);
  if (p.is_relative() && !opt.base_dir.empty()) p = fs::path(opt.base_dir) / p;
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec).lexically_normal();
  if (!ec) *path = abs.string();
  if (!opt.data_roots.empty()) {
    // Where the path really leads (symlinks of its existing part resolved), against each root
    // resolved the same way.
    const fs::path real = fs::weakly_canonical(abs, ec);
    bool inside = false;
    for (const std::string& root : opt.data_roots) {
      std::error_code rec;
      const fs::path r = fs::weakly_canonical(fs::absolute(root, rec), rec);
      const std::string rs = r.string(), ps = real.string();
      if (!rec && !ec &&
          (ps == rs || (ps.size() > rs.size() && ps.compare(0, rs.size(), rs) == 0 &&
                        (rs.back() == '/' || ps[rs.size()] == '/')))) {
        inside = true;
      }
    }
    if (!inside) {
      errors->Add(field, absl::StrCat(abs.string(), " leads to ", real.string(),
                                      ", outside the coordinator's data roots (",
                                      absl::StrJoin(opt.data_roots, ", "), ")"));
      return;
    }
  }
  if (!opt.check_paths) return;
  if (!fs::exists(abs, ec)) {
    errors->Add(field, absl::StrCat("path does not exist: ", abs.string()));
  } else if (want_dir && !fs::is_directory(abs, ec)) {
    errors->Add(field, absl::StrCat("must be a directory: ", abs.string()));
  } else if (!want_dir && fs::is_directory(abs, ec)) {
    errors->Add(field, absl::StrCat("must be a file, not a directory: ", abs.string()));
  }
}

// ---- checks of more than one field, or of paths ---------------------------------------------

void CheckName(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  static const std::regex kName("[a-z0-9][a-z0-9._-]{0,62}");
  if (!s->name.empty() && !std::regex_match(s->name, kName)) {
    e->Add("name", absl::StrCat("must match [a-z0-9][a-z0-9._-]{0,62}, got '", s->name, "'"));
  }
}

void CheckTargetPath(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  NormalizePath(opt, e, "target.path", &s->target.path, /*want_dir=*/true, &BuiltinTargets());
}

void CheckLayerIds(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  if (!s->target.layer_ids) return;
  const auto& ids = *s->target.layer_ids;
  if (ids.empty() || ids.size() > 64) {
    e->Add("target.layer_ids", absl::StrCat("must list 1 to 64 layers, got ", ids.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      e->Add(absl::StrCat("target.layer_ids[", i, "]"), absl::StrCat("must be >= 0, got ", ids[i]));
    } else if (i > 0 && ids[i] <= ids[i - 1]) {
      e->Add(absl::StrCat("target.layer_ids[", i, "]"),
             absl::StrCat("must be strictly increasing, got ", ids[i], " after ", ids[i - 1]));
    }
  }
}

void CheckInitFrom(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  NormalizePath(opt, e, "drafter.init_from", &s->drafter.init_from, /*want_dir=*/true, nullptr);
}

// drafter.sliding_layers: distinct layers of the drafter, with a window that is set and smaller
// than the longest context (else every slot would see all of it: the layers would be full ones
// made causal).
void CheckSliding(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  const DrafterSpec& d = s->drafter;
  if (d.sliding_window < 0) {
    e->Add("drafter.sliding_window", absl::StrCat("must be >= 0, got ", d.sliding_window));
  } else if (d.sliding_window > 0 && d.sliding_window >= s->data.max_length) {
    e->Add("drafter.sliding_window",
           absl::StrCat(d.sliding_window, " is not below data.max_length (", s->data.max_length,
                        "): every slot would see its whole context"));
  }
  if (!d.sliding_layers) return;  // auto: drafter.init_from's, checked when it is read
  const std::vector<int64_t>& ids = *d.sliding_layers;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= d.layers) {
      e->Add(absl::StrCat("drafter.sliding_layers[", i, "]"),
             absl::StrCat(ids[i], " is not a layer of the drafter's ", d.layers));
    } else if (std::count(ids.begin(), ids.end(), ids[i]) > 1) {
      e->Add(absl::StrCat("drafter.sliding_layers[", i, "]"),
             absl::StrCat("layer ", ids[i], " is listed twice"));
    }
  }
  if (!ids.empty() && d.sliding_window == 0) {
    e->Add("drafter.sliding_window", "required (>= 1) with drafter.sliding_layers");
  }
  if (ids.empty() && d.sliding_window > 0) {
    e->Add("drafter.sliding_window", "set, but drafter.sliding_layers lists no layer");
  }
}

// data.thinking: the chat template's enable_thinking switch, so only with chat data and the
// target's own template (the built-in ones have none).
void CheckThinking(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  const std::string& t = s->data.thinking;
  if (t != "auto" && t != "on" && t != "off") {
    e->Add("data.thinking", absl::StrCat("must be one of auto|on|off, got '", t, "'"));
  } else if (t != "auto" && s->data.format != "chat") {
    e->Add("data.thinking", absl::StrCat(t, ": only chat data is rendered with a template (",
                                         "data.format is ", s->data.format, ")"));
  } else if (t != "auto" && s->data.chat_template != "auto") {
    e->Add("data.thinking",
           absl::StrCat(t, ": the built-in ", s->data.chat_template,
                        " template has no thinking switch (data.chat_template: auto renders the "
                        "target's own)"));
  }
}

void CheckTrain(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  NormalizePath(opt, e, "data.train", &s->data.train, /*want_dir=*/false, &BuiltinDatasets());
}

void CheckTokenizer(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  if (s->data.tokenizer != "auto") {
    NormalizePath(opt, e, "data.tokenizer", &s->data.tokenizer, /*want_dir=*/false, nullptr);
  }
}

void CheckMaxLength(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  // Documents with fewer than 2*B supervised tokens are dropped (docs/method.md).
  CheckRange(e, "data.max_length", s->data.max_length, 2 * s->drafter.block_size, 1 << 20);
}

void CheckPrepared(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  if (s->data.prepared.empty()) {
    e->Add("data.prepared", "must be auto or a file path, got an empty string");
  } else if (s->data.prepared != "auto") {
    // The prepared file may not exist yet: `dflashctl prepare` writes it.
    RunSpecOptions no_check = opt;
    no_check.check_paths = false;
    NormalizePath(no_check, e, "data.prepared", &s->data.prepared, /*want_dir=*/false, nullptr);
  }
}

void CheckTokenBudget(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  CheckRange(e, "batching.token_budget", s->batching.token_budget, 256, 1 << 20);
  if (s->batching.token_budget >= 256 && s->batching.token_budget < s->data.max_length) {
    e->Add("batching.token_budget",
           absl::StrCat("must be >= data.max_length (", s->data.max_length,
                        ") so that every kept document fits one micro-batch, got ",
                        s->batching.token_budget));
  }
}

void CheckBetas(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  if (s->optim.betas.size() != 2) {
    e->Add("optim.betas", absl::StrCat("must list exactly 2 numbers, got ", s->optim.betas.size()));
  } else {
    CheckRange(e, "optim.betas[0]", s->optim.betas[0], 0.0, 0.999999);
    CheckRange(e, "optim.betas[1]", s->optim.betas[1], 0.0, 0.999999);
  }
}

// drafter.kind and DFlash2's settings (docs/method.md §2.2), the selector loss's schedule included:
// taken by dflash2 only (set with dflash: refused naming the field), auto resolved to their
// defaults.
void CheckDrafterKind(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  DrafterSpec& d = s->drafter;
  if (d.kind != "dflash" && d.kind != "dflash2") {
    e->Add("drafter.kind", absl::StrCat("must be one of dflash|dflash2, got '", d.kind, "'"));
    return;
  }
  const Dflash2Settings resolved = ResolvedDflash2(d);  // auto's defaults
  struct Setting {
    const char* path;
    std::optional<int64_t>* value;
    int64_t fallback, lo, hi;
  };
  const Setting settings[] = {
      {"drafter.conv_kernel_size", &d.conv_kernel_size, resolved.conv_kernel_size, 1, 64},
      {"drafter.conv_group_size", &d.conv_group_size, resolved.conv_group_size, 1, 65536},
      {"drafter.selector_rank", &d.selector_rank, resolved.selector_rank, 1, 65536},
      {"drafter.selector_top_k", &d.selector_top_k, resolved.selector_top_k, 1, 1048576},
  };
  for (const auto& [path, steps] :
       {std::pair{"loss.selector_warmup_steps", s->loss.selector_warmup_steps},
        std::pair{"loss.selector_ramp_steps", s->loss.selector_ramp_steps}}) {
    if (d.kind == "dflash" && steps != 0) {
      e->Add(path, "taken by drafter.kind dflash2 only (this run's drafter.kind is dflash)");
    }
  }
  for (const Setting& x : settings) {
    if (d.kind == "dflash") {
      if (x.value->has_value()) {
        e->Add(x.path, "taken by drafter.kind dflash2 only (this run's drafter.kind is dflash)");
      }
      continue;
    }
    if (!x.value->has_value()) *x.value = x.fallback;
    CheckRange(e, x.path, **x.value, x.lo, x.hi);
  }
  if (d.kind == "dflash2" && d.conv_kernel_size.value_or(0) > d.block_size) {
    e->Add("drafter.conv_kernel_size",
           absl::StrCat(*d.conv_kernel_size, " exceeds drafter.block_size ", d.block_size,
                        " (the convolution runs over a block's slots)"));
  }
}

// drafter.precision: fp8 runs the projections' GEMMs in fp8 and the rest in bf16.
void CheckPrecision(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  if (s->drafter.precision != "auto" && s->drafter.precision != "fp8") {
    e->Add("drafter.precision",
           absl::StrCat("must be one of auto|fp8, got '", s->drafter.precision, "'"));
  } else if (s->drafter.precision == "fp8" && s->target.dtype != "bfloat16") {
    e->Add("drafter.precision", absl::StrCat("fp8 needs target.dtype bfloat16 (the compute dtype "
                                             "around the fp8 GEMMs), got '",
                                             s->target.dtype, "'"));
  }
}

void CheckGamma(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  if (s->loss.gamma) {
    CheckRange(e, "loss.gamma", *s->loss.gamma, 0.0, 1000.0, /*min_exclusive=*/true);
  } else if (auto g = DefaultGamma(s->drafter.block_size)) {
    s->loss.gamma = *g;
  } else {
    e->Add("loss.gamma", absl::StrCat("has no default for drafter.block_size ",
                                      s->drafter.block_size, " (known for 8, 10, 16); set it"));
  }
}

void CheckTargetParallel(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  CheckRange(e, "placement.target_parallel", s->placement.target_parallel, 1, 64);
}

void CheckEvalWorker(const RunSpecOptions&, RunSpec* s, ConfigErrors* e) {
  const std::string& w = s->eval.worker;
  if (w != "auto" && w != "pair" && w != "reserved") {
    e->Add("eval.worker", absl::StrCat("must be one of auto|pair|reserved, got '", w, "'"));
  } else if (w == "reserved" && s->eval.every_steps == 0) {
    e->Add("eval.worker", "reserved needs eval.every_steps > 0 (a group kept for no evaluation)");
  }
}

void CheckEvalPrompts(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  if (s->eval.every_steps > 0 && s->eval.prompts.empty()) {
    e->Add("eval.prompts", "required when eval.every_steps > 0");
  }
  NormalizePath(opt, e, "eval.prompts", &s->eval.prompts, /*want_dir=*/false, &BuiltinDatasets());
}

// ---- rule constructors -----------------------------------------------------------------------

FieldRule IntRange(int64_t lo, int64_t hi) {
  FieldRule r;
  r.kind = FieldRule::kIntRange;
  r.int_min = lo;
  r.int_max = hi;
  return r;
}

FieldRule IntMin(int64_t lo) {
  FieldRule r;
  r.kind = FieldRule::kIntMin;
  r.int_min = lo;
  return r;
}

FieldRule Range(double lo, double hi, bool min_exclusive = false) {
  FieldRule r;
  r.kind = FieldRule::kDoubleRange;
  r.min = lo;
  r.max = hi;
  r.min_exclusive = min_exclusive;
  return r;
}

FieldRule OneOf(std::vector<std::string> choices) {
  FieldRule r;
  r.kind = FieldRule::kOneOf;
  r.choices = std::move(choices);
  return r;
}

// placement.transport: auto, or a transport's name (common/transport/transport.h).
std::vector<std::string> TransportChoices() {
  std::vector<std::string> choices = transport::TransportNames();
  choices.insert(choices.begin(), "auto");
  return choices;
}

FieldRule Custom(void (*check)(const RunSpecOptions&, RunSpec*, ConfigErrors*)) {
  FieldRule r;
  r.kind = FieldRule::kCustom;
  r.custom = check;
  return r;
}

// A field at `expr` of a RunSpec `s` (a captureless lambda, so that the table holds a pointer).
#define DFLASH_AT(expr) (+[](RunSpec& s) -> FieldPtr { return &(expr); })

std::vector<RunField> MakeFields() {
  const unsigned T = kEchoTarget, T0 = kEchoTargetRank0, D = kEchoDrafter;
  return {
      {"", "name", true, false, DFLASH_AT(s.name), Custom(CheckName)},
      {"", "seed", false, false, DFLASH_AT(s.seed), IntMin(0)},

      {"target", "path", true, false, DFLASH_AT(s.target.path), Custom(CheckTargetPath), T | D},
      {"target", "layer_ids", false, false, DFLASH_AT(s.target.layer_ids), Custom(CheckLayerIds),
       T | D},
      {"target", "dtype", false, false, DFLASH_AT(s.target.dtype),
       OneOf({"bfloat16", "float16", "float32"}), T},

      {"drafter", "layers", false, false, DFLASH_AT(s.drafter.layers), IntRange(1, 64), D},
      {"drafter", "block_size", false, false, DFLASH_AT(s.drafter.block_size), IntRange(2, 64), D},
      {"drafter", "mask_token_id", false, false, DFLASH_AT(s.drafter.mask_token_id), IntMin(0), D},
      {"drafter", "init_from", false, true, DFLASH_AT(s.drafter.init_from), Custom(CheckInitFrom)},
      {"drafter", "recompute", false, false, DFLASH_AT(s.drafter.recompute),
       OneOf(RecomputeModes()), D},
      {"drafter", "sliding_layers", false, false, DFLASH_AT(s.drafter.sliding_layers), {}, D},
      {"drafter", "sliding_window", false, false, DFLASH_AT(s.drafter.sliding_window),
       Custom(CheckSliding), D},
      {"drafter", "kind", false, false, DFLASH_AT(s.drafter.kind), Custom(CheckDrafterKind), D},
      {"drafter", "precision", false, false, DFLASH_AT(s.drafter.precision), Custom(CheckPrecision),
       D},
      {"drafter", "conv_kernel_size", false, false, DFLASH_AT(s.drafter.conv_kernel_size), {}, D},
      {"drafter", "conv_group_size", false, false, DFLASH_AT(s.drafter.conv_group_size), {}, D},
      {"drafter", "selector_rank", false, false, DFLASH_AT(s.drafter.selector_rank), {}, D},
      {"drafter", "selector_top_k", false, false, DFLASH_AT(s.drafter.selector_top_k), {}, D},

      {"data", "train", true, false, DFLASH_AT(s.data.train), Custom(CheckTrain)},
      {"data", "format", false, false, DFLASH_AT(s.data.format),
       OneOf({"chat", "pretokenized", "text"})},
      {"data", "tokenizer", false, false, DFLASH_AT(s.data.tokenizer), Custom(CheckTokenizer)},
      {"data", "chat_template", false, false, DFLASH_AT(s.data.chat_template),
       OneOf({"auto", "chatml", "llama3"})},
      {"data", "thinking", false, false, DFLASH_AT(s.data.thinking), Custom(CheckThinking)},
      {"data", "max_length", false, false, DFLASH_AT(s.data.max_length), Custom(CheckMaxLength)},
      {"data", "long_documents", false, false, DFLASH_AT(s.data.long_documents),
       OneOf({"truncate", "split"})},
      {"data", "on_bad_record", false, false, DFLASH_AT(s.data.on_bad_record),
       OneOf({"skip", "fail"})},
      {"data", "prepared", false, false, DFLASH_AT(s.data.prepared), Custom(CheckPrepared)},

      {"batching", "token_budget", false, false, DFLASH_AT(s.batching.token_budget),
       Custom(CheckTokenBudget), T},
      {"batching", "max_anchors", false, false, DFLASH_AT(s.batching.max_anchors),
       IntRange(1, 65536), D},
      {"batching", "grad_accum", false, false, DFLASH_AT(s.batching.grad_accum), IntRange(1, 4096)},

      {"optim", "lr", false, false, DFLASH_AT(s.optim.lr), Range(0.0, 1.0, true), D},
      {"optim", "warmup_ratio", false, false, DFLASH_AT(s.optim.warmup_ratio), Range(0.0, 0.5)},
      {"optim", "schedule", false, false, DFLASH_AT(s.optim.schedule),
       OneOf({"cosine", "linear", "constant"})},
      {"optim", "epochs", false, false, DFLASH_AT(s.optim.epochs), Range(0.0, 10000.0, true)},
      {"optim", "max_steps", false, false, DFLASH_AT(s.optim.max_steps), IntMin(0)},
      {"optim", "clip", false, false, DFLASH_AT(s.optim.clip), Range(0.0, 1e6)},
      {"optim", "weight_decay", false, false, DFLASH_AT(s.optim.weight_decay), Range(0.0, 1.0)},
      {"optim", "betas", false, false, DFLASH_AT(s.optim.betas), Custom(CheckBetas)},
      {"optim", "eps", false, false, DFLASH_AT(s.optim.eps), Range(0.0, 1e-2, true)},

      {"loss", "gamma", false, false, DFLASH_AT(s.loss.gamma), Custom(CheckGamma),
       kEchoDrafterIfSet},
      {"loss", "weighting", false, false, DFLASH_AT(s.loss.weighting), OneOf({"decay", "dpace"}),
       D},
      {"loss", "dpace_alpha", false, false, DFLASH_AT(s.loss.dpace_alpha), Range(0.0, 1.0, true),
       D},
      {"loss", "selector_alpha", false, false, DFLASH_AT(s.loss.selector_alpha), Range(0.0, 100.0),
       D},
      {"loss", "selector_warmup_steps", false, false, DFLASH_AT(s.loss.selector_warmup_steps),
       IntMin(0), D},
      {"loss", "selector_ramp_steps", false, false, DFLASH_AT(s.loss.selector_ramp_steps),
       IntMin(0), D},

      {"placement", "pairs", false, false, DFLASH_AT(s.placement.pairs), IntRange(1, 1024), D},
      {"placement", "transport", false, false, DFLASH_AT(s.placement.transport),
       OneOf(TransportChoices()), T0 | D},
      {"placement", "target_parallel", false, false, DFLASH_AT(s.placement.target_parallel),
       Custom(CheckTargetParallel)},

      {"checkpoint", "every_steps", false, false, DFLASH_AT(s.checkpoint.every_steps), IntMin(1)},
      {"checkpoint", "keep", false, false, DFLASH_AT(s.checkpoint.keep), IntRange(1, 1000)},

      {"eval", "every_steps", false, false, DFLASH_AT(s.eval.every_steps), IntMin(0)},
      {"eval", "worker", false, false, DFLASH_AT(s.eval.worker), Custom(CheckEvalWorker)},
      {"eval", "prompts", false, true, DFLASH_AT(s.eval.prompts), Custom(CheckEvalPrompts)},
      {"eval", "max_new_tokens", false, false, DFLASH_AT(s.eval.max_new_tokens),
       IntRange(1, 32768)},
      {"eval", "max_prompts", false, false, DFLASH_AT(s.eval.max_prompts), IntRange(1, 100000)},
      {"eval", "temperature", false, false, DFLASH_AT(s.eval.temperature), Range(0.0, 100.0)},
      {"eval", "top_p", false, false, DFLASH_AT(s.eval.top_p), Range(0.0, 1.0, true)},
      {"eval", "top_k", false, false, DFLASH_AT(s.eval.top_k), IntRange(0, 1 << 30)},
      {"eval", "seed", false, false, DFLASH_AT(s.eval.seed), IntMin(0)},
  };
}

#undef DFLASH_AT

}  // namespace

std::string YamlDouble(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, r.ptr);
  // Keep YAML readers from taking "6" as an integer, and YAML 1.1 readers (which want a dot in
  // the mantissa) from taking "6e-04" as a string: emit "6.0" and "6.0e-04".
  const size_t e = s.find_first_of("eE");
  const std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') == std::string::npos)
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

std::string RunField::path() const {
  return section.empty() ? std::string(key) : absl::StrCat(section, ".", key);
}

const std::vector<RunField>& RunFields() {
  static const std::vector<RunField>* fields = new std::vector<RunField>(MakeFields());
  return *fields;
}

const std::vector<absl::string_view>& RunSections() {
  static const std::vector<absl::string_view> sections = {
      "target", "drafter", "data", "batching", "optim", "loss", "placement", "checkpoint", "eval"};
  return sections;
}

bool SectionRequired(absl::string_view section) { return section == "target" || section == "data"; }

std::string FieldValueText(const RunField& field, const RunSpec& spec) {
  // `at` points into a mutable spec (reading writes through it); here it is only read.
  const FieldPtr p = field.at(const_cast<RunSpec&>(spec));
  if (auto* v = std::get_if<std::string*>(&p)) {
    return (*v)->empty() && field.null_when_empty ? "null" : **v;
  }
  if (auto* v = std::get_if<int64_t*>(&p)) return std::to_string(**v);
  if (auto* v = std::get_if<double*>(&p)) return YamlDouble(**v);
  if (auto* v = std::get_if<std::optional<int64_t>*>(&p)) {
    return (*v)->has_value() ? std::to_string(***v) : "auto";
  }
  if (auto* v = std::get_if<std::optional<double>*>(&p)) {
    return (*v)->has_value() ? YamlDouble(***v) : "auto";
  }
  if (auto* v = std::get_if<std::optional<std::vector<int64_t>>*>(&p)) {
    return (*v)->has_value() ? absl::StrCat("[", absl::StrJoin(***v, ", "), "]") : "auto";
  }
  const std::vector<double>& list = *std::get<std::vector<double>*>(p);
  std::vector<std::string> parts;
  for (double d : list) parts.push_back(YamlDouble(d));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string EchoValueText(const RunField& field, const RunSpec& spec) {
  const FieldPtr p = field.at(const_cast<RunSpec&>(spec));  // only read, as FieldValueText
  if (auto* v = std::get_if<std::string*>(&p)) return **v;
  if (auto* v = std::get_if<int64_t*>(&p)) return std::to_string(**v);
  if (auto* v = std::get_if<double*>(&p)) return absl::StrCat(**v);
  if (auto* v = std::get_if<std::optional<int64_t>*>(&p)) {
    return (*v)->has_value() ? std::to_string(***v) : "auto";
  }
  if (auto* v = std::get_if<std::optional<double>*>(&p)) {
    return (*v)->has_value() ? absl::StrCat(***v) : "auto";
  }
  if (auto* v = std::get_if<std::optional<std::vector<int64_t>>*>(&p)) {
    return (*v)->has_value() ? absl::StrJoin(***v, ",") : "auto";
  }
  return absl::StrJoin(*std::get<std::vector<double>*>(p), ",");
}

std::vector<std::string> EchoedFields(unsigned echo_mask) {
  std::vector<std::string> out;
  for (const RunField& f : RunFields()) {
    if (f.echo & echo_mask) out.push_back(f.path());
  }
  return out;
}

}  // namespace dflash::config
