// Settings echo (architecture.md, "Configuration"; issue 8): every worker answers PrepareRun with
// the settings it will actually apply, as flat "field.path -> value" entries; the coordinator
// compares them with the run's resolved config and refuses to start the run on any difference,
// naming the field, the worker and both values. A flag that silently did not reach the code
// becomes an error before the first step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/run_spec.h"

namespace dflash::coordinator {

// What a pair's workers must echo, formatted as the workers format it: the resolved config's
// values, with what the coordinator resolves itself (the target layer ids, the pair's transport,
// the schedule's total steps, the step the run resumes at, the number of pairs).
std::map<std::string, std::string> ExpectedSettings(const config::RunSpec& spec,
                                                    const std::vector<int64_t>& layer_ids,
                                                    const std::string& transport,
                                                    int64_t total_steps, int64_t resume_step,
                                                    int64_t num_pairs);

// FAILED_PRECONDITION for the first echoed entry whose key is expected and whose value differs.
// Entries the coordinator does not resolve itself (e.g. drafter.mask_token_id) are not compared.
absl::Status CheckEcho(const std::string& worker,
                       const std::map<std::string, std::string>& expected,
                       const std::map<std::string, std::string>& applied);

}  // namespace dflash::coordinator
