#include "services/dflashctl/output.h"

#include <google/protobuf/util/json_util.h>

#include <ctime>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/rpc/run_state.h"

namespace dflash::ctl {
namespace {

std::string Time(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

// Left-aligned columns sized to their widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string Role(v1::WorkerRole r) {
  return r == v1::WORKER_ROLE_TARGET ? "target" : r == v1::WORKER_ROLE_DRAFTER ? "drafter" : "?";
}

}  // namespace

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string RunsTable(const std::vector<v1::RunStatus>& runs) {
  std::vector<std::vector<std::string>> rows = {
      {"RUN", "NAME", "STATE", "STEP", "CREATED", "MESSAGE"}};
  for (const auto& r : runs) {
    std::string msg = r.message();
    if (msg.size() > 60) msg = msg.substr(0, 57) + "...";
    rows.push_back({r.run_id(), r.name(), StateName(r.state()),
                    r.total_steps() > 0 ? absl::StrCat(r.step(), "/", r.total_steps())
                                        : absl::StrCat(r.step()),
                    Time(r.created_unix_ms()), msg});
  }
  return Table(rows);
}

// The prepared data as the coordinator found it at submission (docs/data.md).
std::string DataLines(const v1::DataSummary& d) {
  std::ostringstream out;
  out << "data:     " << d.prepared_path() << "\n"
      << "  documents " << d.documents() << ", tokens " << d.tokens() << " (supervised "
      << d.supervised_tokens() << "), tokenizer " << d.tokenizer_fingerprint().substr(0, 12) << "\n"
      << "  records read " << d.records_read() << ", skipped " << d.records_skipped();
  if (d.records_skipped() > 0) {
    std::map<std::string, int64_t> sorted(d.skipped_by_reason().begin(),
                                          d.skipped_by_reason().end());
    out << " (";
    bool first = true;
    for (const auto& [reason, n] : sorted) {
      out << (first ? "" : ", ") << reason << " " << n;
      first = false;
    }
    out << ")";
  }
  out << ", over max_length " << d.documents_over_max_length() << "\n"
      << "  per epoch: " << d.micro_batches_per_epoch() << " micro-batches per pair x " << d.pairs()
      << " pairs, " << d.steps_per_epoch() << " steps, fill "
      << absl::StrFormat("%.1f%%", 100.0 * d.fill_ratio()) << "\n";
  return out.str();
}

std::string RunDetails(const v1::RunStatus& r) {
  std::ostringstream out;
  out << "run:      " << r.run_id() << "\n"
      << "name:     " << r.name() << "\n"
      << "state:    " << StateName(r.state()) << "\n"
      << "message:  " << r.message() << "\n"
      << "step:     " << r.step() << (r.total_steps() ? absl::StrCat("/", r.total_steps()) : "")
      << "\n"
      << "created:  " << Time(r.created_unix_ms()) << "\n"
      << "updated:  " << Time(r.updated_unix_ms()) << "\n"
      << "workers:  ";
  for (int i = 0; i < r.worker_ids_size(); ++i) out << (i ? ", " : "") << r.worker_ids(i);
  out << (r.worker_ids_size() ? "" : "-") << "\n";
  if (!r.run_dir().empty()) out << "run dir:  " << r.run_dir() << "\n";
  if (r.has_resolved_target()) {
    const v1::ResolvedTarget& t = r.resolved_target();
    out << "target layer ids: " << absl::StrJoin(t.target_layer_ids(), ",") << "\n"
        << "mask token id:    " << t.mask_token_id() << " ("
        << (t.mask_token().empty() ? "" : absl::StrCat(t.mask_token(), ": ")) << t.mask_token_rule()
        << ")\n";
  }
  if (r.has_last_step()) {
    const v1::StepMetrics& m = r.last_step();
    out << "last step: " << m.step() + 1 << " (epoch " << m.epoch() << "): loss "
        << absl::StrFormat("%.4f", m.loss()) << ", acc.len "
        << absl::StrFormat("%.2f", m.acceptance_length()) << ", grad norm "
        << absl::StrFormat("%.3g", m.grad_norm()) << ", lr " << absl::StrFormat("%.3g", m.lr())
        << ", " << m.tokens() << " tokens in " << absl::StrFormat("%.2f", m.seconds()) << " s"
        << (m.skipped() ? ", SKIPPED" : "") << ", skipped so far " << m.skipped_steps() << "\n";
  }
  if (r.has_last_eval()) {
    const v1::EvalResult& e = r.last_eval();
    out << "last eval: step " << e.step() << ": tau " << absl::StrFormat("%.3f", e.tau())
        << " over " << e.prompts() << " prompts (" << e.new_tokens() << " tokens, "
        << absl::StrFormat("%.1f", e.tokens_per_second()) << " tokens/s) on " << e.worker()
        << "; accepted by position:";
    for (int k = 1; k < e.acceptance_by_position_size(); ++k) {
      out << absl::StrFormat(" %.2f", e.acceptance_by_position(k));
    }
    out << "\n";
  }
  if (r.has_evaluating()) {
    const v1::EvalInProgress& e = r.evaluating();
    out << "evaluating: the drafter of step " << e.step() << " on " << e.worker()
        << (e.reserved()        ? " (reserved for evaluation, beside the training steps)"
            : e.between_steps() ? " (pair 0's target group, between the training steps)"
                                : " (pair 0's target, beside the training steps)")
        << " since " << Time(e.started_unix_ms()) << "\n";
  }
  if (r.has_best_eval()) {
    out << "best eval: step " << r.best_eval().step() << ": tau "
        << absl::StrFormat("%.3f", r.best_eval().tau()) << " (dflashctl export --best copies "
        << r.best_eval().drafter_dir() << ")\n";
  }
  if (r.has_data()) out << DataLines(r.data());
  out << "resolved config:\n";
  std::istringstream cfg(r.resolved_config_yaml());
  for (std::string line; std::getline(cfg, line);) out << "  " << line << "\n";
  return out.str();
}

std::string EvalTable(const v1::EvalResult& r) {
  std::ostringstream out;
  out << "drafter    " << r.drafter_dir() << " (block size " << r.block_size() << ")\n";
  if (r.step() > 0) out << "step       " << r.step() << "\n";
  out << "worker     " << r.worker() << "\n";
  const bool sampled = r.temperature() > 0;
  out << "decoding   "
      << (sampled ? absl::StrFormat("sampled: temperature %g, top_p %g, top_k %d, seed %d",
                                    r.temperature(), r.top_p(), static_cast<long long>(r.top_k()),
                                    static_cast<long long>(r.seed()))
                  : std::string("greedy"))
      << "\n";
  out << "prompts    " << r.prompts() << ", " << r.new_tokens() << " new tokens in "
      << absl::StrFormat("%.2f s (%.1f tokens/s; loading %.2f s)", r.seconds(),
                         r.tokens_per_second(), r.load_seconds())
      << "\n";
  out << "tau        " << absl::StrFormat("%.3f", r.tau()) << " tokens per verification ("
      << r.verifications() << " verifications)\n";
  if (r.emitted_histogram_size() > 0) {
    out << "emitted    " << absl::StrFormat("%.3f", r.tau_pooled())
        << " tokens per verification pooled, " << absl::StrFormat("%.3f", r.tau_prompt_mean())
        << " mean of the prompts' means; share of verifications by tokens emitted:";
    for (int e = 0; e < r.emitted_histogram_size(); ++e) {
      out << absl::StrFormat(" %d:%.3f", e, r.emitted_histogram(e));
    }
    out << "\n";
  }
  // By context length: the tokens before each verification's block.
  for (const v1::EvalContextBucket& c : r.by_context()) {
    out << absl::StrFormat("context    %-12s tau %.3f (%d verifications)\n", c.range() + " tokens",
                           c.tau(), static_cast<long long>(c.verifications()));
  }
  if (r.baseline_tokens_per_second() > 0) {
    out << "baseline   " << absl::StrFormat("%.1f", r.baseline_tokens_per_second())
        << " tokens/s by plain " << (sampled ? "sampled" : "greedy")
        << " decoding of the same prompts: speed-up "
        << absl::StrFormat("%.2fx", r.tokens_per_second() / r.baseline_tokens_per_second()) << "\n";
    if (!sampled) {
      out << "identical  " << r.baseline_identical_prompts() << " of " << r.prompts()
          << " prompts decoded token for token alike by both\n";
    }
  }
  out << "accepted   position: share of verifications that accepted it\n";
  for (int k = 1; k < r.acceptance_by_position_size(); ++k) {
    out << absl::StrFormat("  %2d  %.3f\n", k, r.acceptance_by_position(k));
  }
  return out.str();
}

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "ROLE", "HEALTH", "DEVICE",
                                                 "MEMORY FREE/TOTAL", "RUN", "ADDRESS",
                                                 "LAST HEARTBEAT"}};
  for (const auto& w : workers) {
    const auto& d = w.device();
    std::string device =
        d.kind() == "cuda" ? absl::StrCat("cuda:", d.index(), " ", d.name()) : d.kind();
    rows.push_back({w.worker_id(), w.name(), Role(w.role()),
                    w.health() == v1::WORKER_HEALTH_UP ? "up" : "down", device,
                    absl::StrCat(FormatBytes(d.free_bytes()), " / ", FormatBytes(d.total_bytes())),
                    w.run_id().empty() ? "-" : w.run_id(), w.control_address(),
                    Time(w.last_heartbeat_unix_ms())});
  }
  return Table(rows);
}

std::string EventLine(const v1::RunEvent& e) {
  std::string from = e.from_state() == v1::RUN_STATE_UNSPECIFIED ? std::string("submitted")
                                                                 : StateName(e.from_state());
  return absl::StrCat("[", Time(e.unix_ms()), "] ", from, " -> ", StateName(e.to_state()),
                      e.message().empty() ? "" : absl::StrCat(": ", e.message()));
}

}  // namespace dflash::ctl
