#include "common/spec/speculative.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"

namespace dflash::spec {
namespace {

absl::Status CheckPair(const nn::TargetModel& target, const drafter::DrafterModel& drafter) {
  if (!target.full()) {
    return absl::FailedPreconditionError(
        "the target model was loaded as a feature extractor (options.full is false): it cannot "
        "verify");
  }
  const drafter::DrafterConfig& d = drafter.config();
  const model::TransformerConfig& t = target.config();
  if (d.target_layer_ids != target.layer_ids()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the drafter reads target layers [", absl::StrJoin(d.target_layer_ids, ", "),
                     "], the target captures [", absl::StrJoin(target.layer_ids(), ", "), "]"));
  }
  if (d.target.hidden_size != t.hidden_size || d.target.vocab_size != t.vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the drafter was made for hidden size ", d.target.hidden_size, " and vocabulary ",
        d.target.vocab_size, ", the target has ", t.hidden_size, " and ", t.vocab_size));
  }
  return absl::OkStatus();
}

// Row-wise argmax on the logits' device (the first maximum on every device); only the ids travel
// to the host, not the [rows, vocabulary] logits.
std::vector<int64_t> Argmax(const at::Tensor& logits) {
  at::Tensor a = at::argmax(logits, 1).to(at::kCPU).contiguous();
  return std::vector<int64_t>(a.data_ptr<int64_t>(), a.data_ptr<int64_t>() + a.numel());
}

// One sequence being decoded.
struct Sequence : DraftContext {
  std::vector<int64_t> emitted;
  std::vector<int64_t> step_emitted, step_accepted;  // per verification
  bool done = false;
};

// Appends `tokens` to the sequence's output up to a stop token or the limit; true when it ended.
bool Emit(const std::vector<int64_t>& tokens, const SpecDecodeOptions& options,
          const std::set<int64_t>& stops, Sequence* s) {
  for (int64_t t : tokens) {
    s->emitted.push_back(t);
    if (stops.count(t) > 0 || static_cast<int64_t>(s->emitted.size()) >= options.max_new_tokens) {
      return true;
    }
  }
  return false;
}

using Drafts = DraftBlocks;
// A proposer with the decoding's sampler (null when greedy).
using DraftFn =
    std::function<absl::StatusOr<Drafts>(const std::vector<const DraftContext*>&, Sampler*)>;

// Each sequence's drafter cache, by its DraftContext (stable for one SpeculativeGenerate call), and
// the tokens each sequence may still generate (a new cache reserves room for them).
struct DrafterCaches {
  std::unordered_map<const DraftContext*, drafter::DrafterKvCache> of;
  int64_t max_new_tokens = 0;
};

// The drafter's final hidden states [n * B, H] for the active sequences' blocks, from each
// sequence's whole context (Forward).
absl::StatusOr<at::Tensor> UncachedHidden(const drafter::DrafterModel& drafter,
                                          const std::vector<const DraftContext*>& active) {
  std::vector<at::Tensor> contexts;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<int64_t> lengths;
  for (const DraftContext* s : active) {
    contexts.push_back(at::cat(s->features, 0));
    tokens.push_back(s->tokens);
    lengths.push_back(s->block_length);
  }
  at::NoGradGuard no_grad;
  return drafter.Forward(
      drafter::DecodingBatch(contexts, tokens, lengths, drafter.config().block_size));
}

// The same from each sequence's cached context keys and values (ForwardCached), each cache first
// extended by the context rows it lacks (the features of the tokens accepted since).
absl::StatusOr<at::Tensor> CachedHidden(const drafter::DrafterModel& drafter,
                                        const std::vector<const DraftContext*>& active,
                                        DrafterCaches* caches) {
  const int64_t b = drafter.config().block_size;
  std::vector<drafter::CachedBlock> blocks;
  for (const DraftContext* s : active) {
    drafter::CachedBlock block;
    auto [entry, created] = caches->of.try_emplace(s);
    block.cache = &entry->second;
    const int64_t context = static_cast<int64_t>(s->tokens.size()) - 1;  // rows before the anchor
    // Every context row this sequence can reach, its anchor's row and a block: one allocation.
    if (created) block.cache->reserve = context + caches->max_new_tokens + 1 + b;
    const int64_t have = block.cache->rows;
    if (context > have) {
      // The newest chunks hold the rows the cache lacks; earlier ones are not copied again.
      std::vector<at::Tensor> chunks;
      int64_t end = context;
      for (auto it = s->features.rbegin(); it != s->features.rend() && end > have; ++it) {
        chunks.insert(chunks.begin(), *it);
        end -= it->size(0);
      }
      block.new_features = at::cat(chunks, 0).narrow(0, have - end, context - have);
    }
    block.anchor_token = s->tokens.back();
    block.block_length = s->block_length > 0 ? std::min(s->block_length, b) : b;
    blocks.push_back(std::move(block));
  }
  return drafter.ForwardCached(blocks);
}

// A DFlash2 drafter's proposals: the candidate selector's path through each slot's top-k
// (docs/method.md §2.2), greedy (the best score) or sampled from softmax(scores / temperature)
// over the candidates; q is that distribution placed on the candidates' ids (0 elsewhere), so the
// lossless acceptance rule applies unchanged.
absl::StatusOr<Drafts> SelectorDraft(const drafter::DrafterModel& drafter, const at::Tensor& hidden,
                                     const std::vector<const DraftContext*>& active,
                                     const SamplingOptions& sampling, Sampler* sampler) {
  const int64_t n = static_cast<int64_t>(active.size()), b = drafter.config().block_size;
  std::vector<int64_t> anchors;
  for (const DraftContext* s : active) anchors.push_back(s->tokens.back());
  std::vector<at::Tensor> q_rows;  // per slot [n, K]
  const drafter::DrafterModel::PickFn pick = [&](const at::Tensor& scores) {
    if (sampler == nullptr) return at::argmax(scores, -1);
    nn::SamplingOptions over_candidates;  // temperature only, as the serving format samples
    over_candidates.temperature = sampling.temperature;
    const at::Tensor q = nn::SamplingProbabilities(scores, over_candidates);
    q_rows.push_back(q);
    const std::vector<int64_t> drawn = sampler->Sample(q);
    return at::tensor(drawn, at::TensorOptions().dtype(at::kLong));
  };
  at::Tensor candidates;  // [n, B-1, K]
  ASSIGN_OR_RETURN(at::Tensor path,
                   drafter.SelectCandidates(hidden, anchors, pick, &candidates, nullptr));
  Drafts out;
  const at::Tensor ids = path.contiguous();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t* row = ids.data_ptr<int64_t>() + j * (b - 1);
    out.tokens.emplace_back(row, row + (b - 1));
  }
  if (sampler != nullptr) {
    const int64_t v = drafter.config().target.vocab_size;
    const at::Tensor q = at::stack(q_rows, 1);  // [n, B-1, K]
    out.q = at::zeros({n, b - 1, v}, q.options()).scatter_(2, candidates.to(q.device()), q);
  }
  return out;
}

// The drafter's proposals (slots 1..B-1) for each active sequence, one batched forward: its argmax
// (greedy; `sampler` null), or drawn from its sampling distribution q. `caches`: the drafter keeps
// each sequence's context keys and values (null: the whole context at every block).
absl::StatusOr<Drafts> Draft(const drafter::DrafterModel& drafter,
                             const std::vector<const DraftContext*>& active,
                             const SamplingOptions& sampling, Sampler* sampler,
                             DrafterCaches* caches = nullptr) {
  const int64_t b = drafter.config().block_size;
  at::Tensor hidden;
  if (caches != nullptr) {
    ASSIGN_OR_RETURN(hidden, CachedHidden(drafter, active, caches));
  } else {
    ASSIGN_OR_RETURN(hidden, UncachedHidden(drafter, active));
  }
  Drafts out;
  if (drafter.config().dflash2()) {
    ASSIGN_OR_RETURN(out, SelectorDraft(drafter, hidden, active, sampling, sampler));
    out.context_kept = caches != nullptr;
    return out;
  }
  out.context_kept = caches != nullptr;
  ASSIGN_OR_RETURN(at::Tensor logits, drafter.Logits(hidden));
  std::vector<int64_t> picks;  // [n * (B-1)]
  if (sampler == nullptr) {
    const std::vector<int64_t> all = Argmax(logits);  // [n * B]
    for (size_t j = 0; j < active.size(); ++j) {
      picks.insert(picks.end(), all.begin() + j * b + 1, all.begin() + (j + 1) * b);
    }
  } else {
    const int64_t n = static_cast<int64_t>(active.size()), v = logits.size(1);
    const at::Tensor slots = logits.view({n, b, v}).narrow(1, 1, b - 1).reshape({-1, v});
    out.q = nn::SamplingProbabilities(slots, sampling).view({n, b - 1, v});
    picks = sampler->Sample(out.q.view({-1, v}));
  }
  for (size_t j = 0; j < active.size(); ++j) {
    out.tokens.emplace_back(picks.begin() + j * (b - 1), picks.begin() + (j + 1) * (b - 1));
  }
  return out;
}

absl::StatusOr<SpecDecodeResult> Generate(const nn::TargetModel& target, int64_t b,
                                          const DraftFn& draft,
                                          const std::vector<std::vector<int64_t>>& prompts,
                                          const SpecDecodeOptions& options);

}  // namespace

size_t ContextBucket(int64_t context_tokens) {
  size_t b = 0;
  while (b < kContextBuckets - 1 && context_tokens >= kContextBucketBounds[b]) ++b;
  return b;
}

int64_t ContextBucketMin(size_t bucket) {
  return bucket == 0 ? 0 : kContextBucketBounds[bucket - 1];
}

int64_t ContextBucketMax(size_t bucket) {
  return bucket + 1 < kContextBuckets ? kContextBucketBounds[bucket] : 0;
}

double AcceptanceStats::tau() const {
  return verifications == 0 ? 0.0 : 1.0 + static_cast<double>(accepted) / verifications;
}

std::vector<double> AcceptanceStats::acceptance_by_position() const {
  std::vector<double> out(accepted_at.size(), 0.0);
  if (!out.empty()) out[0] = 1.0;
  for (size_t k = 1; k < accepted_at.size() && verifications > 0; ++k) {
    out[k] = static_cast<double>(accepted_at[k]) / verifications;
  }
  return out;
}

double AcceptanceStats::tau_pooled() const {
  return verifications == 0 ? 0.0 : static_cast<double>(emitted) / verifications;
}

double AcceptanceStats::tau_prompt_mean() const {
  return prompts_verified == 0 ? 0.0 : prompt_tau_sum / prompts_verified;
}

void AcceptanceStats::Add(const AcceptanceStats& other) {
  verifications += other.verifications;
  accepted += other.accepted;
  emitted += other.emitted;
  prompts_verified += other.prompts_verified;
  prompt_tau_sum += other.prompt_tau_sum;
  auto add = [](const std::vector<int64_t>& from, std::vector<int64_t>* to) {
    if (to->size() < from.size()) to->resize(from.size());
    for (size_t k = 0; k < from.size(); ++k) (*to)[k] += from[k];
  };
  add(other.accepted_at, &accepted_at);
  add(other.emitted_histogram, &emitted_histogram);
  if (by_context.size() < other.by_context.size()) by_context.resize(other.by_context.size());
  for (size_t c = 0; c < other.by_context.size(); ++c) {
    by_context[c].verifications += other.by_context[c].verifications;
    by_context[c].accepted += other.by_context[c].accepted;
    by_context[c].emitted += other.by_context[c].emitted;
    add(other.by_context[c].accepted_at, &by_context[c].accepted_at);
  }
}

Proposer DrafterProposer(const drafter::DrafterModel& drafter) {
  return [&drafter](const std::vector<const DraftContext*>& active)
             -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    ASSIGN_OR_RETURN(Drafts d, Draft(drafter, active, SamplingOptions{}, nullptr));
    return std::move(d.tokens);
  };
}

void SetInferenceDrafterOptions(const nn::TargetModel& target, drafter::DrafterOptions* options) {
  options->device = target.device();
  options->dtype = target.dtype();
  options->compute_dtype.reset();
}

absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> LoadExportedDrafter(
    const nn::TargetModel& target, const std::string& dir) {
  ASSIGN_OR_RETURN(drafter::DrafterConfig config, drafter::ReadDrafterConfig(dir));
  drafter::DrafterOptions options;
  SetInferenceDrafterOptions(target, &options);
  ASSIGN_OR_RETURN(
      std::unique_ptr<drafter::DrafterModel> model,
      drafter::DrafterModel::Create(config, options, target.embed_tokens(), target.lm_head()));
  RETURN_IF_ERROR(drafter::ImportDrafter(dir, model.get()));
  return model;
}

absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, const drafter::DrafterModel& drafter,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options) {
  RETURN_IF_ERROR(CheckPair(target, drafter));
  const SamplingOptions sampling = options.sampling;
  // One cache per sequence of this call (its DraftContext stays put until the call returns).
  auto caches = options.drafter_kv_cache ? std::make_shared<DrafterCaches>() : nullptr;
  if (caches != nullptr) caches->max_new_tokens = options.max_new_tokens;
  return Generate(
      target, drafter.config().block_size,
      [&drafter, sampling, caches](const std::vector<const DraftContext*>& active,
                                   Sampler* sampler) {
        return Draft(drafter, active, sampling, sampler, caches.get());
      },
      prompts, options);
}

absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, int64_t b, const Proposer& proposer,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options) {
  return Generate(
      target, b,
      [&proposer](const std::vector<const DraftContext*>& active,
                  Sampler*) -> absl::StatusOr<Drafts> {
        ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> tokens, proposer(active));
        return Drafts{std::move(tokens), at::Tensor()};
      },
      prompts, options);
}

absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, int64_t b, const SamplingProposer& proposer,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options) {
  return Generate(
      target, b,
      [&proposer](const std::vector<const DraftContext*>& active, Sampler*) {
        return proposer(active);
      },
      prompts, options);
}

namespace {

absl::StatusOr<SpecDecodeResult> Generate(const nn::TargetModel& target, int64_t b,
                                          const DraftFn& draft,
                                          const std::vector<std::vector<int64_t>>& prompts,
                                          const SpecDecodeOptions& options) {
  if (b < 2) return absl::InvalidArgumentError(absl::StrCat("block size ", b, " must be >= 2"));
  RETURN_IF_ERROR(nn::ValidateSampling(options.sampling));
  if (options.sampling.repetition_penalty != 1.0) {
    // Verification scores every block row against the target's own distribution; a penalty that
    // depends on each row's prefix is plain generation's only (nn::Generate).
    return absl::UnimplementedError(
        absl::StrCat("repetition_penalty ", options.sampling.repetition_penalty,
                     ": speculative decoding verifies against the unpenalized distribution (1 "
                     "only)"));
  }
  const bool sampled = options.sampling.temperature > 0;
  std::unique_ptr<Sampler> sampler;
  if (sampled) sampler = std::make_unique<Sampler>(options.sampling, target.device());
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens ", options.max_new_tokens, " must be at least 1"));
  }
  SpecDecodeResult result;
  result.stats.accepted_at.assign(b, 0);
  result.stats.emitted_histogram.assign(b + 1, 0);
  result.stats.by_context.assign(kContextBuckets, ContextBucketStats{0, 0, 0, {}});
  for (ContextBucketStats& c : result.stats.by_context) c.accepted_at.assign(b, 0);
  if (prompts.empty()) return result;
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " is empty"));
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
  }
  const int64_t n = static_cast<int64_t>(prompts.size());
  ASSIGN_OR_RETURN(std::unique_ptr<nn::KvCache> cache,
                   nn::KvCache::Create(target, n, longest + options.max_new_tokens + b));
  const std::set<int64_t> stops(options.stop_token_ids.begin(), options.stop_token_ids.end());
  std::vector<Sequence> seqs(n);
  try {
    // Prefill: features of every prompt position and the target's first token.
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    ASSIGN_OR_RETURN(nn::ExtendOutput pre, target.Extend(all, prompts, cache.get(), true));
    ++result.target_forwards;
    std::vector<int64_t> last_rows;
    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = static_cast<int64_t>(prompts[i].size());
      seqs[i].features.push_back(pre.features.narrow(0, row, len));
      row += len;
      last_rows.push_back(row - 1);
    }
    ASSIGN_OR_RETURN(
        at::Tensor first_logits,
        target.Logits(pre.hidden.index_select(
            0,
            at::tensor(last_rows, at::TensorOptions().dtype(at::kLong)).to(pre.hidden.device()))));
    const std::vector<int64_t> first =
        sampled ? sampler->Sample(nn::SamplingProbabilities(first_logits, options.sampling))
                : Argmax(first_logits);
    for (int64_t i = 0; i < n; ++i) {
      seqs[i].tokens = prompts[i];
      seqs[i].tokens.push_back(first[i]);
      seqs[i].done = Emit({first[i]}, options, stops, &seqs[i]);
    }

    while (true) {
      std::vector<Sequence*> active;
      std::vector<const DraftContext*> contexts;
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < n; ++i) {
        if (!seqs[i].done) {
          const int64_t left =
              options.max_new_tokens - static_cast<int64_t>(seqs[i].emitted.size());
          seqs[i].block_length = std::min(b, left + 1);
          active.push_back(&seqs[i]);
          contexts.push_back(&seqs[i]);
          ids.push_back(i);
        }
      }
      if (active.empty()) break;
      auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(Drafts drafts, draft(contexts, sampler.get()));
      if (drafts.context_kept) {
        for (Sequence* s : active) s->features.clear();
      }
      const std::vector<std::vector<int64_t>>& proposals = drafts.tokens;
      ++result.drafter_forwards;
      auto t1 = std::chrono::steady_clock::now();
      result.draft_seconds += std::chrono::duration<double>(t1 - t0).count();
      if (proposals.size() != active.size()) {
        return absl::InternalError(absl::StrCat("the proposer returned ", proposals.size(),
                                                " blocks for ", active.size(), " sequences"));
      }
      for (const std::vector<int64_t>& p : proposals) {
        if (static_cast<int64_t>(p.size()) != b - 1) {
          return absl::InternalError(absl::StrCat("the proposer returned ", p.size(),
                                                  " tokens, the block has ", b - 1, " slots"));
        }
      }
      std::vector<std::vector<int64_t>> blocks;
      std::vector<int64_t> offsets;  // first row of each block in the verification's output
      int64_t rows = 0;
      for (size_t j = 0; j < active.size(); ++j) {
        const int64_t len = active[j]->block_length;
        blocks.push_back({active[j]->tokens.back()});
        blocks.back().insert(blocks.back().end(), proposals[j].begin(),
                             proposals[j].begin() + (len - 1));
        offsets.push_back(rows);
        rows += len;
      }
      t0 = std::chrono::steady_clock::now();
      // A hybrid target's recurrent states cannot drop rejected tokens: saved here, and the
      // blocks with rejected tokens run their kept tokens again from them below.
      const bool recurrent = cache->has_recurrent_state();
      if (recurrent) cache->SaveStates(ids);
      ASSIGN_OR_RETURN(nn::ExtendOutput verify, target.Extend(ids, blocks, cache.get(), true));
      ++result.target_forwards;
      ASSIGN_OR_RETURN(at::Tensor logits, target.Logits(verify.hidden));
      // Per block: the proposals kept, then the target's next token.
      std::vector<int64_t> kept(active.size());
      std::vector<std::vector<int64_t>> outs(active.size());
      if (sampled) {
        std::vector<SampledBlock> sb;
        for (size_t j = 0; j < active.size(); ++j) {
          sb.push_back({offsets[j], active[j]->block_length, &proposals[j],
                        drafts.q.defined() ? static_cast<int64_t>(j) : -1});
        }
        const std::vector<SampledVerdict> verdicts = AcceptSampled(
            nn::SamplingProbabilities(logits, options.sampling), drafts.q, sb, sampler.get());
        for (size_t j = 0; j < active.size(); ++j) {
          kept[j] = verdicts[j].accepted;
          outs[j].assign(proposals[j].begin(), proposals[j].begin() + kept[j]);
          outs[j].push_back(verdicts[j].next);
        }
      } else {
        const std::vector<int64_t> greedy = Argmax(logits);  // [rows]
        for (size_t j = 0; j < active.size(); ++j) {
          const int64_t* g = greedy.data() + offsets[j];
          int64_t k = 0;  // proposals accepted: proposal k+1 (slot k+1) must equal g[k]
          while (k < active[j]->block_length - 1 && proposals[j][k] == g[k]) ++k;
          kept[j] = k;
          outs[j].assign(g, g + k + 1);  // accepted proposals, then the bonus
        }
      }
      std::vector<int64_t> replay_ids;
      std::vector<std::vector<int64_t>> replay_tokens;
      for (size_t j = 0; j < active.size(); ++j) {
        if (!recurrent || kept[j] + 1 == static_cast<int64_t>(blocks[j].size())) continue;
        RETURN_IF_ERROR(cache->RestoreStates(ids[j]));
        replay_ids.push_back(ids[j]);
        replay_tokens.emplace_back(blocks[j].begin(), blocks[j].begin() + kept[j] + 1);
      }
      if (!replay_ids.empty()) {
        // The kept rows again (their features are the verification's: the rows after them
        // never reach them), now leaving the states where the sequence goes on.
        RETURN_IF_ERROR(target.Extend(replay_ids, replay_tokens, cache.get(), false).status());
        ++result.replays;
      }
      // The kept rows' features, gathered into one tensor of those rows only: a narrow of the
      // verification's whole [rows, K*H] features per sequence kept every verification's
      // rejected rows alive until decoding ended (at batch 64, block 16 and Qwen3-8B's 5 x 4096
      // features 42 MB per verification).
      std::vector<int64_t> kept_rows;
      for (size_t j = 0; j < active.size(); ++j) {
        for (int64_t r = 0; r <= kept[j]; ++r) kept_rows.push_back(offsets[j] + r);
      }
      const at::Tensor kept_features = verify.features.index_select(
          0, at::tensor(kept_rows, at::kLong).to(verify.features.device()));
      int64_t kept_at = 0;
      result.verify_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (size_t j = 0; j < active.size(); ++j) {
        Sequence* s = active[j];
        const int64_t k = kept[j];
        ++result.stats.verifications;
        result.stats.accepted += k;
        for (int64_t i = 1; i <= k; ++i) ++result.stats.accepted_at[i];
        // The tokens before this block: the prompt and everything emitted so far.
        ContextBucketStats& bucket =
            result.stats.by_context[ContextBucket(static_cast<int64_t>(s->tokens.size()) - 1)];
        ++bucket.verifications;
        bucket.accepted += k;
        for (int64_t i = 1; i <= k; ++i) ++bucket.accepted_at[i];
        // The target ran the block's first k+1 rows for real: keep their cache and features.
        const int64_t kept = static_cast<int64_t>(s->tokens.size()) + k;
        RETURN_IF_ERROR(cache->Truncate(ids[j], kept));
        s->features.push_back(kept_features.narrow(0, kept_at, k + 1));
        kept_at += k + 1;
        const std::vector<int64_t>& out = outs[j];
        s->tokens.insert(s->tokens.end(), out.begin(), out.end());
        const size_t before = s->emitted.size();
        s->done = Emit(out, options, stops, s);
        const int64_t e = static_cast<int64_t>(s->emitted.size() - before);
        result.stats.emitted += e;
        bucket.emitted += e;
        ++result.stats.emitted_histogram[e];
        s->step_emitted.push_back(e);
        s->step_accepted.push_back(k);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("speculative decoding: ", e.what_without_backtrace()));
  }
  for (Sequence& s : seqs) {
    if (!s.step_emitted.empty()) {
      int64_t e = 0;
      for (int64_t x : s.step_emitted) e += x;
      ++result.stats.prompts_verified;
      result.stats.prompt_tau_sum += static_cast<double>(e) / s.step_emitted.size();
    }
    result.tokens.push_back(std::move(s.emitted));
    result.step_emitted.push_back(std::move(s.step_emitted));
    result.step_accepted.push_back(std::move(s.step_accepted));
  }
  return result;
}

}  // namespace

}  // namespace dflash::spec
