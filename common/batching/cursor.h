// The data cursor: where a run is in its data, plus what it needs to check that a resumed run
// plans the same batches. Plans are pure functions of (lengths, options, epoch) (plan.h), so the
// cursor stores no plan, only the position and the identity of the inputs. The coordinator stores
// SerializeCursor()'s string with each committed step (SQLite) and hands it back on resume.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/batching/document_source.h"
#include "common/batching/plan.h"

namespace dflash::batching {

struct DataCursor {
  // Position: the next step to produce is the one starting at per-pair micro-batch
  // `micro_batch` (a multiple of grad_accum) of epoch `epoch`.
  int64_t epoch = 0;
  int64_t micro_batch = 0;
  // Optimizer steps produced since the run began, over all epochs (the anchor seed uses it; the
  // count is not derivable from the position without re-planning every earlier epoch).
  int64_t step = 0;

  // Identity: a resume is refused unless all of these equal the resuming run's.
  uint64_t seed = 0;
  int64_t num_pairs = 0;
  int64_t token_budget = 0;
  int64_t max_length = 0;
  LongDocuments long_documents = LongDocuments::kTruncate;
  int64_t pack_window = 0;
  int64_t grad_accum = 0;
  int64_t num_documents = 0;
  uint64_t data_fingerprint = 0;

  friend bool operator==(const DataCursor& a, const DataCursor& b);
};

// Digest of the data set's shape: the document count and every document's length (cheap: the
// length index; ~4 ms per million documents). Lengths decide the whole plan; a data set rewritten
// with the same lengths but other tokens plans identically and is not caught here (the prepared
// data set's own content hash covers that).
uint64_t DataFingerprint(const DocumentSource& source);

// The cursor at the start of a run with these options over this data.
DataCursor InitialCursor(const BatchingOptions& options, const DocumentSource& source);

// Checks a saved cursor's identity against this run's; FailedPrecondition naming every field that
// differs ("cannot resume: seed: saved 1, this run 2; num_pairs: saved 4, this run 2").
absl::Status CheckCursorMatches(const DataCursor& saved, const DataCursor& current);

// One line of `key=value` pairs separated by ';', versioned, e.g.
//   v=1;epoch=2;micro_batch=40;step=1234;seed=7;num_pairs=4;token_budget=8192;max_length=4096;
//   long_documents=truncate;pack_window=2048;grad_accum=2;num_documents=100000;
//   data_fingerprint=9f86d081884c7d65
// (one line, wrapped here). ParseCursor rejects unknown, missing, duplicate or malformed keys.
std::string SerializeCursor(const DataCursor& cursor);
absl::StatusOr<DataCursor> ParseCursor(absl::string_view text);

}  // namespace dflash::batching
