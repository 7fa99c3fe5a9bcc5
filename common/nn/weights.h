// Turning tensors of a safetensors checkpoint (common/model), or tensors already in memory, into
// the model's at::Tensors: one dtype, one device, memory owned by LibTorch (the checkpoint may be
// closed afterwards). Every tensor is checked against the shape the model expects; errors name the
// tensor and, for a checkpoint, the file it came from.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/safetensors.h"

namespace dflash::nn {

// The LibTorch dtype of a safetensors dtype (all of them have one).
c10::ScalarType ToScalarType(model::DType dtype);

// Copies the viewed bytes into a new tensor of `dtype` on `device` (the source dtype is the
// file's).
at::Tensor ViewToTensor(const model::TensorView& view, c10::ScalarType dtype, c10::Device device);

// Every tensor of one .safetensors file, on the CPU in its stored dtype (test references, small
// files). Errors name the file.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadTensorFile(const std::string& path);

// "[64, 32]".
std::string ShapeString(const std::vector<int64_t>& shape);

// Where a model's named weights come from: a checkpoint on disk (WeightReader) or tensors already
// in memory (TensorMapReader). Names and shapes are the HF checkpoint's.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // OK when `name` exists with exactly `shape` and a floating-point dtype; NOT_FOUND or
  // INVALID_ARGUMENT naming the tensor otherwise.
  virtual absl::Status Check(const std::string& name, const std::vector<int64_t>& shape) const = 0;
  // Check, then the tensor converted to the source's dtype and device.
  virtual absl::StatusOr<at::Tensor> Read(const std::string& name,
                                          const std::vector<int64_t>& shape) const = 0;
};

// Reads named floating-point weights of one checkpoint.
class WeightReader : public WeightSource {
 public:
  WeightReader(const model::Checkpoint& checkpoint, c10::ScalarType dtype, c10::Device device)
      : checkpoint_(checkpoint), dtype_(dtype), device_(device) {}

  // Errors:
  //   NOT_FOUND "model.norm.weight: not in the checkpoint at /dir"
  //   INVALID_ARGUMENT "model.layers.3.self_attn.q_proj.weight: shape [64, 32] in
  //     /dir/model.safetensors, expected [128, 32]"
  absl::Status Check(const std::string& name, const std::vector<int64_t>& shape) const override;
  absl::StatusOr<at::Tensor> Read(const std::string& name,
                                  const std::vector<int64_t>& shape) const override;

 private:
  const model::Checkpoint& checkpoint_;
  c10::ScalarType dtype_;
  c10::Device device_;
};

// Reads named tensors held in memory (random weights for benchmarks, tensors built by tests).
// Read returns the tensor itself, not a copy, when it already has the dtype and device.
class TensorMapReader : public WeightSource {
 public:
  TensorMapReader(const std::map<std::string, at::Tensor>& tensors, c10::ScalarType dtype,
                  c10::Device device)
      : tensors_(tensors), dtype_(dtype), device_(device) {}
  // Takes the tensors: each Read hands its tensor over and forgets it, so that a model fusing
  // q/k/v layer by layer frees each layer's originals as it goes (a second Read of a name is
  // NOT_FOUND).
  TensorMapReader(std::map<std::string, at::Tensor>&& tensors, c10::ScalarType dtype,
                  c10::Device device)
      : owned_(std::move(tensors)),
        consume_(true),
        tensors_(owned_),
        dtype_(dtype),
        device_(device) {}

  // Errors: NOT_FOUND "model.norm.weight: not among the given tensors";
  // INVALID_ARGUMENT "...: shape [64, 32], expected [128, 32]" or "...: dtype Long, expected a
  // floating-point weight".
  absl::Status Check(const std::string& name, const std::vector<int64_t>& shape) const override;
  absl::StatusOr<at::Tensor> Read(const std::string& name,
                                  const std::vector<int64_t>& shape) const override;

 private:
  mutable std::map<std::string, at::Tensor> owned_;  // the taken tensors (consume_)
  bool consume_ = false;
  const std::map<std::string, at::Tensor>& tensors_;
  c10::ScalarType dtype_;
  c10::Device device_;
};

}  // namespace dflash::nn
