// Tests of the shipped Grafana dashboard (deploy/grafana/dashboards/dflash.json) against the
// metric catalogue (common/metrics/catalogue.h): every metric that a PromQL expression of the
// dashboard names must be one a dflash process exports. A renamed metric or a panel written
// against a metric that does not exist fails here instead of drawing an empty panel in
// production. Also checks the layout the operators rely on: per-GPU memory comes first.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/metrics/catalogue.h"

namespace dflash::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Json = nlohmann::json;

constexpr char kDashboardPath[] = DFLASH_SOURCE_DIR "/deploy/grafana/dashboards/dflash.json";
constexpr char kGpuMemoryPrefix[] = "dflash_worker_gpu_memory_";

bool IsIdentifierChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == ':';
}

// The metric names a PromQL expression uses: identifiers that start with "dflash_". Quoted
// strings are skipped, because label values (job=~"dflash.*") are not metric names; so is the
// identifier after '$' or '${', a Grafana variable.
std::set<std::string> DflashMetricNames(const std::string& expr) {
  std::set<std::string> names;
  size_t i = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      // Backquoted strings have no escapes in PromQL; the other two do.
      for (++i; i < expr.size() && expr[i] != c; ++i) {
        if (expr[i] == '\\' && c != '`') ++i;
      }
      ++i;
      continue;
    }
    if (!IsIdentifierChar(c)) {
      ++i;
      continue;
    }
    const bool variable =
        (i > 0 && expr[i - 1] == '$') || (i > 1 && expr[i - 1] == '{' && expr[i - 2] == '$');
    const size_t start = i;
    while (i < expr.size() && IsIdentifierChar(expr[i])) ++i;
    const std::string word = expr.substr(start, i - start);
    if (!variable && word.rfind("dflash_", 0) == 0) names.insert(word);
  }
  return names;
}

// Every string of the dashboard that Grafana sends to Prometheus: panel targets ("expr") and
// query variables ("query", as a string or as {"query": ...}, and its "definition").
void CollectExpressions(const Json& node, std::vector<std::string>* out) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if ((key == "expr" || key == "query" || key == "definition") && value.is_string()) {
        out->push_back(value.get<std::string>());
      } else {
        CollectExpressions(value, out);
      }
    }
  } else if (node.is_array()) {
    for (const Json& item : node) CollectExpressions(item, out);
  }
}

// The metric names of `dashboard` that are not in the catalogue, each with the expression that
// uses it.
std::vector<std::string> UnknownMetrics(const Json& dashboard) {
  std::set<std::string> known;
  for (const MetricDef& def : Catalogue()) known.insert(def.name);
  std::vector<std::string> expressions;
  CollectExpressions(dashboard, &expressions);
  std::vector<std::string> unknown;
  for (const std::string& expr : expressions) {
    for (const std::string& name : DflashMetricNames(expr)) {
      if (known.count(name) == 0) unknown.push_back(name + " in: " + expr);
    }
  }
  return unknown;
}

Json LoadDashboard() {
  std::ifstream in(kDashboardPath);
  EXPECT_TRUE(in.good()) << "cannot open " << kDashboardPath;
  std::stringstream text;
  text << in.rdbuf();
  // Throws on malformed JSON, failing the test with the parser's position.
  return Json::parse(text.str());
}

// The panels below the first row, in order (from the row itself when it is collapsed).
std::vector<Json> FirstRowPanels(const Json& dashboard) {
  const Json& panels = dashboard.at("panels");
  std::vector<Json> row;
  if (panels.empty() || panels[0].value("type", "") != "row") return row;
  if (panels[0].value("collapsed", false)) {
    for (const Json& p : panels[0].at("panels")) row.push_back(p);
    return row;
  }
  for (size_t i = 1; i < panels.size() && panels[i].value("type", "") != "row"; ++i) {
    row.push_back(panels[i]);
  }
  return row;
}

std::vector<std::string> TargetExpressions(const Json& panel) {
  std::vector<std::string> exprs;
  for (const Json& t : panel.value("targets", Json::array())) exprs.push_back(t.value("expr", ""));
  return exprs;
}

TEST(DashboardMetricNames, FindsMetricsAndSkipsLabelValuesAndVariables) {
  EXPECT_THAT(DflashMetricNames("rate(dflash_worker_tokens_total{worker=~\"$worker\"}[5m])"),
              ElementsAre("dflash_worker_tokens_total"));
  EXPECT_THAT(DflashMetricNames("max by (instance, gpu) (dflash_worker_gpu_memory_used_bytes) / "
                                "max by (instance, gpu) (dflash_worker_gpu_memory_total_bytes)"),
              UnorderedElementsAre("dflash_worker_gpu_memory_used_bytes",
                                   "dflash_worker_gpu_memory_total_bytes"));
  EXPECT_THAT(DflashMetricNames("label_values(dflash_coordinator_run_step, run)"),
              ElementsAre("dflash_coordinator_run_step"));
  // Label values, escaped quotes inside them, Grafana variables and other prefixes are not
  // metric names.
  EXPECT_THAT(DflashMetricNames("up{job=~\"dflash_x\", a='dflash_y', b=`dflash_z`}"), IsEmpty());
  EXPECT_THAT(DflashMetricNames("up{a=\"x\\\"dflash_q\"} + $dflash_var + ${dflash_var2}"),
              IsEmpty());
  EXPECT_THAT(DflashMetricNames("my_dflash_metric + dflashfoo + time()"), IsEmpty());
}

// The negative check: a dashboard with a panel on a metric that no process exports is caught.
TEST(DashboardMetricNames, ReportsAMetricMissingFromTheCatalogue) {
  // R"json(...)json": the expressions contain )" which would end a plain raw string.
  const Json dashboard = Json::parse(R"json({
    "panels": [
      {"type": "timeseries", "targets": [
        {"expr": "dflash_worker_gpu_memory_total_bytes"},
        {"expr": "rate(dflash_worker_gpu_memory_invented_bytes[1m])"}]}],
    "templating": {"list": [{"query": {"query": "label_values(dflash_no_such_metric, run)"}}]}
  })json");
  const std::vector<std::string> unknown = UnknownMetrics(dashboard);
  ASSERT_EQ(unknown.size(), 2u);
  EXPECT_THAT(unknown[0], HasSubstr("dflash_worker_gpu_memory_invented_bytes"));
  EXPECT_THAT(unknown[1], HasSubstr("dflash_no_such_metric"));
}

TEST(Dashboard, UsesOnlyMetricsOfTheCatalogue) {
  const Json dashboard = LoadDashboard();
  std::vector<std::string> expressions;
  CollectExpressions(dashboard, &expressions);
  // Guards against a vacuous pass, e.g. if the panels moved under keys this walk does not read.
  EXPECT_GE(expressions.size(), 15u);
  size_t named = 0;
  for (const std::string& expr : expressions) {
    named += DflashMetricNames(expr).size();
    // A regex on __name__ would select metrics this test cannot see.
    EXPECT_THAT(expr, ::testing::Not(HasSubstr("__name__"))) << "name metrics explicitly";
  }
  EXPECT_GE(named, 15u);
  EXPECT_THAT(UnknownMetrics(dashboard), IsEmpty())
      << "the dashboard uses metrics that common/metrics/catalogue.cc does not declare";
}

TEST(Dashboard, FirstRowIsPerGpuMemoryWithTheTotalAsALimitLine) {
  const Json dashboard = LoadDashboard();
  const Json& panels = dashboard.at("panels");
  ASSERT_FALSE(panels.empty());
  EXPECT_EQ(panels[0].value("type", ""), "row") << "the dashboard must open with a row";
  EXPECT_EQ(panels[0].at("gridPos").value("y", -1), 0);
  const std::vector<Json> row = FirstRowPanels(dashboard);
  ASSERT_FALSE(row.empty()) << "the first row has no panels";

  const Json& first = row[0];
  const std::vector<std::string> exprs = TargetExpressions(first);
  ASSERT_FALSE(exprs.empty()) << "the first panel has no queries";
  for (const std::string& expr : exprs) {
    for (const std::string& name : DflashMetricNames(expr)) {
      EXPECT_EQ(name.rfind(kGpuMemoryPrefix, 0), 0u) << name << " in the first panel";
    }
  }
  // The GPU's capacity is one of the series, drawn differently (dashed) from the others.
  bool has_total = false;
  for (const std::string& expr : exprs) {
    has_total |= DflashMetricNames(expr).count("dflash_worker_gpu_memory_total_bytes") > 0;
  }
  EXPECT_TRUE(has_total) << "the first panel must draw dflash_worker_gpu_memory_total_bytes";
  bool dashed = false;
  for (const Json& o : first.at("fieldConfig").value("overrides", Json::array())) {
    for (const Json& p : o.value("properties", Json::array())) {
      dashed |= p.value("id", "") == "custom.lineStyle";
    }
  }
  EXPECT_TRUE(dashed) << "the total is drawn as a limit line through a lineStyle override";
}

TEST(Dashboard, PanelIdsAreUnique) {
  const Json dashboard = LoadDashboard();
  std::set<int> ids;
  for (const Json& p : dashboard.at("panels")) {
    EXPECT_TRUE(ids.insert(p.at("id").get<int>()).second) << "duplicate panel id " << p.at("id");
  }
}

}  // namespace
}  // namespace dflash::metrics
