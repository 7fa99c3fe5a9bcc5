#include "common/rpc/run_state.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace dflash {

using v1::RunState;

bool IsTerminal(RunState s) {
  return s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED || s == v1::RUN_STATE_DONE;
}

bool IsAllowedTransition(RunState from, RunState to) {
  if (from == v1::RUN_STATE_UNSPECIFIED || to == v1::RUN_STATE_UNSPECIFIED) return false;
  if (IsTerminal(from) || from == to) return false;
  if (to == v1::RUN_STATE_FAILED || to == v1::RUN_STATE_CANCELLED) return true;
  switch (from) {
    case v1::RUN_STATE_QUEUED:
      return to == v1::RUN_STATE_STARTING;
    case v1::RUN_STATE_STARTING:
      return to == v1::RUN_STATE_RUNNING || to == v1::RUN_STATE_PAUSED;
    case v1::RUN_STATE_RUNNING:
      return to == v1::RUN_STATE_PAUSED || to == v1::RUN_STATE_DONE;
    case v1::RUN_STATE_PAUSED:
      return to == v1::RUN_STATE_QUEUED || to == v1::RUN_STATE_STARTING;
    default:
      return false;
  }
}

std::string StateName(RunState s) {
  std::string name = v1::RunState_Name(s);
  constexpr absl::string_view kPrefix = "RUN_STATE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

bool ParseStateName(const std::string& name, RunState* state) {
  return v1::RunState_Parse("RUN_STATE_" + absl::AsciiStrToUpper(name), state) &&
         *state != v1::RUN_STATE_UNSPECIFIED;
}

}  // namespace dflash
