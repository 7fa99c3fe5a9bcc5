#include "services/coordinator/regen.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/base/logging.h"
#include "common/base/rng.h"
#include "common/base/status.h"
#include "common/data/builtin_data.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/chat_template.h"
#include "common/data/records.h"
#include "common/data/run_data.h"
#include "common/model/generation_config.h"
#include "common/plan/memory_plan.h"
#include "services/coordinator/evaluation.h"

namespace dflash::coordinator {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<int64_t>;

constexpr int64_t kChatMaxNewTokens = 1024;

// One usable input record and what has been regenerated of it.
struct Record {
  // Token data: prompt part r precedes answer r.
  std::vector<Tokens> parts, answers, generated;
  // Chat data.
  std::vector<data::Message> messages;
  std::vector<size_t> assistant_at;  // message index of answer r
  std::string origin;                // "FILE:LINE" or "builtin:NAME document D", for errors
};

size_t Turns(const Record& r) {
  return r.messages.empty() ? r.answers.size() : r.assistant_at.size();
}

// Prompt/answer runs of a document; false when it does not start with a prompt or has no answer.
bool SplitRuns(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, Record* r) {
  size_t i = 0;
  while (i < tokens.size()) {
    Tokens part, answer;
    while (i < tokens.size() && mask[i] == 0) part.push_back(tokens[i++]);
    while (i < tokens.size() && mask[i] != 0) answer.push_back(tokens[i++]);
    if (answer.empty()) break;  // a trailing prompt part without an answer is dropped
    if (part.empty() && r->parts.empty()) return false;
    r->parts.push_back(std::move(part));
    r->answers.push_back(std::move(answer));
  }
  r->generated.resize(r->answers.size());
  return !r->answers.empty();
}

struct Input {
  std::vector<Record> records;
  int64_t skipped = 0;
  bool chat = false;
};

absl::StatusOr<Input> ReadInput(const config::RunSpec& spec, int64_t max_records,
                                int64_t vocab_size) {
  Input in;
  const std::string& path = spec.data.train;
  auto full = [&] {
    return max_records > 0 && static_cast<int64_t>(in.records.size()) >= max_records;
  };
  if (absl::StartsWith(path, "builtin:")) {
    ASSIGN_OR_RETURN(auto source, data::BuiltinDataset(path.substr(8)));
    for (int64_t d = 0; d < source->num_documents() && !full(); ++d) {
      batching::DocumentView v = source->document(d);
      Record r;
      r.origin = absl::StrCat(path, " document ", d);
      if (SplitRuns({v.tokens.begin(), v.tokens.end()}, {v.loss_mask.begin(), v.loss_mask.end()},
                    &r)) {
        in.records.push_back(std::move(r));
      } else {
        ++in.skipped;
      }
    }
    return in;
  }
  ASSIGN_OR_RETURN(data::DataFormat format, data::ParseDataFormat(spec.data.format));
  if (format == data::DataFormat::kText) {
    return absl::InvalidArgumentError(
        "data.format: text records are all answer and have no prompt to regenerate from");
  }
  in.chat = format == data::DataFormat::kChat;
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("data.train: cannot open ", path));
  std::string line;
  for (int64_t line_no = 1; !full() && std::getline(file, line); ++line_no) {
    if (line.empty()) continue;
    // A chat record without an answer is a prompt: one answer is generated after its last message.
    std::variant<data::Record, data::BadRecord> parsed =
        data::ParseRecord(line, format, /*require_assistant_turn=*/false);
    if (std::holds_alternative<data::BadRecord>(parsed)) {
      ++in.skipped;
      continue;
    }
    data::Record& rec = std::get<data::Record>(parsed);
    Record r;
    r.origin = absl::StrCat(path, ":", line_no);
    bool ok = false;
    if (in.chat) {
      r.messages = std::move(rec.messages);
      for (size_t m = 0; m < r.messages.size(); ++m) {
        if (r.messages[m].role == data::Role::kAssistant) r.assistant_at.push_back(m);
      }
      if (r.assistant_at.empty() && !r.messages.empty()) {
        r.assistant_at.push_back(r.messages.size());
        r.messages.push_back({data::Role::kAssistant, ""});
      }
      ok = !r.assistant_at.empty() && r.assistant_at.front() > 0;
    } else {
      ok = std::all_of(rec.input_ids.begin(), rec.input_ids.end(),
                       [&](int32_t id) { return id >= 0 && id < vocab_size; }) &&
           SplitRuns(rec.input_ids, rec.loss_mask, &r);
    }
    if (ok) {
      in.records.push_back(std::move(r));
    } else {
      ++in.skipped;
    }
  }
  return in;
}

// What one generation of answer `turn` of record `record` asks for.
struct Item {
  size_t record = 0;
  Tokens prompt;
  int64_t max_new = 0;
};

// Chat: the tokenizer and template; prompts are rendered from messages.
struct ChatTools {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  data::ResolvedChatTemplate tmpl;
  int64_t end_of_turn = 0;  // the template's token that closes an answer
};

// The prompt of answer `turn` of a chat record (earlier answers already regenerated): the
// messages before it rendered with add_generation_prompt=true, as eval prompts are.
absl::Status ChatPrompt(const ChatTools& chat, const Record& r, size_t turn, Tokens* prompt) {
  absl::StatusOr<std::vector<int32_t>> ids = data::TokenizePrompt(
      *chat.tok, chat.tmpl, absl::MakeConstSpan(r.messages).subspan(0, r.assistant_at[turn]));
  if (!ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("answer ", turn, ": ", ids.status().message()));
  }
  prompt->assign(ids->begin(), ids->end());
  return absl::OkStatus();
}

// Prompts per Generate call, as a multiple of the sequences a worker decodes together: the worker
// refills the rows of finished sequences from the rest, so only the call's last wave runs short.
constexpr size_t kPromptsPerRowPerCall = 4;

// Sequences each worker decodes together (RegenerateRequest.batch_size).
size_t DecodeBatch(const v1::RegenerateRequest& req) {
  return req.batch_size() > 0 ? static_cast<size_t>(req.batch_size()) : 16;
}

// Runs `items` on the groups (each takes calls of kPromptsPerRowPerCall x batch prompts from a
// shared queue; every rank of a tensor-parallel group gets each call) and returns the outputs in
// item order.
absl::StatusOr<std::vector<Tokens>> GenerateAll(const std::vector<Item>& items, size_t turn,
                                                const std::vector<int64_t>& stops,
                                                const v1::RegenerateRequest& req,
                                                const std::string& yaml,
                                                const std::vector<DecodeGroupWorkers>& groups,
                                                WorkerControl* control) {
  const size_t rows = DecodeBatch(req), batch = kPromptsPerRowPerCall * rows;
  std::vector<Tokens> out(items.size());
  std::atomic<size_t> next{0};
  auto work = [&](const DecodeGroupWorkers& group) -> absl::Status {
    const v1::WorkerInfo& w = group[0];
    while (true) {
      const size_t first = next.fetch_add(batch);
      if (first >= items.size()) return absl::OkStatus();
      const size_t last = std::min(items.size(), first + batch);
      v1::GenerateRequest g;
      g.set_resolved_config_yaml(yaml);
      for (size_t i = first; i < last; ++i) {
        g.add_prompts()->mutable_ids()->Add(items[i].prompt.begin(), items[i].prompt.end());
        g.add_max_new_tokens(items[i].max_new);
      }
      g.mutable_stop_token_ids()->Add(stops.begin(), stops.end());
      g.set_temperature(req.temperature());
      g.set_top_p(req.top_p());
      g.set_top_k(req.top_k());
      g.set_repetition_penalty(req.repetition_penalty());
      g.set_max_batch(static_cast<int64_t>(rows));
      // Per batch: the run's seed, the batch's first record and the turn (not the batch index,
      // which a resume shifts).
      g.set_seed(SeedHash(req.seed(), {items[first].record, turn}));
      absl::StatusOr<v1::GenerateResponse> answer = GenerateOnGroup(group, g, control);
      if (!answer.ok()) return answer.status();
      const v1::GenerateResponse& resp = *answer;
      if (resp.outputs_size() != static_cast<int>(last - first)) {
        return absl::InternalError(absl::StrCat("worker ", w.name(), " answered ",
                                                resp.outputs_size(), " of ", last - first,
                                                " prompts"));
      }
      for (size_t i = first; i < last; ++i) {
        const auto& ids = resp.outputs(static_cast<int>(i - first)).ids();
        out[i].assign(ids.begin(), ids.end());
      }
    }
  };
  std::vector<std::future<absl::Status>> calls;
  for (const DecodeGroupWorkers& g : groups) {
    calls.push_back(std::async(std::launch::async, work, g));
  }
  absl::Status status;
  for (auto& c : calls) {
    absl::Status s = c.get();
    if (status.ok() && !s.ok()) status = s;
  }
  if (!status.ok()) return status;
  return out;
}

// The output line of a finished record.
absl::StatusOr<std::string> OutputLine(const Record& r, const std::vector<std::string>& texts) {
  nlohmann::json j;
  if (!r.messages.empty()) {
    nlohmann::json messages = nlohmann::json::array();
    size_t turn = 0;
    for (size_t m = 0; m < r.messages.size(); ++m) {
      if (turn < r.assistant_at.size() && r.assistant_at[turn] == m) {
        messages.push_back({{"role", "assistant"}, {"content", texts[turn++]}});
      } else if (turn < r.assistant_at.size()) {  // messages after the last answer are dropped
        messages.push_back({{"role", std::string(data::RoleName(r.messages[m].role))},
                            {"content", r.messages[m].content}});
      }
    }
    j["messages"] = std::move(messages);
  } else {
    std::vector<int64_t> ids;
    std::vector<int> mask;
    for (size_t t = 0; t < r.parts.size(); ++t) {
      ids.insert(ids.end(), r.parts[t].begin(), r.parts[t].end());
      mask.insert(mask.end(), r.parts[t].size(), 0);
      ids.insert(ids.end(), r.generated[t].begin(), r.generated[t].end());
      mask.insert(mask.end(), r.generated[t].size(), 1);
    }
    j["input_ids"] = std::move(ids);
    j["loss_mask"] = std::move(mask);
  }
  return j.dump();
}

// Complete lines already in `partial`; a torn last line (a crash mid-write) is cut off.
absl::StatusOr<int64_t> ResumeLines(const fs::path& partial) {
  std::error_code ec;
  if (!fs::exists(partial, ec)) return 0;
  std::ifstream in(partial, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (keep != text.size()) {
    fs::resize_file(partial, keep, ec);
    if (ec) return absl::InternalError(absl::StrCat(partial.string(), ": ", ec.message()));
  }
  return static_cast<int64_t>(std::count(text.begin(), text.begin() + keep, '\n'));
}

}  // namespace

namespace {

absl::StatusOr<ChatTools> LoadChatTools(const config::RunSpec& spec) {
  ChatTools chat;
  ASSIGN_OR_RETURN(data::RunDataPaths paths, data::ResolveRunDataPaths(spec));
  ASSIGN_OR_RETURN(chat.tok, data::LoadTokenizer(paths.tokenizer));
  ASSIGN_OR_RETURN(chat.tmpl,
                   data::ResolveChatTemplate(spec.data.chat_template, paths.tokenizer,
                                             paths.chat_template_dir, spec.data.thinking));
  ASSIGN_OR_RETURN(const int32_t end_of_turn, data::EndOfTurnToken(*chat.tok, chat.tmpl));
  chat.end_of_turn = end_of_turn;
  return chat;
}

// The prompts of turn `turn` of the records [first, last) that have one: a chat record's
// conversation so far rendered by the template, a token record's parts and earlier answers.
absl::Status TurnItems(const Input& input, const ChatTools& chat, size_t first, size_t last,
                       size_t turn, const v1::RegenerateRequest& req, int64_t max_positions,
                       std::vector<Item>* items, std::vector<int64_t>* stops) {
  for (size_t i = first; i < last; ++i) {
    const Record& r = input.records[i];
    if (turn >= Turns(r)) continue;
    Item item;
    item.record = i;
    if (input.chat) {
      RETURN_IF_ERROR(ChatPrompt(chat, r, turn, &item.prompt));
      if (stops->empty()) stops->push_back(chat.end_of_turn);
      item.max_new = req.max_new_tokens() > 0 ? req.max_new_tokens() : kChatMaxNewTokens;
    } else {
      for (size_t t = 0; t <= turn; ++t) {
        item.prompt.insert(item.prompt.end(), r.parts[t].begin(), r.parts[t].end());
        if (t < turn) {
          item.prompt.insert(item.prompt.end(), r.generated[t].begin(), r.generated[t].end());
        }
      }
      item.max_new = req.max_new_tokens() > 0 ? req.max_new_tokens()
                                              : static_cast<int64_t>(r.answers[turn].size());
    }
    // Positions past the target's last one would generate something no model was trained for:
    // refused, the records written so far kept in the resumable .partial file.
    const int64_t need = static_cast<int64_t>(item.prompt.size()) + item.max_new;
    if (need > max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.origin, ", turn ", turn + 1, ": ", item.prompt.size(), " prompt tokens + ",
          item.max_new, " new tokens exceed the target's max_position_embeddings ", max_positions,
          " (lower --max_new_tokens or data.max_length, or drop the record)"));
    }
    items->push_back(std::move(item));
  }
  return absl::OkStatus();
}

// The answers of one turn into their records (a chat answer decoded, its end-of-turn token
// dropped: the template writes it) and into `texts` (per record of the chunk starting at
// `first`); adds the tokens generated to *tokens.
absl::Status KeepAnswers(Input* input, const ChatTools& chat, const std::vector<Item>& items,
                         std::vector<Tokens> outputs, const std::vector<int64_t>& stops,
                         size_t turn, size_t first, std::vector<std::vector<std::string>>* texts,
                         int64_t* tokens) {
  for (size_t k = 0; k < items.size(); ++k) {
    Record& r = input->records[items[k].record];
    *tokens += static_cast<int64_t>(outputs[k].size());
    if (!input->chat) {
      r.generated[turn] = std::move(outputs[k]);
      continue;
    }
    Tokens& o = outputs[k];
    if (!o.empty() && std::find(stops.begin(), stops.end(), o.back()) != stops.end()) {
      o.pop_back();
    }
    std::vector<int32_t> ids(o.begin(), o.end());
    ASSIGN_OR_RETURN(std::string text, chat.tok->Decode(ids, /*skip_special_tokens=*/true));
    r.messages[r.assistant_at[turn]].content = text;
    (*texts)[items[k].record - first].push_back(std::move(text));
  }
  return absl::OkStatus();
}

// The chunk's records as output lines, appended and synced (the resumable part), then freed.
absl::Status WriteChunk(Input* input, size_t first, size_t last,
                        const std::vector<std::vector<std::string>>& texts, std::FILE* out,
                        const fs::path& partial) {
  for (size_t i = first; i < last; ++i) {
    ASSIGN_OR_RETURN(std::string line, OutputLine(input->records[i], texts[i - first]));
    line += '\n';
    if (std::fwrite(line.data(), 1, line.size(), out) != line.size()) {
      return absl::InternalError(absl::StrCat("writing ", partial.string()));
    }
    input->records[i] = Record();  // done: free its tokens
  }
  if (std::fflush(out) != 0 || ::fsync(fileno(out)) != 0) {
    return absl::InternalError(absl::StrCat("writing ", partial.string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status UseGenerationConfig(const config::RunSpec& spec, v1::RegenerateRequest* req) {
  if (req->temperature() != 0 || (req->top_p() != 0 && req->top_p() != 1) || req->top_k() != 0 ||
      (req->repetition_penalty() != 0 && req->repetition_penalty() != 1)) {
    return absl::InvalidArgumentError(
        "--generation_config samples as the target's generation_config.json says: give it "
        "without --temperature, --top_p, --top_k and --repetition_penalty");
  }
  if (absl::StartsWith(spec.target.path, "builtin:")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--generation_config: target.path ", spec.target.path,
        " is a built-in model, with no generation_config.json (give --temperature instead)"));
  }
  ASSIGN_OR_RETURN(model::GenerationDefaults g, model::ReadGenerationConfig(spec.target.path));
  if (g.do_sample && g.temperature > 0) {
    req->set_temperature(g.temperature);
    req->set_top_p(g.top_p);
    req->set_top_k(g.top_k);
  }
  req->set_repetition_penalty(g.repetition_penalty);  // greedy or sampled, as transformers
  LOG(INFO) << "regen: " << g.path << " says " << DecodingText(*req);
  return absl::OkStatus();
}

std::string DecodingText(const v1::RegenerateRequest& req) {
  const double penalty = req.repetition_penalty();
  const std::string repeats =
      penalty > 0 && penalty != 1 ? absl::StrCat(", repetition_penalty ", penalty) : "";
  if (req.temperature() <= 0) return absl::StrCat("greedy", repeats);
  return absl::StrCat("sampled: temperature ", req.temperature(), ", top_p ",
                      req.top_p() > 0 ? req.top_p() : 1.0, ", top_k ", req.top_k(), ", seed ",
                      req.seed(), repeats);
}

absl::Status Regenerate(const config::RunSpec& spec, const v1::RegenerateRequest& req,
                        const std::vector<DecodeGroupWorkers>& groups, WorkerControl* control,
                        const std::function<bool(const v1::RegenerateProgress&)>& progress) {
  if (groups.empty()) {
    const int64_t n = spec.placement.target_parallel;
    return absl::FailedPreconditionError(
        n > 1
            ? absl::StrCat("no group of ", n, " idle target workers (placement.target_parallel ", n,
                           ": one machine, one kind, one GPU each) is registered to generate "
                           "with")
            : std::string("no idle target worker is registered to generate with"));
  }
  if (req.output().empty()) return absl::InvalidArgumentError("output: required");
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model::TransformerConfig target, run::RunTargetConfig(spec));
  ASSIGN_OR_RETURN(Input input, ReadInput(spec, req.max_records(), target.vocab_size));
  ChatTools chat;
  if (input.chat) {
    ASSIGN_OR_RETURN(chat, LoadChatTools(spec));
  }
  const fs::path out_path = req.output(), partial = req.output() + ".partial";
  ASSIGN_OR_RETURN(const int64_t resumed, ResumeLines(partial));
  std::FILE* out = std::fopen(partial.c_str(), "ab");
  if (out == nullptr) return absl::InternalError(absl::StrCat("cannot write ", partial.string()));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(out, &std::fclose);

  v1::RegenerateProgress p;
  p.set_records_total(static_cast<int64_t>(input.records.size()));
  p.set_records_skipped(input.skipped);
  p.set_resumed_from(std::min<int64_t>(resumed, p.records_total()));
  p.set_records_done(p.resumed_from());
  p.set_workers(static_cast<int64_t>(groups.size()));
  p.set_output(out_path.string());
  p.set_decoding(absl::StrCat(
      DecodingText(req), req.generation_config() ? " (the target's generation_config.json)" : ""));
  const std::string yaml = config::EmitRunSpec(spec);
  // Records written per chunk: one call per worker.
  const size_t chunk =
      std::max<size_t>(64, kPromptsPerRowPerCall * DecodeBatch(req) * groups.size());
  for (size_t first = p.records_done(); first < input.records.size(); first += chunk) {
    const size_t last = std::min(input.records.size(), first + chunk);
    size_t turns = 0;
    for (size_t i = first; i < last; ++i) turns = std::max(turns, Turns(input.records[i]));
    std::vector<std::vector<std::string>> texts(last - first);
    for (size_t turn = 0; turn < turns; ++turn) {
      std::vector<Item> items;
      std::vector<int64_t> stops;
      RETURN_IF_ERROR(TurnItems(input, chat, first, last, turn, req, target.max_position_embeddings,
                                &items, &stops));
      ASSIGN_OR_RETURN(std::vector<Tokens> outputs,
                       GenerateAll(items, turn, stops, req, yaml, groups, control));
      int64_t tokens = p.tokens_generated();
      RETURN_IF_ERROR(KeepAnswers(&input, chat, items, std::move(outputs), stops, turn, first,
                                  &texts, &tokens));
      p.set_tokens_generated(tokens);
    }
    RETURN_IF_ERROR(WriteChunk(&input, first, last, texts, out, partial));
    p.set_records_done(static_cast<int64_t>(last));
    p.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!progress(p))
      return absl::CancelledError("regeneration stopped; the output so far is kept");
  }
  closer.reset();
  std::error_code ec;
  fs::rename(partial, out_path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("renaming to ", out_path.string(), ": ", ec.message()));
  p.set_done(true);
  p.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  LOG(INFO) << "regenerated " << p.records_done() << " records into " << out_path.string() << " ("
            << p.tokens_generated() << " tokens, " << groups.size()
            << (spec.placement.target_parallel > 1
                    ? absl::StrCat(" groups of ", spec.placement.target_parallel, " workers)")
                    : std::string(" workers)"));
  progress(p);
  return absl::OkStatus();
}

}  // namespace dflash::coordinator
