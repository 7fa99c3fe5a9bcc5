// Speculative decoding with a DFlash drafter, exactly as served (method.md §1). Greedy: the target
// prefills each prompt and emits its first token; then, per verification, the drafter sees the
// target's features of every position strictly before the block and the block [last accepted
// token, MASK x (B-1)] and proposes B-1 tokens in one forward; the target runs the block in one
// forward (KV cache) and keeps the longest prefix of proposals equal to its own argmax, plus its
// own next token (the bonus). The output equals plain greedy decoding of the target (lossless).
// Sequences of a batch decode together: one drafter forward and one target forward per step.
// Near the token limit the block shrinks to 1 + the tokens still to emit (its drafted slots see
// only the block's own slots), as the reference inference code (dflash_generate) does, so that
// both draft, verify and emit the same tokens step for step.
// Sampled (SpecDecodeOptions::sampling, sampling.h): the first token and every later one are drawn
// from the target's sampling distribution p; the drafter draws its proposals from its own q (the
// same temperature, top-k and top-p over its logits) and the lossless acceptance rule keeps a
// prefix of them and draws the next token, so that the output is distributed as plain sampling.
//
// LibTorch is a PRIVATE dependency of dflash_spec: a target that includes this header links
// ${TORCH_LIBRARIES} itself and must not also include generated protobuf headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/sampling.h"

namespace dflash::drafter {
class DrafterModel;
struct DrafterOptions;
}  // namespace dflash::drafter
namespace dflash::nn {
class TargetModel;
}

namespace dflash::spec {

struct SpecDecodeOptions {
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_token_ids;  // a sequence ends after emitting one
  SamplingOptions sampling;             // greedy by default
  // With a DrafterModel: keep each sequence's context keys and values between blocks
  // (DrafterModel::ForwardCached) instead of projecting the whole context at every block. The
  // same proposals either way; false only to measure the difference.
  bool drafter_kv_cache = true;
};

// Acceptance statistics of a set of verifications (summable across calls and workers).
// Acceptance by context length (docs/cli.md#eval): each verification is counted in the bucket of
// the tokens before its block (the prompt and everything emitted so far): [0, 1024), [1024, 4096),
// [4096, 16384), [16384, ...).
inline constexpr int64_t kContextBucketBounds[] = {1024, 4096, 16384};
inline constexpr size_t kContextBuckets = 4;
size_t ContextBucket(int64_t context_tokens);
int64_t ContextBucketMin(size_t bucket);  // 0, 1024, 4096, 16384
int64_t ContextBucketMax(size_t bucket);  // 1024, 4096, 16384, 0 (none)

struct ContextBucketStats {
  int64_t verifications = 0, accepted = 0, emitted = 0;
  std::vector<int64_t> accepted_at;  // as AcceptanceStats::accepted_at
};

struct AcceptanceStats {
  int64_t verifications = 0;  // target forwards over a drafted block
  int64_t accepted = 0;       // proposals accepted, summed
  // accepted_at[k] (k = 1..B-1; index 0 unused): verifications whose proposal k was accepted,
  // i.e. whose accepted prefix reached slot k.
  std::vector<int64_t> accepted_at;
  // Tokens the verifications emitted (accepted proposals plus the bonus, cut at a stop token and
  // at the token limit): the reference's per-step "acceptance length". The first token, from the
  // prefill, is not counted.
  int64_t emitted = 0;
  // emitted_histogram[e] (e = 0..B): verifications that emitted e tokens.
  std::vector<int64_t> emitted_histogram;
  // Prompts with at least one verification, and the sum over them of emitted / verifications of
  // the prompt.
  int64_t prompts_verified = 0;
  double prompt_tau_sum = 0;
  // kContextBuckets entries once decoding has counted (empty before): the same counts by the
  // context length of each verification.
  std::vector<ContextBucketStats> by_context;

  // tau, tokens per verification: 1 + accepted / verifications (0 with no verification).
  double tau() const;
  // emitted / verifications: tau pooled over every verification as emitted (0 with none).
  double tau_pooled() const;
  // prompt_tau_sum / prompts_verified: the mean over prompts of each prompt's tokens emitted per
  // verification, what the reference benchmark prints as "Average Acceptance length" (0 with none).
  double tau_prompt_mean() const;
  // accepted_at[k] / verifications for k = 1..B-1 (index 0: 1). tau = sum over k of these.
  std::vector<double> acceptance_by_position() const;
  void Add(const AcceptanceStats& other);
};

struct SpecDecodeResult {
  std::vector<std::vector<int64_t>> tokens;  // new tokens per prompt (a stop token included)
  // Per prompt, per verification in order: tokens the verification emitted, and proposals the
  // target accepted (the acceptance of each step; see AcceptanceStats).
  std::vector<std::vector<int64_t>> step_emitted, step_accepted;
  AcceptanceStats stats;
  int64_t target_forwards = 0;  // prefill + verifications, batched
  // Hybrid targets: batched target forwards that ran a verification's kept tokens again from the
  // saved recurrent states (counted in verify_seconds, not in target_forwards).
  int64_t replays = 0;
  int64_t drafter_forwards = 0;  // batched
  // Wall-clock seconds in the proposer and in the verifications (forward, logits, argmax); each
  // ends with the picked ids on the host, so the device work is inside. The prefill and the
  // bookkeeping between are neither.
  double draft_seconds = 0, verify_seconds = 0;
};

// One sequence as a proposer sees it.
struct DraftContext {
  std::vector<int64_t> tokens;  // prompt and emitted tokens; the target has not run the last
  // Target features [rows, K*H] of tokens[0..size-2], in chunks; after a proposer that keeps
  // them (DraftBlocks::context_kept), only the rows added since its last call.
  std::vector<at::Tensor> features;
  // Slots of this step's block, in [2, B]: B, or 1 + the tokens still to emit when fewer. The
  // proposer still returns B-1 tokens; only the first block_length-1 are verified.
  int64_t block_length = 0;
};

// Proposals for slots 1..B-1 of the block of each given sequence (B-1 token ids each). In sampled
// decoding a Proposer's proposals are certain (sampling.h): only the drafter's own proposer
// (SpeculativeGenerate with a DrafterModel) draws them from a distribution.
using Proposer = std::function<absl::StatusOr<std::vector<std::vector<int64_t>>>(
    const std::vector<const DraftContext*>&)>;

// Proposals with the distribution each was drawn from, for sampled decoding: q [sequences, B-1,
// V] probabilities on the target's device (each row sums to 1 over the vocabulary); undefined:
// the proposals are certain (sampling.h).
struct DraftBlocks {
  std::vector<std::vector<int64_t>> tokens;
  at::Tensor q;
  // The proposer keeps what it needs of every feature row it was given (the drafter's cache of
  // context keys and values): the decoding loop drops each sequence's features after the call,
  // so that a DraftContext holds only the rows added since the previous block, not the whole
  // context (at Qwen3-8B's 5 x 4096 features, 40 KB per token of every sequence).
  bool context_kept = false;
};
using SamplingProposer =
    std::function<absl::StatusOr<DraftBlocks>(const std::vector<const DraftContext*>&)>;

// The DFlash drafter as a proposer: one batched forward (method.md §1; no gradient).
Proposer DrafterProposer(const drafter::DrafterModel& drafter);

// Sets `options` for a drafter that only decodes beside `target`: its weights in the target's
// dtype on the target's device, no separate compute dtype (nothing trains them, so no fp32
// masters: a bf16 drafter reads 2 bytes per weight per forward instead of casting 4-byte masters
// at every block; the results are the same bit for bit).
void SetInferenceDrafterOptions(const nn::TargetModel& target, drafter::DrafterOptions* options);

// The exported drafter at `dir` (drafter_checkpoint.h) made ready to decode with `target`, as
// dflashctl eval loads it: SetInferenceDrafterOptions, embedding and lm_head borrowed from the
// target. Errors of ReadDrafterConfig / ImportDrafter.
absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> LoadExportedDrafter(
    const nn::TargetModel& target, const std::string& dir);

// The decoding loop with any proposer of blocks of `block_size` (>= 2): tests use proposers that
// know the answer. Same contract as below.
absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, int64_t block_size, const Proposer& proposer,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options);

// The same with a proposer that draws its proposals from distributions it gives (tests).
absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, int64_t block_size, const SamplingProposer& proposer,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options);

// Decodes every prompt (non-empty, ids in the vocabulary) with `target` (loaded with
// options.full) verifying `drafter`'s blocks, greedily or sampled (options.sampling). The drafter
// must match the target: its target_layer_ids are the target's feature layers, its hidden size and
// vocabulary the target's (FAILED_PRECONDITION naming the difference). The acceptance of a
// verification counts every accepted proposal, also those past a stop token (the drafter's quality,
// not the request's length); emitted tokens stop there.
absl::StatusOr<SpecDecodeResult> SpeculativeGenerate(
    const nn::TargetModel& target, const drafter::DrafterModel& drafter,
    const std::vector<std::vector<int64_t>>& prompts, const SpecDecodeOptions& options);

}  // namespace dflash::spec
