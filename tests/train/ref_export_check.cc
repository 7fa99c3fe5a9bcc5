// Checks a drafter exported by the PyTorch reference training loop (scripts/bench/train_ref.py)
// against dflash itself, on the CPU:
//   ref_export_check RUN_YAML EXPORT_DIR [--init INIT_DIR] [--batch BATCH_DIR]
//   - builds the run's drafter exactly as a drafter worker does (CreateRunDrafter: config from
//     run.yaml and the target, dflash's seeded init) and loads EXPORT_DIR into it with
//     drafter::ImportDrafter, the loader of drafter.init_from and `dflashctl eval`: any name,
//     shape or config difference fails;
//   - --init: the reference's initial weights (train_ref.py --dump-init, F32) must equal dflash's
//     freshly initialized drafter bit for bit;
//   - --batch: the loss of the imported drafter on the reference's last micro-batch
//     (train_ref.py --dump-last-batch: batch.safetensors + loss.json) must match the reference's
//     loss to 1e-4 relative (same weights, same features: the forward and loss agree).
// Prints one line per check; exit status 1 on the first failure, naming what differs.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "common/config/run_spec.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/weights.h"
#include "common/train/run_options.h"
#include "common/train/run_setup.h"
#include "nlohmann/json.hpp"

namespace fs = std::filesystem;
using namespace dflash;

namespace {

int Fail(const std::string& what) {
  std::cerr << "ref_export_check: FAIL: " << what << "\n";
  return 1;
}

std::string Arg(int argc, char** argv, const std::string& flag) {
  for (int i = 3; i + 1 < argc; ++i) {
    if (argv[i] == flag) return argv[i + 1];
  }
  return "";
}

// The reference's initial weights against dflash's freshly initialized drafter's.
int CheckInit(const drafter::DrafterModel& model, const std::string& dir) {
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  absl::StatusOr<std::map<std::string, at::Tensor>> ref = nn::ReadTensorFile(path);
  if (!ref.ok()) return Fail(std::string(ref.status().message()));
  if (ref->size() != model.parameters().size()) {
    return Fail(path + ": " + std::to_string(ref->size()) + " tensors, dflash's drafter has " +
                std::to_string(model.parameters().size()));
  }
  for (const drafter::NamedParameter& p : model.parameters()) {
    auto it = ref->find(p.name);
    if (it == ref->end()) return Fail(path + ": no tensor '" + p.name + "'");
    const at::Tensor mine = p.tensor.detach().to(at::kCPU, at::kFloat);
    if (it->second.sizes() != mine.sizes() || !at::equal(it->second.to(at::kFloat), mine)) {
      const double diff = it->second.sizes() == mine.sizes()
                              ? (it->second.to(at::kFloat) - mine).abs().max().item<double>()
                              : -1;
      return Fail(path + ": '" + p.name + "' differs from dflash's seeded init (max |diff| " +
                  std::to_string(diff) + ")");
    }
  }
  std::cout << "init: " << model.parameters().size()
            << " tensors equal to dflash's seeded init, bit for bit\n";
  return 0;
}

// The imported drafter's loss on the reference's last micro-batch against the reference's.
int CheckBatch(const drafter::DrafterModel& model, const config::RunSpec& spec,
               const std::string& dir) {
  absl::StatusOr<std::map<std::string, at::Tensor>> t =
      nn::ReadTensorFile((fs::path(dir) / "batch.safetensors").string());
  if (!t.ok()) return Fail(std::string(t.status().message()));
  std::ifstream in(fs::path(dir) / "loss.json");
  const nlohmann::json want = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!want.is_object() || !want.contains("loss")) return Fail(dir + "/loss.json: no \"loss\"");
  drafter::DrafterBatch b;
  b.features = t->at("features").to(at::kFloat);
  b.input_ids = t->at("input_ids").to(at::kLong);
  b.positions = t->at("positions").to(at::kLong);
  b.cu_seqlens = t->at("cu_seqlens").to(at::kInt);
  b.anchors = t->at("anchors").to(at::kLong);
  b.loss_mask = t->at("loss_mask").to(at::kLong);
  absl::StatusOr<train::LocalRunOptions> options = train::LocalRunOptionsFor(spec, 1, 1);
  if (!options.ok()) return Fail(std::string(options.status().message()));
  const at::NoGradGuard no_grad;
  absl::StatusOr<at::Tensor> hidden = model.Forward(b);
  if (!hidden.ok()) return Fail("dflash forward: " + std::string(hidden.status().message()));
  absl::StatusOr<drafter::DrafterLoss> loss = model.Loss(b, *hidden, options->loss);
  if (!loss.ok()) return Fail("dflash loss: " + std::string(loss.status().message()));
  const double ours = loss->numerator.item<double>() / loss->denominator.item<double>();
  const double ref = want["loss"].get<double>();
  const double rel = std::abs(ours - ref) / std::max(std::abs(ref), 1e-12);
  std::cout << "loss on the last batch: dflash " << ours << ", reference " << ref << ", rel diff "
            << rel << "\n";
  if (!(rel <= 1e-4)) return Fail("the losses differ by more than 1e-4 relative");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ref_export_check RUN_YAML EXPORT_DIR [--init DIR] [--batch DIR]\n";
    return 2;
  }
  const std::string run_yaml = argv[1], export_dir = argv[2];
  std::ifstream in(run_yaml);
  if (!in) return Fail("cannot read " + run_yaml);
  std::stringstream text;
  text << in.rdbuf();
  config::RunSpecOptions opts;
  opts.base_dir = fs::absolute(run_yaml).parent_path().string();
  opts.check_paths = false;
  absl::StatusOr<config::RunSpec> spec = config::ParseRunSpec(text.str(), run_yaml, opts);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  absl::StatusOr<std::unique_ptr<nn::TargetModel>> target =
      train::LoadRunTarget(*spec, c10::Device(c10::kCPU), /*embeddings_only=*/true);
  if (!target.ok()) return Fail(std::string(target.status().message()));
  absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> model =
      train::CreateRunDrafter(*spec, **target, c10::Device(c10::kCPU));
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const std::string init_dir = Arg(argc, argv, "--init");
  if (!init_dir.empty() && CheckInit(**model, init_dir) != 0) return 1;
  if (absl::Status s = drafter::ImportDrafter(export_dir, model->get()); !s.ok()) {
    return Fail("ImportDrafter: " + std::string(s.message()));
  }
  std::cout << "import: " << export_dir << " loads into the run's drafter ("
            << (*model)->parameters().size() << " tensors)\n";
  const std::string batch_dir = Arg(argc, argv, "--batch");
  if (!batch_dir.empty() && CheckBatch(**model, *spec, batch_dir) != 0) return 1;
  return 0;
}
