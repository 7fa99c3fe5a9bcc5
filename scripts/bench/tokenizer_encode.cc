// Single-threaded Tokenizer::Encode throughput on a JSON-lines corpus ({"text": ...} per line, as
// written by tokenizer_encode_hf.py --make-corpus), printed in the same table as the HF script:
//   tokenizer_encode --tokenizer <tokenizer.json> --corpus <corpus.jsonl> [--passes 3]
// One untimed warm-up pass (it fills the BPE cache, as HF's warm-up fills its own), then the best
// of --passes timed passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace {

struct Args {
  std::string tokenizer, corpus;
  int passes = 3;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      args->tokenizer = argv[i + 1];
    } else if (flag == "--corpus") {
      args->corpus = argv[i + 1];
    } else if (flag == "--passes") {
      args->passes = std::max(1, std::atoi(argv[i + 1]));
    } else {
      return false;
    }
  }
  return !args->tokenizer.empty() && !args->corpus.empty();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::cerr << "usage: tokenizer_encode --tokenizer <tokenizer.json> --corpus <corpus.jsonl> "
                 "[--passes N]\n";
    return 2;
  }
  auto tok = dflash::tokenizer::Tokenizer::FromFile(args.tokenizer);
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return 1;
  }
  std::vector<std::string> texts;
  std::ifstream in(args.corpus, std::ios::binary);
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("text")) {
      std::cerr << args.corpus << ": bad line " << texts.size() + 1 << "\n";
      return 1;
    }
    texts.push_back(j["text"].get<std::string>());
    bytes += texts.back().size();
  }
  size_t tokens = 0;
  for (const std::string& t : texts) {
    auto ids = (*tok)->EncodeIds(t);
    if (!ids.ok()) {
      std::cerr << ids.status() << "\n";
      return 1;
    }
    tokens += ids->size();
  }
  double best = 1e300;
  for (int pass = 0; pass < args.passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& t : texts) {
      auto enc = (*tok)->Encode(t);
      if (!enc.ok()) return 1;
    }
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("dflash tokenizer, one thread, %s\n", args.tokenizer.c_str());
  std::printf("%8s %10s %9s %8s %11s %7s\n", "strings", "bytes", "tokens", "seconds", "tokens/s",
              "MB/s");
  std::printf("%8zu %10zu %9zu %8.3f %11.0f %7.2f\n", texts.size(), bytes, tokens, best,
              tokens / best, bytes / best / 1e6);
  return 0;
}
