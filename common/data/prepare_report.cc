// PrepareReport: JSON (for --output json and the report section of the prepared file) and the
// human-readable table.
#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "common/data/prepare.h"

namespace dflash::data {
namespace {

using json = nlohmann::json;

// Bucket k of the histogram holds lengths in [2^k, 2^(k+1)); bucket 0 also holds 0.
int64_t BucketMin(size_t k) { return k == 0 ? 0 : int64_t{1} << k; }
int64_t BucketMax(size_t k) { return (int64_t{2} << k) - 1; }

std::string Percent(int64_t part, int64_t whole) {
  return whole == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * part / whole);
}

}  // namespace

absl::string_view OnBadRecordName(OnBadRecord mode) {
  return mode == OnBadRecord::kFail ? "fail" : "skip";
}

absl::StatusOr<OnBadRecord> ParseOnBadRecord(absl::string_view name) {
  if (name == "skip") return OnBadRecord::kSkip;
  if (name == "fail") return OnBadRecord::kFail;
  return absl::InvalidArgumentError(
      absl::StrCat("on_bad_record: expected skip or fail, got '", name, "'"));
}

int64_t PrepareReport::dropped_total() const {
  int64_t n = 0;
  for (const DropStats& d : dropped) n += d.count;
  return n;
}

json PrepareReport::ToJson() const {
  json drops = json::object();
  for (int r = 0; r < kNumDropReasons; ++r) {
    if (dropped[r].count == 0) continue;
    drops[std::string(DropReasonName(static_cast<DropReason>(r)))] = {
        {"count", dropped[r].count}, {"examples", dropped[r].examples}};
  }
  json histogram = json::array();
  for (size_t k = 0; k < length_histogram.size(); ++k) {
    histogram.push_back(
        {{"min", BucketMin(k)}, {"max", BucketMax(k)}, {"count", length_histogram[k]}});
  }
  return {{"input", input},
          {"output", output},
          {"format", format},
          {"chat_template", chat_template},
          {"tokenizer_fingerprint", tokenizer_fingerprint},
          {"threads", threads},
          {"input_bytes", input_bytes},
          {"lines_read", lines_read},
          {"blank_lines", blank_lines},
          {"documents", documents},
          {"dropped_total", dropped_total()},
          {"dropped", drops},
          {"max_length", max_length},
          {"over_max_length", over_max_length},
          {"tokens", tokens},
          {"supervised_tokens", supervised_tokens},
          {"longest_document", longest_document},
          {"length_histogram", histogram},
          {"seconds", seconds}};
}

absl::StatusOr<PrepareReport> PrepareReport::FromJson(const json& j) {
  PrepareReport r;
  try {
    r.input = j.at("input").get<std::string>();
    // output, threads and seconds are absent from the copy stored in a prepared file.
    r.output = j.value("output", "");
    r.format = j.at("format").get<std::string>();
    r.chat_template = j.at("chat_template").get<std::string>();
    r.tokenizer_fingerprint = j.at("tokenizer_fingerprint").get<std::string>();
    r.threads = j.value("threads", 0);
    r.input_bytes = j.at("input_bytes").get<int64_t>();
    r.lines_read = j.at("lines_read").get<int64_t>();
    r.blank_lines = j.at("blank_lines").get<int64_t>();
    r.documents = j.at("documents").get<int64_t>();
    for (const auto& [name, value] : j.at("dropped").items()) {
      std::optional<DropReason> reason = ParseDropReason(name);
      if (!reason) return absl::InvalidArgumentError("prepare report: unknown drop reason " + name);
      DropStats& d = r.dropped[static_cast<size_t>(*reason)];
      d.count = value.at("count").get<int64_t>();
      d.examples = value.at("examples").get<std::vector<std::string>>();
    }
    r.max_length = j.at("max_length").get<int64_t>();
    r.over_max_length = j.at("over_max_length").get<int64_t>();
    r.tokens = j.at("tokens").get<int64_t>();
    r.supervised_tokens = j.at("supervised_tokens").get<int64_t>();
    r.longest_document = j.at("longest_document").get<int64_t>();
    for (const json& bucket : j.at("length_histogram")) {
      r.length_histogram.push_back(bucket.at("count").get<int64_t>());
    }
    r.seconds = j.value("seconds", 0.0);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("prepare report: ", e.what()));
  }
  return r;
}

std::string PrepareReport::ToTable() const {
  std::string out;
  auto row = [&out](absl::string_view name, const std::string& value) {
    absl::StrAppendFormat(&out, "  %-22s %s\n", name, value);
  };
  absl::StrAppend(&out, "prepare ", input, " -> ", output, "\n");
  row("format", format == "chat" ? absl::StrCat(format, " (", chat_template, ")") : format);
  row("lines read", absl::StrCat(lines_read, " (", blank_lines, " blank)"));
  row("documents kept", absl::StrCat(documents));
  row("documents dropped", absl::StrCat(dropped_total()));
  for (int r = 0; r < kNumDropReasons; ++r) {
    if (dropped[r].count == 0) continue;
    row(absl::StrCat("  ", DropReasonName(static_cast<DropReason>(r))),
        absl::StrCat(dropped[r].count));
    for (const std::string& example : dropped[r].examples)
      absl::StrAppend(&out, "      ", example, "\n");
  }
  row("tokens", absl::StrCat(tokens));
  row("supervised tokens",
      absl::StrCat(supervised_tokens, " (", Percent(supervised_tokens, tokens), ")"));
  row("mean length", documents == 0 ? "-" : absl::StrFormat("%.1f", 1.0 * tokens / documents));
  row("longest document", absl::StrCat(longest_document));
  row(absl::StrCat("over max_length ", max_length),
      absl::StrCat(over_max_length,
                   " (kept whole; the packer truncates or splits them per data.long_documents)"));
  row("seconds", absl::StrFormat("%.2f (%d threads)", seconds, threads));
  absl::StrAppend(&out, "  length histogram (tokens: documents)\n");
  for (size_t k = 0; k < length_histogram.size(); ++k) {
    if (length_histogram[k] == 0) continue;
    absl::StrAppendFormat(&out, "    %8d .. %-8d %10d  %s\n", BucketMin(k), BucketMax(k),
                          length_histogram[k], Percent(length_histogram[k], documents));
  }
  return out;
}

}  // namespace dflash::data
