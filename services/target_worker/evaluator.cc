// The target worker's evaluator (services/worker_common/evaluator.h): takes the run's target with
// every layer from the process's target cache (shared_target.h: one copy per checkpoint, shared
// with training), reads the drafter snapshot, and measures the acceptance length by speculative
// decoding (common/spec), or generates (regen). A rank of a tensor-parallel decoding group takes
// its shard instead and joins the group for the call: every rank runs the same decoding, summing
// partial layer outputs over the group, and gets the same tokens (docs/models.md, "Generating with a
// tensor-parallel target").
#include "services/worker_common/evaluator.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"
#include "common/train/run_setup.h"
#include "common/transport/group.h"
#include "common/transport/nccl_communicator.h"
#include "common/transport/transport.h"
#include "services/target_worker/shared_target.h"

namespace dflash::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The target one call decodes with: the whole model from the process's cache, or this rank's
// shard (cached too) summing over the call's own group.
struct Decoding {
  std::shared_ptr<nn::TargetModel> cached;        // keeps the cache's model alive for the call
  std::unique_ptr<transport::Communicator> comm;  // a decoding group's (world > 1)
  std::unique_ptr<nn::TargetModel> bound;         // `cached` summing over comm
  const nn::TargetModel& model() const { return bound ? *bound : *cached; }
  // A failed call leaves the group at once, so that the other ranks' next sum ends too.
  absl::Status Fail(absl::Status s) {
    if (comm) comm->Abort();
    return s;
  }
};

class TargetEvaluator : public Evaluator {
 public:
  absl::StatusOr<GenerateReport> Generate(const GenerateWork& work) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (work.prompts.empty()) return absl::InvalidArgumentError("no prompts to generate from");
    absl::StatusOr<Decoding> decoding = Join(work.spec, work.gpu, work.group);
    if (!decoding.ok()) return decoding.status();
    const nn::TargetModel* const target = &decoding->model();
    nn::GenerateOptions options;
    options.max_new_tokens_per_prompt = work.max_new_tokens;
    options.stop_token_ids = work.stop_token_ids;
    options.sampling.temperature = work.temperature;
    options.sampling.top_p = work.top_p;
    options.sampling.top_k = work.top_k;
    options.sampling.repetition_penalty = work.repetition_penalty;
    options.sampling.seed = work.seed;
    options.max_batch = work.max_batch;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<nn::Generation>> out;
    try {
      out = nn::Generate(*target, work.prompts, options);
    } catch (const c10::Error& e) {
      return decoding->Fail(
          absl::InternalError(absl::StrCat("generating: ", e.what_without_backtrace())));
    } catch (...) {  // the RPC's guard makes it a status; the group's other ranks end too
      if (decoding->comm) decoding->comm->Abort();
      throw;
    }
    if (!out.ok()) return decoding->Fail(out.status());
    GenerateReport report;
    for (nn::Generation& g : *out) {
      report.outputs.push_back(std::move(g.tokens));
      report.stopped.push_back(g.stopped);
    }
    report.seconds = SecondsSince(start);
    return report;
  }

  absl::StatusOr<EvalReport> Evaluate(const EvalWork& work) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (work.prompts.empty()) return absl::InvalidArgumentError("no prompts to evaluate");
    const auto load_start = std::chrono::steady_clock::now();
    absl::StatusOr<Decoding> decoding = Join(work.spec, work.gpu, work.group);
    if (!decoding.ok()) return decoding.status();
    absl::StatusOr<EvalReport> report;
    try {
      report = Evaluate(work, decoding->model(), load_start);
    } catch (...) {  // the RPC's guard makes it a status; the group's other ranks end too
      if (decoding->comm) decoding->comm->Abort();
      throw;
    }
    if (!report.ok()) return decoding->Fail(report.status());
    return report;
  }

  absl::StatusOr<std::string> OpenDecodeGroup(const std::string& collective, int gpu) override {
    absl::StatusOr<transport::Collective> c = transport::ParseCollective(collective, "collective");
    if (!c.ok()) return c.status();
    if (*c != transport::Collective::kNccl) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective: ", collective, " groups need no opening (nccl ones do)"));
    }
    if (gpu < 0) return absl::FailedPreconditionError("collective nccl: this worker has no GPU");
    return transport::NewNcclUniqueId();
  }

 private:
  // Every rank of a decoding group (and a worker alone) decodes this way; rank 0's report is the
  // result.
  absl::StatusOr<EvalReport> Evaluate(const EvalWork& work, const nn::TargetModel& target_model,
                                      std::chrono::steady_clock::time_point load_start) {
    const nn::TargetModel* const target = &target_model;
    absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> model =
        spec::LoadExportedDrafter(*target, work.drafter_dir);
    if (!model.ok()) return model.status();
    const drafter::DrafterConfig* config = &(*model)->config();

    EvalReport report;
    report.load_seconds = SecondsSince(load_start);
    report.block_size = config->block_size;
    spec::SpecDecodeOptions decode;
    decode.max_new_tokens = work.max_new_tokens;
    decode.stop_token_ids = work.stop_token_ids;
    // Greedy, or sampled speculative decoding (docs/method.md §1.1), as eval.* of the run says.
    decode.sampling.temperature = work.spec.eval.temperature;
    decode.sampling.top_p = work.spec.eval.top_p;
    decode.sampling.top_k = work.spec.eval.top_k;
    decode.sampling.seed = static_cast<uint64_t>(work.spec.eval.seed);
    const bool sampled = decode.sampling.temperature > 0;
    report.temperature = decode.sampling.temperature;
    report.top_p = decode.sampling.top_p;
    report.top_k = decode.sampling.top_k;
    report.seed = work.spec.eval.seed;
    const size_t batch =
        work.batch_size > 0 ? static_cast<size_t>(work.batch_size) : work.prompts.size();
    spec::AcceptanceStats stats;
    stats.accepted_at.assign(config->block_size, 0);
    stats.emitted_histogram.assign(config->block_size + 1, 0);
    const auto start = std::chrono::steady_clock::now();
    double draft_seconds = 0, verify_seconds = 0;
    int64_t drafter_forwards = 0;
    std::vector<std::vector<int64_t>> outputs;  // per prompt, to compare with plain decoding
    for (size_t first = 0; first < work.prompts.size(); first += batch) {
      const size_t last = std::min(work.prompts.size(), first + batch);
      std::vector<std::vector<int64_t>> prompts(work.prompts.begin() + first,
                                                work.prompts.begin() + last);
      absl::StatusOr<spec::SpecDecodeResult> r =
          spec::SpeculativeGenerate(*target, **model, prompts, decode);
      if (!r.ok()) return r.status();
      stats.Add(r->stats);
      draft_seconds += r->draft_seconds;
      verify_seconds += r->verify_seconds;
      drafter_forwards += r->drafter_forwards;
      for (std::vector<int64_t>& t : r->tokens) {
        report.new_tokens += t.size();
        outputs.push_back(std::move(t));
      }
    }
    report.seconds = SecondsSince(start);
    if (work.measure_baseline) {
      // Plain decoding of the same prompts in the same batches, to the same lengths, greedy or
      // sampled alike (sampled outputs are not compared token for token: other draws).
      nn::GenerateOptions plain;
      plain.max_new_tokens = work.max_new_tokens;
      plain.stop_token_ids = work.stop_token_ids;
      plain.sampling = decode.sampling;
      const auto base_start = std::chrono::steady_clock::now();
      for (size_t first = 0; first < work.prompts.size(); first += batch) {
        const size_t last = std::min(work.prompts.size(), first + batch);
        std::vector<std::vector<int64_t>> prompts(work.prompts.begin() + first,
                                                  work.prompts.begin() + last);
        absl::StatusOr<std::vector<nn::Generation>> g = nn::Generate(*target, prompts, plain);
        if (!g.ok()) return g.status();
        for (size_t i = 0; i < g->size(); ++i) {
          report.baseline_tokens += (*g)[i].tokens.size();
          if (!sampled && (*g)[i].tokens == outputs[first + i]) ++report.baseline_identical;
        }
      }
      report.baseline_seconds = SecondsSince(base_start);
    }
    report.prompts = static_cast<int64_t>(work.prompts.size());
    report.verifications = stats.verifications;
    report.accepted = stats.accepted;
    report.accepted_at = stats.accepted_at;
    report.emitted = stats.emitted;
    report.emitted_histogram = stats.emitted_histogram;
    report.prompts_verified = stats.prompts_verified;
    report.prompt_tau_sum = stats.prompt_tau_sum;
    for (size_t c = 0; c < stats.by_context.size(); ++c) {
      const spec::ContextBucketStats& b = stats.by_context[c];
      report.by_context.push_back({spec::ContextBucketMin(c), spec::ContextBucketMax(c),
                                   b.verifications, b.accepted, b.emitted, b.accepted_at});
    }
    LOG_RUN(INFO, work.run_id, work.step)
        << (work.group.world > 1
                ? absl::StrCat("rank ", work.group.rank, " of ", work.group.world, ": ")
                : std::string())
        << "evaluated " << work.drafter_dir << ": tau " << stats.tau() << " over " << report.prompts
        << " prompts, " << report.new_tokens << " tokens in " << report.seconds << " s (load "
        << report.load_seconds << " s); " << drafter_forwards << " drafter forwards "
        << draft_seconds << " s, verifications " << verify_seconds << " s, the rest "
        << report.seconds - draft_seconds - verify_seconds << " s; plain "
        << (sampled ? "sampled " : "greedy ")
        << (work.measure_baseline
                ? absl::StrCat(report.baseline_tokens, " tokens in ", report.baseline_seconds,
                               " s, ", report.baseline_identical, " of ", report.prompts,
                               " prompts identical to the speculative output")
                : std::string("not measured"));
    return report;
  }

  static c10::Device DeviceOf(int gpu) {
    return gpu < 0 ? c10::Device(c10::DeviceType::CPU) : c10::Device(c10::DeviceType::CUDA, gpu);
  }

  // The spec's target with every layer (or this rank's shard of it), from the process's cache
  // (shared_target.h): a run's or an earlier call's copy when one is alive, else loaded. The cache
  // keeps it idle after the call; the evaluator holds it only during the call. A rank of a group
  // joins the group first (rank 0 of a host group creates it), and leaves it when loading fails.
  absl::StatusOr<Decoding> Join(const config::RunSpec& spec, int gpu, const DecodeGroupWork& g) {
    Decoding d;
    train::TargetShard shard;
    if (g.world > 1) {
      transport::GroupOptions o;
      o.rank = g.rank;
      o.world = g.world;
      o.collective = g.collective;
      o.name = g.name;
      o.nccl_unique_id = g.nccl_unique_id;
      o.gpu = gpu;
      o.collective_field = "group.collective";
      o.name_field = "group.name";
      std::string made;  // unused: the coordinator had rank 0 make the id (OpenDecodeGroup)
      absl::StatusOr<std::unique_ptr<transport::Communicator>> comm =
          transport::JoinGroup(o, &made);
      if (!comm.ok()) return comm.status();
      d.comm = *std::move(comm);
      shard = {g.rank, g.world, NoGroupYet()};
    }
    const c10::Device device = DeviceOf(gpu);
    TargetCache& cache = TargetCache::Process();
    absl::StatusOr<std::shared_ptr<nn::TargetModel>> target = cache.Acquire(
        spec, device, {.full = true, .features = false, .tp_rank = g.rank, .tp_world = g.world},
        [&] {
          return train::LoadRunTarget(spec, device, /*embeddings_only=*/false, /*full=*/true,
                                      shard);
        });
    if (!target.ok()) return d.Fail(target.status());
    cache.KeepIdle(*target);
    d.cached = *std::move(target);
    if (d.comm) d.bound = d.cached->WithAllReduce(SumOver(d.comm.get()));
    return d;
  }

  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Evaluator> NewTargetEvaluator() { return std::make_unique<TargetEvaluator>(); }

}  // namespace dflash::worker
