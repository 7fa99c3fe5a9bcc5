// Turning tensors of a safetensors checkpoint (common/model) into at::Tensors: one dtype, one
// device, memory owned by LibTorch (the checkpoint may be closed afterwards). Every tensor is
// checked against the shape the model expects; errors name the tensor and the file it came from.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/safetensors.h"

namespace dflash::nn {

// The LibTorch dtype of a safetensors dtype (all of them have one).
c10::ScalarType ToScalarType(model::DType dtype);

// Copies the viewed bytes into a new tensor of `dtype` on `device` (the source dtype is the
// file's).
at::Tensor ViewToTensor(const model::TensorView& view, c10::ScalarType dtype, c10::Device device);

// "[64, 32]".
std::string ShapeString(const std::vector<int64_t>& shape);

// Reads named floating-point weights of one checkpoint.
class WeightReader {
 public:
  WeightReader(const model::Checkpoint& checkpoint, c10::ScalarType dtype, c10::Device device)
      : checkpoint_(checkpoint), dtype_(dtype), device_(device) {}

  // OK when `name` exists with exactly `shape` and a floating-point dtype. Errors:
  //   NOT_FOUND "model.norm.weight: not in the checkpoint at /dir"
  //   INVALID_ARGUMENT "model.layers.3.self_attn.q_proj.weight: shape [64, 32] in
  //     /dir/model.safetensors, expected [128, 32]"
  absl::Status Check(const std::string& name, const std::vector<int64_t>& shape) const;
  // Check, then the tensor converted to the reader's dtype and device.
  absl::StatusOr<at::Tensor> Read(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  const model::Checkpoint& checkpoint_;
  c10::ScalarType dtype_;
  c10::Device device_;
};

}  // namespace dflash::nn
