// The run state machine of the coordinator's API (v1::RunState): which transitions exist, which
// states are terminal, and the names dflashctl prints. Here, not in services/coordinator/, so that
// dflashctl depends on the API and not on the coordinator.
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

namespace dflash {

bool IsTerminal(v1::RunState state);
bool IsAllowedTransition(v1::RunState from, v1::RunState to);
// Lower-case name without the prefix: "queued", "running", ...
std::string StateName(v1::RunState state);
// Inverse of StateName; returns false for unknown names.
bool ParseStateName(const std::string& name, v1::RunState* state);

}  // namespace dflash
