#include "services/coordinator/evaluation.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/eval_prompts.h"
#include "common/plan/memory_plan.h"

namespace dflash::coordinator {

absl::StatusOr<v1::EvaluateRequest> MakeEvaluateRequest(const config::RunSpec& spec,
                                                        const std::string& drafter_dir) {
  if (spec.eval.prompts.empty()) {
    return absl::InvalidArgumentError("eval.prompts: no prompts to evaluate on");
  }
  ASSIGN_OR_RETURN(model::TransformerConfig target, run::RunTargetConfig(spec));
  absl::StatusOr<data::EvalPrompts> prompts =
      data::LoadEvalPrompts(spec, spec.eval.prompts, spec.eval.max_prompts, target.vocab_size);
  if (!prompts.ok()) {
    return absl::Status(prompts.status().code(),
                        absl::StrCat("eval.prompts: ", prompts.status().message()));
  }
  // A prompt and its answer must fit the target's positions (the block beyond the last token too).
  const int64_t room = spec.eval.max_new_tokens + spec.drafter.block_size;
  for (size_t i = 0; i < prompts->prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts->prompts[i].size());
    if (n + room > target.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "eval.prompts: ", i < prompts->origins.size() ? prompts->origins[i] : "a prompt", ": ", n,
          " prompt tokens + eval.max_new_tokens ", spec.eval.max_new_tokens, " + a block of ",
          spec.drafter.block_size, " exceed the target's max_position_embeddings ",
          target.max_position_embeddings));
    }
  }
  v1::EvaluateRequest req;
  req.set_resolved_config_yaml(config::EmitRunSpec(spec));
  req.set_drafter_dir(drafter_dir);
  for (const std::vector<int64_t>& p : prompts->prompts) {
    v1::TokenIds* ids = req.add_prompts();
    ids->mutable_ids()->Add(p.begin(), p.end());
  }
  req.set_max_new_tokens(spec.eval.max_new_tokens);
  req.mutable_stop_token_ids()->Add(prompts->stop_token_ids.begin(), prompts->stop_token_ids.end());
  return req;
}

absl::Status WorkerFailure(const absl::Status& s, const std::string& worker) {
  if (s.code() != absl::StatusCode::kUnavailable &&
      s.code() != absl::StatusCode::kDeadlineExceeded) {
    return s;
  }
  return absl::AbortedError(absl::StrCat("target worker ", worker, " failed: ", s.message()));
}

v1::EvalResult ToEvalResult(const v1::EvaluateResponse& resp, const std::string& worker,
                            const std::string& drafter_dir, int64_t step, int64_t unix_ms) {
  v1::EvalResult r;
  r.set_worker(worker);
  r.set_drafter_dir(drafter_dir);
  r.set_step(step);
  r.set_prompts(resp.prompts());
  r.set_new_tokens(resp.new_tokens());
  r.set_verifications(resp.verifications());
  const double v = static_cast<double>(resp.verifications());
  r.set_tau(v > 0 ? 1.0 + static_cast<double>(resp.accepted()) / v : 0.0);
  for (int k = 0; k < resp.accepted_at_size(); ++k) {
    r.add_acceptance_by_position(k == 0 ? 1.0 : (v > 0 ? resp.accepted_at(k) / v : 0.0));
  }
  r.set_tau_pooled(v > 0 ? static_cast<double>(resp.emitted()) / v : 0.0);
  r.set_temperature(resp.temperature());
  r.set_top_p(resp.top_p());
  r.set_top_k(resp.top_k());
  r.set_seed(resp.seed());
  r.set_tau_prompt_mean(resp.prompts_verified() > 0
                            ? resp.prompt_tau_sum() / static_cast<double>(resp.prompts_verified())
                            : 0.0);
  for (int64_t e : resp.emitted_histogram()) r.add_emitted_histogram(v > 0 ? e / v : 0.0);
  for (const v1::ContextBucketCounts& c : resp.by_context()) {
    if (c.verifications() == 0) continue;
    const double cv = static_cast<double>(c.verifications());
    v1::EvalContextBucket* b = r.add_by_context();
    b->set_min_tokens(c.min_tokens());
    b->set_max_tokens(c.max_tokens());
    b->set_range(c.max_tokens() > 0 ? absl::StrCat(c.min_tokens(), "-", c.max_tokens() - 1)
                                    : absl::StrCat(c.min_tokens(), "+"));
    b->set_verifications(c.verifications());
    b->set_tau(1.0 + static_cast<double>(c.accepted()) / cv);
    b->set_tau_pooled(static_cast<double>(c.emitted()) / cv);
    for (int k = 0; k < c.accepted_at_size(); ++k) {
      b->add_acceptance_by_position(k == 0 ? 1.0 : c.accepted_at(k) / cv);
    }
  }
  r.set_block_size(resp.block_size());
  r.set_seconds(resp.seconds());
  r.set_tokens_per_second(resp.seconds() > 0 ? resp.new_tokens() / resp.seconds() : 0.0);
  r.set_load_seconds(resp.load_seconds());
  if (resp.baseline_seconds() > 0) {
    r.set_baseline_tokens_per_second(resp.baseline_tokens() / resp.baseline_seconds());
    r.set_baseline_identical_prompts(resp.baseline_identical());
  }
  r.set_unix_ms(unix_ms);
  return r;
}

}  // namespace dflash::coordinator
