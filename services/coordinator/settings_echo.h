// Settings echo (architecture.md, "Configuration"): every worker answers PrepareRun with
// the settings it will actually apply, as flat "field.path -> value" entries; the coordinator
// compares them with the run's resolved config and refuses to start the run on any difference,
// naming the field, the worker and both values. A flag that silently did not reach the code
// becomes an error before the first step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/model/hf_config.h"
#include "dflash/v1/common.pb.h"

namespace dflash::coordinator {

// target.layer_ids and drafter.mask_token_id resolved for `target` by the rules the workers apply
// (common/plan/memory_plan.h), `auto` included; errors name the field.
absl::StatusOr<v1::ResolvedTarget> ResolveTargetSettings(const config::RunSpec& spec,
                                                         const model::TransformerConfig& target);
// "target layer ids 1,8,15,22,28; mask token id 3 (<repo_name>: ...)", for logs and messages.
std::string DescribeResolvedTarget(const v1::ResolvedTarget& r);

// What a pair's workers must echo, formatted as the workers format it: the resolved config's
// values, with what the coordinator resolves itself (the target layer ids, the mask token id, the
// pair's transport,
// the schedule's total steps, the step the run resumes at, the number of pairs).
std::map<std::string, std::string> ExpectedSettings(
    const config::RunSpec& spec, const std::vector<int64_t>& layer_ids, int64_t mask_token_id,
    const std::string& transport, int64_t total_steps, int64_t resume_step, int64_t num_pairs);

// The settings a worker of that role must echo: the table of common/run/resolve.h
// (TargetEchoKeys for a target of tensor-parallel rank `tp_rank`, DrafterEchoKeys with
// loss.gamma where `expected` holds it), each read back from the object that applies it.
std::vector<std::string> RequiredEcho(bool drafter, int64_t tp_rank,
                                      const std::map<std::string, std::string>& expected);

// FAILED_PRECONDITION for the first `required` key the worker did not echo (a setting that may
// not have reached the code), then for the first echoed entry whose key is expected and whose
// value differs; each names the field and the worker.
absl::Status CheckEcho(const std::string& worker,
                       const std::map<std::string, std::string>& expected,
                       const std::map<std::string, std::string>& applied,
                       const std::vector<std::string>& required);

}  // namespace dflash::coordinator
