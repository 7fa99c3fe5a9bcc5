// What travels from a target worker to its drafter for one micro-batch: the packed batch the
// target ran (token ids, loss mask, document offsets, positions, document ids) and its features
// [T, K*H], in one flat byte message with a fixed header and a CRC-32 over everything after it.
// The transport carries the batch id beside the message (shm_ring.h); the message itself is
// checked for size, shape and checksum on decode, so a torn or foreign slot is refused, never
// trained on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batching/packed_batch.h"

namespace dflash::transport {

// Element type of the features (the target's dtype).
enum class FeatureDType : uint32_t { kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3 };
size_t FeatureDTypeSize(FeatureDType dtype);

// Where a cuda_ipc message's features are: a peer's device buffer (cuda_ipc.h), rows of
// feature_dim elements from `offset` bytes into it.
struct DeviceFeatureRef {
  std::array<uint8_t, 64> ipc_handle{};  // cuda_ipc; zero over nccl (the features follow)
  uint64_t offset = 0;
  // feature_checksum.h over the T * feature_dim elements as the target wrote them: the drafter
  // recomputes it before training on them.
  uint64_t checksum_sum = 0;
  uint64_t checksum_weighted = 0;
};

// The largest message for a micro-batch of at most `token_budget` tokens (and as many pieces);
// `inline_features` false: the features travel by DeviceFeatureRef, not in the message.
size_t MaxFeatureMessageBytes(int64_t token_budget, int64_t feature_dim, FeatureDType dtype,
                              bool inline_features = true);

// Writes the message into `out` (resized). `features` holds T * feature_dim elements of `dtype`,
// row-major, T = batch.input_ids.size(). Returns the CRC-32 written into the header.
absl::StatusOr<uint32_t> EncodeFeatureMessage(const batching::PackedBatch& batch,
                                              const void* features, int64_t feature_dim,
                                              FeatureDType dtype, std::vector<uint8_t>* out);

// The same message whose features stay in a device buffer: only `ref` travels. The CRC-32 covers
// the packed batch and the reference (with the features' own checksum), not the feature values.
absl::StatusOr<uint32_t> EncodeFeatureMessageRef(const batching::PackedBatch& batch,
                                                 int64_t feature_dim, FeatureDType dtype,
                                                 const DeviceFeatureRef& ref,
                                                 std::vector<uint8_t>* out);

struct DecodedFeatures {
  batching::PackedBatch batch;  // input_ids, loss_mask, cu_seqlens, positions, doc_ids
  int64_t feature_dim = 0;
  FeatureDType dtype = FeatureDType::kFloat32;
  const uint8_t* features = nullptr;       // T * feature_dim elements, inside the decoded message
  std::optional<DeviceFeatureRef> device;  // set instead of `features` by EncodeFeatureMessageRef
  uint32_t crc32 = 0;
};

// DATA_LOSS for a checksum mismatch, INVALID_ARGUMENT for a malformed header or sizes.
absl::StatusOr<DecodedFeatures> DecodeFeatureMessage(absl::Span<const uint8_t> message);

}  // namespace dflash::transport
