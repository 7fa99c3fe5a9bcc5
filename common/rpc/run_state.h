// The run state machine: which transitions exist, which states are terminal.
//
//   queued ──▶ starting ──▶ running ──▶ done
//     │           │  ▲         │
//     │           ▼  │         ▼
//     │         paused ◀───────┘        (worker lost, coordinator restarted)
//     │           │
//     └──────┴────┴──▶ failed | cancelled   (from any non-terminal state)
//   paused ──▶ queued (placed again once workers are back)
#pragma once

#include <string>

#include "dflash/v1/common.pb.h"

namespace dflash::coordinator {

using v1::RunState;

bool IsTerminal(RunState state);
bool IsAllowedTransition(RunState from, RunState to);
// Lower-case name without the prefix: "queued", "running", ...
std::string StateName(RunState state);
// Inverse of StateName; returns false for unknown names.
bool ParseStateName(const std::string& name, RunState* state);

}  // namespace dflash::coordinator
