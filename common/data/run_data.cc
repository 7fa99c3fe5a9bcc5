#include "common/data/run_data.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/batching/plan.h"
#include "common/data/builtin_data.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;

std::string PrepareHint(const config::RunSpec& spec) {
  return absl::StrCat("run `dflashctl prepare <run.yaml>` (data.train ", spec.data.train,
                      ") to create it");
}

// The JSONL a prepared file was made from must not have changed since: training on a prepared file
// that no longer matches its source would silently ignore the user's edits.
absl::Status CheckSourceUnchanged(const RunDataPaths& paths, const PreparedMetadata& m) {
  if (paths.train_is_prepared) return absl::OkStatus();
  struct stat st {};
  if (::stat(paths.train.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("data.train: cannot stat ", paths.train.string()));
  }
  const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  if (st.st_size != m.source_bytes || mtime_ns != m.source_mtime_ns) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.prepared: ", paths.prepared.string(), " was prepared from ", m.source_path, " (",
        m.source_bytes, " bytes), but data.train ", paths.train.string(), " has changed since (",
        st.st_size, " bytes now); run `dflashctl prepare <run.yaml>` again"));
  }
  return absl::OkStatus();
}

absl::Status CheckSettings(const config::RunSpec& spec, const PreparedMetadata& m,
                           const fs::path& prepared) {
  if (m.data_format != spec.data.format) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.format: the run says '", spec.data.format, "' but ", prepared.string(),
                     " was prepared as '", m.data_format, "'; prepare it again"));
  }
  if (spec.data.format == "chat" && spec.data.chat_template != "auto" &&
      m.chat_template != spec.data.chat_template) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.chat_template: the run says '", spec.data.chat_template, "' but ", prepared.string(),
        " was rendered with '", m.chat_template, "'; prepare it again"));
  }
  // The thinking mode a file was rendered with is part of its template's name ("jinja-think").
  if (spec.data.format == "chat") {
    const std::string recorded = RecordedThinking(m.chat_template);
    if (recorded != spec.data.thinking) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.thinking: the run says '", spec.data.thinking, "' but ", prepared.string(),
          " was rendered with thinking ", recorded, "; prepare it again"));
    }
  }
  return absl::OkStatus();
}

void FillFromReport(absl::string_view report_json, RunDataSummary* s) {
  auto parsed = nlohmann::json::parse(report_json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return;
  auto report = PrepareReport::FromJson(parsed);
  if (!report.ok()) return;
  s->records_read = report->lines_read - report->blank_lines;
  s->records_skipped = report->dropped_total();
  for (int r = 0; r < kNumDropReasons; ++r) {
    const DropStats& d = report->dropped[r];
    if (d.count > 0) s->skipped_by_reason[std::string(DropReasonName(DropReason(r)))] = d.count;
  }
}

absl::Status PlanSummary(const config::RunSpec& spec, const batching::DocumentSource& data,
                         RunDataSummary* s) {
  // placement.pairs auto is settled at placement; until then the plan is made for one pair.
  ASSIGN_OR_RETURN(batching::BatchingOptions o,
                   BatchingOptionsFor(spec, spec.placement.pairs.value_or(1)));
  ASSIGN_OR_RETURN(batching::EpochPlan plan, batching::PlanEpoch(data, o, /*epoch=*/0));
  s->pairs = o.num_pairs;
  s->micro_batches_per_epoch = plan.micro_batches_per_pair();
  s->steps_per_epoch = plan.steps();
  s->fill_ratio = plan.stats().fill_ratio();
  s->documents_over_max_length = plan.stats().truncated_documents + plan.stats().split_documents;
  s->total_steps = spec.optim.max_steps > 0
                       ? spec.optim.max_steps
                       : static_cast<int64_t>(std::ceil(spec.optim.epochs * plan.steps()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<batching::BatchingOptions> BatchingOptionsFor(const config::RunSpec& spec,
                                                             int64_t num_pairs) {
  batching::BatchingOptions o;
  o.token_budget = spec.batching.token_budget;
  o.max_length = spec.data.max_length;
  absl::StatusOr<batching::LongDocuments> long_docs =
      batching::ParseLongDocuments(spec.data.long_documents);
  if (!long_docs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.long_documents: ", long_docs.status().message()));
  }
  o.long_documents = *long_docs;
  o.grad_accum = spec.batching.grad_accum;
  o.num_pairs = num_pairs;
  o.seed = static_cast<uint64_t>(spec.seed);
  RETURN_IF_ERROR(batching::ValidateBatchingOptions(o));
  return o;
}

bool LooksPrepared(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kPreparedMagic)] = {};
  if (!in.read(magic, sizeof(magic))) return false;
  return std::equal(magic, magic + sizeof(magic), kPreparedMagic);
}

absl::StatusOr<RunDataPaths> ResolveRunDataPaths(const config::RunSpec& spec) {
  if (absl::StartsWith(spec.data.train, "builtin:")) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.train: ", spec.data.train, " is built in; there is nothing to prepare"));
  }
  RunDataPaths p;
  p.train = spec.data.train;
  if (!absl::StartsWith(spec.target.path, "builtin:")) p.chat_template_dir = spec.target.path;
  if (spec.data.tokenizer != "auto") {
    p.tokenizer = spec.data.tokenizer;
  } else if (absl::StartsWith(spec.target.path, "builtin:")) {
    p.tokenizer = spec.target.path;  // its built-in tokenizer (builtin_tokenizer.h)
  } else {
    p.tokenizer = fs::path(spec.target.path) / "tokenizer.json";
    std::error_code ec;
    if (!fs::is_regular_file(p.tokenizer, ec)) {
      return absl::InvalidArgumentError(absl::StrCat("data.tokenizer: auto looks for ",
                                                     p.tokenizer.string(),
                                                     ", which does not exist; set data.tokenizer"));
    }
  }
  p.train_is_prepared = LooksPrepared(p.train);
  if (p.train_is_prepared) {
    p.prepared = p.train;
  } else if (spec.data.prepared != "auto") {
    p.prepared = spec.data.prepared;
  } else {
    p.prepared = fs::path(p.train).replace_extension(".dfdata");
  }
  return p;
}

absl::StatusOr<PrepareOptions> PrepareOptionsFor(const config::RunSpec& spec,
                                                 const RunDataPaths& paths) {
  if (paths.train_is_prepared) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.train: ", paths.train.string(), " is already a prepared file; nothing to prepare"));
  }
  PrepareOptions o;
  o.input = paths.train;
  o.output = paths.prepared;
  o.tokenizer = paths.tokenizer;
  o.chat_template_dir = paths.chat_template_dir;
  ASSIGN_OR_RETURN(o.format, ParseDataFormat(spec.data.format));
  o.chat_template = spec.data.chat_template;
  o.thinking = spec.data.thinking;
  o.block_size = static_cast<int>(spec.drafter.block_size);
  o.max_length = spec.data.max_length;
  ASSIGN_OR_RETURN(o.on_bad_record, ParseOnBadRecord(spec.data.on_bad_record));
  return o;
}

absl::StatusOr<RunData> OpenRunData(const config::RunSpec& spec, bool verify) {
  RunData rd;
  if (absl::StartsWith(spec.data.train, "builtin:")) {
    auto builtin = BuiltinDataset(spec.data.train.substr(std::strlen("builtin:")));
    if (!builtin.ok()) {
      return absl::Status(builtin.status().code(),
                          absl::StrCat("data.train: ", builtin.status().message()));
    }
    RunDataSummary& s = rd.summary;
    for (int64_t i = 0; i < (*builtin)->num_documents(); ++i) {
      const batching::DocumentView doc = (*builtin)->document(i);
      s.tokens += static_cast<int64_t>(doc.tokens.size());
      for (uint8_t m : doc.loss_mask) s.supervised_tokens += m != 0;
    }
    s.documents = (*builtin)->num_documents();
    s.records_read = s.documents;
    rd.builtin = *std::move(builtin);
    RETURN_IF_ERROR(PlanSummary(spec, *rd.builtin, &s));
    return rd;
  }
  ASSIGN_OR_RETURN(rd.paths, ResolveRunDataPaths(spec));
  std::error_code ec;
  if (!fs::exists(rd.paths.prepared, ec)) {
    return absl::FailedPreconditionError(absl::StrCat("data.prepared: ", rd.paths.prepared.string(),
                                                      " does not exist; ", PrepareHint(spec)));
  }
  ASSIGN_OR_RETURN(auto tok, LoadTokenizer(rd.paths.tokenizer));
  PreparedOpenOptions open;
  open.expected_fingerprint = tok->fingerprint();
  open.verify = verify;
  auto dataset = PreparedDataset::Open(rd.paths.prepared, open);
  if (!dataset.ok()) {
    return absl::Status(dataset.status().code(),
                        absl::StrCat("data.prepared: ", dataset.status().message()));
  }
  rd.dataset = std::move(*dataset);
  const PreparedMetadata& m = rd.dataset->metadata();
  RETURN_IF_ERROR(CheckSettings(spec, m, rd.paths.prepared));
  RETURN_IF_ERROR(CheckSourceUnchanged(rd.paths, m));
  RunDataSummary& s = rd.summary;
  s.prepared_path = rd.paths.prepared.string();
  s.tokenizer_fingerprint = m.tokenizer_fingerprint;
  s.documents = m.num_documents;
  s.tokens = m.num_tokens;
  s.supervised_tokens = m.num_supervised;
  FillFromReport(rd.dataset->report_json(), &s);
  RETURN_IF_ERROR(PlanSummary(spec, *rd.dataset, &s));
  return rd;
}

absl::Status CheckDataVocabulary(const config::RunSpec& spec, const RunData& data,
                                 int64_t target_vocab_size) {
  if (data.dataset == nullptr) return absl::OkStatus();  // built-in data
  const int64_t prepared = data.dataset->metadata().vocab_size;
  const std::string file = data.dataset->path().string();
  if (prepared > target_vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.prepared: ", file, " was prepared with a tokenizer of ", prepared,
                     " tokens, but the target ", spec.target.path,
                     " (target.path) has a vocabulary of ", target_vocab_size,
                     "; prepare it with the target's tokenizer (data.tokenizer: auto, then "
                     "`dflashctl prepare`)"));
  }
  if (spec.data.tokenizer == "auto" || absl::StartsWith(spec.target.path, "builtin:")) {
    return absl::OkStatus();  // the fingerprint check made it the target's own tokenizer
  }
  const fs::path own = fs::path(spec.target.path) / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(own, ec) || fs::equivalent(own, spec.data.tokenizer, ec)) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(auto tok, LoadTokenizer(own));
  if (tok->vocab_size() != prepared) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.prepared: ", file, " was prepared with a tokenizer of ", prepared,
        " tokens (data.tokenizer ", spec.data.tokenizer, "), but the target ", spec.target.path,
        " (target.path) has ", tok->vocab_size(),
        " in its tokenizer.json; prepare it with the target's tokenizer (data.tokenizer: auto)"));
  }
  return absl::OkStatus();
}

}  // namespace dflash::data
