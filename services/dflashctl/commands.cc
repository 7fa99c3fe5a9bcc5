#include "services/dflashctl/commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config/run_spec.h"
#include "common/rpc/channel.h"
#include "common/rpc/run_state.h"
#include "common/train/eval_snapshots.h"
#include "nlohmann/json.hpp"
#include "services/dflashctl/output.h"
#include "services/dflashctl/progress.h"

namespace dflash::ctl {
namespace {

namespace fs = std::filesystem;

// Every request: the deadline, and the bearer token when one is configured (--token_file).
void PrepareContext(grpc::ClientContext* ctx, const GlobalOptions& opts) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(opts.timeout_ms));
  if (!opts.token.empty()) ctx->AddMetadata("authorization", "Bearer " + opts.token);
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

Commands::Commands(GlobalOptions opts) : opts_(std::move(opts)) {
  stub_ = v1::Coordinator::NewStub(MakeChannel(opts_.coordinator, opts_.creds));
}

int Commands::RpcError(const grpc::Status& s, const std::string& what) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      std::cerr << "dflashctl: cannot reach coordinator at " << opts_.coordinator << " (" << what
                << "): " << s.error_message()
                << "\n  start it, or point --coordinator / DFLASH_COORDINATOR at it\n";
      return kUnreachable;
    case grpc::StatusCode::FAILED_PRECONDITION:
      // Submit: the run's data is not usable (not prepared, another tokenizer...): the run.yaml is
      // refused. Elsewhere (cancel of an ended run) it is an ordinary error.
      if (what != "submit") {
        std::cerr << "dflashctl: " << what << ": " << s.error_message() << "\n";
        return kError;
      }
      [[fallthrough]];
    case grpc::StatusCode::INVALID_ARGUMENT:
      std::cerr << "dflashctl: " << what << " rejected:\n" << s.error_message() << "\n";
      return kInvalidConfig;
    default:
      std::cerr << "dflashctl: " << what << ": " << s.error_message() << "\n";
      return kError;
  }
}

std::optional<config::RunSpec> ParseLocally(const std::string& path, std::ostream& err) {
  std::string text;
  if (!ReadFile(path, &text)) {
    err << "dflashctl: cannot read " << path << "\n";
    return std::nullopt;
  }
  config::RunSpecOptions opts;
  opts.base_dir = fs::absolute(path).parent_path().string();
  auto spec = config::ParseRunSpec(text, path, opts);
  if (!spec.ok()) {
    err << "dflashctl: invalid run config:\n" << spec.status().message() << "\n";
    return std::nullopt;
  }
  return *std::move(spec);
}

namespace {

// The resolved config of ParseLocally, or "" after printing why not.
std::string ResolveLocally(const std::string& path) {
  std::optional<config::RunSpec> spec = ParseLocally(path, std::cerr);
  return spec ? config::EmitRunSpec(*spec) : "";
}

}  // namespace

int Commands::Submit(const std::string& path, bool detach, bool dry_run) {
  const std::string resolved = ResolveLocally(path);
  if (resolved.empty()) return kInvalidConfig;
  if (!opts_.json) std::cout << "# resolved config of " << path << "\n" << resolved << std::flush;

  v1::SubmitRunRequest req;
  req.set_run_yaml(resolved);
  req.set_source_name(path);
  req.set_dry_run(dry_run);
  v1::SubmitRunResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->SubmitRun(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, "submit");
  if (dry_run) {
    if (opts_.json)
      std::cout << ToJson(resp.run()) << "\n";
    else
      std::cout << "# dry run: the coordinator accepted the config; nothing was queued\n";
    return kOk;
  }
  if (!opts_.json) std::cout << "submitted run " << resp.run().run_id() << "\n" << std::flush;
  if (detach) {
    if (opts_.json) std::cout << ToJson(resp.run()) << "\n";
    return kOk;
  }
  return Follow(resp.run().run_id());
}

int Commands::Follow(const std::string& run_id) {
  // Watches until the run ends; a dropped stream is resumed from the last event seen.
  int64_t after = 0;
  int attempts = 0;
  // The step line goes to stdout with the events, so that they interleave in order.
  StepProgress progress(stdout, !opts_.json);
  while (true) {
    grpc::ClientContext ctx;  // no deadline: the watch lasts as long as the run
    if (!opts_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + opts_.token);
    v1::WatchRunRequest req;
    req.set_run_id(run_id);
    req.set_after_seq(after);
    auto reader = stub_->WatchRun(&ctx, req);
    v1::RunEvent e;
    double measured_tau = 0;
    while (reader->Read(&e)) {
      after = e.seq();
      attempts = 0;
      if (opts_.json) {
        std::cout << ToJson(e) << "\n" << std::flush;
      } else if (e.has_progress()) {
        const v1::StepMetrics& m = e.progress();
        StepSample sample;
        sample.step = m.step() + 1;
        sample.total_steps = e.total_steps();
        sample.epoch = m.epoch();
        sample.loss = m.loss();
        sample.acceptance_length = m.acceptance_length();
        // tau is measured at evaluation steps only: the newest measurement stays on the line.
        if (m.measured_acceptance_length() > 0) measured_tau = m.measured_acceptance_length();
        sample.measured_tau = measured_tau;
        sample.step_seconds = m.seconds();
        sample.tokens_per_s = m.seconds() > 0 ? m.tokens() / m.seconds() : 0;
        progress.Update(sample);
      } else {
        progress.Break();
        std::cout << EventLine(e) << "\n" << std::flush;
      }
    }
    progress.Break();
    grpc::Status s = reader->Finish();
    if (s.ok()) break;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || ++attempts > 5) {
      return RpcError(s, "watch");
    }
    std::cerr << "dflashctl: lost the coordinator; reconnecting (" << attempts << "/5)\n";
    std::this_thread::sleep_for(std::chrono::seconds(1));  // back off before reconnecting
  }
  v1::RunStatus run;
  grpc::Status s = GetRun(run_id, &run);
  if (!s.ok()) return RpcError(s, "status");
  if (!opts_.json) {
    std::cout << "run " << run_id << " ended: " << StateName(run.state()) << "\n";
  }
  return run.state() == v1::RUN_STATE_DONE ? kOk : kRunFailed;
}

grpc::Status Commands::GetRun(const std::string& run_id, v1::RunStatus* run) {
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  v1::GetRunResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->GetRun(&ctx, req, &resp);
  if (s.ok()) *run = std::move(*resp.mutable_run());
  return s;
}

int Commands::Status(const std::string& run_id) {
  v1::RunStatus run;
  grpc::Status s = GetRun(run_id, &run);
  if (!s.ok()) return RpcError(s, "status " + run_id);
  std::cout << (opts_.json ? ToJson(run) + "\n" : RunDetails(run));
  return kOk;
}

int Commands::List() {
  v1::ListRunsResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->ListRuns(&ctx, v1::ListRunsRequest(), &resp);
  if (!s.ok()) return RpcError(s, "list");
  if (opts_.json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    std::cout << RunsTable({resp.runs().begin(), resp.runs().end()});
  }
  return kOk;
}

int Commands::Cancel(const std::string& run_id) {
  v1::CancelRunRequest req;
  req.set_run_id(run_id);
  v1::CancelRunResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->CancelRun(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, "cancel " + run_id);
  std::cout << (opts_.json ? ToJson(resp.run()) + "\n"
                           : absl::StrCat("run ", run_id, " cancelled\n"));
  return kOk;
}

int Commands::Workers() {
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return RpcError(s, "workers");
  if (opts_.json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    std::cout << WorkersTable({resp.workers().begin(), resp.workers().end()});
  }
  return kOk;
}

int Commands::Plan(const std::string& path, bool largest) {
  const std::string resolved = ResolveLocally(path);  // as submit
  if (resolved.empty()) return kInvalidConfig;
  v1::PlanRunRequest req;
  req.set_run_yaml(resolved);
  req.set_largest(largest);
  v1::PlanRunResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->PlanRun(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, "plan");
  std::cout << (opts_.json ? resp.json() : resp.table()) << std::flush;
  // A worker that does not fit: what submit would refuse, with the fix.
  for (const std::string& p : resp.problems())
    std::cerr << "dflashctl: does not fit: " << p << "\n";
  // Too little free now: submit would queue the run until the memory frees (not a refusal).
  for (const std::string& w : resp.waits()) std::cerr << "dflashctl: would wait: " << w << "\n";
  return resp.problems().empty() ? kOk : kDoesNotFit;
}

// The run.yaml of eval and regen: `run_yaml`, or (without one) the target and `data` as data.train
// (data settings default; the tokenizer follows the target); target.path overridden by `target`.
// Paths come back absolute. Prints the error and returns nullopt when it is invalid.
std::optional<config::RunSpec> SpecFor(const std::string& run_yaml, const std::string& target,
                                       const std::string& data, const char* what) {
  std::string yaml;
  if (!run_yaml.empty()) {
    if (!ReadFile(run_yaml, &yaml)) {
      std::cerr << "dflashctl: cannot read " << run_yaml << "\n";
      return std::nullopt;
    }
  } else {
    yaml = absl::StrCat("name: ", what, "\ntarget: {path: \"", target, "\"}\ndata: {train: \"",
                        data, "\"}\n");
  }
  config::RunSpecOptions opts;
  opts.base_dir = run_yaml.empty() ? fs::current_path().string()
                                   : fs::absolute(run_yaml).parent_path().string();
  auto spec = config::ParseRunSpec(yaml, run_yaml.empty() ? what : run_yaml, opts);
  if (spec.ok() && !target.empty()) spec->target.path = target;
  if (spec.ok()) spec = config::ParseRunSpec(config::EmitRunSpec(*spec), what, opts);
  if (!spec.ok()) {
    std::cerr << "dflashctl: invalid run config:\n" << spec.status().message() << "\n";
    return std::nullopt;
  }
  return *std::move(spec);
}

// Paths travel absolute: the coordinator resolves nothing against its own directory.
std::string Absolute(const std::string& p) {
  return p.empty() || p.rfind("builtin:", 0) == 0 ? p : fs::absolute(p).string();
}

int Commands::Eval(const EvalArgs& args) {
  std::optional<config::RunSpec> spec = SpecFor(args.run_yaml, args.target, args.prompts, "eval");
  if (!spec) return kInvalidConfig;
  // The coordinator checks them again as eval.* of the run.yaml it is sent.
  if (args.temperature) spec->eval.temperature = *args.temperature;
  if (args.top_p) spec->eval.top_p = *args.top_p;
  if (args.top_k) spec->eval.top_k = *args.top_k;
  if (args.seed) spec->eval.seed = *args.seed;
  auto absolute = [](const std::string& p) { return Absolute(p); };
  v1::EvaluateDrafterRequest req;
  req.set_run_yaml(config::EmitRunSpec(*spec));
  req.set_drafter_dir(absolute(args.drafter));
  req.set_prompts(absolute(args.prompts));
  req.set_max_new_tokens(args.max_new_tokens);
  req.set_max_prompts(args.max_prompts);
  req.set_batch_size(args.batch_size);
  v1::EvaluateDrafterResponse resp;
  grpc::ClientContext ctx;
  GlobalOptions long_opts = opts_;  // decoding takes longer than a control request
  long_opts.timeout_ms = std::max<int64_t>(opts_.timeout_ms, 3600 * 1000);
  PrepareContext(&ctx, long_opts);
  if (!opts_.json) std::cerr << "dflashctl: decoding on a target worker...\n";
  grpc::Status s = stub_->EvaluateDrafter(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, "eval");
  std::cout << (opts_.json ? ToJson(resp.result()) + "\n" : EvalTable(resp.result()));
  return kOk;
}

int Commands::Regen(const RegenArgs& args) {
  std::optional<config::RunSpec> spec = SpecFor(args.run_yaml, args.target, args.input, "regen");
  if (!spec) return kInvalidConfig;
  v1::RegenerateRequest req;
  req.set_run_yaml(config::EmitRunSpec(*spec));
  req.set_input(Absolute(args.input));
  req.set_output(Absolute(args.out));
  req.set_max_new_tokens(args.max_new_tokens);
  req.set_max_records(args.max_records);
  req.set_temperature(args.temperature);
  req.set_top_p(args.top_p);
  req.set_top_k(args.top_k);
  req.set_repetition_penalty(args.repetition_penalty);
  req.set_seed(args.seed);
  req.set_batch_size(args.batch_size);
  req.set_generation_config(args.generation_config);
  grpc::ClientContext ctx;
  GlobalOptions long_opts = opts_;  // the stream lasts as long as the regeneration
  long_opts.timeout_ms = std::max<int64_t>(opts_.timeout_ms, int64_t{7} * 24 * 3600 * 1000);
  PrepareContext(&ctx, long_opts);
  std::unique_ptr<grpc::ClientReader<v1::RegenerateProgress>> reader = stub_->Regenerate(&ctx, req);
  v1::RegenerateProgress p, read;  // p: the last message (a failed Read may clear its argument)
  const bool tty = isatty(fileno(stderr)) == 1;
  int last_decile = -1;
  bool said_decoding = false;
  while (reader->Read(&read)) {
    p = read;
    if (opts_.json) continue;
    if (!said_decoding && !p.decoding().empty()) {
      std::cerr << "regen  decoding: " << p.decoding() << "\n";
      said_decoding = true;
    }
    const double rate = p.seconds() > 0 ? p.tokens_generated() / p.seconds() : 0;
    const int64_t left = p.records_total() - p.records_done();
    const int64_t fresh = p.records_done() - p.resumed_from();
    const std::string line = absl::StrFormat(
        "regen  %d/%d records  %d tokens  %.1f tok/s  %d workers%s", p.records_done(),
        p.records_total(), p.tokens_generated(), rate, p.workers(),
        fresh > 0 && left > 0
            ? absl::StrFormat("  ETA %.0f s", p.seconds() / fresh * static_cast<double>(left))
            : std::string());
    const int decile =
        p.records_total() > 0 ? static_cast<int>(10 * p.records_done() / p.records_total()) : 10;
    if (tty) {
      std::cerr << "\r" << line << "\033[K" << (p.done() ? "\n" : "") << std::flush;
    } else if (decile != last_decile || p.done()) {
      std::cerr << line << "\n";
      last_decile = decile;
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return RpcError(s, "regen");
  if (opts_.json) {
    std::cout << ToJson(p) << "\n";
  } else {
    std::cout << "regenerated " << p.records_done() << " records (" << p.tokens_generated()
              << " new tokens"
              << (p.resumed_from() > 0 ? absl::StrCat(", ", p.resumed_from(), " resumed")
                                       : std::string())
              << ", " << p.records_skipped() << " skipped) into " << p.output() << "\n";
  }
  return kOk;
}

int Commands::Export(const std::string& run_id, const std::string& out, bool force, bool best) {
  v1::RunStatus run;
  grpc::Status s = GetRun(run_id, &run);
  if (!s.ok()) return RpcError(s, "export " + run_id);
  fs::path src = fs::path(run.run_dir()) / "export";
  int64_t step = run.step();
  std::optional<double> tau;
  std::error_code ec;
  if (best) {
    // The snapshot of the run's best held-out tau (eval/best.json; any state: the snapshot is
    // complete once evaluated).
    absl::StatusOr<std::optional<train::EvalSnapshot>> b = train::ReadBestEval(run.run_dir());
    if (!b.ok()) {
      std::cerr << "dflashctl: export " << run_id << " --best: " << b.status().message() << "\n";
      return kError;
    }
    if (!b->has_value() || !fs::is_regular_file(fs::path((*b)->dir) / "model.safetensors", ec)) {
      std::cerr << "dflashctl: export " << run_id << " --best: the run has no evaluated snapshot"
                << (b->has_value() ? " left at " + (*b)->dir : std::string())
                << " (held-out evaluations run every eval.every_steps; with none, export the "
                   "finished run without --best)\n";
      return kError;
    }
    src = (*b)->dir;
    step = (*b)->step;
    tau = (*b)->tau;
  } else if (run.state() != v1::RUN_STATE_DONE ||
             !fs::is_regular_file(src / "model.safetensors", ec)) {
    std::cerr << "dflashctl: export " << run_id << ": the run is " << StateName(run.state())
              << "; the serving-format drafter is written when it finishes (" << src.string()
              << (run.run_dir().empty() ? "" : ", on the coordinator's machine")
              << "; --best exports the snapshot of its best held-out evaluation so far)\n";
    return kError;
  }
  fs::path dst = fs::path(out).lexically_normal();
  if (dst.filename().empty()) dst = dst.parent_path();  // "DIR/" names DIR
  if (fs::exists(dst, ec) && !force) {
    std::cerr << "dflashctl: export: " << out << " exists; give --force to replace it\n";
    return kError;
  }
  // Copied next to the destination, then renamed: a reader never sees half a drafter.
  const fs::path tmp = dst.string() + ".tmp-export";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (!ec) fs::copy(src, tmp, fs::copy_options::recursive, ec);
  if (!ec && fs::exists(dst)) fs::remove_all(dst, ec);
  if (!ec) fs::rename(tmp, dst, ec);
  if (ec) {
    fs::remove_all(tmp);
    std::cerr << "dflashctl: export: cannot write " << out << ": " << ec.message() << "\n";
    return kError;
  }
  if (opts_.json) {
    nlohmann::json j = {{"run_id", run_id}, {"out", fs::absolute(dst).string()}, {"step", step}};
    if (tau) j["tau"] = *tau;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "exported the drafter of run " << run_id << " (step " << step
              << (tau ? absl::StrFormat(", the run's best held-out tau %.3f", *tau) : "") << ") to "
              << out << " (config.json + model.safetensors, docs/method.md §7)\n";
  }
  return kOk;
}

}  // namespace dflash::ctl
