#include "common/batching/cursor.h"

#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/base/rng.h"

namespace dflash::batching {
namespace {

constexpr absl::string_view kVersion = "1";

// The integer fields, in serialization order (long_documents and data_fingerprint are written
// after them with their own encodings).
struct IntField {
  absl::string_view name;
  int64_t DataCursor::*member;
};
constexpr IntField kIntFields[] = {
    {"epoch", &DataCursor::epoch},
    {"micro_batch", &DataCursor::micro_batch},
    {"step", &DataCursor::step},
    {"num_pairs", &DataCursor::num_pairs},
    {"token_budget", &DataCursor::token_budget},
    {"max_length", &DataCursor::max_length},
    {"pack_window", &DataCursor::pack_window},
    {"grad_accum", &DataCursor::grad_accum},
    {"num_documents", &DataCursor::num_documents},
};

bool ParseHex64(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

std::string Hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

// Sets one field from its text; InvalidArgument on a bad value.
absl::Status SetField(absl::string_view key, absl::string_view value, DataCursor* c) {
  for (const IntField& f : kIntFields) {
    if (key != f.name) continue;
    if (!absl::SimpleAtoi(value, &(c->*f.member)) || c->*f.member < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data cursor: ", key, "=\"", value, "\" is not a non-negative integer"));
    }
    return absl::OkStatus();
  }
  if (key == "seed") {
    if (!absl::SimpleAtoi(value, &c->seed)) {
      return absl::InvalidArgumentError(absl::StrCat("data cursor: bad seed \"", value, "\""));
    }
    return absl::OkStatus();
  }
  if (key == "data_fingerprint") {
    if (!ParseHex64(value, &c->data_fingerprint)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data cursor: bad data_fingerprint \"", value, "\""));
    }
    return absl::OkStatus();
  }
  if (key == "long_documents") {
    ASSIGN_OR_RETURN(c->long_documents, ParseLongDocuments(value));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("data cursor: unknown key \"", key, "\""));
}

}  // namespace

bool operator==(const DataCursor& a, const DataCursor& b) {
  return SerializeCursor(a) == SerializeCursor(b);
}

uint64_t DataFingerprint(const DocumentSource& source) {
  const int64_t n = source.num_documents();
  uint64_t h = SeedHash(kTagDataPrint, {static_cast<uint64_t>(n)});
  for (int64_t i = 0; i < n; ++i) {
    h = Mix64(h ^ Mix64(static_cast<uint64_t>(source.length(i)) + 0x9e3779b97f4a7c15ULL));
  }
  return h;
}

DataCursor InitialCursor(const BatchingOptions& options, const DocumentSource& source) {
  DataCursor c;
  c.seed = options.seed;
  c.num_pairs = options.num_pairs;
  c.token_budget = options.token_budget;
  c.max_length = options.max_length;
  c.long_documents = options.long_documents;
  c.pack_window = options.pack_window;
  c.grad_accum = options.grad_accum;
  c.num_documents = source.num_documents();
  c.data_fingerprint = DataFingerprint(source);
  return c;
}

absl::Status CheckCursorMatches(const DataCursor& saved, const DataCursor& current) {
  std::vector<std::string> diffs;
  auto check = [&](absl::string_view name, const std::string& a, const std::string& b) {
    if (a != b) diffs.push_back(absl::StrCat(name, ": saved ", a, ", this run ", b));
  };
  check("seed", absl::StrCat(saved.seed), absl::StrCat(current.seed));
  for (const IntField& f : kIntFields) {
    if (f.name == "epoch" || f.name == "micro_batch" || f.name == "step") continue;
    check(f.name, absl::StrCat(saved.*f.member), absl::StrCat(current.*f.member));
  }
  check("long_documents", std::string(LongDocumentsName(saved.long_documents)),
        std::string(LongDocumentsName(current.long_documents)));
  check("data_fingerprint", Hex64(saved.data_fingerprint), Hex64(current.data_fingerprint));
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot resume: the saved data cursor was written for different data or batching settings "
      "(",
      absl::StrJoin(diffs, "; "), "); the resumed run would train on other batches"));
}

std::string SerializeCursor(const DataCursor& c) {
  std::string s = absl::StrCat("v=", kVersion);
  for (const IntField& f : kIntFields) {
    absl::StrAppend(&s, ";", f.name, "=", c.*f.member);
    if (f.name == "step") absl::StrAppend(&s, ";seed=", c.seed);
  }
  absl::StrAppend(&s, ";long_documents=", LongDocumentsName(c.long_documents),
                  ";data_fingerprint=", Hex64(c.data_fingerprint));
  return s;
}

absl::StatusOr<DataCursor> ParseCursor(absl::string_view text) {
  DataCursor c;
  std::map<std::string, bool> seen;
  bool first = true;
  for (absl::string_view item : absl::StrSplit(text, ';')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (item.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("data cursor: \"", item, "\" is not key=value"));
    }
    if (first) {
      if (kv.first != "v" || kv.second != kVersion) {
        return absl::InvalidArgumentError(absl::StrCat("data cursor: expected version v=", kVersion,
                                                       " first, got \"", item, "\""));
      }
      first = false;
      continue;
    }
    if (!seen.emplace(std::string(kv.first), true).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("data cursor: duplicate key \"", kv.first, "\""));
    }
    RETURN_IF_ERROR(SetField(kv.first, kv.second, &c));
  }
  const size_t expected = sizeof(kIntFields) / sizeof(kIntFields[0]) + 3;
  if (seen.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor: expected ", expected,
                                                   " fields after the version, got ", seen.size(),
                                                   " in \"", text, "\""));
  }
  return c;
}

}  // namespace dflash::batching
