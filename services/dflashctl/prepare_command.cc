#include "services/dflashctl/prepare_command.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/config/run_spec.h"
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
  o.tokenizer = fs::absolute(a.tokenizer);
  o.output = a.out.empty() ? fs::path(o.input).replace_extension(".dfdata") : fs::absolute(a.out);
  auto format = data::ParseDataFormat(a.format);
  if (!format.ok()) return format.status();
  o.format = *format;
  o.chat_template = a.chat_template;
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
  auto tok = tokenizer::Tokenizer::FromFile(o.tokenizer);
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
         m.block_size == o.block_size && m.max_length == o.max_length;
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
