#include "common/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/checkpoint/test_files.h"

namespace dflash::model {
namespace {

using ::dflash::model::testing::RawSafetensors;
using ::dflash::model::testing::ReadFile;
using ::dflash::model::testing::TempDir;
using ::dflash::model::testing::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(DType, NamesSizesAndParsing) {
  EXPECT_STREQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32,
                  DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_THAT(Message(ParseDType("F8_E4M3").status()), HasSubstr("unknown dtype 'F8_E4M3'"));
  EXPECT_FALSE(ParseDType("bf16").ok());  // case matters, as in the reference implementation
}

TEST(WriteSafetensors, RoundTripIsBitExactForF32F16BF16) {
  TempDir dir;
  const std::string path = dir.Join("model.safetensors");
  // Random bytes include NaN and denormal patterns: the round trip must not touch any of them.
  auto f32 = RandomBytes(3 * 5 * 4, 1);
  auto f16 = RandomBytes(7 * 2, 2);
  auto bf16 = RandomBytes(2 * 3 * 4 * 2, 3);
  std::vector<TensorToWrite> tensors = {
      {"layers.0.mlp.up_proj.weight", DType::kF32, {3, 5}, f32.data(), f32.size()},
      {"norm.weight", DType::kF16, {7}, f16.data(), f16.size()},
      {"fc.weight", DType::kBF16, {2, 3, 4}, bf16.data(), bf16.size()},
      {"empty", DType::kBF16, {0, 4}, nullptr, 0},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsHeader& h = (*file)->header();
  EXPECT_EQ(h.data_offset % 8, 0u);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), 4u);
  for (size_t i = 1; i < h.tensors.size(); ++i) EXPECT_LE(h.tensors[i - 1].end, h.tensors[i].begin);

  for (const TensorToWrite& t : tensors) {
    auto view = (*file)->Get(t.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->info->name, t.name);
    EXPECT_EQ(view->info->dtype, t.dtype);
    EXPECT_EQ(view->info->shape, t.shape);
    EXPECT_EQ(view->file, path);
    ASSERT_EQ(view->info->end - view->info->begin, t.nbytes);
    if (t.nbytes > 0) EXPECT_EQ(std::memcmp(view->data, t.data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ((*file)->Get("fc.weight")->info->numel(), 24);

  // The header is space-padded JSON, as the reference writer pads it.
  std::string bytes = ReadFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  // No temporary file is left next to the checkpoint.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(WriteSafetensors, RefusesInconsistentTensors) {
  TempDir dir;
  const std::string path = dir.Join("bad.safetensors");
  std::vector<uint8_t> buf(16);
  absl::Status s = WriteSafetensors(path, {{"w", DType::kF32, {3}, buf.data(), 16}}, {});
  EXPECT_THAT(Message(s), AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("needs 12")));
  s = WriteSafetensors(
      path, {{"w", DType::kU8, {4}, buf.data(), 4}, {"w", DType::kU8, {4}, buf.data(), 4}}, {});
  EXPECT_THAT(Message(s), HasSubstr("written twice"));
  s = WriteSafetensors(path, {{"w", DType::kU8, {-1}, buf.data(), 0}}, {});
  EXPECT_THAT(Message(s), HasSubstr("bad shape [-1]"));
  s = WriteSafetensors(dir.Join("no/such/dir/x.safetensors"), {}, {});
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsFile, ReadsAFileWrittenByTheReferenceImplementation) {
  // Written by safetensors 0.8.0 (Python, torch): see fuzz_corpus/reference_torch.safetensors.
  auto file =
      SafetensorsFile::Open(std::string(DFLASH_FUZZ_CORPUS_DIR) + "/reference_torch.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->header().metadata.at("format"), "pt");
  auto fc = (*file)->Get("fc.weight");
  ASSERT_TRUE(fc.ok());
  EXPECT_THAT(fc->info->shape, ElementsAre(2, 3));
  const float* f = static_cast<const float*>(fc->data);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f[i], static_cast<float>(i));
  auto norm = (*file)->Get("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->info->dtype, DType::kBF16);
  const uint16_t* b = static_cast<const uint16_t*>(norm->data);
  EXPECT_THAT(std::vector<uint16_t>(b, b + 4), ElementsAre(0x0000, 0x3f80, 0x4000, 0x4040));
  EXPECT_EQ(*static_cast<const int64_t*>((*file)->Get("ids")->data), 7);
  EXPECT_THAT(Message((*file)->Get("nope").status()), HasSubstr("no tensor 'nope'"));
}

// Writes `bytes` as <dir>/model.safetensors, opens it and returns the error message (the test
// fails when it opens).
std::string OpenError(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.Join("model.safetensors");
  WriteFile(path, bytes);
  auto file = SafetensorsFile::Open(path);
  EXPECT_FALSE(file.ok());
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(Message(file.status()), HasSubstr(path));
  return Message(file.status());
}

constexpr const char* kNorm = R"("model.norm.weight":{"dtype":"BF16","shape":[4],)";

TEST(SafetensorsBadInput, TruncatedFile) {
  TempDir dir;
  EXPECT_THAT(OpenError(dir, ""), HasSubstr("file is 0 bytes, shorter than the 8-byte"));
  EXPECT_THAT(OpenError(dir, std::string("\x10\0\0\0\0", 5)), HasSubstr("file is 5 bytes"));
}

TEST(SafetensorsBadInput, HeaderLengthPastEndOrHuge) {
  TempDir dir;
  std::string header = std::string("{") + kNorm + R"("data_offsets":[0,8]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 8, 1000)),
              HasSubstr("header length 1000 runs past the end of the file (" +
                        std::to_string(8 + header.size() + 8) + " bytes)"));
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 8, int64_t{1} << 40)),
              HasSubstr("is more than the 100000000-byte limit"));
  // Every byte of the length counts: 2^63 must not wrap around to something small.
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 8, INT64_MAX)), HasSubstr("limit"));
  // A header cut short inside the JSON.
  std::string file = RawSafetensors(header, 0);
  EXPECT_THAT(OpenError(dir, file.substr(0, file.size() - 3)), HasSubstr("runs past the end"));
}

TEST(SafetensorsBadInput, NotJsonOrNotAnObject) {
  TempDir dir;
  EXPECT_THAT(OpenError(dir, RawSafetensors("{\"a\":", 0)), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(OpenError(dir, RawSafetensors("[1, 2]  ", 0)),
              HasSubstr("header must be a JSON object, got array"));
  EXPECT_THAT(OpenError(dir, RawSafetensors("\"str\"", 0)), HasSubstr("got string"));
  EXPECT_THAT(OpenError(dir, RawSafetensors("{} {}", 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(OpenError(dir, RawSafetensors(std::string(100, '[') + std::string(100, ']'), 0)),
              HasSubstr("nesting deeper than"));
  EXPECT_THAT(OpenError(dir, RawSafetensors("{\"\xff\":1}", 0)), HasSubstr("not valid JSON"));
}

TEST(SafetensorsBadInput, ByteCountMismatchNamesFileTensorAndSizes) {
  // The example of the issue, through the parser directly.
  std::string header = std::string("{") + kNorm + R"("data_offsets":[10,20]}})";
  std::string bytes = RawSafetensors(header, 32);
  auto h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  bytes.size(), "model.safetensors");
  EXPECT_EQ(Message(h.status()),
            "model.safetensors: tensor 'model.norm.weight': data_offsets [10, 20] hold 10 bytes "
            "but shape [4] of BF16 needs 8");
}

TEST(SafetensorsBadInput, OffsetsOutsideTheDataArea) {
  TempDir dir;
  std::string header = std::string("{") + kNorm + R"("data_offsets":[8,16]}})";
  EXPECT_THAT(
      OpenError(dir, RawSafetensors(header, 12)),
      AllOf(HasSubstr("tensor 'model.norm.weight'"),
            HasSubstr("data_offsets [8, 16] run past the end of the data area (12 bytes)")));
  header = std::string("{") + kNorm + R"("data_offsets":[8,0]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 12)),
              AllOf(HasSubstr("tensor 'model.norm.weight'"), HasSubstr("begin is past end")));
  header = std::string("{") + kNorm + R"("data_offsets":[18446744073709551615,8]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 12)), HasSubstr("begin is past end"));
  header = std::string("{") + kNorm + R"("data_offsets":[-8,0]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 12)),
              HasSubstr("data_offsets[0] is -8, must be a non-negative integer"));
  header = std::string("{") + kNorm + R"("data_offsets":[0,8,16]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 16)), HasSubstr("got 3 elements"));
  header = std::string("{") + kNorm + R"("data_offsets":[0,8.0]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 16)),
              HasSubstr("data_offsets[1] must be a non-negative integer, got number"));
}

TEST(SafetensorsBadInput, OverlappingTensorsNameBoth) {
  TempDir dir;
  std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 12)),
              HasSubstr("tensor 'b' [4, 12] overlaps tensor 'a' [0, 8]"));
  // Same range twice.
  header = R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
           R"("a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 4)), HasSubstr("overlaps"));
  // Overlap hidden behind an empty tensor sitting between the two.
  header = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
           R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  EXPECT_THAT(OpenError(dir, RawSafetensors(header, 8)),
              HasSubstr("tensor 'b' [4, 8] overlaps tensor 'a' [0, 8]"));
}

TEST(SafetensorsBadInput, DtypeShapeAndKeys) {
  TempDir dir;
  auto entry = [](const std::string& body) { return "{\"w.weight\":{" + body + "}}"; };
  EXPECT_THAT(
      OpenError(dir, RawSafetensors(entry(R"("dtype":"F7","shape":[1],"data_offsets":[0,1])"), 1)),
      AllOf(HasSubstr("tensor 'w.weight'"), HasSubstr("unknown dtype 'F7'")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(
                                 entry(R"("dtype":"U8","shape":[2,-3],"data_offsets":[0,0])"), 0)),
              AllOf(HasSubstr("tensor 'w.weight'"),
                    HasSubstr("shape[1] is -3, must be a non-negative integer")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(
                                 entry(R"("dtype":"U8","shape":[1.5],"data_offsets":[0,0])"), 0)),
              HasSubstr("shape[0] must be a non-negative integer"));
  EXPECT_THAT(OpenError(dir, RawSafetensors(entry(R"("dtype":"U8","shape":[4294967296,)"
                                                  R"(4294967296],"data_offsets":[0,0])"),
                                            0)),
              AllOf(HasSubstr("tensor 'w.weight'"), HasSubstr("more than 2^63 elements")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(entry(R"("dtype":"F64","shape":[4294967296,)"
                                                  R"(1073741824],"data_offsets":[0,0])"),
                                            0)),
              HasSubstr("needs more than 2^64 bytes"));
  EXPECT_THAT(OpenError(dir, RawSafetensors(entry(R"("dtype":"U8","shape":[1],)"
                                                  R"("data_offsets":[0,1],"offset":3)"),
                                            1)),
              AllOf(HasSubstr("tensor 'w.weight'"), HasSubstr("unknown key 'offset'")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(entry(R"("dtype":"U8","data_offsets":[0,1])"), 1)),
              AllOf(HasSubstr("tensor 'w.weight'"), HasSubstr("missing 'shape'")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(R"({"w.weight":[1]})", 0)),
              AllOf(HasSubstr("tensor 'w.weight'"), HasSubstr("entry must be an object")));
  EXPECT_THAT(OpenError(dir, RawSafetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":)"
                                            R"([0,1]},"w":{"dtype":"U8","shape":[1],)"
                                            R"("data_offsets":[1,2]}})",
                                            2)),
              HasSubstr("duplicate key 'w'"));
}

TEST(SafetensorsBadInput, Metadata) {
  TempDir dir;
  EXPECT_THAT(OpenError(dir, RawSafetensors(R"({"__metadata__":{"format":1}})", 0)),
              HasSubstr("__metadata__ 'format' must be a string, got number"));
  EXPECT_THAT(OpenError(dir, RawSafetensors(R"({"__metadata__":["pt"]})", 0)),
              HasSubstr("__metadata__ must be an object of strings"));
}

TEST(SafetensorsHeader, AcceptsEmptyZeroSizeAndPaddedHeaders) {
  std::string bytes = RawSafetensors(R"({"e":{"dtype":"BF16","shape":[0,4],"data_offsets":[3,3]},)"
                                     R"("s":{"dtype":"U8","shape":[],"data_offsets":[2,3]},)"
                                     R"("f":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}    )",
                                     3);
  auto h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  bytes.size(), "x");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "f");  // sorted by begin
  EXPECT_EQ(h->tensors[2].name, "e");
  EXPECT_EQ(h->tensors[1].numel(), 1);  // a scalar
  bytes = RawSafetensors("{}", 0);
  h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                             bytes.size(), "x");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->tensors.empty());
  EXPECT_EQ(h->data_offset, 10u);
  // Only the header given, with the file size: enough to validate.
  bytes = RawSafetensors(R"({"f":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 8,
                             bytes.size(), "x");
  EXPECT_TRUE(h.ok()) << h.status();
  h = ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), 20, bytes.size(), "x");
  EXPECT_THAT(Message(h.status()), HasSubstr("only 20 were given"));
}

// --- Checkpoint directories ---

void WriteTensors(const std::string& path, const std::vector<std::string>& names) {
  std::vector<float> data = {1, 2, 3, 4};
  std::vector<TensorToWrite> tensors;
  for (const auto& n : names) tensors.push_back({n, DType::kF32, {4}, data.data(), 16});
  ASSERT_TRUE(WriteSafetensors(path, tensors, {}).ok());
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  WriteTensors(dir.Join("model.safetensors"), {"norm.weight", "fc.weight"});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->TensorNames(), ElementsAre("fc.weight", "norm.weight"));
  EXPECT_TRUE((*ckpt)->Has("fc.weight"));
  EXPECT_FALSE((*ckpt)->Has("lm_head.weight"));
  auto view = (*ckpt)->Get("norm.weight");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(static_cast<const float*>(view->data)[3], 4.0f);
  auto missing = (*ckpt)->Get("lm_head.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()),
              AllOf(HasSubstr(dir.path()), HasSubstr("'lm_head.weight'")));
}

constexpr const char* kIndex = R"({"metadata": {"total_size": 48}, "weight_map": {
  "a.weight": "model-00001-of-00002.safetensors",
  "b.weight": "model-00001-of-00002.safetensors",
  "c.weight": "model-00002-of-00002.safetensors"}})";

TEST(Checkpoint, ShardedIndex) {
  TempDir dir;
  WriteTensors(dir.Join("model-00001-of-00002.safetensors"), {"a.weight", "b.weight"});
  WriteTensors(dir.Join("model-00002-of-00002.safetensors"), {"c.weight", "unlisted"});
  WriteFile(dir.Join("model.safetensors.index.json"), kIndex);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->TensorNames(), ElementsAre("a.weight", "b.weight", "c.weight"));
  EXPECT_EQ((*ckpt)->Get("a.weight")->file, dir.Join("model-00001-of-00002.safetensors"));
  EXPECT_EQ((*ckpt)->Get("c.weight")->file, dir.Join("model-00002-of-00002.safetensors"));
  // Both tensors of shard 1 are views into one mapping.
  EXPECT_EQ(static_cast<const char*>((*ckpt)->Get("b.weight")->data) -
                static_cast<const char*>((*ckpt)->Get("a.weight")->data),
            16);
}

std::string CheckpointError(const TempDir& dir) {
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_FALSE(ckpt.ok());
  return ckpt.ok() ? "" : Message(ckpt.status());
}

TEST(Checkpoint, MissingShard) {
  TempDir dir;
  WriteTensors(dir.Join("model-00001-of-00002.safetensors"), {"a.weight", "b.weight"});
  WriteFile(dir.Join("model.safetensors.index.json"), kIndex);
  EXPECT_THAT(CheckpointError(dir), AllOf(HasSubstr("model.safetensors.index.json"),
                                          HasSubstr("shard 'model-00002-of-00002.safetensors'"),
                                          HasSubstr("tensor 'c.weight'"), HasSubstr("is missing")));
}

TEST(Checkpoint, TensorMissingFromItsShard) {
  TempDir dir;
  WriteTensors(dir.Join("model-00001-of-00002.safetensors"), {"a.weight"});
  WriteTensors(dir.Join("model-00002-of-00002.safetensors"), {"c.weight", "b.weight"});
  WriteFile(dir.Join("model.safetensors.index.json"), kIndex);
  EXPECT_THAT(CheckpointError(dir), AllOf(HasSubstr("assigns tensor 'b.weight'"),
                                          HasSubstr(dir.Join("model-00001-of-00002.safetensors")),
                                          HasSubstr("does not hold it")));
}

TEST(Checkpoint, IndexMayNotEscapeTheDirectory) {
  TempDir dir;
  WriteTensors(dir.Join("model-00001-of-00001.safetensors"), {"a.weight"});
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"a.weight": "../model-00001-of-00001.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir),
              AllOf(HasSubstr("tensor 'a.weight'"), HasSubstr("escapes the checkpoint directory")));
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"a.weight": "sub/../../x.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir), HasSubstr("escapes the checkpoint directory"));
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"a.weight": "/etc/passwd"}})");
  EXPECT_THAT(CheckpointError(dir), AllOf(HasSubstr("tensor 'a.weight'"),
                                          HasSubstr("'/etc/passwd' is an absolute path")));
  WriteFile(dir.Join("model.safetensors.index.json"), R"({"weight_map": {"a.weight": ""}})");
  EXPECT_THAT(CheckpointError(dir), HasSubstr("shard name is empty"));
}

TEST(Checkpoint, BadIndexFiles) {
  TempDir dir;
  WriteFile(dir.Join("model.safetensors.index.json"), R"({"weight_map": ["a"]})");
  EXPECT_THAT(CheckpointError(dir), HasSubstr("\"weight_map\" object"));
  WriteFile(dir.Join("model.safetensors.index.json"), R"({"weight_map": {"a.weight": 3}})");
  EXPECT_THAT(CheckpointError(dir), HasSubstr("weight_map 'a.weight' must name a shard file"));
  WriteFile(dir.Join("model.safetensors.index.json"), R"({"weight_map": {)");
  EXPECT_THAT(CheckpointError(dir),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not valid JSON")));
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir), HasSubstr("duplicate key 'weight_map'.'a'"));
}

TEST(Checkpoint, EmptyDirectoryAndBadShard) {
  TempDir dir;
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("neither model.safetensors nor"));
  // A corrupt shard's error names the shard file.
  WriteFile(dir.Join("model-00001-of-00001.safetensors"), "abc");
  WriteFile(dir.Join("model.safetensors.index.json"),
            R"({"weight_map": {"a.weight": "model-00001-of-00001.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir),
              HasSubstr(dir.Join("model-00001-of-00001.safetensors") + ": file is 3 bytes"));
}

}  // namespace
}  // namespace dflash::model
