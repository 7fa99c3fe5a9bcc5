// The feature message between a target and its drafter: what is encoded decodes to the same batch
// and feature bytes, and a corrupted, truncated or foreign message is refused, never decoded.
#include "common/transport/feature_message.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace dflash::transport {
namespace {

batching::PackedBatch Batch() {
  batching::PackedBatch b;
  b.input_ids = {5, 6, 7, 8, 9};
  b.loss_mask = {0, 1, 1, 0, 1};
  b.cu_seqlens = {0, 3, 5};
  b.positions = {0, 1, 2, 0, 1};
  b.doc_ids = {0, 0, 0, 1, 1};
  b.total_tokens = 5;
  return b;
}

TEST(FeatureMessageTest, RoundTripsBatchAndFeatures) {
  const batching::PackedBatch b = Batch();
  std::vector<float> features(5 * 3);
  std::iota(features.begin(), features.end(), 0.5f);
  std::vector<uint8_t> msg;
  auto crc = EncodeFeatureMessage(b, features.data(), 3, FeatureDType::kFloat32, &msg);
  ASSERT_TRUE(crc.ok()) << crc.status();
  EXPECT_LE(msg.size(), MaxFeatureMessageBytes(8, 3, FeatureDType::kFloat32));
  auto d = DecodeFeatureMessage(msg);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->crc32, *crc);
  EXPECT_EQ(d->batch.input_ids, b.input_ids);
  EXPECT_EQ(d->batch.loss_mask, b.loss_mask);
  EXPECT_EQ(d->batch.cu_seqlens, b.cu_seqlens);
  EXPECT_EQ(d->batch.positions, b.positions);
  EXPECT_EQ(d->batch.doc_ids, b.doc_ids);
  EXPECT_EQ(d->feature_dim, 3);
  EXPECT_EQ(std::memcmp(d->features, features.data(), features.size() * sizeof(float)), 0);
}

TEST(FeatureMessageTest, RefusesCorruptTruncatedAndInconsistentMessages) {
  const batching::PackedBatch b = Batch();
  std::vector<uint16_t> features(5 * 4, 0x3f80);  // bf16 1.0
  std::vector<uint8_t> msg;
  ASSERT_TRUE(EncodeFeatureMessage(b, features.data(), 4, FeatureDType::kBFloat16, &msg).ok());
  std::vector<uint8_t> flipped = msg;
  flipped.back() ^= 1;  // one feature bit
  EXPECT_EQ(DecodeFeatureMessage(flipped).status().code(), absl::StatusCode::kDataLoss);
  std::vector<uint8_t> cut(msg.begin(), msg.end() - 2);
  EXPECT_EQ(DecodeFeatureMessage(cut).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeFeatureMessage(absl::Span<const uint8_t>(msg.data(), 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> foreign = msg;
  foreign[0] ^= 0xff;  // magic
  EXPECT_EQ(DecodeFeatureMessage(foreign).status().code(), absl::StatusCode::kInvalidArgument);
  // A peer of another build (the header's version word, after the magic): named, not "corrupt".
  std::vector<uint8_t> older = msg;
  older[4] = 1;
  const absl::Status version = DecodeFeatureMessage(older).status();
  EXPECT_EQ(version.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(version.message()), ::testing::HasSubstr("format version 1, this build"));
  batching::PackedBatch bad = b;
  bad.positions.pop_back();
  EXPECT_EQ(
      EncodeFeatureMessage(bad, features.data(), 4, FeatureDType::kBFloat16, &msg).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(FeatureMessageTest, DeviceReferenceTravelsInsteadOfTheFeatures) {
  const batching::PackedBatch b = Batch();
  DeviceFeatureRef ref;
  for (size_t i = 0; i < ref.ipc_handle.size(); ++i) ref.ipc_handle[i] = static_cast<uint8_t>(i);
  ref.offset = 4096;
  std::vector<uint8_t> msg;
  ASSERT_TRUE(EncodeFeatureMessageRef(b, 4096, FeatureDType::kBFloat16, ref, &msg).ok());
  EXPECT_LE(msg.size(), MaxFeatureMessageBytes(8, 4096, FeatureDType::kBFloat16, false));
  EXPECT_LT(msg.size(), 256u);  // no feature bytes
  auto d = DecodeFeatureMessage(msg);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->features, nullptr);
  ASSERT_TRUE(d->device.has_value());
  EXPECT_EQ(d->device->ipc_handle, ref.ipc_handle);
  EXPECT_EQ(d->device->offset, 4096u);
  EXPECT_EQ(d->dtype, FeatureDType::kBFloat16);
  EXPECT_EQ(d->batch.input_ids, b.input_ids);
  msg[msg.size() - 9] ^= 1;  // inside the reference: covered by the CRC
  EXPECT_EQ(DecodeFeatureMessage(msg).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dflash::transport
