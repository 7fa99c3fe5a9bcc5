// Tests of run.yaml parsing (common/config/run_spec.h): every bad input names the field path and
// the reason, defaults are filled, paths resolve, and EmitRunSpec round-trips.
#include "common/config/run_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dflash::config {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

constexpr char kName[] = "name: demo\n";
constexpr char kTarget[] = "target: {path: \"builtin:tiny-qwen3\"}\n";
constexpr char kData[] = "data: {train: \"builtin:tiny-chat\"}\n";

// The smallest valid run.yaml plus `extra` (which must not repeat name, target or data).
std::string Minimal(const std::string& extra = "") {
  return absl::StrCat(kName, kTarget, kData, extra);
}
// A valid run.yaml whose target section is `target` (a flow mapping body).
std::string WithTarget(const std::string& target) {
  return absl::StrCat(kName, "target: {", target, "}\n", kData);
}
// A valid run.yaml whose data section is `data` (a flow mapping body).
std::string WithData(const std::string& data) {
  return absl::StrCat(kName, kTarget, "data: {", data, "}\n");
}

absl::StatusOr<RunSpec> Parse(const std::string& yaml, const RunSpecOptions& options = {}) {
  return ParseRunSpec(yaml, "run.yaml", options);
}

// The error message of a parse that must fail with InvalidArgument.
std::string ErrorOf(const std::string& yaml, const RunSpecOptions& options = {}) {
  auto spec = Parse(yaml, options);
  EXPECT_FALSE(spec.ok()) << "unexpectedly parsed:\n" << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

std::vector<std::string> Lines(const std::string& message) {
  return absl::StrSplit(message, '\n', absl::SkipEmpty());
}

// A fresh directory under /tmp, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dflash-run-spec-test-XXXXXX";
    char* dir = mkdtemp(tmpl);
    EXPECT_NE(dir, nullptr);
    if (dir != nullptr) path_ = dir;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Join(const std::string& rel) const { return (fs::path(path_) / rel).string(); }
  std::string MakeDir(const std::string& rel) const {
    std::string p = Join(rel);
    fs::create_directories(p);
    return p;
  }
  std::string WriteFile(const std::string& rel, const std::string& content) const {
    std::string p = Join(rel);
    fs::create_directories(fs::path(p).parent_path());
    std::ofstream out(p);
    out << content;
    return p;
  }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// Bad inputs, one per row: the YAML and a substring the error message must contain.

struct BadCase {
  const char* label;
  std::string yaml;
  std::string expected;
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.label; }

class RunSpecBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(RunSpecBadInputTest, ReportsFieldPathAndReason) {
  const BadCase& c = GetParam();
  std::string message = ErrorOf(c.yaml);
  // Every error line carries the source name and the field path.
  EXPECT_THAT(message, HasSubstr(absl::StrCat("run.yaml: ", c.expected))) << c.yaml;
}

const BadCase kBadCases[] = {
    // Unknown keys.
    {"UnknownTopLevelKey", Minimal("tensorboard_dir: /tmp/tb\n"), "tensorboard_dir: unknown field"},
    {"UnknownTopLevelKeyTypoHint", Minimal("seeed: 1\n"),
     "seeed: unknown field (did you mean 'seed'?)"},
    {"UnknownTopLevelSectionTypoHint", Minimal("optimm: {lr: 0.1}\n"),
     "optimm: unknown field (did you mean 'optim'?)"},
    {"UnknownNestedKeyTypoHint", Minimal("batching: {token_budgt: 9000}\n"),
     "batching.token_budgt: unknown field (did you mean 'token_budget'?)"},
    {"UnknownNestedKeyInTarget", WithTarget("path: \"builtin:tiny-qwen3\", dtyp: float32"),
     "target.dtyp: unknown field (did you mean 'dtype'?)"},
    // Wrong types.
    {"StringForInt", Minimal("batching: {token_budget: lots}\n"),
     "batching.token_budget: must be an integer, got 'lots'"},
    {"FloatForInt", Minimal("drafter: {layers: 2.5}\n"),
     "drafter.layers: must be an integer, got '2.5'"},
    {"ListForString", absl::StrCat("name: [a, b]\n", kTarget, kData),
     "name: must be a string, got a list"},
    {"MappingForString", Minimal("optim: {schedule: {kind: cosine}}\n"),
     "optim.schedule: must be a string, got a mapping"},
    {"MappingForInt", Minimal("drafter: {block_size: {value: 16}}\n"),
     "drafter.block_size: must be an integer, got a mapping"},
    {"StringForFloat", Minimal("optim: {lr: fast}\n"),
     "optim.lr: must be a finite number, got 'fast'"},
    {"InfiniteFloat", Minimal("optim: {lr: inf}\n"),
     "optim.lr: must be a finite number, got 'inf'"},
    {"SectionIsScalar", Minimal("batching: 5\n"), "batching: must be a mapping of fields, got '5'"},
    {"SectionIsList", Minimal("optim: [1, 2]\n"), "optim: must be a mapping of fields, got a list"},
    {"TargetIsScalar", absl::StrCat(kName, "target: \"builtin:tiny-qwen3\"\n", kData),
     "target: must be a mapping of fields, got 'builtin:tiny-qwen3'"},
    {"DocumentIsList", "- a\n- b\n", "(document): must be a mapping of fields, got a list"},
    {"DocumentIsScalar", "hello\n", "(document): must be a mapping of fields, got 'hello'"},
    {"LayerIdsWord", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: all"),
     "target.layer_ids: must be 'auto' or a list of integers, got 'all'"},
    {"LayerIdsElementNotInt", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: [1, x]"),
     "target.layer_ids[1]: must be an integer, got 'x'"},
    {"MaskTokenIdWord", Minimal("drafter: {mask_token_id: none}\n"),
     "drafter.mask_token_id: must be 'auto' or an integer, got 'none'"},
    {"GammaWord", Minimal("loss: {gamma: big}\n"),
     "loss.gamma: must be 'auto' or a finite number, got 'big'"},
    {"PairsWord", Minimal("placement: {pairs: all}\n"),
     "placement.pairs: must be 'auto' or an integer, got 'all'"},
    {"BetasScalar", Minimal("optim: {betas: 0.9}\n"),
     "optim.betas: must be a list of numbers, got '0.9'"},
    {"BetasElementNotNumber", Minimal("optim: {betas: [0.9, x]}\n"),
     "optim.betas[1]: must be a finite number, got 'x'"},
    // Integer ranges, low and high.
    {"TokenBudgetTooLow", Minimal("batching: {token_budget: 0}\n"),
     "batching.token_budget: must be >= 256, got 0"},
    {"TokenBudgetTooHigh", Minimal("batching: {token_budget: 2097152}\n"),
     "batching.token_budget: must be <= 1048576, got 2097152"},
    {"MaxAnchorsTooLow", Minimal("batching: {max_anchors: 0}\n"),
     "batching.max_anchors: must be >= 1, got 0"},
    {"GradAccumTooHigh", Minimal("batching: {grad_accum: 5000}\n"),
     "batching.grad_accum: must be <= 4096, got 5000"},
    {"EvalTemperatureBelowZero", Minimal("eval: {temperature: -0.5}\n"), "eval.temperature: "},
    {"EvalTopPZero", Minimal("eval: {top_p: 0}\n"), "eval.top_p: "},
    {"EvalTopKBelowZero", Minimal("eval: {top_k: -1}\n"), "eval.top_k: must be >= 0, got -1"},
    {"DrafterLayersTooLow", Minimal("drafter: {layers: 0}\n"),
     "drafter.layers: must be >= 1, got 0"},
    {"DrafterLayersTooHigh", Minimal("drafter: {layers: 65}\n"),
     "drafter.layers: must be <= 64, got 65"},
    {"BlockSizeTooLow", Minimal("drafter: {block_size: 1}\n"),
     "drafter.block_size: must be >= 2, got 1"},
    {"NegativeSeed", Minimal("seed: -1\n"), "seed: must be >= 0, got -1"},
    {"NegativeMaskTokenId", Minimal("drafter: {mask_token_id: -1}\n"),
     "drafter.mask_token_id: must be >= 0, got -1"},
    {"MaxLengthBelowTwoBlocks", WithData("train: \"builtin:tiny-chat\", max_length: 16"),
     "data.max_length: must be >= 32, got 16"},
    {"LongDocumentsUnknown", WithData("train: \"builtin:tiny-chat\", long_documents: drop"),
     "data.long_documents: must be one of truncate|split, got 'drop'"},
    {"OnBadRecordUnknown", WithData("train: \"builtin:tiny-chat\", on_bad_record: ignore"),
     "data.on_bad_record: must be one of skip|fail, got 'ignore'"},
    {"PreparedEmpty", WithData("train: \"builtin:tiny-chat\", prepared: \"\""),
     "data.prepared: must be auto or a file path, got an empty string"},
    {"NegativeMaxSteps", Minimal("optim: {max_steps: -5}\n"),
     "optim.max_steps: must be >= 0, got -5"},
    {"PairsTooLow", Minimal("placement: {pairs: 0}\n"), "placement.pairs: must be >= 1, got 0"},
    {"CheckpointEveryStepsZero", Minimal("checkpoint: {every_steps: 0}\n"),
     "checkpoint.every_steps: must be >= 1, got 0"},
    {"CheckpointKeepZero", Minimal("checkpoint: {keep: 0}\n"),
     "checkpoint.keep: must be >= 1, got 0"},
    {"EvalNegativeEverySteps", Minimal("eval: {every_steps: -1}\n"),
     "eval.every_steps: must be >= 0, got -1"},
    {"EvalMaxNewTokensTooHigh", Minimal("eval: {max_new_tokens: 40000}\n"),
     "eval.max_new_tokens: must be <= 32768, got 40000"},
    // Float ranges, including exclusive minimums.
    {"LrZeroExclusive", Minimal("optim: {lr: 0}\n"), "optim.lr: must be > 0, got 0"},
    {"LrNegative", Minimal("optim: {lr: -0.001}\n"), "optim.lr: must be > 0, got -0.001"},
    {"LrTooHigh", Minimal("optim: {lr: 1.5}\n"), "optim.lr: must be <= 1, got 1.5"},
    {"WarmupRatioNegative", Minimal("optim: {warmup_ratio: -0.1}\n"),
     "optim.warmup_ratio: must be >= 0, got -0.1"},
    {"WarmupRatioTooHigh", Minimal("optim: {warmup_ratio: 0.6}\n"),
     "optim.warmup_ratio: must be <= 0.5, got 0.6"},
    {"EpochsZeroExclusive", Minimal("optim: {epochs: 0}\n"), "optim.epochs: must be > 0, got 0"},
    {"ClipNegative", Minimal("optim: {clip: -1}\n"), "optim.clip: must be >= 0, got -1"},
    {"WeightDecayTooHigh", Minimal("optim: {weight_decay: 2}\n"),
     "optim.weight_decay: must be <= 1, got 2"},
    {"EpsZeroExclusive", Minimal("optim: {eps: 0}\n"), "optim.eps: must be > 0, got 0"},
    {"EpsTooHigh", Minimal("optim: {eps: 0.1}\n"), "optim.eps: must be <= 0.01, got 0.1"},
    {"BetaTooHigh", Minimal("optim: {betas: [0.9, 1.0]}\n"),
     "optim.betas[1]: must be <= 0.999999, got 1"},
    {"BetaNegative", Minimal("optim: {betas: [-0.1, 0.99]}\n"),
     "optim.betas[0]: must be >= 0, got -0.1"},
    {"GammaZeroExclusive", Minimal("loss: {gamma: 0}\n"), "loss.gamma: must be > 0, got 0"},
    // Missing required fields.
    {"MissingName", absl::StrCat(kTarget, kData), "name: required field is missing"},
    {"NullName", absl::StrCat("name: ~\n", kTarget, kData), "name: required field is missing"},
    {"MissingTarget", absl::StrCat(kName, kData), "target: required field is missing"},
    {"MissingTargetPath", WithTarget("dtype: float32"), "target.path: required field is missing"},
    {"MissingData", absl::StrCat(kName, kTarget), "data: required field is missing"},
    {"MissingDataTrain", WithData("format: chat"), "data.train: required field is missing"},
    // Builtins.
    {"UnknownBuiltinTarget", WithTarget("path: \"builtin:huge-model\""),
     "target.path: unknown builtin 'huge-model' (known: tiny-qwen3, qwen3-8b-random, "
     "qwen3.5-27b-random)"},
    {"UnknownBuiltinDataset", WithData("train: \"builtin:nope\""),
     "data.train: unknown builtin 'nope' (known: tiny-chat, long-synthetic)"},
    {"RecomputeUnknown", Minimal("drafter: {recompute: all}\n"),
     "drafter.recompute: must be one of none|mlp|layers, got 'all'"},
    // Sliding-attention layers (method.md §2.1).
    {"Fp8WithAFloat32Target",
     absl::StrCat(kName, "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n", kData,
                  "drafter: {precision: fp8}\n"),
     "drafter.precision: fp8 needs target.dtype bfloat16 (the compute dtype around the fp8 GEMMs), "
     "got 'float32'"},
    {"UnknownPrecision", Minimal("drafter: {precision: fp16}\n"),
     "drafter.precision: must be one of auto|fp8, got 'fp16'"},
    {"SelectorScheduleWithDflash", Minimal("loss: {selector_warmup_steps: 100}\n"),
     "loss.selector_warmup_steps: taken by drafter.kind dflash2 only (this run's drafter.kind is "
     "dflash)"},
    {"NegativeSelectorRamp", Minimal("drafter: {kind: dflash2}\nloss: {selector_ramp_steps: -1}\n"),
     "loss.selector_ramp_steps: must be >= 0, got -1"},
    {"SlidingLayerOutsideTheDrafter",
     Minimal("drafter: {layers: 2, sliding_layers: [0, 2], sliding_window: 64}\n"),
     "drafter.sliding_layers[1]: 2 is not a layer of the drafter's 2"},
    {"SlidingLayerTwice", Minimal("drafter: {sliding_layers: [1, 1], sliding_window: 64}\n"),
     "drafter.sliding_layers[0]: layer 1 is listed twice"},
    {"SlidingLayersWithoutWindow", Minimal("drafter: {sliding_layers: [0]}\n"),
     "drafter.sliding_window: required (>= 1) with drafter.sliding_layers"},
    {"SlidingWindowWithoutLayers", Minimal("drafter: {sliding_layers: [], sliding_window: 64}\n"),
     "drafter.sliding_window: set, but drafter.sliding_layers lists no layer"},
    {"SlidingWindowAsLongAsTheContext",
     Minimal("drafter: {sliding_layers: [0], sliding_window: 4096}\n"),
     "drafter.sliding_window: 4096 is not below data.max_length (4096): every slot would see its "
     "whole context"},
    {"SlidingLayersNotAList", Minimal("drafter: {sliding_layers: all}\n"),
     "drafter.sliding_layers: must be 'auto' or a list of integers, got"},
    {"BuiltinInitFrom", Minimal("drafter: {init_from: \"builtin:tiny-qwen3\"}\n"),
     "drafter.init_from: builtin: names are not accepted here"},
    {"BuiltinTokenizer", WithData("train: \"builtin:tiny-chat\", tokenizer: \"builtin:x\""),
     "data.tokenizer: builtin: names are not accepted here"},
    // Layer ids.
    {"LayerIdsNotIncreasing", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: [5, 2]"),
     "target.layer_ids[1]: must be strictly increasing, got 2 after 5"},
    {"LayerIdsRepeated", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: [1, 3, 3]"),
     "target.layer_ids[2]: must be strictly increasing, got 3 after 3"},
    {"LayerIdsNegativeFirst", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: [-1, 2]"),
     "target.layer_ids[0]: must be >= 0, got -1"},
    {"LayerIdsNegativeLater", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: [1, -4]"),
     "target.layer_ids[1]: must be >= 0, got -4"},
    {"LayerIdsEmpty", WithTarget("path: \"builtin:tiny-qwen3\", layer_ids: []"),
     "target.layer_ids: must list 1 to 64 layers, got 0"},
    // Betas length.
    {"BetasTooShort", Minimal("optim: {betas: [0.9]}\n"),
     "optim.betas: must list exactly 2 numbers, got 1"},
    {"BetasTooLong", Minimal("optim: {betas: [0.9, 0.99, 0.999]}\n"),
     "optim.betas: must list exactly 2 numbers, got 3"},
    // Cross-field rules.
    {"GammaNoDefaultForBlockSize12", Minimal("drafter: {block_size: 12}\n"),
     "loss.gamma: has no default for drafter.block_size 12 (known for 8, 10, 16); set it"},
    {"EvalPromptsRequired", Minimal("eval: {every_steps: 100}\n"),
     "eval.prompts: required when eval.every_steps > 0"},
    {"TokenBudgetBelowMaxLength", Minimal("batching: {token_budget: 2048}\n"),
     "batching.token_budget: must be >= data.max_length (4096) so that every kept document fits "
     "one micro-batch, got 2048"},
    // Enumerations.
    {"BadDtype", WithTarget("path: \"builtin:tiny-qwen3\", dtype: fp8"),
     "target.dtype: must be one of bfloat16|float16|float32, got 'fp8'"},
    {"BadTransport", Minimal("placement: {transport: rdma}\n"),
     "placement.transport: must be one of auto|nccl|cuda_ipc|host, got 'rdma'"},
    {"BadSchedule", Minimal("optim: {schedule: step}\n"),
     "optim.schedule: must be one of cosine|linear|constant, got 'step'"},
    {"BadDataFormat", WithData("train: \"builtin:tiny-chat\", format: parquet"),
     "data.format: must be one of chat|pretokenized|text, got 'parquet'"},
    {"BadChatTemplate", WithData("train: \"builtin:tiny-chat\", chat_template: vicuna"),
     "data.chat_template: must be one of auto|chatml|llama3, got 'vicuna'"},
    // Name pattern.
    {"NameWithSpaceAndUpperCase", absl::StrCat("name: My Run\n", kTarget, kData),
     "name: must match [a-z0-9][a-z0-9._-]{0,62}, got 'My Run'"},
    {"NameStartsWithDash", absl::StrCat("name: -demo\n", kTarget, kData),
     "name: must match [a-z0-9][a-z0-9._-]{0,62}, got '-demo'"},
    {"NameTooLong", absl::StrCat("name: ", std::string(64, 'a'), "\n", kTarget, kData),
     absl::StrCat("name: must match [a-z0-9][a-z0-9._-]{0,62}, got '", std::string(64, 'a'), "'")},
};

INSTANTIATE_TEST_SUITE_P(AllCases, RunSpecBadInputTest, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.label);
                         });

TEST(RunSpecErrorsTest, UnknownKeyFarFromEveryFieldHasNoHint) {
  std::string message = ErrorOf(Minimal("tensorboard_dir: /tmp/tb\n"));
  EXPECT_THAT(message, Not(HasSubstr("did you mean")));
}

TEST(RunSpecErrorsTest, EmptyDocument) {
  EXPECT_THAT(ErrorOf(""), HasSubstr("run.yaml: (document): is empty; a run needs at least name, "
                                     "target.path and data.train"));
  EXPECT_THAT(ErrorOf("# only a comment\n\n"), HasSubstr("run.yaml: (document): is empty"));
}

TEST(RunSpecErrorsTest, MalformedYamlNamesLineAndColumn) {
  EXPECT_THAT(ErrorOf("name: demo\n  bad: indent\n"),
              HasSubstr("run.yaml:2:6: malformed YAML: illegal map value"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kName, "target: {path: x\n")),
              HasSubstr("run.yaml:3:1: malformed YAML: end of map flow not found"));
}

TEST(RunSpecErrorsTest, MalformedYamlWithoutSourceNameSaysYaml) {
  auto spec = ParseRunSpec("name: demo\n  bad: indent\n", "", {});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("yaml:2:6: malformed YAML"));
}

TEST(RunSpecErrorsTest, ReportsEveryValidationErrorInOneMessage) {
  std::string yaml =
      absl::StrCat("name: Bad Name\n", "target: {path: \"builtin:tiny-qwen3\", dtype: fp8}\n",
                   kData, "batching: {token_budget: 0}\n", "optim: {lr: 0, schedule: step}\n");
  std::string message = ErrorOf(yaml);
  EXPECT_THAT(Lines(message),
              ElementsAre("run.yaml: name: must match [a-z0-9][a-z0-9._-]{0,62}, got 'Bad Name'",
                          "run.yaml: target.dtype: must be one of bfloat16|float16|float32, got "
                          "'fp8'",
                          "run.yaml: batching.token_budget: must be >= 256, got 0",
                          "run.yaml: optim.lr: must be > 0, got 0",
                          "run.yaml: optim.schedule: must be one of cosine|linear|constant, got "
                          "'step'"));
}

TEST(RunSpecErrorsTest, ReportsEveryTypeAndKeyErrorInOneMessage) {
  std::string yaml = Minimal(
      "batching: {token_budget: lots, max_anchors: many}\n"
      "optim: {lr: fast, learning_rate: 0.1}\n"
      "seeed: 3\n");
  std::string message = ErrorOf(yaml);
  EXPECT_THAT(message,
              AllOf(HasSubstr("run.yaml: batching.token_budget: must be an integer, got 'lots'"),
                    HasSubstr("run.yaml: batching.max_anchors: must be an integer, got 'many'"),
                    HasSubstr("run.yaml: optim.lr: must be a finite number, got 'fast'"),
                    HasSubstr("run.yaml: optim.learning_rate: unknown field"),
                    HasSubstr("run.yaml: seeed: unknown field (did you mean 'seed'?)")));
  EXPECT_EQ(Lines(message).size(), 5u) << message;
}

TEST(RunSpecErrorsTest, MissingEverythingRequired) {
  std::string message = ErrorOf("seed: 1\n");
  EXPECT_THAT(message, AllOf(HasSubstr("run.yaml: name: required field is missing"),
                             HasSubstr("run.yaml: target: required field is missing"),
                             HasSubstr("run.yaml: target.path: required field is missing"),
                             HasSubstr("run.yaml: data: required field is missing"),
                             HasSubstr("run.yaml: data.train: required field is missing")));
}

// ---------------------------------------------------------------------------------------------
// Paths on disk.

class RunSpecPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.MakeDir("model");
    train_ = tmp_.WriteFile("train.jsonl", "{}\n");
    options_.base_dir = tmp_.path();
    options_.check_paths = true;
  }

  // A run.yaml with the given target path and data section body.
  std::string Yaml(const std::string& target_path, const std::string& data,
                   const std::string& extra = "") {
    return absl::StrCat(kName, "target: {path: \"", target_path, "\"}\n", "data: {", data, "}\n",
                        extra);
  }

  TempDir tmp_;
  std::string model_;
  std::string train_;
  RunSpecOptions options_;
};

TEST_F(RunSpecPathTest, TargetPathDoesNotExist) {
  EXPECT_THAT(ErrorOf(Yaml("models/nope", "train: train.jsonl"), options_),
              HasSubstr(absl::StrCat("run.yaml: target.path: path does not exist: ",
                                     tmp_.Join("models/nope"))));
}

TEST_F(RunSpecPathTest, TargetPathIsAFile) {
  EXPECT_THAT(ErrorOf(Yaml("train.jsonl", "train: train.jsonl"), options_),
              HasSubstr(absl::StrCat("run.yaml: target.path: must be a directory: ", train_)));
}

TEST_F(RunSpecPathTest, DataTrainDoesNotExist) {
  EXPECT_THAT(ErrorOf(Yaml("model", "train: missing.jsonl"), options_),
              HasSubstr(absl::StrCat("run.yaml: data.train: path does not exist: ",
                                     tmp_.Join("missing.jsonl"))));
}

TEST_F(RunSpecPathTest, DataTrainIsADirectory) {
  EXPECT_THAT(
      ErrorOf(Yaml("model", "train: model"), options_),
      HasSubstr(absl::StrCat("run.yaml: data.train: must be a file, not a directory: ", model_)));
}

TEST_F(RunSpecPathTest, InitFromDoesNotExist) {
  EXPECT_THAT(ErrorOf(Yaml("model", "train: train.jsonl", "drafter: {init_from: ckpt/step-100}\n"),
                      options_),
              HasSubstr(absl::StrCat("run.yaml: drafter.init_from: path does not exist: ",
                                     tmp_.Join("ckpt/step-100"))));
}

TEST_F(RunSpecPathTest, InitFromIsAFile) {
  EXPECT_THAT(
      ErrorOf(Yaml("model", "train: train.jsonl", "drafter: {init_from: train.jsonl}\n"), options_),
      HasSubstr(absl::StrCat("run.yaml: drafter.init_from: must be a directory: ", train_)));
}

TEST_F(RunSpecPathTest, TokenizerDoesNotExist) {
  EXPECT_THAT(ErrorOf(Yaml("model", "train: train.jsonl, tokenizer: tok/tokenizer.json"), options_),
              HasSubstr(absl::StrCat("run.yaml: data.tokenizer: path does not exist: ",
                                     tmp_.Join("tok/tokenizer.json"))));
}

TEST_F(RunSpecPathTest, EvalPromptsDoesNotExist) {
  EXPECT_THAT(ErrorOf(Yaml("model", "train: train.jsonl",
                           "eval: {every_steps: 100, prompts: eval.jsonl}\n"),
                      options_),
              HasSubstr(absl::StrCat("run.yaml: eval.prompts: path does not exist: ",
                                     tmp_.Join("eval.jsonl"))));
}

TEST_F(RunSpecPathTest, ReportsEveryMissingPathAtOnce) {
  std::string message = ErrorOf(
      Yaml("no-model", "train: no-train.jsonl, tokenizer: no-tok.json",
           "drafter: {init_from: no-ckpt}\neval: {every_steps: 10, prompts: no-eval.jsonl}\n"),
      options_);
  EXPECT_THAT(message, AllOf(HasSubstr("target.path: path does not exist"),
                             HasSubstr("drafter.init_from: path does not exist"),
                             HasSubstr("data.train: path does not exist"),
                             HasSubstr("data.tokenizer: path does not exist"),
                             HasSubstr("eval.prompts: path does not exist")));
  EXPECT_EQ(Lines(message).size(), 5u) << message;
}

TEST_F(RunSpecPathTest, RelativePathsResolveAgainstBaseDir) {
  tmp_.MakeDir("ckpt");
  tmp_.WriteFile("tok/tokenizer.json", "{}");
  tmp_.WriteFile("eval.jsonl", "{}\n");
  auto spec =
      Parse(Yaml("sub/../model", "train: ./train.jsonl, tokenizer: tok/tokenizer.json",
                 "drafter: {init_from: ckpt}\neval: {every_steps: 50, prompts: eval.jsonl}\n"),
            options_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->target.path, model_);
  EXPECT_EQ(spec->data.train, train_);
  EXPECT_EQ(spec->data.tokenizer, tmp_.Join("tok/tokenizer.json"));
  EXPECT_EQ(spec->drafter.init_from, tmp_.Join("ckpt"));
  EXPECT_EQ(spec->eval.prompts, tmp_.Join("eval.jsonl"));
  EXPECT_TRUE(fs::path(spec->target.path).is_absolute());
}

TEST_F(RunSpecPathTest, AbsolutePathsIgnoreBaseDir) {
  RunSpecOptions options;
  options.base_dir = "/nonexistent-base";
  auto spec = Parse(Yaml(model_, absl::StrCat("train: ", train_)), options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->target.path, model_);
  EXPECT_EQ(spec->data.train, train_);
}

TEST_F(RunSpecPathTest, CheckPathsFalseAcceptsMissingPathsButStillResolvesThem) {
  options_.check_paths = false;
  auto spec =
      Parse(Yaml("no-model", "train: data/no-train.jsonl",
                 "drafter: {init_from: no-ckpt}\neval: {every_steps: 10, prompts: e.jsonl}\n"),
            options_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->target.path, tmp_.Join("no-model"));
  EXPECT_EQ(spec->data.train, tmp_.Join("data/no-train.jsonl"));
  EXPECT_EQ(spec->drafter.init_from, tmp_.Join("no-ckpt"));
  EXPECT_EQ(spec->eval.prompts, tmp_.Join("e.jsonl"));
}

TEST_F(RunSpecPathTest, CheckPathsFalseStillRejectsUnknownBuiltins) {
  options_.check_paths = false;
  EXPECT_THAT(ErrorOf(Yaml("builtin:nope", "train: x.jsonl"), options_),
              HasSubstr("target.path: unknown builtin 'nope'"));
}

// ---------------------------------------------------------------------------------------------
// Valid inputs.

TEST(RunSpecParseTest, MinimalConfigFillsDefaults) {
  auto spec = Parse(Minimal());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "demo");
  EXPECT_EQ(spec->seed, 0);
  EXPECT_EQ(spec->target.path, "builtin:tiny-qwen3");
  EXPECT_EQ(spec->target.layer_ids, std::nullopt);
  EXPECT_EQ(spec->target.dtype, "bfloat16");
  EXPECT_EQ(spec->drafter.layers, 5);
  EXPECT_EQ(spec->drafter.block_size, 16);
  EXPECT_EQ(spec->drafter.mask_token_id, std::nullopt);
  EXPECT_EQ(spec->drafter.init_from, "");
  EXPECT_EQ(spec->data.train, "builtin:tiny-chat");
  EXPECT_EQ(spec->data.format, "chat");
  EXPECT_EQ(spec->data.tokenizer, "auto");
  EXPECT_EQ(spec->data.chat_template, "auto");
  EXPECT_EQ(spec->data.max_length, 4096);
  EXPECT_EQ(spec->batching.token_budget, 8192);
  EXPECT_EQ(spec->batching.max_anchors, 512);
  EXPECT_EQ(spec->batching.grad_accum, 1);
  EXPECT_DOUBLE_EQ(spec->optim.lr, 6.0e-4);
  EXPECT_DOUBLE_EQ(spec->optim.warmup_ratio, 0.04);
  EXPECT_EQ(spec->optim.schedule, "cosine");
  EXPECT_DOUBLE_EQ(spec->optim.epochs, 6.0);
  EXPECT_EQ(spec->optim.max_steps, 0);
  EXPECT_DOUBLE_EQ(spec->optim.clip, 1.0);
  EXPECT_DOUBLE_EQ(spec->optim.weight_decay, 0.0);
  EXPECT_THAT(spec->optim.betas, ElementsAre(0.9, 0.999));
  EXPECT_DOUBLE_EQ(spec->optim.eps, 1e-8);
  EXPECT_THAT(spec->loss.gamma, Optional(7.0));
  EXPECT_EQ(spec->placement.pairs, std::nullopt);
  EXPECT_EQ(spec->placement.transport, "auto");
  EXPECT_EQ(spec->checkpoint.every_steps, 1000);
  EXPECT_EQ(spec->checkpoint.keep, 3);
  EXPECT_EQ(spec->eval.every_steps, 0);
  EXPECT_EQ(spec->eval.prompts, "");
  EXPECT_EQ(spec->eval.max_new_tokens, 256);
}

TEST(RunSpecParseTest, GammaDefaultFollowsBlockSize) {
  auto b8 = Parse(Minimal("drafter: {block_size: 8}\n"));
  ASSERT_TRUE(b8.ok()) << b8.status();
  EXPECT_THAT(b8->loss.gamma, Optional(4.0));
  auto b10 = Parse(Minimal("drafter: {block_size: 10}\n"));
  ASSERT_TRUE(b10.ok()) << b10.status();
  EXPECT_THAT(b10->loss.gamma, Optional(5.0));
  auto b16 = Parse(Minimal("drafter: {block_size: 16}\nloss: {gamma: auto}\n"));
  ASSERT_TRUE(b16.ok()) << b16.status();
  EXPECT_THAT(b16->loss.gamma, Optional(7.0));
}

TEST(RunSpecParseTest, ExplicitGammaAllowsBlockSizeWithoutDefault) {
  auto spec = Parse(Minimal("drafter: {block_size: 12}\nloss: {gamma: 5.5}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->drafter.block_size, 12);
  EXPECT_THAT(spec->loss.gamma, Optional(5.5));
}

TEST(RunSpecParseTest, DefaultGammaTable) {
  EXPECT_THAT(DefaultGamma(16), Optional(7.0));
  EXPECT_THAT(DefaultGamma(10), Optional(5.0));
  EXPECT_THAT(DefaultGamma(8), Optional(4.0));
  EXPECT_EQ(DefaultGamma(12), std::nullopt);
}

TEST(RunSpecParseTest, BuiltinNames) {
  EXPECT_THAT(BuiltinTargets(), ::testing::Contains("tiny-qwen3"));
  EXPECT_THAT(BuiltinDatasets(), ::testing::Contains("tiny-chat"));
}

TEST(RunSpecParseTest, ExplicitValuesAreRead) {
  std::string yaml = absl::StrCat(
      "name: qwen3-8b.dflash_v2\nseed: 42\n",
      "target: {path: \"builtin:tiny-qwen3\", layer_ids: [1, 9, 17, 25, 33], dtype: float16}\n",
      "drafter: {layers: 3, block_size: 10, mask_token_id: 151669}\n",
      "data: {train: \"builtin:tiny-chat\", format: text, chat_template: llama3, max_length: "
      "2048}\n",
      "batching: {token_budget: 4096, max_anchors: 64, grad_accum: 4}\n",
      "optim: {lr: 1.0e-4, warmup_ratio: 0.1, schedule: linear, epochs: 2.5, max_steps: 300, "
      "clip: 0, weight_decay: 0.01, betas: [0.8, 0.95], eps: 1.0e-6}\n",
      "placement: {pairs: 2, transport: nccl}\n", "checkpoint: {every_steps: 50, keep: 10}\n",
      "eval: {every_steps: 100, prompts: \"builtin:tiny-chat\", max_new_tokens: 64}\n");
  auto spec = Parse(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "qwen3-8b.dflash_v2");
  EXPECT_EQ(spec->seed, 42);
  EXPECT_THAT(spec->target.layer_ids, Optional(ElementsAre(1, 9, 17, 25, 33)));
  EXPECT_EQ(spec->target.dtype, "float16");
  EXPECT_EQ(spec->drafter.layers, 3);
  EXPECT_EQ(spec->drafter.block_size, 10);
  EXPECT_THAT(spec->drafter.mask_token_id, Optional(151669));
  EXPECT_EQ(spec->data.format, "text");
  EXPECT_EQ(spec->data.chat_template, "llama3");
  EXPECT_EQ(spec->data.max_length, 2048);
  EXPECT_EQ(spec->batching.token_budget, 4096);
  EXPECT_EQ(spec->batching.max_anchors, 64);
  EXPECT_EQ(spec->batching.grad_accum, 4);
  EXPECT_DOUBLE_EQ(spec->optim.lr, 1e-4);
  EXPECT_DOUBLE_EQ(spec->optim.warmup_ratio, 0.1);
  EXPECT_EQ(spec->optim.schedule, "linear");
  EXPECT_DOUBLE_EQ(spec->optim.epochs, 2.5);
  EXPECT_EQ(spec->optim.max_steps, 300);
  EXPECT_DOUBLE_EQ(spec->optim.clip, 0.0);
  EXPECT_DOUBLE_EQ(spec->optim.weight_decay, 0.01);
  EXPECT_THAT(spec->optim.betas, ElementsAre(0.8, 0.95));
  EXPECT_DOUBLE_EQ(spec->optim.eps, 1e-6);
  EXPECT_THAT(spec->loss.gamma, Optional(5.0));
  EXPECT_THAT(spec->placement.pairs, Optional(2));
  EXPECT_EQ(spec->placement.transport, "nccl");
  EXPECT_EQ(spec->checkpoint.every_steps, 50);
  EXPECT_EQ(spec->checkpoint.keep, 10);
  EXPECT_EQ(spec->eval.every_steps, 100);
  EXPECT_EQ(spec->eval.prompts, "builtin:tiny-chat");
  EXPECT_EQ(spec->eval.max_new_tokens, 64);
}

TEST(RunSpecParseTest, AutoWordsAndNullsKeepDefaults) {
  std::string yaml =
      absl::StrCat(kName, "target: {path: \"builtin:tiny-qwen3\", layer_ids: auto}\n", kData,
                   "drafter: {mask_token_id: auto, init_from: null}\n", "loss: {gamma: auto}\n",
                   "placement: {pairs: auto}\n", "eval: {prompts: ~}\n", "checkpoint:\n");
  auto spec = Parse(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->target.layer_ids, std::nullopt);
  EXPECT_EQ(spec->drafter.mask_token_id, std::nullopt);
  EXPECT_EQ(spec->drafter.init_from, "");
  EXPECT_THAT(spec->loss.gamma, Optional(7.0));
  EXPECT_EQ(spec->placement.pairs, std::nullopt);
  EXPECT_EQ(spec->eval.prompts, "");
  EXPECT_EQ(spec->checkpoint.every_steps, 1000);
}

// ---------------------------------------------------------------------------------------------
// EmitRunSpec round trips.

// Parses `yaml`, emits it, parses the emitted text and checks that emitting again is identical.
void ExpectRoundTrip(const std::string& yaml, const RunSpecOptions& options = {}) {
  auto first = ParseRunSpec(yaml, "run.yaml", options);
  ASSERT_TRUE(first.ok()) << first.status();
  std::string emitted = EmitRunSpec(*first);
  auto second = ParseRunSpec(emitted, "emitted.yaml", options);
  ASSERT_TRUE(second.ok()) << second.status() << "\n" << emitted;
  EXPECT_EQ(EmitRunSpec(*second), emitted);
}

TEST(RunSpecEmitTest, MinimalRoundTripsByteIdentical) {
  ExpectRoundTrip(Minimal());
  auto spec = Parse(Minimal());
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::string emitted = EmitRunSpec(*spec);
  // The resolved values are written out, not "auto".
  EXPECT_THAT(emitted, HasSubstr("gamma: 7.0\n"));
  EXPECT_THAT(emitted, HasSubstr("layer_ids: auto\n"));
  EXPECT_THAT(emitted, HasSubstr("token_budget: 8192\n"));
}

TEST(RunSpecEmitTest, ExplicitValuesRoundTripByteIdentical) {
  std::string yaml = absl::StrCat(
      "name: full-run\nseed: 7\n",
      "target: {path: \"builtin:tiny-qwen3\", layer_ids: [1, 9, 17, 25, 33], dtype: float32}\n",
      "drafter: {layers: 2, block_size: 8, mask_token_id: 151669}\n",
      "data: {train: \"builtin:tiny-chat\", format: pretokenized, max_length: 1024, "
      "long_documents: split, on_bad_record: fail, prepared: /tmp/x.dfdata}\n",
      "batching: {token_budget: 1024, max_anchors: 16, grad_accum: 2}\n",
      "optim: {lr: 6e-4, warmup_ratio: 0.125, epochs: 3, clip: 0.5, weight_decay: 0.1, "
      "betas: [0.9, 0.95], eps: 1e-8}\n",
      "loss: {gamma: 3.25}\n", "placement: {pairs: 3, transport: cuda_ipc}\n",
      "eval: {every_steps: 20, prompts: \"builtin:tiny-chat\"}\n");
  ExpectRoundTrip(yaml);

  auto spec = Parse(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto again = ParseRunSpec(EmitRunSpec(*spec), "emitted.yaml", {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->target.layer_ids, Optional(ElementsAre(1, 9, 17, 25, 33)));
  EXPECT_THAT(again->drafter.mask_token_id, Optional(151669));
  EXPECT_THAT(again->placement.pairs, Optional(3));
  EXPECT_DOUBLE_EQ(again->optim.lr, 6e-4);
  EXPECT_DOUBLE_EQ(again->optim.eps, 1e-8);
  EXPECT_DOUBLE_EQ(again->optim.epochs, 3.0);
  EXPECT_THAT(again->optim.betas, ElementsAre(0.9, 0.95));
  EXPECT_THAT(again->loss.gamma, Optional(3.25));
  EXPECT_EQ(again->data.format, "pretokenized");
  EXPECT_EQ(again->placement.transport, "cuda_ipc");
}

TEST(RunSpecEmitTest, PathsRoundTripByteIdentical) {
  TempDir tmp;
  tmp.MakeDir("model dir");
  tmp.MakeDir("ckpt");
  tmp.WriteFile("train.jsonl", "{}\n");
  tmp.WriteFile("eval.jsonl", "{}\n");
  tmp.WriteFile("tokenizer.json", "{}\n");
  RunSpecOptions options;
  options.base_dir = tmp.path();
  std::string yaml =
      absl::StrCat(kName, "target: {path: \"model dir\"}\n", "drafter: {init_from: ckpt}\n",
                   "data: {train: train.jsonl, tokenizer: tokenizer.json}\n",
                   "eval: {every_steps: 5, prompts: eval.jsonl}\n");
  ExpectRoundTrip(yaml, options);
  auto spec = Parse(yaml, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // The emitted paths are absolute, so the text parses the same from any base_dir.
  auto elsewhere = ParseRunSpec(EmitRunSpec(*spec), "emitted.yaml", {});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(elsewhere->target.path, tmp.Join("model dir"));
  EXPECT_EQ(elsewhere->data.tokenizer, tmp.Join("tokenizer.json"));
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(RunSpecEmitTest, DemoConfigParsesAndRoundTrips) {
  const std::string dir = DFLASH_SOURCE_DIR "/configs";
  std::string text = ReadFileOrDie(dir + "/demo.yaml");
  ASSERT_FALSE(text.empty());
  RunSpecOptions options;
  options.base_dir = dir;
  auto spec = ParseRunSpec(text, "demo.yaml", options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "demo");
  EXPECT_EQ(spec->target.path, "builtin:tiny-qwen3");
  EXPECT_EQ(spec->target.dtype, "float32");
  EXPECT_EQ(spec->drafter.block_size, 8);
  EXPECT_THAT(spec->loss.gamma, Optional(4.0));
  EXPECT_EQ(spec->data.train, "builtin:tiny-chat");
  EXPECT_EQ(spec->optim.max_steps, 300);
  EXPECT_THAT(spec->placement.pairs, Optional(1));
  EXPECT_EQ(spec->placement.transport, "host");
  ExpectRoundTrip(text, options);
}

// Strictness beyond types and ranges: nothing a user wrote is silently dropped or taken twice.
TEST(RunSpecStrict, RepeatedKeysAreRefusedWithBothLines) {
  EXPECT_THAT(
      ErrorOf(Minimal("batching:\n  token_budget: 9000\n  token_budget: 0\n")),
      HasSubstr("run.yaml: batching.token_budget: duplicate field (line 6; first on line 5)"));
  EXPECT_THAT(ErrorOf(Minimal("data: {train: \"builtin:tiny-chat\"}\n")),
              HasSubstr("run.yaml: data: duplicate field"));
}

TEST(RunSpecStrict, SecondYamlDocumentIsRefused) {
  EXPECT_THAT(
      ErrorOf(Minimal("---\nname: other\n")),
      HasSubstr("run.yaml: holds 2 YAML documents (separated by ---); it must hold exactly one"));
}

TEST(RunSpecStrict, EmptyRequiredStringsAreRefused) {
  EXPECT_THAT(ErrorOf(absl::StrCat("name: \"\"\n", kTarget, kData)),
              HasSubstr("run.yaml: name: required field is empty"));
  EXPECT_THAT(ErrorOf(WithTarget("path: \"\"")),
              HasSubstr("run.yaml: target.path: required field is empty"));
  EXPECT_THAT(ErrorOf(WithData("train: \"\"")),
              HasSubstr("run.yaml: data.train: required field is empty"));
}

TEST(RunSpecStrict, NonMappingDocumentReportsOnlyThat) {
  EXPECT_THAT(Lines(ErrorOf("- a\n- b\n")),
              ElementsAre("run.yaml: (document): must be a mapping of fields, got a list"));
}

TEST(RunSpecEmit, FloatsCarryADotForYaml11Readers) {
  auto spec = Parse(Minimal("optim: {lr: 6.0e-4, eps: 1.0e-8, epochs: 6}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string text = EmitRunSpec(*spec);
  EXPECT_THAT(text, HasSubstr("lr: 6.0e-04\n"));
  EXPECT_THAT(text, HasSubstr("eps: 1.0e-08\n"));
  EXPECT_THAT(text, HasSubstr("epochs: 6.0\n"));
}

}  // namespace
}  // namespace dflash::config
