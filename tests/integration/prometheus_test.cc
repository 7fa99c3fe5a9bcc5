// Every PromQL expression of the shipped Grafana dashboard (deploy/grafana/dashboards/dflash.json)
// evaluated by a real Prometheus that scrapes real dflash processes through the shipped scrape
// config (deploy/prometheus/prometheus.yml), each one required to return data.
//
// The test starts the coordinator, a target and a drafter worker on the CPU with their /metrics on
// loopback ports chosen by the OS, and Debian's `prometheus` binary with a config derived from the
// shipped one: the same jobs and everything else in them, each shipped target replaced by the test
// process the port plan of docs/operations.md gives it (9470 coordinator, 9500+N target on GPU N,
// 9600+N drafter on GPU N; GPU N > 0 has no process here and is dropped), scrape_interval 1 s,
// storage in the test's directory. It trains a short run, waits until Prometheus has scraped
// every target twice within a rate interval, then evaluates each panel query of the dashboard in
// order (per-GPU memory first) through /api/v1/query, polling until it returns a series (one per
// worker when the query is filtered by $worker), all queries within one 30 s deadline.
// No query is skipped on the CPU: a CPU worker exports its memory series too, with gpu="cpu",
// host memory as used and total, and 0 from LibTorch's CUDA allocator (checked below).
//
// Grafana's variables are substituted as Grafana would:
//   - query variables (label_values(METRIC, LABEL)) are resolved through Prometheus
//     (/api/v1/label/LABEL/values?match[]=METRIC), must not be empty, and are substituted with
//     every value selected, formatted as Grafana does for a multi-value Prometheus variable:
//     (v1|v2), each value regex-escaped;
//   - $__rate_interval is 4 s: Grafana's max($__interval + scrape interval, 4 x scrape interval)
//     with the datasource's scrape interval (timeInterval) set to the test's 1 s.
// Prometheus missing: the test skips, except under CI=true, where it fails (scripts/setup.sh
// installs it).
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/common/http_get.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using json = nlohmann::json;
using ms = std::chrono::milliseconds;

constexpr char kDashboard[] = DFLASH_SOURCE_DIR "/deploy/grafana/dashboards/dflash.json";
constexpr char kScrapeConfig[] = DFLASH_SOURCE_DIR "/deploy/prometheus/prometheus.yml";
constexpr char kRateInterval[] = "4s";
constexpr int64_t kSteps = 20;

// The prometheus server binary: the first on PATH, else Debian's /usr/bin/prometheus; "" if none.
std::string FindPrometheus() {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (!dir.empty()) candidates.push_back(dir + "/prometheus");
    }
  }
  candidates.push_back("/usr/bin/prometheus");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(c)) return c;
  }
  return "";
}

std::string UrlEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// GET on Prometheus's HTTP API; the parsed JSON body of a 200 answer with status "success", else
// null (not up yet, a bad query: the caller's deadline decides).
json ApiGet(int port, const std::string& path_and_query, std::string* error) {
  const std::string response = HttpGet(port, path_and_query);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    *error = "no HTTP answer";
    return nullptr;
  }
  json parsed = json::parse(response.substr(body + 4), nullptr, /*allow_exceptions=*/false);
  if (response.find(" 200 ") > response.find("\r\n") || parsed.is_discarded() ||
      parsed.value("status", "") != "success") {
    *error = response.substr(0, response.find("\r\n")) + " " + response.substr(body + 4);
    return nullptr;
  }
  return parsed;
}

// The shipped scrape config with its targets moved to the test's processes (see the top comment).
YAML::Node DeriveScrapeConfig(int coordinator, int target, int drafter) {
  YAML::Node config = YAML::LoadFile(kScrapeConfig);
  config["global"]["scrape_interval"] = "1s";
  config["global"]["scrape_timeout"] = "1s";
  for (YAML::Node job : config["scrape_configs"]) {
    for (YAML::Node group : job["static_configs"]) {
      YAML::Node moved(YAML::NodeType::Sequence);
      for (const YAML::Node& t : group["targets"]) {
        const std::string shipped = t.as<std::string>();
        const int port = std::stoi(shipped.substr(shipped.rfind(':') + 1));
        const int ours = port == 9470   ? coordinator
                         : port == 9500 ? target
                         : port == 9600 ? drafter
                                        : 0;
        if (ours == 0) {
          std::cout << "[prometheus_test] " << job["job_name"] << ": shipped target " << shipped
                    << " has no process in this test (one target, one drafter); dropped\n";
          continue;
        }
        moved.push_back("127.0.0.1:" + std::to_string(ours));
      }
      group["targets"] = moved;
    }
  }
  // Rule files are relative to the shipped file's directory.
  if (config["rule_files"]) {
    YAML::Node rules(YAML::NodeType::Sequence);
    for (const YAML::Node& r : config["rule_files"]) {
      const std::string file = r.as<std::string>();
      rules.push_back(file.rfind('/', 0) == 0
                          ? file
                          : std::filesystem::path(kScrapeConfig).parent_path().string() + "/" +
                                file);
    }
    config["rule_files"] = rules;
  }
  return config;
}

struct Expression {
  std::string panel;
  std::string expr;
};

// Every panel target's expression in the dashboard's order, rows' collapsed panels included.
void CollectTargets(const json& panels, std::vector<Expression>* out) {
  for (const json& p : panels) {
    for (const json& t : p.value("targets", json::array())) {
      if (t.contains("expr")) out->push_back({p.value("title", "?"), t["expr"]});
    }
    if (p.contains("panels")) CollectTargets(p["panels"], out);
  }
}

// A label value as a regex inside a PromQL string literal, escaped as Grafana does for
// Prometheus variables: a regex metacharacter gets a backslash, written \\ in the string.
std::string RegexEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\\\\\";  // regex \\ (a backslash), each one \\ in the string
      continue;
    }
    if (std::string("^$.|?*+()[]{}'").find(c) != std::string::npos) out += "\\\\";
    out += c;
  }
  return out;
}

// Grafana's $name and ${name} replaced by their values; an unknown name is returned in *unknown.
std::string Substitute(const std::string& expr, const std::map<std::string, std::string>& values,
                       std::string* unknown) {
  static const std::regex kVariable(R"re(\$(\w+)|\$\{(\w+)\})re");
  std::string out;
  auto last = expr.cbegin();
  for (std::sregex_iterator it(expr.begin(), expr.end(), kVariable), end; it != end; ++it) {
    const std::string name = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    const auto value = values.find(name);
    if (value == values.end()) *unknown = name;
    out.append(last, (*it)[0].first);
    out += value == values.end() ? (*it)[0].str() : value->second;
    last = (*it)[0].second;
  }
  out.append(last, expr.cend());
  return out;
}

std::string Summarize(const json& result) {
  std::vector<std::string> series;
  for (const json& r : result) {
    std::vector<std::string> labels;
    for (const auto& [k, v] : r["metric"].items()) {
      if (k != "instance" && k != "__name__") labels.push_back(k + "=" + v.get<std::string>());
    }
    series.push_back("{" + absl::StrJoin(labels, ",") + "} " + r["value"][1].get<std::string>());
  }
  return series.empty() ? "no series" : absl::StrJoin(series, "; ");
}

class PrometheusTest : public TrainingCluster {
 protected:
  // Instant query at "now"; the result vector, or null while it errs.
  json Query(const std::string& expr, std::string* error) {
    json r = ApiGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(expr), error);
    return r.is_null() ? r : r["data"]["result"];
  }

  int prometheus_port_ = 0;
};

TEST_F(PrometheusTest, EveryDashboardExpressionReturnsDataFromARealPrometheus) {
  const std::string prometheus = FindPrometheus();
  if (prometheus.empty()) {
    const char* ci = std::getenv("CI");
    ASSERT_FALSE(ci != nullptr && std::string(ci) == "true")
        << "CI=true but no prometheus binary (scripts/setup.sh installs Debian's `prometheus`)";
    GTEST_SKIP() << "no prometheus binary on PATH or at /usr/bin/prometheus; install Debian's "
                    "`prometheus` package (scripts/setup.sh does) to run this test";
  }
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const int target = ReadReadyPort(dir_ + "/t0.ready", "metrics_port", ms(1000));
  const int drafter = ReadReadyPort(dir_ + "/d0.ready", "metrics_port", ms(1000));
  ASSERT_GT(metrics_port_, 0);
  ASSERT_GT(target, 0);
  ASSERT_GT(drafter, 0);

  const std::string config_path = dir_ + "/prometheus.yml";
  {
    YAML::Emitter yaml;
    yaml << DeriveScrapeConfig(metrics_port_, target, drafter);
    std::ofstream(config_path) << yaml.c_str() << "\n";
  }
  std::cout << "[prometheus_test] derived scrape config:\n" << ReadFile(config_path);
  const std::string log = dir_ + "/prometheus.log";
  // Declared after the cluster's processes and destroyed (SIGKILL) at the end of this body, before
  // TearDown removes its storage.
  Process server(prometheus,
                 {"--config.file=" + config_path, "--storage.tsdb.path=" + dir_ + "/prometheus",
                  "--web.listen-address=127.0.0.1:0"},
                 log);
  // Port 0: the address it got is in its log ('msg="Listening on" address=127.0.0.1:N').
  const std::regex listening(R"re(msg="Listening on" address=127\.0\.0\.1:(\d+))re");
  ASSERT_TRUE(WaitFor(
      [&] {
        std::smatch m;
        const std::string text = ReadFile(log);
        if (!std::regex_search(text, m, listening)) return false;
        prometheus_port_ = std::stoi(m[1]);
        return true;
      },
      ms(20000)))
      << ReadFile(log);
  std::string error;
  ASSERT_TRUE(
      WaitFor([&] { return HttpGet(prometheus_port_, "/-/ready").find(" 200 ") < 20; }, ms(20000)))
      << ReadFile(log);

  // A short CPU run; Prometheus scrapes it while it trains, and the workers afterwards.
  const std::string run_yaml = WriteRunYaml(
      "run.yaml", absl::StrCat("name: prom\nseed: 3\n"
                               "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                               "drafter: {layers: 1, block_size: 8}\n"
                               "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                               "batching: {token_budget: 512, max_anchors: 64, grad_accum: 1}\n"
                               "optim: {lr: 2.0e-2, max_steps: ",
                               kSteps,
                               "}\nplacement: {pairs: 1, transport: host}\n"
                               "eval: {every_steps: 4, prompts: \"builtin:tiny-chat\", "
                               "max_prompts: 2, max_new_tokens: 8}\n"));
  CtlResult follow = RunCtl(address_, {"submit", run_yaml});
  ASSERT_EQ(follow.exit_code, 0) << follow.out << follow.err;

  // Prometheus has scraped the coordinator since the run's last step committed, and every shipped
  // job's target is up and was scraped at least twice within the last rate interval (rate() needs
  // two samples), before anything else is asked.
  json done;
  ASSERT_TRUE(WaitFor(
      [&] {
        done = Query(absl::StrCat("dflash_coordinator_run_step == ", kSteps), &error);
        return done.is_array() && done.size() == 1;
      },
      ms(20000)))
      << "run step " << kSteps << " not scraped: " << done.dump() << " " << error;
  json up;
  ASSERT_TRUE(WaitFor(
      [&] {
        up = Query(absl::StrCat("count_over_time(up{job=~\"dflash.*\"}[", kRateInterval,
                                "]) >= 2 and up == 1"),
                   &error);
        return up.is_array() && up.size() == 3;
      },
      ms(20000)))
      << "targets up and scraped twice: " << up.dump() << " " << error << "\n"
      << ReadFile(log);

  // The dashboard's variables, resolved through Prometheus.
  std::ifstream in(kDashboard);
  const json dashboard = json::parse(in);
  std::map<std::string, std::string> variables = {{"__rate_interval", kRateInterval}};
  const std::regex label_values(R"re(^label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)$)re");
  for (const json& v : dashboard["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    const std::string name = v["name"];
    const std::string q = v["query"].is_object() ? v["query"]["query"] : v["query"];
    std::smatch m;
    ASSERT_TRUE(std::regex_match(q, m, label_values)) << "variable " << name << ": " << q;
    json values;
    ASSERT_TRUE(WaitFor(
        [&] {
          json r =
              ApiGet(prometheus_port_,
                     "/api/v1/label/" + m[2].str() + "/values?match[]=" + UrlEncode(m[1]), &error);
          values = r.is_null() ? json::array() : r["data"];
          return !values.empty();
        },
        ms(20000)))
        << "variable $" << name << " (" << q << ") has no value: " << error;
    std::vector<std::string> escaped;
    for (const json& value : values) escaped.push_back(RegexEscape(value));
    if (name == "worker") EXPECT_EQ(values, json({"d0", "t0"}));
    variables[name] = escaped.size() == 1 ? escaped[0] : "(" + absl::StrJoin(escaped, "|") + ")";
    std::cout << "[prometheus_test] $" << name << " = " << variables[name] << "\n";
  }
  EXPECT_EQ(variables["gpu"], "cpu") << "CPU workers label their memory series gpu=\"cpu\"";

  const size_t num_workers = 2;  // t0, d0
  std::vector<Expression> exprs;
  CollectTargets(dashboard["panels"], &exprs);
  ASSERT_GE(exprs.size(), 20u);
  EXPECT_EQ(exprs[0].expr.find("dflash_worker_gpu_memory_"), 0u)
      << "the dashboard opens with per-GPU memory: " << exprs[0].expr;
  // Everything was scraped by now; the deadline, shared by all the queries, bounds the test when
  // some return nothing.
  const auto deadline = std::chrono::steady_clock::now() + ms(30000);
  std::map<std::string, json> results;  // by the dashboard's expression
  size_t with_data = 0;
  for (const Expression& e : exprs) {
    std::string unknown;
    const std::string q = Substitute(e.expr, variables, &unknown);
    ASSERT_TRUE(unknown.empty()) << "no value for $" << unknown << " in: " << e.expr;
    // A query filtered by $worker draws each worker (both roles export every dflash_worker_
    // metric, and the coordinator's per-worker gauges name both): one series each at least.
    const size_t want = e.expr.find("$worker") != std::string::npos ? num_workers : 1;
    json result;
    const bool data = WaitFor(
        [&] {
          result = Query(q, &error);
          return result.is_array() && result.size() >= want;
        },
        std::max(ms(0),
                 std::chrono::duration_cast<ms>(deadline - std::chrono::steady_clock::now())));
    EXPECT_TRUE(data) << "no data (" << want << " series wanted) for panel \"" << e.panel
                      << "\": " << q << "\n"
                      << (result.is_null() ? error : result.dump());
    std::cout << "[prometheus_test] " << (data ? "data   " : "NO DATA") << " " << e.panel
              << "\n    " << q << "\n    -> " << (result.is_array() ? Summarize(result) : error)
              << "\n";
    results[e.expr] = result;
    with_data += data ? 1 : 0;
  }
  // None is skipped on the CPU: the memory series exist there too (below), so every query counts.
  std::cout << "[prometheus_test] " << with_data << " of " << exprs.size()
            << " dashboard queries returned data, 0 skipped\n";

  // What the CPU machine's memory series say, truthfully: the "GPU" is the host (MemTotal and
  // MemTotal - MemAvailable) and LibTorch's CUDA allocator holds nothing, so those read 0.
  const auto values = [&](const std::string& prefix) {
    std::vector<double> out;
    for (const auto& [expr, result] : results) {
      if (expr.rfind(prefix, 0) != 0 || !result.is_array()) continue;
      for (const json& r : result) out.push_back(std::stod(r["value"][1].get<std::string>()));
    }
    return out;
  };
  for (const char* allocator : {"allocated", "reserved", "peak"}) {
    for (double v : values(absl::StrCat("dflash_worker_gpu_memory_", allocator, "_bytes"))) {
      EXPECT_EQ(v, 0.0) << allocator << " on a CPU worker";
    }
  }
  for (double v : values("dflash_worker_gpu_memory_used_bytes")) EXPECT_GT(v, 0.0);
  for (double v : values("dflash_worker_host_rss_bytes")) EXPECT_GT(v, 1e6);
  for (double v : values("dflash_coordinator_run_step")) EXPECT_EQ(v, kSteps);
}

}  // namespace
}  // namespace dflash::testing
