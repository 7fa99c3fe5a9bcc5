// dflashctl: the user's command line for the dflash coordinator. See docs/cli.md.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "common/base/file_mode.h"
#include "common/rpc/tls.h"
#include "services/dflashctl/commands.h"
#include "services/dflashctl/plan_local.h"
#include "services/dflashctl/prepare_command.h"

int main(int argc, char** argv) {
  using dflash::ctl::ExitCode;
  CLI::App app{"dflashctl: submit and watch DFlash drafter training runs"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the subcommand: dflashctl workers --output json
  dflash::ctl::GlobalOptions g;
  const char* env = std::getenv("DFLASH_COORDINATOR");
  g.coordinator = env && *env ? env : "127.0.0.1:7070";
  std::string output = "table";
  app.add_option("--coordinator", g.coordinator,
                 "coordinator host:port (env DFLASH_COORDINATOR, default 127.0.0.1:7070)");
  app.add_option("-o,--output", output, "table|json")->check(CLI::IsMember({"table", "json"}));
  app.add_option("--timeout_ms", g.timeout_ms, "deadline of each request");
  const char* token_env = std::getenv("DFLASH_TOKEN_FILE");
  std::string token_file = token_env != nullptr ? token_env : "";
  app.add_option("--token_file", token_file,
                 "bearer token for a coordinator that requires one (env DFLASH_TOKEN_FILE)");
  dflash::TlsOptions tls;
  const char* ca_env = std::getenv("DFLASH_TLS_CA_FILE");
  tls.ca_file = ca_env != nullptr ? ca_env : "";
  app.add_option("--tls_ca_file", tls.ca_file,
                 "reach a TLS coordinator, verifying it with this PEM CA bundle "
                 "(env DFLASH_TLS_CA_FILE)");
  app.add_option("--tls_cert_file", tls.cert_file, "present this PEM client certificate");
  app.add_option("--tls_key_file", tls.key_file, "the client certificate's PEM key (mode 600)");

  std::string path, run_id;
  bool detach = false, dry_run = false;
  auto* submit = app.add_subcommand("submit", "validate run.yaml, submit it and follow the run");
  submit->add_option("run_yaml", path, "path to run.yaml")->required();
  submit->add_flag("--detach", detach, "return once queued instead of following");
  submit->add_flag("--dry_run", dry_run, "validate and resolve on the coordinator; queue nothing");
  auto* status = app.add_subcommand("status", "show one run with its resolved config");
  status->add_option("run_id", run_id, "run id")->required();
  auto* list = app.add_subcommand("list", "list runs");
  auto* cancel = app.add_subcommand("cancel", "cancel a run");
  cancel->add_option("run_id", run_id, "run id")->required();
  auto* workers = app.add_subcommand("workers", "list registered workers");
  std::string export_out;
  bool export_force = false;
  auto* exp = app.add_subcommand("export", "copy a finished run's drafter (serving format) to DIR");
  exp->add_option("run_id", run_id, "run id")->required();
  exp->add_option("--out", export_out, "destination directory")->required();
  exp->add_flag("--force", export_force, "replace an existing destination");
  bool export_best = false;
  exp->add_flag(
      "--best", export_best,
      "the snapshot of the run's best held-out tau (eval/best.json), not the last step's");
  auto* plan = app.add_subcommand(
      "plan", "predicted peak GPU memory per worker, by term, against the registered GPUs");
  plan->add_option("run_yaml", path, "path to run.yaml")->required();
  dflash::ctl::LocalPlanArgs lp;
  bool plan_local = false;
  plan->add_flag("--local", plan_local,
                 "plan here, without a coordinator, against --gpu_gib (paths checked here)");
  plan->add_option("--gpu_gib", lp.gpu_gib,
                   "with --local: each GPU's memory in GiB (0: not checked)")
      ->check(CLI::Range(0.0, 1.0e6));
  plan->add_option("--layout", lp.layout,
                   "with --local: one_gpu (the pair shares a GPU; auto -> cuda_ipc) or two_gpus "
                   "(auto -> nccl)")
      ->check(CLI::IsMember({"one_gpu", "two_gpus"}));
  plan->add_flag("--largest", lp.largest,
                 "also the largest batching.token_budget that fits (max_anchors scaled with "
                 "it): the registered GPUs, or with --local --gpu_gib");

  dflash::ctl::EvalArgs ea;
  auto* eval = app.add_subcommand(
      "eval", "acceptance length (tau) of a drafter by speculative decoding on a target worker");
  eval->add_option("run_yaml", ea.run_yaml, "take the target and data settings from run.yaml");
  eval->add_option("--drafter", ea.drafter, "exported drafter directory")->required();
  eval->add_option("--prompts", ea.prompts, "prompts: JSONL in data.format, or builtin:NAME");
  eval->add_option("--target", ea.target, "target checkpoint directory or builtin:NAME");
  eval->add_option("--max_new_tokens", ea.max_new_tokens, "tokens generated per prompt")
      ->check(CLI::Range(int64_t{1}, int64_t{32768}));
  eval->add_option("--max_prompts", ea.max_prompts, "prompts decoded")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  eval->add_option("--temperature", ea.temperature,
                   "sampled speculative decoding above 0 (default: eval.temperature, 0: greedy)")
      ->check(CLI::Range(0.0, 100.0));
  eval->add_option("--top_p", ea.top_p, "nucleus sampling, in (0, 1] (default: eval.top_p, 1)")
      ->check(CLI::Range(0.0, 1.0));
  eval->add_option("--top_k", ea.top_k, "sample among the k most likely (default: eval.top_k, 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  eval->add_option("--seed", ea.seed, "sampling seed (default: eval.seed, 0)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  eval->add_option("--batch_size", ea.batch_size, "prompts decoded together (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));

  dflash::ctl::RegenArgs ra;
  auto* regen = app.add_subcommand(
      "regen", "regenerate a data set's answers with the target workers (resumable)");
  regen->add_option("run_yaml", ra.run_yaml, "take the target and data settings from run.yaml");
  regen->add_option("--out", ra.out, "output JSONL (on the coordinator's machine)")->required();
  regen->add_option("--input", ra.input, "input data (default: data.train of run_yaml)");
  regen->add_option("--target", ra.target, "target checkpoint directory or builtin:NAME");
  regen
      ->add_option("--max_new_tokens", ra.max_new_tokens,
                   "tokens per answer (default: the original length; chat 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{32768}));
  regen->add_option("--max_records", ra.max_records, "records to regenerate (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  regen->add_option("--temperature", ra.temperature, "0: greedy (default)")
      ->check(CLI::Range(0.0, 100.0));
  regen->add_option("--top_p", ra.top_p, "nucleus sampling (0 or 1: off)")
      ->check(CLI::Range(0.0, 1.0));
  regen->add_option("--top_k", ra.top_k, "sample among the k most likely (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  regen->add_option("--seed", ra.seed, "sampling seed");
  regen
      ->add_option("--repetition_penalty", ra.repetition_penalty,
                   "transformers' repetition_penalty, greedy or sampled (0 or 1: off)")
      ->check(CLI::Range(0.0, 100.0));
  regen->add_flag("--generation_config", ra.generation_config,
                  "sample as the target checkpoint's generation_config.json says (do_sample, "
                  "temperature, top_p, top_k, repetition_penalty)");
  regen
      ->add_option("--batch_size", ra.batch_size,
                   "sequences each worker decodes together (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));

  dflash::ctl::PrepareArgs pa;
  auto* prepare =
      app.add_subcommand("prepare", "tokenize a JSONL data set once into a prepared .dfdata file");
  prepare->add_option("run_yaml", pa.run_yaml, "take data, tokenizer and settings from run.yaml");
  prepare->add_option("--data", pa.data, "JSONL input (without run_yaml)");
  prepare->add_option("--tokenizer", pa.tokenizer, "tokenizer.json (without run_yaml)");
  prepare->add_option("--out", pa.out, "output file (default: --data with extension .dfdata)");
  prepare->add_option("--format", pa.format, "chat|pretokenized|text")
      ->check(CLI::IsMember({"chat", "pretokenized", "text"}));
  prepare->add_option("--chat_template", pa.chat_template, "auto|chatml|llama3")
      ->check(CLI::IsMember({"auto", "chatml", "llama3"}));
  prepare
      ->add_option("--thinking", pa.thinking,
                   "the chat template's enable_thinking: auto (unset), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  prepare
      ->add_option("--block_size", pa.block_size,
                   "drafter block size B: documents with < 2B supervised tokens are dropped")
      ->check(CLI::Range(2, 64));
  prepare->add_option("--max_length", pa.max_length, "longest document (over-long are counted)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  prepare->add_option("--on_bad_record", pa.on_bad_record, "skip|fail")
      ->check(CLI::IsMember({"skip", "fail"}));
  prepare->add_option("--threads", pa.threads, "tokenizer threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  prepare->add_flag("--force", pa.force, "prepare again even when the output is up to date");
  for (const char* f : {"--data", "--tokenizer", "--out", "--format", "--chat_template",
                        "--thinking", "--block_size", "--max_length", "--on_bad_record"}) {
    prepare->get_option(f)->excludes(prepare->get_option("run_yaml"));
  }

  try {
    app.parse(argc, argv);
    if (*eval && ea.run_yaml.empty() && (ea.target.empty() || ea.prompts.empty())) {
      throw CLI::ValidationError("eval", "give run_yaml, or both --target and --prompts");
    }
    if (*regen && ra.run_yaml.empty() && (ra.target.empty() || ra.input.empty())) {
      throw CLI::ValidationError("regen", "give run_yaml, or both --target and --input");
    }
    if (*prepare && pa.run_yaml.empty() && (pa.data.empty() || pa.tokenizer.empty())) {
      throw CLI::ValidationError("prepare", "give run_yaml, or both --data and --tokenizer");
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return ExitCode::kUsage;
  }
  g.json = output == "json";
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = dflash::ReadTokenFile(token_file);
    if (!token.ok()) {
      std::cerr << "dflashctl: --token_file: " << token.status().message() << "\n";
      return dflash::ctl::kUsage;
    }
    g.token = *std::move(token);
  }
  absl::StatusOr<dflash::TransportSecurity> security =
      dflash::TransportSecurity::Load(tls, "--tls_");
  if (!security.ok()) {
    std::cerr << "dflashctl: " << security.status().message() << "\n";
    return dflash::ctl::kUsage;
  }
  g.creds = security->ChannelCredentials();
  dflash::ctl::Commands cmd(g);
  if (*submit) return cmd.Submit(path, detach, dry_run);
  if (*status) return cmd.Status(run_id);
  if (*list) return cmd.List();
  if (*cancel) return cmd.Cancel(run_id);
  if (*workers) return cmd.Workers();
  if (*plan) {
    if (!plan_local) {
      if (plan->count("--gpu_gib") + plan->count("--layout") > 0) {
        std::cerr << "dflashctl: plan: --gpu_gib and --layout go with --local (the coordinator "
                     "plans against its registered GPUs)\n";
        return ExitCode::kUsage;
      }
      return cmd.Plan(path, lp.largest);
    }
    lp.run_yaml = path;
    lp.json = g.json;
    return dflash::ctl::PlanLocal(lp, std::cout, std::cerr);
  }
  if (*exp) return cmd.Export(run_id, export_out, export_force, export_best);
  if (*eval) return cmd.Eval(ea);
  if (*regen) return cmd.Regen(ra);
  if (*prepare) {
    pa.json = g.json;
    return dflash::ctl::RunPrepare(pa);
  }
  return ExitCode::kUsage;
}
