#include "common/config/run_spec.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/config/yaml_reader.h"

namespace dflash::config {
namespace {

namespace fs = std::filesystem;
constexpr absl::string_view kBuiltinPrefix = "builtin:";

void Read(MapReader& m, TargetSpec* t) {
  m.Require("path");
  m.Get("path", &t->path);
  m.GetAutoIntList("layer_ids", &t->layer_ids);
  m.Get("dtype", &t->dtype);
  m.Finish();
}

void Read(MapReader& m, DrafterSpec* d) {
  m.Get("layers", &d->layers);
  m.Get("block_size", &d->block_size);
  m.GetAutoInt("mask_token_id", &d->mask_token_id);
  m.Get("init_from", &d->init_from);
  m.Get("recompute", &d->recompute);
  m.Finish();
}

void Read(MapReader& m, DataSpec* d) {
  m.Require("train");
  m.Get("train", &d->train);
  m.Get("format", &d->format);
  m.Get("tokenizer", &d->tokenizer);
  m.Get("chat_template", &d->chat_template);
  m.Get("max_length", &d->max_length);
  m.Get("long_documents", &d->long_documents);
  m.Get("on_bad_record", &d->on_bad_record);
  m.Get("prepared", &d->prepared);
  m.Finish();
}

void Read(MapReader& m, BatchingSpec* b) {
  m.Get("token_budget", &b->token_budget);
  m.Get("max_anchors", &b->max_anchors);
  m.Get("grad_accum", &b->grad_accum);
  m.Finish();
}

void Read(MapReader& m, OptimSpec* o) {
  m.Get("lr", &o->lr);
  m.Get("warmup_ratio", &o->warmup_ratio);
  m.Get("schedule", &o->schedule);
  m.Get("epochs", &o->epochs);
  m.Get("max_steps", &o->max_steps);
  m.Get("clip", &o->clip);
  m.Get("weight_decay", &o->weight_decay);
  m.Get("betas", &o->betas);
  m.Get("eps", &o->eps);
  m.Finish();
}

void Read(MapReader& m, LossSpec* l) {
  m.GetAutoDouble("gamma", &l->gamma);
  m.Finish();
}

void Read(MapReader& m, PlacementSpec* p) {
  m.GetAutoInt("pairs", &p->pairs);
  m.Get("transport", &p->transport);
  m.Get("target_parallel", &p->target_parallel);
  m.Finish();
}

void Read(MapReader& m, CheckpointSpec* c) {
  m.Get("every_steps", &c->every_steps);
  m.Get("keep", &c->keep);
  m.Finish();
}

void Read(MapReader& m, EvalSpec* e) {
  m.Get("every_steps", &e->every_steps);
  m.Get("prompts", &e->prompts);
  m.Get("max_new_tokens", &e->max_new_tokens);
  m.Get("max_prompts", &e->max_prompts);
  m.Finish();
}

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

void Validate(const RunSpecOptions& opt, RunSpec* s, ConfigErrors* e) {
  static const std::regex kName("[a-z0-9][a-z0-9._-]{0,62}");
  if (!s->name.empty() && !std::regex_match(s->name, kName)) {
    e->Add("name", absl::StrCat("must match [a-z0-9][a-z0-9._-]{0,62}, got '", s->name, "'"));
  }
  CheckMin(e, "seed", s->seed, 0);

  NormalizePath(opt, e, "target.path", &s->target.path, /*want_dir=*/true, &BuiltinTargets());
  if (s->target.layer_ids) {
    const auto& ids = *s->target.layer_ids;
    if (ids.empty() || ids.size() > 64) {
      e->Add("target.layer_ids", absl::StrCat("must list 1 to 64 layers, got ", ids.size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) {
        e->Add(absl::StrCat("target.layer_ids[", i, "]"),
               absl::StrCat("must be >= 0, got ", ids[i]));
      } else if (i > 0 && ids[i] <= ids[i - 1]) {
        e->Add(absl::StrCat("target.layer_ids[", i, "]"),
               absl::StrCat("must be strictly increasing, got ", ids[i], " after ", ids[i - 1]));
      }
    }
  }
  CheckOneOf(e, "target.dtype", s->target.dtype, {"bfloat16", "float16", "float32"});

  CheckRange(e, "drafter.layers", s->drafter.layers, 1, 64);
  CheckRange(e, "drafter.block_size", s->drafter.block_size, 2, 64);
  if (s->drafter.mask_token_id) CheckMin(e, "drafter.mask_token_id", *s->drafter.mask_token_id, 0);
  NormalizePath(opt, e, "drafter.init_from", &s->drafter.init_from, /*want_dir=*/true, nullptr);
  CheckOneOf(e, "drafter.recompute", s->drafter.recompute, RecomputeModes());

  NormalizePath(opt, e, "data.train", &s->data.train, /*want_dir=*/false, &BuiltinDatasets());
  CheckOneOf(e, "data.format", s->data.format, {"chat", "pretokenized", "text"});
  if (s->data.tokenizer != "auto") {
    NormalizePath(opt, e, "data.tokenizer", &s->data.tokenizer, /*want_dir=*/false, nullptr);
  }
  CheckOneOf(e, "data.chat_template", s->data.chat_template, {"auto", "chatml", "llama3"});
  // Documents with fewer than 2*B supervised tokens are dropped (method.md §5).
  CheckRange(e, "data.max_length", s->data.max_length, 2 * s->drafter.block_size, 1 << 20);
  CheckOneOf(e, "data.long_documents", s->data.long_documents, {"truncate", "split"});
  CheckOneOf(e, "data.on_bad_record", s->data.on_bad_record, {"skip", "fail"});
  if (s->data.prepared.empty()) {
    e->Add("data.prepared", "must be auto or a file path, got an empty string");
  } else if (s->data.prepared != "auto") {
    // The prepared file may not exist yet: `dflashctl prepare` writes it.
    RunSpecOptions no_check = opt;
    no_check.check_paths = false;
    NormalizePath(no_check, e, "data.prepared", &s->data.prepared, /*want_dir=*/false, nullptr);
  }

  CheckRange(e, "batching.token_budget", s->batching.token_budget, 256, 1 << 20);
  if (s->batching.token_budget >= 256 && s->batching.token_budget < s->data.max_length) {
    e->Add("batching.token_budget",
           absl::StrCat("must be >= data.max_length (", s->data.max_length,
                        ") so that every kept document fits one micro-batch, got ",
                        s->batching.token_budget));
  }
  CheckRange(e, "batching.max_anchors", s->batching.max_anchors, 1, 65536);
  CheckRange(e, "batching.grad_accum", s->batching.grad_accum, 1, 4096);

  CheckRange(e, "optim.lr", s->optim.lr, 0.0, 1.0, /*min_exclusive=*/true);
  CheckRange(e, "optim.warmup_ratio", s->optim.warmup_ratio, 0.0, 0.5);
  CheckOneOf(e, "optim.schedule", s->optim.schedule, {"cosine", "linear", "constant"});
  CheckRange(e, "optim.epochs", s->optim.epochs, 0.0, 10000.0, /*min_exclusive=*/true);
  CheckMin(e, "optim.max_steps", s->optim.max_steps, 0);
  CheckRange(e, "optim.clip", s->optim.clip, 0.0, 1e6);
  CheckRange(e, "optim.weight_decay", s->optim.weight_decay, 0.0, 1.0);
  if (s->optim.betas.size() != 2) {
    e->Add("optim.betas", absl::StrCat("must list exactly 2 numbers, got ", s->optim.betas.size()));
  } else {
    CheckRange(e, "optim.betas[0]", s->optim.betas[0], 0.0, 0.999999);
    CheckRange(e, "optim.betas[1]", s->optim.betas[1], 0.0, 0.999999);
  }
  CheckRange(e, "optim.eps", s->optim.eps, 0.0, 1e-2, /*min_exclusive=*/true);

  if (s->loss.gamma) {
    CheckRange(e, "loss.gamma", *s->loss.gamma, 0.0, 1000.0, /*min_exclusive=*/true);
  } else if (auto g = DefaultGamma(s->drafter.block_size)) {
    s->loss.gamma = *g;
  } else {
    e->Add("loss.gamma", absl::StrCat("has no default for drafter.block_size ",
                                      s->drafter.block_size, " (known for 8, 10, 16); set it"));
  }

  if (s->placement.pairs) CheckRange(e, "placement.pairs", *s->placement.pairs, 1, 1024);
  CheckOneOf(e, "placement.transport", s->placement.transport,
             {"auto", "nccl", "cuda_ipc", "host"});
  CheckRange(e, "placement.target_parallel", s->placement.target_parallel, 1, 64);
  if (s->placement.target_parallel > 1 && s->eval.every_steps > 0) {
    e->Add("placement.target_parallel",
           "evaluation during training (eval.every_steps > 0) decodes with one target process; "
           "generating with a tensor-parallel target is not implemented: set eval.every_steps: 0");
  }

  CheckMin(e, "checkpoint.every_steps", s->checkpoint.every_steps, 1);
  CheckRange(e, "checkpoint.keep", s->checkpoint.keep, 1, 1000);

  CheckMin(e, "eval.every_steps", s->eval.every_steps, 0);
  if (s->eval.every_steps > 0 && s->eval.prompts.empty()) {
    e->Add("eval.prompts", "required when eval.every_steps > 0");
  }
  NormalizePath(opt, e, "eval.prompts", &s->eval.prompts, /*want_dir=*/false, &BuiltinDatasets());
  CheckRange(e, "eval.max_new_tokens", s->eval.max_new_tokens, 1, 32768);
  CheckRange(e, "eval.max_prompts", s->eval.max_prompts, 1, 100000);
}

std::string Num(double v) {
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

}  // namespace

const std::vector<std::string>& BuiltinTargets() {
  static const std::vector<std::string> names = {"tiny-qwen3", "qwen3-8b-random"};
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
  top.Require("name");
  top.Get("name", &spec.name);
  top.Get("seed", &spec.seed);
  top.Require("target");
  top.Require("data");
  {
    MapReader m = top.Child("target");
    Read(m, &spec.target);
  }
  {
    MapReader m = top.Child("drafter");
    Read(m, &spec.drafter);
  }
  {
    MapReader m = top.Child("data");
    Read(m, &spec.data);
  }
  {
    MapReader m = top.Child("batching");
    Read(m, &spec.batching);
  }
  {
    MapReader m = top.Child("optim");
    Read(m, &spec.optim);
  }
  {
    MapReader m = top.Child("loss");
    Read(m, &spec.loss);
  }
  {
    MapReader m = top.Child("placement");
    Read(m, &spec.placement);
  }
  {
    MapReader m = top.Child("checkpoint");
    Read(m, &spec.checkpoint);
  }
  {
    MapReader m = top.Child("eval");
    Read(m, &spec.eval);
  }
  top.Finish();
  // Type errors first: range checks on half-read values would only add noise.
  if (!errors.empty()) return errors.ToStatus(source_name);
  Validate(options, &spec, &errors);
  if (!errors.empty()) return errors.ToStatus(source_name);
  return spec;
}

std::string EmitRunSpec(const RunSpec& s) {
  YAML::Emitter out;
  auto auto_or = [](const std::optional<int64_t>& v) {
    return v ? std::to_string(*v) : std::string("auto");
  };
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "seed" << YAML::Value << s.seed;
  out << YAML::Key << "target" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "path" << YAML::Value << s.target.path;
  out << YAML::Key << "layer_ids" << YAML::Value;
  if (s.target.layer_ids) {
    out << YAML::Flow << YAML::BeginSeq;
    for (int64_t id : *s.target.layer_ids) out << id;
    out << YAML::EndSeq;
  } else {
    out << "auto";
  }
  out << YAML::Key << "dtype" << YAML::Value << s.target.dtype << YAML::EndMap;
  out << YAML::Key << "drafter" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "layers" << YAML::Value << s.drafter.layers;
  out << YAML::Key << "block_size" << YAML::Value << s.drafter.block_size;
  out << YAML::Key << "mask_token_id" << YAML::Value << auto_or(s.drafter.mask_token_id);
  out << YAML::Key << "init_from" << YAML::Value;
  if (s.drafter.init_from.empty())
    out << YAML::Null;
  else
    out << s.drafter.init_from;
  out << YAML::Key << "recompute" << YAML::Value << s.drafter.recompute;
  out << YAML::EndMap;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "train" << YAML::Value << s.data.train;
  out << YAML::Key << "format" << YAML::Value << s.data.format;
  out << YAML::Key << "tokenizer" << YAML::Value << s.data.tokenizer;
  out << YAML::Key << "chat_template" << YAML::Value << s.data.chat_template;
  out << YAML::Key << "max_length" << YAML::Value << s.data.max_length;
  out << YAML::Key << "long_documents" << YAML::Value << s.data.long_documents;
  out << YAML::Key << "on_bad_record" << YAML::Value << s.data.on_bad_record;
  out << YAML::Key << "prepared" << YAML::Value << s.data.prepared << YAML::EndMap;
  out << YAML::Key << "batching" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "token_budget" << YAML::Value << s.batching.token_budget;
  out << YAML::Key << "max_anchors" << YAML::Value << s.batching.max_anchors;
  out << YAML::Key << "grad_accum" << YAML::Value << s.batching.grad_accum << YAML::EndMap;
  out << YAML::Key << "optim" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "lr" << YAML::Value << Num(s.optim.lr);
  out << YAML::Key << "warmup_ratio" << YAML::Value << Num(s.optim.warmup_ratio);
  out << YAML::Key << "schedule" << YAML::Value << s.optim.schedule;
  out << YAML::Key << "epochs" << YAML::Value << Num(s.optim.epochs);
  out << YAML::Key << "max_steps" << YAML::Value << s.optim.max_steps;
  out << YAML::Key << "clip" << YAML::Value << Num(s.optim.clip);
  out << YAML::Key << "weight_decay" << YAML::Value << Num(s.optim.weight_decay);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double b : s.optim.betas) out << Num(b);
  out << YAML::EndSeq;
  out << YAML::Key << "eps" << YAML::Value << Num(s.optim.eps) << YAML::EndMap;
  out << YAML::Key << "loss" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "gamma" << YAML::Value << (s.loss.gamma ? Num(*s.loss.gamma) : "auto");
  out << YAML::EndMap;
  out << YAML::Key << "placement" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "pairs" << YAML::Value << auto_or(s.placement.pairs);
  out << YAML::Key << "transport" << YAML::Value << s.placement.transport;
  out << YAML::Key << "target_parallel" << YAML::Value << s.placement.target_parallel
      << YAML::EndMap;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every_steps" << YAML::Value << s.checkpoint.every_steps;
  out << YAML::Key << "keep" << YAML::Value << s.checkpoint.keep << YAML::EndMap;
  out << YAML::Key << "eval" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every_steps" << YAML::Value << s.eval.every_steps;
  out << YAML::Key << "prompts" << YAML::Value;
  if (s.eval.prompts.empty())
    out << YAML::Null;
  else
    out << s.eval.prompts;
  out << YAML::Key << "max_new_tokens" << YAML::Value << s.eval.max_new_tokens;
  out << YAML::Key << "max_prompts" << YAML::Value << s.eval.max_prompts << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace dflash::config
