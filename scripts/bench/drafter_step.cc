// One drafter training step (GPU targets): the project's DrafterModel + DrafterTrainer,
// unchanged, at the Qwen3-8B drafter geometry, timed and measured the way the drafter worker runs
// it (services/drafter_worker/drafter_runner.cc): target from run.yaml `builtin:qwen3-8b-random`
// loaded with embeddings_only (embed_tokens, lm_head and layer 0, as the worker holds them),
// drafter from CreateRunDrafter (fp32 master weights, bf16 compute, 5 layers, block 16, K = 5
// feature layers), one micro-batch per step: AddMicroBatch (forward, fused loss, backward of the
// numerator) then Step (1 / weight sum, clip 1.0, AdamW).
//
// The batch: documents of --doc-min..--doc-max tokens (uniform lengths, uniform token ids, loss
// mask alternating prompt / answer runs of 16..271 tokens, like batching::SyntheticSource) packed
// to exactly --tokens tokens (the last one cut), materialized by batching::MaterializeBatch,
// anchors from batching::SampleAnchors (--anchors = max_anchors), features [T, K*H] drawn on the
// device in the target dtype. The same batch every step.
//
// Reports (one JSON line on stdout, and --json FILE): median ms per step over --steps timed steps
// after --warmup, steps/s, context tokens/s, the CUDA caching allocator's peak of allocated bytes
// over the WHOLE process (setup included, never reset), the static bytes (fp32 parameters 4 B +
// gradients 4 B + AdamW exp_avg and exp_avg_sq 8 B per trainable element; the frozen lm_head the
// drafter borrows, and embed_tokens where it stays on the device: tied, or a CPU run; the other
// target tensors the process held at load) and the loss of every step.
//
// For drafter_step_ref.py (the PyTorch reference of the same step, in the same run):
//   --dump-dir DIR       DIR/batch.safetensors: features, input_ids, positions, cu_seqlens,
//   anchors,
//                        loss_mask (what DrafterBatch holds), and DIR/meta.json (shapes, gamma,
//                        rms eps, rope theta, mask id, block size).
//   --export-weights DIR the initial drafter (drafter::ExportDrafter, F32, method.md §7 names) in
//                        DIR/drafter and the frozen embed_tokens / lm_head in
//                        DIR/frozen.safetensors.
//
// Usage: drafter_step [--tokens 8192] [--anchors 512] [--steps 10] [--warmup 3] [--seed 1]
//          [--doc-min 200] [--doc-max 2000] [--target builtin:qwen3-8b-random] [--dtype bfloat16]
//          [--layers 5] [--recompute none|mlp|layers] [--device cuda|cpu] [--json FILE] [--dump-dir
//          DIR] [--export-weights DIR] [--profile 1] [--precision auto|fp8] [--kind dflash|dflash2]
//          [--mask-token ID] [--weighting decay|dpace]
// Each timed step ends with a device synchronization (ms_median); then the same number of steps
// runs back to back with one synchronization at the end (ms_pipelined: what a run's steps take,
// without the host's wait between them; drafter_step_ref.py measures both the same way).
// --kind dflash2: drafter.kind dflash2 with its auto settings (convolution taps 2, groups of 16
// channels, selector rank 256 over the top 16; the selector loss at loss.selector_alpha 1;
// docs/method.md §2.2); drafter_step_ref.py runs the same DFlash2 step from the dump.
// --precision fp8: drafter.precision fp8 (the projections' GEMMs in e4m3, docs/method.md §4.1;
// a GPU of compute capability 8.9 or later).
// --profile 1 (CUDA only) adds where the device time goes (common/device/kernel_profile.h): the
// kernels of the forward + loss, of the backward and of one trainer step by category, tables on
// stderr and "profile" in the JSON.
// --target builtin:tiny-qwen3 --device cpu --dtype float32 --tokens 512 --anchors 32 --doc-min 60
// --doc-max 200 is a CPU smoke-test geometry (with 256 tokens / 8 anchors the first step can have
// no supervised anchor and is refused as skipped).
#include <ATen/Context.h>
#include <ATen/ops/randn.h>
#include <c10/core/Device.h>

#ifdef DFLASH_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/rng.h"
#include "common/batching/anchors.h"
#include "common/batching/memory_source.h"
#include "common/batching/packed_batch.h"
#include "common/config/run_spec.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/drafter_model.h"
#include "common/model/safetensors.h"
#include "common/train/local_run.h"
#include "common/train/run_options.h"
#include "common/train/run_setup.h"
#include "common/train/trainer.h"
#include "scripts/bench/bench_device.h"
#include "scripts/bench/bench_flags.h"
#include "common/device/kernel_profile.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;

using dflash::SplitMix64;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "drafter_step: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

struct Memory {
  int64_t current = 0, peak = 0;
};
Memory DeviceMemory(const c10::Device& device) {
#ifdef DFLASH_BENCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return {stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak};
  }
#endif
  return {};
}
void ResetPeak(const c10::Device& device) {
#ifdef DFLASH_BENCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

dflash::model::DType FileDType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return dflash::model::DType::kF32;
    case at::kBFloat16:
      return dflash::model::DType::kBF16;
    case at::kHalf:
      return dflash::model::DType::kF16;
    case at::kLong:
      return dflash::model::DType::kI64;
    case at::kInt:
      return dflash::model::DType::kI32;
    default:
      Die(absl::StrCat("no file dtype for ", c10::toString(t.scalar_type())));
  }
}

// Writes CPU copies of `tensors` (widest element first, so every tensor stays aligned).
void WriteTensors(const std::string& path, std::vector<std::pair<std::string, at::Tensor>> tensors,
                  const std::map<std::string, std::string>& metadata = {}) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();
  });
  std::vector<at::Tensor> keep;
  std::vector<dflash::model::TensorToWrite> out;
  for (const auto& [name, t] : tensors) {
    keep.push_back(t.detach().to(at::kCPU).contiguous());
    dflash::model::TensorToWrite w;
    w.name = name;
    w.dtype = FileDType(keep.back());
    w.shape = keep.back().sizes().vec();
    w.data = keep.back().data_ptr();
    w.nbytes = keep.back().nbytes();
    out.push_back(std::move(w));
  }
  Check(dflash::model::WriteSafetensors(path, out, metadata), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--tokens", "--anchors", "--steps", "--warmup", "--seed", "--doc-min", "--doc-max",
       "--layers", "--recompute", "--target", "--dtype", "--device", "--json", "--dump-dir",
       "--precision", "--export-weights", "--profile", "--kind", "--mask-token",
       "--weighting"},
      "drafter_step");
  const int64_t tokens = Flag(argc, argv, "--tokens", 8192);
  const int64_t max_anchors = Flag(argc, argv, "--anchors", 512);
  const int64_t steps = Flag(argc, argv, "--steps", 10);
  const int64_t warmup = Flag(argc, argv, "--warmup", 3);
  const int64_t seed = Flag(argc, argv, "--seed", 1);
  const int64_t doc_min = Flag(argc, argv, "--doc-min", 200);
  const int64_t doc_max = Flag(argc, argv, "--doc-max", 2000);
  const int64_t layers = Flag(argc, argv, "--layers", 5);
  const std::string recompute = StrFlag(argc, argv, "--recompute", "none");
  const std::string precision = StrFlag(argc, argv, "--precision", "auto");
  const std::string kind = StrFlag(argc, argv, "--kind", "dflash");
  dflash::bench::RequireOneOf(kind, {"dflash", "dflash2"}, "--kind", "drafter_step");
  const std::string target_path = StrFlag(argc, argv, "--target", "builtin:qwen3-8b-random");
  const std::string dtype = StrFlag(argc, argv, "--dtype", "bfloat16");
  const std::string device_name = StrFlag(argc, argv, "--device", "cuda");
  const std::string json_path = StrFlag(argc, argv, "--json");
  const std::string dump_dir = StrFlag(argc, argv, "--dump-dir");
  const std::string export_dir = StrFlag(argc, argv, "--export-weights");
  const bool profile = Flag(argc, argv, "--profile", 0) != 0;
  // drafter.mask_token_id; -1 keeps `auto` (a target without tokenizer.json, as the builtin
  // Qwen3.5 shapes, needs an id: one above 151000 is never in this benchmark's data).
  const int64_t mask_token = Flag(argc, argv, "--mask-token", -1);
  // loss.weighting: decay (the default) or dpace (D-PACE, loss.dpace_alpha's default 0.5).
  const std::string weighting = StrFlag(argc, argv, "--weighting", "decay");
  dflash::bench::RequireOneOf(weighting, {"decay", "dpace"}, "--weighting", "drafter_step");
  if (tokens < 2 || max_anchors < 1 || steps < 1 || warmup < 0 || doc_min < 2 ||
      doc_max < doc_min) {
    Die("bad flags: need --tokens >= 2, --anchors >= 1, --steps >= 1, 2 <= --doc-min <= --doc-max");
  }
  const c10::Device device =
      device_name == "cpu" ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
#ifndef DFLASH_BENCH_CUDA
  if (device.is_cuda()) Die("built without CUDA: use --device cpu");
#endif
  if (profile && !device.is_cuda())
    Die("--profile 1 needs --device cuda (it times device kernels)");

  // The run.yaml the drafter worker would get (only target, drafter, seed and optim matter here).
  const std::string yaml = absl::StrCat(
      "name: drafter-step-bench\nseed: ", seed, "\ntarget: {path: \"", target_path,
      "\", dtype: ", dtype, "}\ndrafter: {layers: ", layers, ", recompute: ", recompute,
      ", precision: ", precision, ", kind: ", kind, ", block_size: 16",
      mask_token >= 0 ? absl::StrCat(", mask_token_id: ", mask_token) : std::string(),
      "}\ndata: {train: \"builtin:long-synthetic\", max_length: ", std::min<int64_t>(2048, tokens),
      "}\n", "batching: {token_budget: ", tokens, ", max_anchors: ", max_anchors,
      ", grad_accum: 1}\n",
      "optim: {lr: 6.0e-4, schedule: constant, warmup_ratio: 0.0, max_steps: ", warmup + steps,
      "}\nloss: {weighting: ", weighting, "}\n");
  dflash::config::RunSpecOptions spec_options;
  spec_options.check_paths = false;
  absl::StatusOr<dflash::config::RunSpec> spec =
      dflash::config::ParseRunSpec(yaml, "drafter_step.yaml", spec_options);
  Check(spec.status(), "run spec");
  absl::StatusOr<dflash::train::LocalRunOptions> run_options =
      dflash::train::LocalRunOptionsFor(*spec, warmup + steps, 1);
  Check(run_options.status(), "run options");

  const auto t_setup = std::chrono::steady_clock::now();
  // As the drafter worker: the target's embeddings only, then the drafter borrowing them.
  absl::StatusOr<std::unique_ptr<dflash::nn::TargetModel>> target =
      dflash::train::LoadRunTarget(*spec, device, /*embeddings_only=*/true);
  Check(target.status(), "target");
  const int64_t target_bytes = DeviceMemory(device).current;
  absl::StatusOr<std::unique_ptr<dflash::drafter::DrafterModel>> drafter =
      dflash::train::CreateRunDrafter(*spec, **target, device);
  Check(drafter.status(), "drafter");
  const dflash::drafter::DrafterConfig& config = (*drafter)->config();
  absl::StatusOr<std::unique_ptr<dflash::train::DrafterTrainer>> trainer =
      dflash::train::DrafterTrainer::Create(drafter->get(), run_options->optim, run_options->loss);
  Check(trainer.status(), "trainer");

  // Static memory, from the parameter list: fp32 master weights, their gradients, AdamW's two
  // moments (4 + 4 + 8 bytes per element).
  int64_t param_elems = 0, param_bytes = 0;
  for (const auto& p : (*drafter)->parameters()) {
    param_elems += p.tensor.numel();
    param_bytes += static_cast<int64_t>(p.tensor.nbytes());
  }
  const int64_t train_static = param_bytes * 4;  // params + grads + exp_avg + exp_avg_sq (fp32)
  int64_t frozen = 0, other_held = 0;
  {
    // Handles only while the target exists: the drafter keeps what it uses (lm_head on the
    // device, embed_tokens in host memory), and a handle kept here would hold the device copy of
    // embed_tokens (1.16 GiB) in the peak.
    const at::Tensor embed = (*target)->embed_tokens();
    const at::Tensor lm_head = (*target)->lm_head();
    const bool tied = lm_head.is_same(embed);
    const int64_t loaded =
        static_cast<int64_t>(embed.nbytes()) + (tied ? 0 : static_cast<int64_t>(lm_head.nbytes()));
    // On the drafter's device: lm_head; an untied embed_tokens only on the CPU (a CUDA drafter
    // keeps it in host memory, DrafterModel::InitParameters).
    frozen = tied || !device.is_cuda() ? loaded : static_cast<int64_t>(lm_head.nbytes());
    // What else the embeddings-only target held on the device (layer 0, its final norm, the
    // device copy of embed_tokens), freed here as the drafter worker frees it once the drafter
    // exists.
    other_held = device.is_cuda() ? target_bytes - frozen : 0;
    if (!export_dir.empty()) {
      std::filesystem::create_directories(export_dir);
      WriteTensors(export_dir + "/frozen.safetensors",
                   {{"embed_tokens", embed}, {"lm_head", lm_head}});
    }
  }
  target->reset();

  // Documents filling the budget exactly; ids in [16, min(V, 151000)), never the mask id.
  SplitMix64 rng(dflash::SeedHash(0x4452414654535450ULL, {static_cast<uint64_t>(seed)}));
  const int64_t vocab = std::min<int64_t>(config.target.vocab_size, 151000);
  dflash::batching::InMemorySource source;
  std::vector<dflash::batching::Piece> pieces;
  for (int64_t filled = 0; filled < tokens;) {
    const int64_t len =
        doc_min + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(doc_max - doc_min + 1)));
    std::vector<int32_t> ids(static_cast<size_t>(len));
    std::vector<uint8_t> mask(static_cast<size_t>(len));
    bool answer = false;
    for (int64_t i = 0; i < len;) {
      const int64_t run = 16 + static_cast<int64_t>(rng.Below(256));
      for (int64_t k = 0; k < run && i < len; ++k, ++i) {
        int64_t id = 16 + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(vocab - 16)));
        if (id == config.mask_token_id) id = 16;
        ids[i] = static_cast<int32_t>(id);
        mask[i] = answer ? 1 : 0;
      }
      answer = !answer;
    }
    const int64_t take = std::min(len, tokens - filled);
    pieces.push_back({source.num_documents(), 0, static_cast<int32_t>(take)});
    source.Add(std::move(ids), std::move(mask));
    filled += take;
  }
  absl::StatusOr<dflash::batching::PackedBatch> packed =
      dflash::batching::MaterializeBatch(source, pieces, tokens);
  Check(packed.status(), "materialize");
  dflash::batching::AnchorSeed anchor_seed;
  anchor_seed.run_seed = static_cast<uint64_t>(seed);
  absl::StatusOr<std::vector<int32_t>> anchors =
      dflash::batching::SampleAnchors(packed->loss_mask, packed->doc_ids, max_anchors, anchor_seed);
  Check(anchors.status(), "anchors");
  absl::StatusOr<c10::ScalarType> feature_dtype = dflash::train::RunTargetDtype(*spec);
  Check(feature_dtype.status(), "dtype");
  at::manual_seed(static_cast<uint64_t>(seed));
  const at::Tensor features = at::randn({tokens, config.feature_dim()},
                                        at::TensorOptions().dtype(*feature_dtype).device(device));
  const dflash::drafter::DrafterBatch batch =
      dflash::train::MakeDrafterBatch(*packed, *anchors, features);

  if (!export_dir.empty()) {
    std::filesystem::create_directories(export_dir);
    dflash::drafter::ExportOptions eo;
    eo.dtype = dflash::model::DType::kF32;  // bit-exact master weights
    eo.overwrite = true;
    Check(dflash::drafter::ExportDrafter(**drafter, export_dir + "/drafter", eo), "export");
  }
  if (!dump_dir.empty()) {
    std::filesystem::create_directories(dump_dir);
    WriteTensors(dump_dir + "/batch.safetensors", {{"features", batch.features},
                                                   {"input_ids", batch.input_ids},
                                                   {"positions", batch.positions},
                                                   {"cu_seqlens", batch.cu_seqlens},
                                                   {"anchors", batch.anchors},
                                                   {"loss_mask", batch.loss_mask}});
    std::ofstream meta(dump_dir + "/meta.json");
    const auto& t = config.target;
    meta << "{\"tokens\": " << tokens << ", \"anchors\": " << batch.anchors.size(0)
         << ", \"documents\": " << pieces.size() << ", \"block_size\": " << config.block_size
         << ", \"mask_token_id\": " << config.mask_token_id
         << ", \"gamma\": " << run_options->loss.gamma << ", \"rms_norm_eps\": " << t.rms_norm_eps
         << ", \"rope_theta\": " << t.rope_theta << ", \"hidden_size\": " << t.hidden_size
         << ", \"num_attention_heads\": " << t.num_attention_heads
         << ", \"num_key_value_heads\": " << t.num_key_value_heads
         << ", \"head_dim\": " << t.head_dim << ", \"intermediate_size\": " << t.intermediate_size
         << ", \"vocab_size\": " << t.vocab_size << ", \"num_layers\": " << config.num_layers
         << ", \"num_features\": " << config.num_features() << ", \"dtype\": \"" << dtype
         << "\", \"kind\": \"" << kind << "\", \"conv_kernel_size\": " << config.conv_kernel_size
         << ", \"conv_group_size\": " << config.conv_group_size
         << ", \"selector_rank\": " << config.selector_rank
         << ", \"selector_top_k\": " << config.selector_top_k
         << ", \"selector_alpha\": " << run_options->loss.selector_loss_alpha
         << ", \"weighting\": \"" << weighting
         << "\", \"dpace_alpha\": " << run_options->loss.dpace_alpha
         << ", \"lr\": " << run_options->optim.lr
         << ", \"clip_norm\": " << run_options->optim.clip_norm << "}\n";
  }
  dflash::bench::Synchronize(device);
  const double setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();

  std::vector<double> ms, losses;
  double grad_norm0 = 0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Check((*trainer)->AddMicroBatch(batch), "AddMicroBatch");
    absl::StatusOr<dflash::train::StepStats> stats = (*trainer)->Step();
    Check(stats.status(), "Step");
    dflash::bench::Synchronize(device);
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (stats->skipped) Die(absl::StrCat("step ", i, " was skipped (non-finite loss or norm)"));
    if (i == 0) grad_norm0 = stats->grad_norm;
    losses.push_back(stats->loss);
    if (i >= warmup) ms.push_back(elapsed);
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const auto t_pipelined = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    Check((*trainer)->AddMicroBatch(batch), "AddMicroBatch");
    Check((*trainer)->Step().status(), "Step");
  }
  dflash::bench::Synchronize(device);
  const double pipelined =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_pipelined)
          .count() /
      static_cast<double>(steps);
  const Memory mem = DeviceMemory(device);
  const int64_t stat = train_static + frozen;
  // One more micro-batch as the trainer runs it, phase by phase: the forward + loss, then the
  // backward into gradients that do not exist yet; the allocator's peak of each (reset before it)
  // and, with --profile 1, its device kernels by category; then, profiled, a whole trainer step
  // (the same two, 1 / weight sum, clipping and AdamW). The optimizer step's peak is the whole
  // run's when neither phase reaches it.
  int64_t forward_peak = 0, backward_peak = 0;
  std::string profile_json;
  if (device.is_cuda()) {
    // Runs `work`; returns its profile's JSON (empty without --profile) and sets *peak.
    auto phase = [&](const char* title, const std::function<void()>& work, bool host_ops,
                     int64_t* peak) {
      ResetPeak(device);
      std::string json;
      if (profile) {
        absl::StatusOr<dflash::device::KernelProfile> p =
            dflash::device::ProfileKernels(work, host_ops);
        Check(p.status(), title);
        std::fprintf(stderr, "%s\n", dflash::device::ProfileTable(title, *p, 40).c_str());
        json = dflash::device::ProfileJson(*p, 40);
      } else {
        work();
      }
      if (peak != nullptr) *peak = DeviceMemory(device).peak;
      return json;
    };
    absl::StatusOr<dflash::drafter::DrafterLoss> loss;
    const std::string fwd = phase(
        "forward + loss",
        [&] {
          absl::StatusOr<at::Tensor> hidden = (*drafter)->Forward(batch);
          Check(hidden.status(), "forward");
          loss = (*drafter)->Loss(batch, *hidden, run_options->loss);
          Check(loss.status(), "loss");
          dflash::bench::Synchronize(device);
        },
        false, &forward_peak);
    const std::string bwd = phase(
        "backward",
        [&] {
          loss->numerator.backward();
          dflash::bench::Synchronize(device);
        },
        false, &backward_peak);
    loss = absl::UnknownError("released");
    for (const auto& p : (*drafter)->parameters()) p.tensor.mutable_grad() = at::Tensor();
    if (profile) {
      const std::string step = phase(
          "trainer step",
          [&] {
            Check((*trainer)->AddMicroBatch(batch), "AddMicroBatch");
            Check((*trainer)->Step().status(), "Step");
            dflash::bench::Synchronize(device);
          },
          /*host_ops=*/true, nullptr);
      profile_json = absl::StrCat(", \"profile\": {\"forward_loss\": ", fwd,
                                  ", \"backward\": ", bwd, ", \"step\": ", step, "}");
    }
  }
  std::string loss_list;
  for (double l : losses) {
    char one[32];
    std::snprintf(one, sizeof(one), "%s%.6f", loss_list.empty() ? "" : ", ", l);
    loss_list += one;
  }
  char buf[8192];
  std::snprintf(buf, sizeof(buf),
                "{\"impl\": \"dflash%s\", \"tokens\": %lld, \"anchors\": %lld, \"documents\": %zu, "
                "\"steps_timed\": %lld, \"ms_median\": %.3f, \"ms_min\": %.3f, \"ms_max\": %.3f, "
                "\"ms_pipelined\": %.3f, "
                "\"steps_per_s\": %.4f, \"ctx_tok_per_s\": %.1f, \"peak_bytes\": %lld, "
                "\"param_elems\": %lld, \"train_static_bytes\": %lld, \"frozen_bytes\": %lld, "
                "\"static_bytes\": %lld, \"beyond_bytes\": %lld, \"other_target_bytes\": %lld, "
                "\"forward_peak_bytes\": %lld, \"backward_peak_bytes\": %lld, "
                "\"setup_s\": %.1f, \"grad_norm0\": %.6g, \"first_loss\": %.6f, \"losses\": [%s]",
                (std::string(kind == "dflash2" ? "2" : "") +
                 (recompute == "none" ? "" : ", recompute " + recompute) +
                 (precision == "fp8" ? ", fp8" : "") + (weighting == "dpace" ? ", dpace" : ""))
                    .c_str(),
                static_cast<long long>(tokens), static_cast<long long>(batch.anchors.size(0)),
                pieces.size(), static_cast<long long>(steps), median, sorted.front(), sorted.back(),
                pipelined, 1e3 / median, static_cast<double>(tokens) * 1e3 / median,
                static_cast<long long>(mem.peak), static_cast<long long>(param_elems),
                static_cast<long long>(train_static), static_cast<long long>(frozen),
                static_cast<long long>(stat), static_cast<long long>(mem.peak - stat),
                static_cast<long long>(other_held), static_cast<long long>(forward_peak),
                static_cast<long long>(backward_peak), setup_s, grad_norm0, losses.front(),
                loss_list.c_str());
  const std::string line = absl::StrCat(buf, profile_json, "}");
  std::printf("%s\n", line.c_str());
  if (!json_path.empty()) {
    std::ofstream(json_path) << line << "\n";
  }
  return 0;
}
