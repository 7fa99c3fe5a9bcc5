// The prepare engine (see prepare.h): read chunks on the calling thread, tokenize them on a pool,
// write their documents in input order on the calling thread.
#include "common/data/prepare.h"

#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/chat_template.h"
#include "common/data/line_reader.h"
#include "common/data/prepared.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;

// What a worker makes of one chunk.
struct ChunkResult {
  struct Drop {
    int64_t line = 0;
    BadRecord bad;
  };
  std::vector<Document> documents;  // kept, in input order
  std::vector<Drop> drops;          // in input order
  int64_t blank_lines = 0;
};

// One chunk in flight: filled by the reader, processed by a worker, consumed by the writer.
struct Slot {
  LineChunk chunk;
  ChunkResult result;
  bool done = false;  // guarded by Pipeline::mu
};

bool IsBlank(absl::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

void ProcessChunk(const LineChunk& chunk, const tokenizer::Tokenizer& tok,
                  const TokenizeOptions& options, ChunkResult* out) {
  for (size_t i = 0; i < chunk.lines.size(); ++i) {
    const int64_t line_no = chunk.first_line + static_cast<int64_t>(i);
    if (chunk.lines[i].too_long) {
      out->drops.push_back({line_no, {DropReason::kLineTooLong, "(line): longer than the limit"}});
      continue;
    }
    const absl::string_view line = chunk.line(i);
    if (IsBlank(line)) {
      ++out->blank_lines;
      continue;
    }
    std::variant<Record, BadRecord> parsed = ParseRecord(line, options.format);
    if (auto* bad = std::get_if<BadRecord>(&parsed)) {
      out->drops.push_back({line_no, std::move(*bad)});
      continue;
    }
    std::variant<Document, BadRecord> doc = TokenizeRecord(std::get<Record>(parsed), tok, options);
    if (auto* bad = std::get_if<BadRecord>(&doc)) {
      out->drops.push_back({line_no, std::move(*bad)});
      continue;
    }
    out->documents.push_back(std::get<Document>(std::move(doc)));
  }
}

// A fixed pool of workers over a FIFO of tasks. The destructor drops tasks not yet started and
// joins the workers (each finishes at most the chunk in hand).
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      tasks_.clear();
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Accumulates kept documents and drops into the report and the writer, in input order.
class Collector {
 public:
  Collector(const PrepareOptions& options, PreparedWriter* writer, PrepareReport* report)
      : options_(options), writer_(writer), report_(report) {}

  absl::Status Consume(const LineChunk& chunk, const ChunkResult& result) {
    report_->lines_read += static_cast<int64_t>(chunk.lines.size());
    report_->blank_lines += result.blank_lines;
    for (const ChunkResult::Drop& drop : result.drops) RETURN_IF_ERROR(AddDrop(drop));
    for (const Document& doc : result.documents) RETURN_IF_ERROR(AddDocument(doc));
    return absl::OkStatus();
  }

 private:
  absl::Status AddDrop(const ChunkResult::Drop& drop) {
    const std::string where = absl::StrCat(options_.input.string(), ":", drop.line, ": ",
                                           DropReasonName(drop.bad.reason), ": ", drop.bad.message);
    if (options_.on_bad_record == OnBadRecord::kFail) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (on_bad_record: fail; no output written)"));
    }
    DropStats& stats = report_->dropped[static_cast<size_t>(drop.bad.reason)];
    ++stats.count;
    if (static_cast<int>(stats.examples.size()) < options_.max_examples_per_reason) {
      stats.examples.push_back(where);
    }
    return absl::OkStatus();
  }

  absl::Status AddDocument(const Document& doc) {
    RETURN_IF_ERROR(writer_->Append(doc.tokens, doc.loss_mask));
    const int64_t n = static_cast<int64_t>(doc.tokens.size());
    ++report_->documents;
    report_->tokens += n;
    report_->supervised_tokens += doc.num_supervised();
    report_->longest_document = std::max(report_->longest_document, n);
    if (n > options_.max_length) ++report_->over_max_length;
    const size_t bucket = n <= 1 ? 0 : 63 - __builtin_clzll(static_cast<uint64_t>(n));
    if (report_->length_histogram.size() <= bucket) report_->length_histogram.resize(bucket + 1);
    ++report_->length_histogram[bucket];
    return absl::OkStatus();
  }

  const PrepareOptions& options_;
  PreparedWriter* writer_;
  PrepareReport* report_;
};

absl::Status ValidateOptions(const PrepareOptions& o) {
  if (o.input.empty()) return absl::InvalidArgumentError("prepare: input path is empty");
  if (o.output.empty()) return absl::InvalidArgumentError("prepare: output path is empty");
  std::error_code ec;
  if (fs::exists(o.output, ec) && fs::equivalent(o.input, o.output, ec)) {
    return absl::InvalidArgumentError("prepare: output would overwrite the input");
  }
  if (o.block_size < 1) return absl::InvalidArgumentError("prepare: block_size must be >= 1");
  if (o.max_length < 1) return absl::InvalidArgumentError("prepare: max_length must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("prepare: threads must be >= 0");
  if (o.chunk_bytes < 1 || o.max_line_bytes < 1) {
    return absl::InvalidArgumentError("prepare: chunk_bytes and max_line_bytes must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedMetadata> MakeMetadata(const PrepareOptions& o,
                                              const tokenizer::Tokenizer& tok,
                                              absl::string_view chat_template) {
  struct stat st {};
  if (::stat(o.input.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(o.input.string(), ": cannot stat"));
  }
  PreparedMetadata m;
  m.tokenizer_fingerprint = tok.fingerprint();
  m.vocab_size = tok.vocab_size();
  m.data_format = std::string(DataFormatName(o.format));
  m.chat_template = std::string(chat_template);
  m.block_size = o.block_size;
  m.max_length = o.max_length;
  m.source_path = o.input.string();
  m.source_bytes = st.st_size;
  m.source_mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return m;
}

// Bounded in-order pipeline: the calling thread reads chunk k+1.. while workers tokenize, and
// writes chunk k as soon as it is done.
class Pipeline {
 public:
  Pipeline(int threads, const tokenizer::Tokenizer& tok, const TokenizeOptions& tokenize)
      : tok_(tok), tokenize_(tokenize), max_in_flight_(2 * threads + 2), pool_(threads) {}

  absl::Status Run(LineReader& reader, Collector& collector, const ProgressFn& progress,
                   PrepareReport* report) {
    for (;;) {
      auto slot = std::make_shared<Slot>();
      ASSIGN_OR_RETURN(bool more, reader.Next(&slot->chunk));
      if (!more) break;
      Submit(slot);
      while (static_cast<int>(in_flight_.size()) >= max_in_flight_) {
        RETURN_IF_ERROR(ConsumeFront(reader, collector, progress, report));
      }
    }
    while (!in_flight_.empty()) RETURN_IF_ERROR(ConsumeFront(reader, collector, progress, report));
    return absl::OkStatus();
  }

 private:
  void Submit(std::shared_ptr<Slot> slot) {
    in_flight_.push_back(slot);
    pool_.Submit([this, slot] {
      ProcessChunk(slot->chunk, tok_, tokenize_, &slot->result);
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot->done = true;
      }
      cv_.notify_all();
    });
  }

  absl::Status ConsumeFront(const LineReader& reader, Collector& collector,
                            const ProgressFn& progress, PrepareReport* report) {
    std::shared_ptr<Slot> slot = in_flight_.front();
    in_flight_.pop_front();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return slot->done; });
    }
    RETURN_IF_ERROR(collector.Consume(slot->chunk, slot->result));
    if (progress) {
      progress({slot->chunk.end_offset, reader.total_bytes(), report->lines_read, report->documents,
                report->tokens});
    }
    return absl::OkStatus();
  }

  const tokenizer::Tokenizer& tok_;
  const TokenizeOptions tokenize_;
  const int max_in_flight_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Slot>> in_flight_;
  WorkerPool pool_;  // last: joined first, before the state its tasks touch goes away
};

}  // namespace

absl::StatusOr<PrepareReport> Prepare(const PrepareOptions& options,
                                      const tokenizer::Tokenizer& tok, const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateOptions(options));
  TokenizeOptions tokenize;
  tokenize.format = options.format;
  tokenize.block_size = options.block_size;
  std::string template_name = "none";
  if (options.format == DataFormat::kChat) {
    ASSIGN_OR_RETURN(tokenize.chat_template,
                     ResolveChatTemplate(options.chat_template, options.tokenizer,
                                         options.chat_template_dir, options.thinking));
    RETURN_IF_ERROR(CheckTemplateTokens(tokenize.chat_template, tok));
    template_name = RecordedTemplateName(tokenize.chat_template.kind, options.thinking);
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> reader,
                   LineReader::Open(options.input, options.chunk_bytes, options.max_line_bytes));
  ASSIGN_OR_RETURN(PreparedMetadata metadata, MakeMetadata(options, tok, template_name));
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedWriter> writer,
                   PreparedWriter::Create(options.output, metadata));

  PrepareReport report;
  report.input = options.input.string();
  report.output = options.output.string();
  report.format = std::string(DataFormatName(options.format));
  report.chat_template = template_name;
  report.tokenizer_fingerprint = tok.fingerprint();
  report.threads = threads;
  report.input_bytes = reader->total_bytes();
  report.max_length = options.max_length;
  Collector collector(options, writer.get(), &report);
  {
    Pipeline pipeline(threads, tok, tokenize);
    // On error the writer's destructor removes the temporary files: no output is left.
    RETURN_IF_ERROR(pipeline.Run(*reader, collector, progress, &report));
  }
  // The stored copy leaves out what differs between identical runs (output path, threads,
  // seconds), so the file depends only on the input, the tokenizer and the options.
  nlohmann::json stored = report.ToJson();
  for (const char* key : {"output", "threads", "seconds"}) stored.erase(key);
  RETURN_IF_ERROR(writer->Finish(stored.dump()));
  // Measured last, so that it counts the final copy, fsync and rename too.
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

absl::StatusOr<PrepareReport> Prepare(const PrepareOptions& options, const ProgressFn& progress) {
  if (options.tokenizer.empty()) {
    return absl::InvalidArgumentError("prepare: tokenizer path is empty");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, LoadTokenizer(options.tokenizer));
  return Prepare(options, *tok, progress);
}

}  // namespace dflash::data
