#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "common/metrics/catalogue.h"
#include "tests/common/http_get.h"

namespace dflash::metrics {
namespace {

TEST(MetricsCatalogue, NamesFollowTheConvention) {
  const std::regex name("dflash_(coordinator|worker)_[a-z0-9_]+");
  std::set<std::string> seen;
  for (const auto& def : Catalogue()) {
    EXPECT_TRUE(std::regex_match(def.name, name)) << def.name;
    EXPECT_TRUE(seen.insert(def.name).second) << "duplicate " << def.name;
    const std::string n = def.name;
    const bool total = n.size() > 6 && n.substr(n.size() - 6) == "_total";
    EXPECT_EQ(total, def.type == MetricType::kCounter)
        << n << ": counters and only counters end in _total";
    EXPECT_EQ(n.rfind(std::string("dflash_") + def.component + "_", 0), 0u) << n;
    EXPECT_GT(std::string(def.help).size(), 10u) << n;
  }
}

// Every declared metric is exported by its component, on the HTTP endpoint too.
TEST(MetricsCatalogue, EveryDeclaredMetricIsExported) {
  for (const std::string component : {"coordinator", "worker"}) {
    auto server = MetricsServer::Create(component, "");
    ASSERT_TRUE(server.ok()) << server.status();
    for (const auto& def : Catalogue()) {
      if (component != def.component) continue;
      // Touch one child so the family has a sample line, as the services do.
      if (def.type == MetricType::kGauge)
        (*server)->Gauge(def.name).Add({{"worker", "w"}}).Set(1);
      else
        (*server)->Counter(def.name).Add({{"worker", "w"}}).Increment();
    }
    const std::string text = (*server)->Scrape();
    for (const auto& def : Catalogue()) {
      const bool mine = component == def.component;
      EXPECT_EQ(text.find(std::string("# TYPE ") + def.name + " ") != std::string::npos, mine)
          << component << " / " << def.name;
    }
  }
}

TEST(MetricsServer, ServesOverHttpOnAnOsChosenPort) {
  auto server = MetricsServer::Create("worker", "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  (*server)->Gauge("dflash_worker_step").Add({{"worker", "w0"}}).Set(42);
  const std::string resp = dflash::testing::HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(resp, ::testing::StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(resp, ::testing::HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(resp, ::testing::HasSubstr("dflash_worker_step{worker=\"w0\"} 42"));
  EXPECT_THAT(dflash::testing::HttpGet((*server)->port(), "/other"),
              ::testing::StartsWith("HTTP/1.1 404"));
  // A second server on the same port must fail with a clear error, not abort.
  auto clash = MetricsServer::Create("worker", "127.0.0.1:" + std::to_string((*server)->port()));
  EXPECT_FALSE(clash.ok());
  EXPECT_THAT(std::string(clash.status().message()), ::testing::HasSubstr("metrics_listen"));
  auto bad = MetricsServer::Create("worker", "nohost");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dflash::metrics
