#include "common/rpc/run_state.h"

#include <gtest/gtest.h>

#include <set>

namespace dflash::coordinator {
namespace {

constexpr v1::RunState kAll[] = {
    v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,  v1::RUN_STATE_RUNNING, v1::RUN_STATE_PAUSED,
    v1::RUN_STATE_FAILED, v1::RUN_STATE_CANCELLED, v1::RUN_STATE_DONE};

TEST(RunState, TerminalStatesHaveNoWayOut) {
  for (auto from : {v1::RUN_STATE_FAILED, v1::RUN_STATE_CANCELLED, v1::RUN_STATE_DONE}) {
    EXPECT_TRUE(IsTerminal(from));
    for (auto to : kAll) EXPECT_FALSE(IsAllowedTransition(from, to)) << StateName(from);
  }
}

TEST(RunState, EveryLiveStateCanFailOrBeCancelled) {
  for (auto from : {v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING,
                    v1::RUN_STATE_PAUSED}) {
    EXPECT_FALSE(IsTerminal(from));
    EXPECT_TRUE(IsAllowedTransition(from, v1::RUN_STATE_FAILED));
    EXPECT_TRUE(IsAllowedTransition(from, v1::RUN_STATE_CANCELLED));
  }
}

TEST(RunState, ExactTransitionTable) {
  // Everything allowed besides fail/cancel, spelled out.
  const std::set<std::pair<v1::RunState, v1::RunState>> allowed = {
      {v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING},
      {v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING},
      {v1::RUN_STATE_STARTING, v1::RUN_STATE_PAUSED},
      {v1::RUN_STATE_RUNNING, v1::RUN_STATE_PAUSED},
      {v1::RUN_STATE_RUNNING, v1::RUN_STATE_DONE},
      {v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED},
      {v1::RUN_STATE_PAUSED, v1::RUN_STATE_STARTING},
  };
  for (auto from : kAll) {
    for (auto to : kAll) {
      if (to == v1::RUN_STATE_FAILED || to == v1::RUN_STATE_CANCELLED) continue;
      EXPECT_EQ(IsAllowedTransition(from, to), allowed.count({from, to}) == 1)
          << StateName(from) << " -> " << StateName(to);
    }
  }
  EXPECT_FALSE(IsAllowedTransition(v1::RUN_STATE_QUEUED, v1::RUN_STATE_DONE));
  EXPECT_FALSE(IsAllowedTransition(v1::RUN_STATE_UNSPECIFIED, v1::RUN_STATE_QUEUED));
}

TEST(RunState, NamesRoundTrip) {
  for (auto s : kAll) {
    v1::RunState parsed;
    ASSERT_TRUE(ParseStateName(StateName(s), &parsed));
    EXPECT_EQ(parsed, s);
  }
  EXPECT_EQ(StateName(v1::RUN_STATE_RUNNING), "running");
  v1::RunState parsed;
  EXPECT_FALSE(ParseStateName("sleeping", &parsed));
  EXPECT_FALSE(ParseStateName("unspecified", &parsed));
}

}  // namespace
}  // namespace dflash::coordinator
