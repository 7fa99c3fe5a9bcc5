// Throughput of `prepare` (common/data/prepare.h) on a generated, realistic chat JSONL: multi-turn
// conversations of prose, code, numbers and some non-Latin text, about 1000 tokens each on average.
// Prints one row per thread count: documents/s, tokens/s and input MB/s.
//
//   prepare_bench --tokenizer /path/to/tokenizer.json [--conversations 20000] [--threads 1,2]
//                 [--dir /tmp/prepare_bench]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data/chat_template.h"
#include "common/data/prepare.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using dflash::data::PrepareOptions;

const char* const kWords[] = {
    "the",    "model",  "returns",  "a",         "value",     "when",     "function",    "is",
    "called", "with",   "input",    "data",      "and",       "we",       "can",         "see",
    "that",   "result", "depends",  "on",        "training",  "tokens",   "speculative", "decoding",
    "draft",  "target", "accepts",  "block",     "of",        "length",   "every",       "step",
    "memory", "GPU",    "kernel",   "attention", "because",   "however",  "therefore",   "example",
    "simple", "answer", "question", "consider",  "following", "approach", "carefully"};
const char* const kCode[] = {
    "```python\ndef solve(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n    "
    "return total\n```\n",
    "```cpp\nfor (int i = 0; i < n; ++i) {\n  out[i] = std::max(a[i], b[i]);\n}\n```\n",
    "```bash\nls -la /tmp && grep -rn \"TODO\" src/ | head -20\n```\n"};
const char* const kOther[] = {
    "日本語の文章です。", "这是一个中文句子。", "Größe und Maß", "naïve café résumé", "😀 🎉",
    "Ω ≈ 3.14159"};

std::string Paragraph(std::mt19937& rng, int words) {
  std::string out;
  for (int i = 0; i < words; ++i) {
    const uint32_t r = rng() % 100;
    if (r < 2) {
      absl::StrAppend(&out, kOther[rng() % 6], " ");
    } else if (r < 6) {
      absl::StrAppend(&out, rng() % 100000, " ");
    } else {
      absl::StrAppend(&out, kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))],
                      r < 12   ? ", "
                      : r < 16 ? ". "
                               : " ");
    }
  }
  if (rng() % 4 == 0) absl::StrAppend(&out, "\n\n", kCode[rng() % 3]);
  return out;
}

// One conversation: optional system prompt, 1-4 user/assistant exchanges; assistant turns carry
// most of the tokens, as in regenerated training data.
std::string Conversation(std::mt19937& rng) {
  nlohmann::json messages = nlohmann::json::array();
  if (rng() % 3 == 0) {
    messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  }
  const int turns = 1 + static_cast<int>(rng() % 4);
  // About 1000 tokens in total on average (measured 1010 with the Qwen2 tokenizer): ~75 words per
  // user turn and ~200 per assistant turn over 2.5 exchanges, at ~1.45 tokens per word here
  // (digits are one token each, punctuation, code blocks, template tokens).
  for (int t = 0; t < turns; ++t) {
    messages.push_back({{"role", "user"}, {"content", Paragraph(rng, 20 + rng() % 110)}});
    messages.push_back({{"role", "assistant"}, {"content", Paragraph(rng, 50 + rng() % 300)}});
  }
  return nlohmann::json{{"messages", messages}}.dump();
}

int Fail(const std::string& message);

// CPU seconds of the whole process (all threads): on a shared machine, wall time alone misleads.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where one thread's time goes, stage by stage, on the first `limit` lines (each stage timed on
// its own, over the outputs of the previous one).
int Breakdown(const fs::path& input, const std::string& tokenizer_path, int limit) {
  namespace data = dflash::data;
  auto tok = dflash::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) return Fail(std::string(tok.status().message()));
  std::vector<std::string> lines;
  std::ifstream in(input);
  for (std::string line; lines.size() < static_cast<size_t>(limit) && std::getline(in, line);) {
    lines.push_back(line);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<data::Record> records;
  for (const std::string& line : lines) {
    records.push_back(std::get<data::Record>(data::ParseRecord(line, data::DataFormat::kChat)));
  }
  const double parse = Since(t0);
  t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<data::TemplatePiece>> rendered;
  for (const data::Record& r : records) {
    rendered.push_back(data::RenderChat(data::ChatTemplate::kChatml, r.messages));
  }
  const double render = Since(t0);
  t0 = std::chrono::steady_clock::now();
  std::vector<std::string> texts;
  for (const auto& pieces : rendered) {
    std::string text;
    for (const data::TemplatePiece& p : pieces) text += *(*tok)->Normalize(p.text);
    texts.push_back(std::move(text));
  }
  const double normalize = Since(t0);
  t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (const std::string& text : texts) tokens += (*tok)->Encode(text)->ids.size();
  const double encode = Since(t0);
  const double total = parse + render + normalize + encode;
  std::printf("\none thread, %zu conversations, %lld tokens:\n", lines.size(),
              static_cast<long long>(tokens));
  std::printf("  %-22s %8s %7s\n", "stage", "seconds", "share");
  const std::pair<const char*, double> stages[] = {{"parse JSON", parse},
                                                   {"render template", render},
                                                   {"normalize pieces", normalize},
                                                   {"encode (incl. NFC)", encode}};
  for (const auto& [name, s] : stages) {
    std::printf("  %-22s %8.3f %6.1f%%\n", name, s, 100 * s / total);
  }
  return 0;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "prepare_bench: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer, threads_list = "1,2", dir = "/tmp/prepare_bench";
  int64_t conversations = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tokenizer") {
      tokenizer = value;
    } else if (flag == "--threads") {
      threads_list = value;
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag != "--conversations" || !absl::SimpleAtoi(value, &conversations)) {
      return Fail(
          "usage: prepare_bench --tokenizer PATH [--conversations N] [--threads 1,2] "
          "[--dir DIR]");
    }
  }
  if (tokenizer.empty()) return Fail("--tokenizer is required");
  fs::create_directories(dir);
  const fs::path input = fs::path(dir) / "chat.jsonl";
  {
    std::ofstream out(input, std::ios::binary | std::ios::trunc);
    std::mt19937 rng(1234);
    for (int64_t i = 0; i < conversations; ++i) out << Conversation(rng) << '\n';
  }
  std::printf("input: %lld conversations, %.1f MB\n\n", static_cast<long long>(conversations),
              fs::file_size(input) / 1e6);
  std::printf("%7s %9s %12s %9s %9s %9s %10s %8s %9s %13s\n", "threads", "docs", "tokens",
              "mean_len", "wall_s", "cpu_s", "docs/s", "MB/s", "Mtok/s", "Mtok/cpu_s");
  for (absl::string_view t : absl::StrSplit(threads_list, ',')) {
    PrepareOptions options;
    options.input = input;
    options.output = fs::path(dir) / "chat.dflash";
    options.tokenizer = tokenizer;
    options.chat_template = "chatml";
    if (!absl::SimpleAtoi(t, &options.threads)) return Fail("bad --threads");
    const double cpu0 = CpuSeconds();
    auto report = dflash::data::Prepare(options);
    const double cpu = CpuSeconds() - cpu0;
    if (!report.ok()) return Fail(std::string(report.status().message()));
    const double s = report->seconds;
    std::printf("%7d %9lld %12lld %9.1f %9.2f %9.2f %10.0f %8.1f %9.3f %13.3f\n", options.threads,
                static_cast<long long>(report->documents), static_cast<long long>(report->tokens),
                1.0 * report->tokens / std::max<int64_t>(1, report->documents), s, cpu,
                report->documents / s, report->input_bytes / s / 1e6, report->tokens / s / 1e6,
                report->tokens / cpu / 1e6);
  }
  return Breakdown(input, tokenizer, 2000);
}
