// Reading and writing Hugging Face safetensors checkpoints, without LibTorch: the file is
// memory-mapped and every tensor is a typed view into it. The header is untrusted input: it is
// validated completely (offsets inside the data area, no overlaps, byte counts consistent with
// dtype and shape) before any view is handed out. Format: 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then
// the data area; offsets are relative to the data area.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::model {

enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ... as written in safetensors headers.
const char* DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(const std::string& name);
size_t DTypeSize(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data area
  uint64_t end = 0;
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data area starts in the file
};

// Parses and validates the header of a safetensors file held in `bytes` (the whole file, or at
// least its first 8 + N bytes when `file_size` says how long the whole file is). Errors name
// `file_name` and, where one is at fault, the tensor. Used directly by the fuzz target.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                         uint64_t file_size,
                                                         const std::string& file_name);

// A read-only view of one tensor inside a mapped file.
struct TensorView {
  const TensorInfo* info = nullptr;
  const void* data = nullptr;  // info->end - info->begin bytes
  std::string file;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // NOT_FOUND naming the file when absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
};

// A Hugging Face checkpoint directory: model.safetensors, or model.safetensors.index.json with its
// shards ({"weight_map": {tensor: shard file}}). Every shard the index names is opened and checked
// to hold the tensors the index assigns to it.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  bool Has(const std::string& name) const;
  std::vector<std::string> TensorNames() const;  // sorted
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// A tensor to write: raw little-endian bytes of `numel * DTypeSize(dtype)` length.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a single-file safetensors checkpoint (tensors in the given order, 8-byte aligned header
// as the reference implementation does; list wider dtypes first to keep every tensor aligned to
// its element size, since the format allows no gaps between tensors). Written to a temporary file
// and renamed, so a crash never leaves a half-written checkpoint under `path`.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace dflash::model
