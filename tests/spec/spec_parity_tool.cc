// Our side of the parity test against the reference inference package (dflash==0.1.0,
// reference_parity_test.py), through the code dflashctl eval runs: drafter_checkpoint.h's export,
// spec::LoadExportedDrafter and spec::SpeculativeGenerate.
//
//   spec_parity_tool export --target DIR --out DIR [--layers N] [--block_size B]
//                           [--mask_token_id M] [--layer_ids 1,3] [--seed S] [--init_std X]
//                           [--sliding_layers 1 --sliding_window W]
//                           [--dtype bfloat16|float32] [--train_prompts FILE --train_steps N
//                           --lr X --train_tokens N]
//     A randomly initialized drafter for the target, trained for N Adam steps (whole batch, every
//     position an anchor) on the target's greedy continuations of FILE's prompts when given,
//     written by ExportDrafter.
//   spec_parity_tool logits --target DIR --drafter DIR --prompts FILE
//   spec_parity_tool decode --target DIR --drafter DIR --prompts FILE [--max_new_tokens N]
//                           [--stop 2,5] [--batch_size N] [--dtype float32|bfloat16]
//     Speculative decoding of every prompt (JSONL lines {"input_ids": [...]}) and plain greedy
//     decoding of the same prompts; prints one JSON object: per prompt the tokens of both and
//     each verification's emitted and accepted counts, and the eval measures.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/drafter_model.h"
#include "common/model/hf_config.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"
#include "nlohmann/json.hpp"

namespace dflash {
namespace {

using Flags = std::map<std::string, std::string>;

[[noreturn]] void Fail(const std::string& msg) {
  std::cerr << "spec_parity_tool: " << msg << "\n";
  std::exit(1);
}

std::string Need(const Flags& f, const std::string& key) {
  auto it = f.find(key);
  if (it == f.end()) Fail("--" + key + " is required");
  return it->second;
}

int64_t IntOr(const Flags& f, const std::string& key, int64_t fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) Fail("--" + key + ": not an integer: " + it->second);
  return v;
}

std::vector<int64_t> IdsOr(const Flags& f, const std::string& key) {
  std::vector<int64_t> out;
  auto it = f.find(key);
  if (it == f.end() || it->second.empty()) return out;
  for (absl::string_view s : absl::StrSplit(it->second, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) Fail("--" + key + ": not an integer list: " + it->second);
    out.push_back(v);
  }
  return out;
}

c10::ScalarType DtypeOr(const Flags& f, const std::string& fallback) {
  auto it = f.find("dtype");
  const std::string name = it == f.end() ? fallback : it->second;
  if (name == "float32") return c10::kFloat;
  if (name == "bfloat16") return c10::kBFloat16;
  Fail("--dtype must be float32 or bfloat16, got " + name);
}

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) Fail(std::string(v.status().message()));
  return *std::move(v);
}

std::vector<std::vector<int64_t>> ReadPrompts(const std::string& path);

// Adam on the method.md loss over one packed batch: the prompts and the target's greedy
// continuations of them, every position but a document's last an anchor.
void Train(const nn::TargetModel& target, const Flags& f, drafter::DrafterModel* model) {
  const std::vector<std::vector<int64_t>> prompts = ReadPrompts(Need(f, "train_prompts"));
  nn::GenerateOptions go;
  go.max_new_tokens = IntOr(f, "train_tokens", 32);
  std::vector<nn::Generation> gen = OrDie(nn::Generate(target, prompts, go));
  std::vector<int64_t> ids, positions, anchors;
  std::vector<int32_t> cu = {0};
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> doc = prompts[i];
    doc.insert(doc.end(), gen[i].tokens.begin(), gen[i].tokens.end());
    for (size_t p = 0; p < doc.size(); ++p) {
      if (p + 1 < doc.size()) anchors.push_back(static_cast<int64_t>(ids.size()));
      ids.push_back(doc[p]);
      positions.push_back(static_cast<int64_t>(p));
    }
    cu.push_back(static_cast<int32_t>(ids.size()));
  }
  drafter::DrafterBatch batch;
  batch.input_ids = at::tensor(ids, at::kLong);
  batch.positions = at::tensor(positions, at::kLong);
  batch.cu_seqlens = at::tensor(cu, at::kInt);
  batch.anchors = at::tensor(anchors, at::kLong);
  batch.loss_mask = at::ones({static_cast<int64_t>(ids.size())}, at::kLong);
  batch.features =
      OrDie(target.Forward(batch.input_ids, batch.positions, batch.cu_seqlens)).to(at::kFloat);
  double lr = 3e-3;
  if (auto it = f.find("lr"); it != f.end() && !absl::SimpleAtod(it->second, &lr)) {
    Fail("--lr: not a number: " + it->second);
  }
  std::vector<at::Tensor> m, v;
  for (const drafter::NamedParameter& p : model->parameters()) {
    m.push_back(at::zeros_like(p.tensor));
    v.push_back(at::zeros_like(p.tensor));
  }
  drafter::LossOptions loss_options;
  loss_options.gamma = 4.0;  // no default for small blocks (method.md §3.5)
  const int64_t steps = IntOr(f, "train_steps", 0);
  for (int64_t step = 1; step <= steps; ++step) {
    at::Tensor hidden = OrDie(model->Forward(batch));
    drafter::DrafterLoss loss = OrDie(model->Loss(batch, hidden, loss_options));
    (loss.numerator / loss.denominator).backward();
    at::NoGradGuard no_grad;
    const double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.999, step);
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      at::Tensor w = model->parameters()[i].tensor;
      at::Tensor g = w.grad();
      if (!g.defined()) continue;  // a tensor the loss does not reach
      m[i].mul_(0.9).add_(g, 0.1);
      v[i].mul_(0.999).addcmul_(g, g, 0.001);
      w.sub_(lr * (m[i] / c1) / ((v[i] / c2).sqrt() + 1e-8));
      g.zero_();
    }
    if (step == 1 || step == steps) {
      std::cerr << "train step " << step << ": loss "
                << (loss.numerator / loss.denominator).item<double>() << "\n";
    }
  }
}

// The DFlash drafter `trained` as a DFlash2 drafter of conv kernel, group size, selector rank and
// top-k `shape` (docs/method.md §2.2): its weights copied, the convolutions moved off the identity
// and the selector drawn, both small enough that the trained proposals mostly survive but large
// enough to change some of them (DFlash2 is not trained here: only decoded).
std::unique_ptr<drafter::DrafterModel> ToDflash2(const nn::TargetModel& target,
                                                 const std::vector<int64_t>& shape,
                                                 const drafter::DrafterModel& trained) {
  if (shape.size() != 4) Fail("--dflash2: kernel,group,rank,top_k");
  drafter::DrafterConfig c = trained.config();
  c.conv_kernel_size = shape[0];
  c.conv_group_size = shape[1];
  c.selector_rank = shape[2];
  c.selector_top_k = shape[3];
  c.output_multiplier = 1.25;
  c.final_logit_softcapping = 30.0;
  auto model = OrDie(
      drafter::DrafterModel::Create(c, trained.options(), target.embed_tokens(), target.lm_head()));
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(5);
  std::map<std::string, at::Tensor> old;
  for (const drafter::NamedParameter& p : trained.parameters()) old[p.name] = p.tensor;
  for (const drafter::NamedParameter& p : model->parameters()) {
    if (old.count(p.name) > 0) {
      p.tensor.copy_(old[p.name]);
    } else if (p.name.find("candidate_selector") != std::string::npos) {
      p.tensor.copy_(at::randn(p.tensor.sizes(), gen) * 0.5);
    } else {  // a convolution: its identity start plus noise
      p.tensor.add_(at::randn(p.tensor.sizes(), gen) * 0.05);
    }
  }
  return model;
}

int Export(const Flags& f) {
  const std::string target_dir = Need(f, "target");
  drafter::DrafterConfig c;
  c.target = OrDie(model::LoadHfConfig(target_dir));
  c.num_layers = IntOr(f, "layers", 1);
  c.block_size = IntOr(f, "block_size", 4);
  c.mask_token_id = IntOr(f, "mask_token_id", c.target.vocab_size - 1);
  c.target_layer_ids = IdsOr(f, "layer_ids");
  if (c.target_layer_ids.empty()) {
    c.target_layer_ids = model::DefaultTargetLayerIds(c.target.num_hidden_layers, c.num_layers);
  }
  // Sliding-attention layers (method.md §2.1).
  const std::vector<int64_t> sliding = IdsOr(f, "sliding_layers");
  for (int64_t i : sliding) {
    if (i < 0 || i >= c.num_layers) Fail("--sliding_layers: no layer " + std::to_string(i));
  }
  drafter::SetSlidingLayers(&c, sliding, IntOr(f, "sliding_window", 0));
  nn::TargetModelOptions to;
  to.dtype = c10::kFloat;
  to.layer_ids = c.target_layer_ids;
  to.full = f.count("train_prompts") > 0;
  auto target = OrDie(nn::TargetModel::Load(target_dir, to));
  drafter::DrafterOptions o;
  o.seed = static_cast<uint64_t>(IntOr(f, "seed", 0));
  if (auto it = f.find("init_std"); it != f.end() && !absl::SimpleAtod(it->second, &o.init_std)) {
    Fail("--init_std: not a number: " + it->second);
  }
  auto model =
      OrDie(drafter::DrafterModel::Create(c, o, target->embed_tokens(), target->lm_head()));
  if (to.full) Train(*target, f, model.get());
  if (f.count("dflash2") > 0) model = ToDflash2(*target, IdsOr(f, "dflash2"), *model);
  drafter::ExportOptions eo;
  eo.dtype = DtypeOr(f, "bfloat16") == c10::kFloat ? model::DType::kF32 : model::DType::kBF16;
  eo.overwrite = true;
  if (absl::Status s = drafter::ExportDrafter(*model, Need(f, "out"), eo); !s.ok()) {
    Fail(std::string(s.message()));
  }
  return 0;
}

std::vector<std::vector<int64_t>> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path);
  std::vector<std::vector<int64_t>> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("input_ids")) {
      Fail(path + ":" + std::to_string(n) + ": expected {\"input_ids\": [...]}");
    }
    prompts.push_back(j.at("input_ids").get<std::vector<int64_t>>());
  }
  return prompts;
}

int Decode(const Flags& f) {
  const std::string target_dir = Need(f, "target");
  const std::string drafter_dir = Need(f, "drafter");
  const drafter::DrafterConfig dc = OrDie(drafter::ReadDrafterConfig(drafter_dir));
  nn::TargetModelOptions to;
  to.dtype = DtypeOr(f, "float32");
  to.layer_ids = dc.target_layer_ids;
  to.full = true;
  auto target = OrDie(nn::TargetModel::Load(target_dir, to));
  auto drafter = OrDie(spec::LoadExportedDrafter(*target, drafter_dir));
  const std::vector<std::vector<int64_t>> prompts = ReadPrompts(Need(f, "prompts"));
  spec::SpecDecodeOptions so;
  so.max_new_tokens = IntOr(f, "max_new_tokens", 32);
  so.stop_token_ids = IdsOr(f, "stop");
  const size_t batch = static_cast<size_t>(std::max<int64_t>(1, IntOr(f, "batch_size", 1)));
  spec::AcceptanceStats stats;
  nlohmann::json per_prompt = nlohmann::json::array();
  for (size_t first = 0; first < prompts.size(); first += batch) {
    std::vector<std::vector<int64_t>> chunk(
        prompts.begin() + first, prompts.begin() + std::min(prompts.size(), first + batch));
    spec::SpecDecodeResult r = OrDie(spec::SpeculativeGenerate(*target, *drafter, chunk, so));
    nn::GenerateOptions go;
    go.max_new_tokens = so.max_new_tokens;
    go.stop_token_ids = so.stop_token_ids;
    std::vector<nn::Generation> plain = OrDie(nn::Generate(*target, chunk, go));
    stats.Add(r.stats);
    for (size_t i = 0; i < chunk.size(); ++i) {
      per_prompt.push_back({{"tokens", r.tokens[i]},
                            {"greedy", plain[i].tokens},
                            {"step_emitted", r.step_emitted[i]},
                            {"step_accepted", r.step_accepted[i]}});
    }
  }
  nlohmann::json out = {{"prompts", per_prompt},
                        {"block_size", dc.block_size},
                        {"verifications", stats.verifications},
                        {"accepted", stats.accepted},
                        {"emitted", stats.emitted},
                        {"tau", stats.tau()},
                        {"tau_pooled", stats.tau_pooled()},
                        {"tau_prompt_mean", stats.tau_prompt_mean()},
                        {"emitted_histogram", stats.emitted_histogram}};
  std::cout << out.dump() << "\n";
  return 0;
}

// For each prompt, the drafter's fp32 logits of slots 1..B-1 of the first block after it, as the
// reference package's first step computes them: slot 0 the target's greedy next token g, the
// context every prompt row (the features of prompt + g, of which the anchor's row is not seen),
// block positions L..L+B-1. JSON {"logits": [prompt][slot][token], "anchor_tokens": [...]}.
int Logits(const Flags& f) {
  const std::string drafter_dir = Need(f, "drafter");
  const drafter::DrafterConfig dc = OrDie(drafter::ReadDrafterConfig(drafter_dir));
  nn::TargetModelOptions to;
  to.dtype = c10::kFloat;
  to.layer_ids = dc.target_layer_ids;
  to.full = true;
  auto target = OrDie(nn::TargetModel::Load(Need(f, "target"), to));
  auto drafter = OrDie(spec::LoadExportedDrafter(*target, drafter_dir));
  nlohmann::json logits = nlohmann::json::array(), anchors = nlohmann::json::array();
  nlohmann::json proposals = nlohmann::json::array();  // DFlash2: the selector's greedy path
  for (const std::vector<int64_t>& prompt : ReadPrompts(Need(f, "prompts"))) {
    nn::GenerateOptions go;
    go.max_new_tokens = 1;
    const int64_t g = OrDie(nn::Generate(*target, {prompt}, go))[0].tokens.at(0);
    std::vector<int64_t> ids = prompt, positions;
    ids.push_back(g);
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t i = 0; i < n; ++i) positions.push_back(i);
    const at::Tensor id_t = at::tensor(ids, at::kLong), pos_t = at::tensor(positions, at::kLong);
    const at::Tensor cu = at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(n)}, at::kInt);
    at::NoGradGuard no_grad;
    const at::Tensor features = OrDie(target->Forward(id_t, pos_t, cu));
    drafter::DrafterBatch batch{features,
                                id_t,
                                pos_t,
                                cu,
                                at::tensor(std::vector<int64_t>{n - 1}, at::kLong),
                                at::ones({n}, at::kLong)};
    const at::Tensor hidden = OrDie(drafter->Forward(batch));
    const at::Tensor l =
        OrDie(drafter->Logits(hidden)).to(at::kDouble).narrow(0, 1, dc.block_size - 1);
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t k = 0; k < l.size(0); ++k) {
      const at::Tensor row = l[k].contiguous();
      rows.push_back(
          std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + row.numel()));
    }
    logits.push_back(rows);
    anchors.push_back(g);
    if (dc.dflash2()) {
      const at::Tensor path = OrDie(drafter->SelectCandidates(
          hidden, {g}, [](const at::Tensor& s) { return s.argmax(-1); }, nullptr, nullptr));
      proposals.push_back(
          std::vector<int64_t>(path.data_ptr<int64_t>(), path.data_ptr<int64_t>() + path.numel()));
    }
  }
  std::cout << nlohmann::json{{"logits", logits},
                              {"anchor_tokens", anchors},
                              {"proposals", proposals}}
                   .dump()
            << "\n";
  return 0;
}

}  // namespace
}  // namespace dflash

int main(int argc, char** argv) {
  if (argc < 2) dflash::Fail("usage: spec_parity_tool export|decode --flag value ...");
  const std::string mode = argv[1];
  dflash::Flags flags;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) dflash::Fail("expected --flag, got " + key);
    flags[key.substr(2)] = argv[i + 1];
  }
  if ((argc - 2) % 2 != 0) dflash::Fail(std::string("flag without a value: ") + argv[argc - 1]);
  if (mode == "export") return dflash::Export(flags);
  if (mode == "decode") return dflash::Decode(flags);
  if (mode == "logits") return dflash::Logits(flags);
  dflash::Fail("unknown mode " + mode + " (export or decode)");
}
