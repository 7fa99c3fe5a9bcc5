// The one catalogue of every Prometheus metric any dflash process exports.
// Names: dflash_<component>_<what>_<unit>; counters end in _total; labels from {run, worker, role,
// gpu, state, health}. A unit test asserts that every entry here is exported by its component.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::metrics {

class HttpExposer;

enum class MetricType { kCounter, kGauge };

struct MetricDef {
  const char* name;
  MetricType type;
  const char* component;  // "coordinator" or "worker"
  const char* help;
};

const std::vector<MetricDef>& Catalogue();

// The metric registry of one process plus its /metrics HTTP endpoint.
class MetricsServer {
 public:
  // Registers every catalogue family of `component` and, when listen_address is non-empty,
  // serves them on it (port 0 = chosen by the OS; see port()).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Create(const std::string& component,
                                                               const std::string& listen_address);
  ~MetricsServer();

  // Families by catalogue name; asking for a name not in this component's catalogue aborts,
  // because it is a programming error caught by the first test that touches it.
  prometheus::Family<prometheus::Gauge>& Gauge(const std::string& name);
  prometheus::Family<prometheus::Counter>& Counter(const std::string& name);

  int port() const { return port_; }
  // The exposition text, exactly as /metrics serves it.
  std::string Scrape() const;

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpExposer> exposer_;
  std::vector<std::pair<std::string, prometheus::Family<prometheus::Gauge>*>> gauges_;
  std::vector<std::pair<std::string, prometheus::Family<prometheus::Counter>*>> counters_;
  int port_ = 0;
};

}  // namespace dflash::metrics
