#include "services/dflashctl/prepare_command.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/config/run_spec.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/chat_template.h"
#include "common/data/prepare.h"
#include "common/data/prepared.h"
#include "common/data/run_data.h"
#include "services/dflashctl/commands.h"
#include "services/dflashctl/progress.h"

namespace dflash::ctl {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<data::PrepareOptions> FromRunYaml(const PrepareArgs& a) {
  std::ifstream in(a.run_yaml);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", a.run_yaml));
  std::stringstream text;
  text << in.rdbuf();
  config::RunSpecOptions opts;
  opts.base_dir = fs::absolute(a.run_yaml).parent_path().string();
  auto spec = config::ParseRunSpec(text.str(), a.run_yaml, opts);
  if (!spec.ok()) return spec.status();
  auto paths = data::ResolveRunDataPaths(*spec);
  if (!paths.ok()) return paths.status();
  return data::PrepareOptionsFor(*spec, *paths);
}

absl::StatusOr<data::PrepareOptions> FromFlags(const PrepareArgs& a) {
  data::PrepareOptions o;
  o.input = fs::absolute(a.data);
  o.tokenizer =
      a.tokenizer.rfind("builtin:", 0) == 0 ? fs::path(a.tokenizer) : fs::absolute(a.tokenizer);
  o.output = a.out.empty() ? fs::path(o.input).replace_extension(".dfdata") : fs::absolute(a.out);
  auto format = data::ParseDataFormat(a.format);
  if (!format.ok()) return format.status();
  o.format = *format;
  o.chat_template = a.chat_template;
  o.thinking = a.thinking;
  o.block_size = a.block_size;
  o.max_length = a.max_length;
  auto bad = data::ParseOnBadRecord(a.on_bad_record);
  if (!bad.ok()) return bad.status();
  o.on_bad_record = *bad;
  return o;
}

// An output that already holds exactly this preparation (same source size and mtime, tokenizer,
// format, template setting and block size) is kept: preparing is minutes on a large set.
bool UpToDate(const data::PrepareOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.output, ec)) return false;
  auto tok = data::LoadTokenizer(o.tokenizer);
  if (!tok.ok()) return false;
  data::PreparedOpenOptions open;
  open.expected_fingerprint = (*tok)->fingerprint();
  open.verify = false;
  auto ds = data::PreparedDataset::Open(o.output, open);
  if (!ds.ok()) return false;
  const data::PreparedMetadata& m = (*ds)->metadata();
  struct stat st {};
  if (::stat(o.input.c_str(), &st) != 0) return false;
  const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return m.source_path == o.input.string() && m.source_bytes == st.st_size &&
         m.source_mtime_ns == mtime_ns && m.data_format == data::DataFormatName(o.format) &&
         (o.chat_template == "auto" || m.chat_template == o.chat_template) &&
         data::RecordedThinking(m.chat_template) == o.thinking && m.block_size == o.block_size &&
         m.max_length == o.max_length;
}

// Ctrl-C or SIGTERM during a long prepare: the writer's temporary files (possibly many GB) would
// outlive the process, since a signal skips destructors. The handler removes them with unlink (safe
// in a signal handler) and exits 128 + signal; the final output is never touched, so an older
// prepared file under that name survives.
char g_tmp_main[4096];
char g_tmp_mask[4096];

extern "C" void RemoveTemporariesAndExit(int sig) {
  ::unlink(g_tmp_main);
  ::unlink(g_tmp_mask);
  ::_exit(128 + sig);
}

void RemoveTemporariesOnSignal(const fs::path& output) {
  const std::string main_tmp = output.string() + ".tmp", mask_tmp = output.string() + ".tmp.mask";
  if (mask_tmp.size() >= sizeof(g_tmp_mask)) return;  // PATH_MAX: cannot happen on Linux
  std::snprintf(g_tmp_main, sizeof(g_tmp_main), "%s", main_tmp.c_str());
  std::snprintf(g_tmp_mask, sizeof(g_tmp_mask), "%s", mask_tmp.c_str());
  struct sigaction sa {};
  sa.sa_handler = RemoveTemporariesAndExit;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return kBadData;
    case absl::StatusCode::kNotFound:
      return kInvalidConfig;
    default:
      return kError;
  }
}

}  // namespace

int RunPrepare(const PrepareArgs& a) {
  auto options = a.run_yaml.empty() ? FromFlags(a) : FromRunYaml(a);
  if (!options.ok()) {
    std::cerr << "dflashctl prepare: " << options.status().message() << "\n";
    return a.run_yaml.empty() ? kUsage : kInvalidConfig;
  }
  options->threads = a.threads;
  if (!a.force && UpToDate(*options)) {
    if (a.json) {
      std::cout << "{\"up_to_date\": true, \"output\": \"" << options->output.string() << "\"}\n";
    } else {
      std::cout << options->output.string() << " is up to date with " << options->input.string()
                << " (use --force to prepare it again)\n";
    }
    return kOk;
  }
  RemoveTemporariesOnSignal(options->output);
  ProgressBar bar(stderr, /*enabled=*/!a.json);
  ProgressSample last;
  auto report = data::Prepare(*options, [&](const data::PrepareProgress& p) {
    last = ProgressSample{static_cast<uint64_t>(p.bytes_read), static_cast<uint64_t>(p.total_bytes),
                          p.documents, p.tokens};
    bar.Update(last);
  });
  if (!report.ok()) {
    bar.Break();
    std::cerr << "dflashctl prepare: " << report.status().message() << "\n";
    return ExitCodeFor(report.status());
  }
  last.done_bytes = last.total_bytes = static_cast<uint64_t>(report->input_bytes);
  last.documents = report->documents;
  last.tokens = report->tokens;
  bar.Finish(last);
  if (a.json) {
    nlohmann::json j = report->ToJson();
    j["up_to_date"] = false;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << report->ToTable();
  }
  return kOk;
}

}  // namespace dflash::ctl
