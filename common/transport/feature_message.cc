#include "common/transport/feature_message.h"

#include <zlib.h>

#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dflash::transport {
namespace {

constexpr uint32_t kMagic = 0x46464644;  // "DFFF" little-endian
constexpr uint32_t kVersion = 2;         // 2: DeviceFeatureRef carries the features' checksum
constexpr uint32_t kDeviceFlag = 0x100;  // in Header.dtype: features by DeviceFeatureRef

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t dtype;  // FeatureDType, | kDeviceFlag when the features stay on the device
  uint32_t crc32;  // over every byte after the header
  int64_t tokens;
  int64_t pieces;
  int64_t feature_dim;
  int64_t body_bytes;
};
static_assert(sizeof(Header) == 48, "fixed header layout");

template <typename T>
void Put(uint8_t** p, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(*p, v.data(), v.size() * sizeof(T));
  *p += v.size() * sizeof(T);
}

template <typename T>
void Take(const uint8_t** p, int64_t n, std::vector<T>* v) {
  v->resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(v->data(), *p, static_cast<size_t>(n) * sizeof(T));
  *p += static_cast<size_t>(n) * sizeof(T);
}

// Body: input_ids i32[T], positions i32[T], doc_ids i32[T], cu_seqlens i32[b+1], loss_mask u8[T],
// zero padding to 8 bytes, then features [T, F] (inline) or a DeviceFeatureRef (device).
size_t MetaBytes(int64_t t, int64_t b) {
  const size_t n =
      3 * 4 * static_cast<size_t>(t) + 4 * static_cast<size_t>(b + 1) + static_cast<size_t>(t);
  return (n + 7) & ~size_t{7};
}

size_t BodyBytes(int64_t t, int64_t b, int64_t f, size_t elt, bool device) {
  return MetaBytes(t, b) + (device ? sizeof(DeviceFeatureRef)
                                   : static_cast<size_t>(t) * static_cast<size_t>(f) * elt);
}

absl::Status CheckBatch(const batching::PackedBatch& batch, int64_t feature_dim) {
  const int64_t t = static_cast<int64_t>(batch.input_ids.size());
  const int64_t b = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  if (b < 0 || static_cast<int64_t>(batch.positions.size()) != t ||
      static_cast<int64_t>(batch.doc_ids.size()) != t ||
      static_cast<int64_t>(batch.loss_mask.size()) != t || feature_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("feature message: inconsistent batch (", t,
                                                   " tokens, ", b, " pieces, ", feature_dim,
                                                   " feature columns)"));
  }
  return absl::OkStatus();
}

// Writes the header (without its CRC) and the metadata; returns where the payload goes.
uint8_t* WriteMeta(const batching::PackedBatch& batch, int64_t feature_dim, uint32_t dtype_word,
                   size_t body, std::vector<uint8_t>* out) {
  const int64_t t = static_cast<int64_t>(batch.input_ids.size());
  const int64_t b = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  out->assign(sizeof(Header) + body, 0);
  uint8_t* p = out->data() + sizeof(Header);
  Put(&p, batch.input_ids);
  Put(&p, batch.positions);
  Put(&p, batch.doc_ids);
  Put(&p, batch.cu_seqlens);
  Put(&p, batch.loss_mask);
  const Header h{kMagic, kVersion, dtype_word, 0, t, b, feature_dim, static_cast<int64_t>(body)};
  std::memcpy(out->data(), &h, sizeof(h));
  return out->data() + sizeof(Header) + MetaBytes(t, b);
}

// Computes the CRC-32 of the body and stores it in the header.
uint32_t Seal(std::vector<uint8_t>* out) {
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), out->data() + sizeof(Header), out->size() - sizeof(Header)));
  std::memcpy(out->data() + offsetof(Header, crc32), &crc, sizeof(crc));
  return crc;
}

}  // namespace

size_t FeatureDTypeSize(FeatureDType dtype) {
  switch (dtype) {
    case FeatureDType::kFloat32:
      return 4;
    case FeatureDType::kBFloat16:
    case FeatureDType::kFloat16:
      return 2;
  }
  return 0;
}

size_t MaxFeatureMessageBytes(int64_t token_budget, int64_t feature_dim, FeatureDType dtype,
                              bool inline_features) {
  return sizeof(Header) + BodyBytes(token_budget, token_budget, feature_dim,
                                    FeatureDTypeSize(dtype), !inline_features);
}

absl::StatusOr<uint32_t> EncodeFeatureMessage(const batching::PackedBatch& batch,
                                              const void* features, int64_t feature_dim,
                                              FeatureDType dtype, std::vector<uint8_t>* out) {
  const size_t elt = FeatureDTypeSize(dtype);
  if (elt == 0) return absl::InvalidArgumentError("feature message: unknown dtype");
  if (absl::Status s = CheckBatch(batch, feature_dim); !s.ok()) return s;
  const int64_t t = static_cast<int64_t>(batch.input_ids.size());
  if (t > 0 && features == nullptr)
    return absl::InvalidArgumentError("feature message: no features");
  const int64_t b = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  uint8_t* p = WriteMeta(batch, feature_dim, static_cast<uint32_t>(dtype),
                         BodyBytes(t, b, feature_dim, elt, false), out);
  if (t > 0) std::memcpy(p, features, static_cast<size_t>(t * feature_dim) * elt);
  return Seal(out);
}

absl::StatusOr<uint32_t> EncodeFeatureMessageRef(const batching::PackedBatch& batch,
                                                 int64_t feature_dim, FeatureDType dtype,
                                                 const DeviceFeatureRef& ref,
                                                 std::vector<uint8_t>* out) {
  const size_t elt = FeatureDTypeSize(dtype);
  if (elt == 0) return absl::InvalidArgumentError("feature message: unknown dtype");
  if (absl::Status s = CheckBatch(batch, feature_dim); !s.ok()) return s;
  const int64_t t = static_cast<int64_t>(batch.input_ids.size());
  const int64_t b = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  uint8_t* p = WriteMeta(batch, feature_dim, static_cast<uint32_t>(dtype) | kDeviceFlag,
                         BodyBytes(t, b, feature_dim, elt, true), out);
  std::memcpy(p, &ref, sizeof(ref));
  return Seal(out);
}

absl::StatusOr<DecodedFeatures> DecodeFeatureMessage(absl::Span<const uint8_t> message) {
  Header h;
  if (message.size() < sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("feature message: ", message.size(), " bytes is shorter than its header"));
  }
  std::memcpy(&h, message.data(), sizeof(h));
  if (h.magic != kMagic) {
    return absl::InvalidArgumentError("feature message: bad magic (not a feature message)");
  }
  if (h.version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "feature message: format version ", h.version, ", this build reads version ", kVersion,
        ": the target and drafter workers of a pair must run the same dflash build"));
  }
  const bool device = (h.dtype & kDeviceFlag) != 0;
  const auto dtype = static_cast<FeatureDType>(h.dtype & ~kDeviceFlag);
  const size_t elt = FeatureDTypeSize(dtype);
  if (elt == 0 || h.tokens < 0 || h.pieces < 0 || h.pieces > h.tokens + 1 || h.feature_dim < 1 ||
      h.tokens > (int64_t{1} << 32) || h.feature_dim > (int64_t{1} << 24) ||
      h.body_bytes !=
          static_cast<int64_t>(BodyBytes(h.tokens, h.pieces, h.feature_dim, elt, device)) ||
      message.size() != sizeof(h) + static_cast<size_t>(h.body_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature message: header does not match its size (", message.size(), " bytes, ", h.tokens,
        " tokens, ", h.pieces, " pieces, ", h.feature_dim, " feature columns)"));
  }
  const uint8_t* body = message.data() + sizeof(h);
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), body, static_cast<size_t>(h.body_bytes)));
  if (crc != h.crc32) {
    return absl::DataLossError(absl::StrCat("feature message: CRC-32 ", crc, " != header's ",
                                            h.crc32, ": the features were corrupted"));
  }
  DecodedFeatures d;
  const uint8_t* p = body;
  Take(&p, h.tokens, &d.batch.input_ids);
  Take(&p, h.tokens, &d.batch.positions);
  Take(&p, h.tokens, &d.batch.doc_ids);
  Take(&p, h.pieces + 1, &d.batch.cu_seqlens);
  Take(&p, h.tokens, &d.batch.loss_mask);
  d.batch.total_tokens = h.tokens;
  if (d.batch.cu_seqlens.front() != 0 || d.batch.cu_seqlens.back() != h.tokens) {
    return absl::InvalidArgumentError("feature message: cu_seqlens does not span the tokens");
  }
  d.feature_dim = h.feature_dim;
  d.dtype = dtype;
  const uint8_t* payload = body + MetaBytes(h.tokens, h.pieces);
  if (device) {
    DeviceFeatureRef ref;
    std::memcpy(&ref, payload, sizeof(ref));
    d.device = ref;
  } else {
    d.features = payload;
  }
  d.crc32 = crc;
  return d;
}

}  // namespace dflash::transport
