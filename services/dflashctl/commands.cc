#include "services/dflashctl/commands.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config/run_spec.h"
#include "common/rpc/channel.h"
#include "services/coordinator/run_state.h"
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
  stub_ = v1::Coordinator::NewStub(CreateChannel(opts_.coordinator));
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

namespace {

// Reads and validates run.yaml here, relative paths against its folder, so that the user sees
// every problem before anything is sent; the resolved config, or "" after printing why not.
std::string ResolveLocally(const std::string& path) {
  std::string text;
  if (!ReadFile(path, &text)) {
    std::cerr << "dflashctl: cannot read " << path << "\n";
    return "";
  }
  config::RunSpecOptions opts;
  opts.base_dir = fs::absolute(path).parent_path().string();
  auto spec = config::ParseRunSpec(text, path, opts);
  if (!spec.ok()) {
    std::cerr << "dflashctl: invalid run config:\n" << spec.status().message() << "\n";
    return "";
  }
  return config::EmitRunSpec(*spec);
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
    std::cout << "run " << run_id << " ended: " << coordinator::StateName(run.state()) << "\n";
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

int Commands::Plan(const std::string& path) {
  const std::string resolved = ResolveLocally(path);  // as submit
  if (resolved.empty()) return kInvalidConfig;
  v1::PlanRunRequest req;
  req.set_run_yaml(resolved);
  v1::PlanRunResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, opts_);
  grpc::Status s = stub_->PlanRun(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, "plan");
  std::cout << (opts_.json ? resp.json() : resp.table()) << std::flush;
  // A worker that does not fit: what submit would refuse, with the fix.
  for (const std::string& p : resp.problems())
    std::cerr << "dflashctl: does not fit: " << p << "\n";
  return resp.problems().empty() ? kOk : kDoesNotFit;
}

int Commands::Eval(const EvalArgs& args) {
  std::string yaml;
  if (!args.run_yaml.empty()) {
    if (!ReadFile(args.run_yaml, &yaml)) {
      std::cerr << "dflashctl: cannot read " << args.run_yaml << "\n";
      return kInvalidConfig;
    }
  } else {
    // No run.yaml: the target, and prompts as the data (the tokenizer follows the target).
    yaml = "name: eval\ntarget: {path: \"" + args.target + "\"}\ndata: {train: \"" + args.prompts +
           "\"}\n";
  }
  config::RunSpecOptions opts;
  opts.base_dir = args.run_yaml.empty() ? fs::current_path().string()
                                        : fs::absolute(args.run_yaml).parent_path().string();
  auto spec = config::ParseRunSpec(yaml, args.run_yaml.empty() ? "eval" : args.run_yaml, opts);
  if (spec.ok() && !args.target.empty()) spec->target.path = args.target;
  if (spec.ok()) spec = config::ParseRunSpec(config::EmitRunSpec(*spec), "eval", opts);
  if (!spec.ok()) {
    std::cerr << "dflashctl: invalid run config:\n" << spec.status().message() << "\n";
    return kInvalidConfig;
  }
  // Paths travel absolute: the coordinator resolves nothing against its own directory.
  auto absolute = [](const std::string& p) {
    return p.empty() || p.rfind("builtin:", 0) == 0 ? p : fs::absolute(p).string();
  };
  v1::EvaluateDrafterRequest req;
  req.set_run_yaml(config::EmitRunSpec(*spec));
  req.set_drafter_dir(absolute(args.drafter));
  req.set_prompts(absolute(args.prompts));
  req.set_max_new_tokens(args.max_new_tokens);
  req.set_max_prompts(args.max_prompts);
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

int Commands::Export(const std::string& run_id, const std::string& out, bool force) {
  v1::RunStatus run;
  grpc::Status s = GetRun(run_id, &run);
  if (!s.ok()) return RpcError(s, "export " + run_id);
  const fs::path src = fs::path(run.run_dir()) / "export";
  std::error_code ec;
  if (run.state() != v1::RUN_STATE_DONE || !fs::is_regular_file(src / "model.safetensors", ec)) {
    std::cerr << "dflashctl: export " << run_id << ": the run is "
              << coordinator::StateName(run.state())
              << "; the serving-format drafter is written when it finishes (" << src.string()
              << (run.run_dir().empty() ? "" : ", on the coordinator's machine") << ")\n";
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
    std::cout << "{\"run_id\":\"" << run_id << "\",\"out\":\"" << fs::absolute(dst).string()
              << "\"}\n";
  } else {
    std::cout << "exported the drafter of run " << run_id << " (step " << run.step() << ") to "
              << out << " (config.json + model.safetensors, method.md §7)\n";
  }
  return kOk;
}

}  // namespace dflash::ctl
