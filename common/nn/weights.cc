#include "common/nn/weights.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"

namespace dflash::nn {

c10::ScalarType ToScalarType(model::DType dtype) {
  switch (dtype) {
    case model::DType::kF32:
      return at::kFloat;
    case model::DType::kF16:
      return at::kHalf;
    case model::DType::kBF16:
      return at::kBFloat16;
    case model::DType::kF64:
      return at::kDouble;
    case model::DType::kI64:
      return at::kLong;
    case model::DType::kI32:
      return at::kInt;
    case model::DType::kI16:
      return at::kShort;
    case model::DType::kI8:
      return at::kChar;
    case model::DType::kU8:
      return at::kByte;
    case model::DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

at::Tensor ViewToTensor(const model::TensorView& view, c10::ScalarType dtype, c10::Device device) {
  const model::TensorInfo& info = *view.info;
  const auto options = at::TensorOptions().dtype(ToScalarType(info.dtype));
  const size_t nbytes = info.end - info.begin;
  const size_t element = model::DTypeSize(info.dtype);
  at::Tensor host;
  if (reinterpret_cast<uintptr_t>(view.data) % element == 0) {
    // A view of the mapped file; the copy below (copy=true) gives LibTorch its own memory.
    host = at::from_blob(const_cast<void*>(view.data), info.shape, options);
  } else {
    // safetensors does not promise aligned offsets; copy misaligned data before reading it typed.
    host = at::empty(info.shape, options);
    std::memcpy(host.data_ptr(), view.data, nbytes);
  }
  return host.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadTensorFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, model::SafetensorsFile::Open(path));
  std::map<std::string, at::Tensor> out;
  for (const model::TensorInfo& info : file->header().tensors) {
    ASSIGN_OR_RETURN(model::TensorView view, file->Get(info.name));
    out[info.name] = ViewToTensor(view, ToScalarType(info.dtype), c10::Device(c10::kCPU));
  }
  return out;
}

absl::Status WeightReader::Check(const std::string& name, const std::vector<int64_t>& shape) const {
  if (!checkpoint_.Has(name)) {
    return absl::NotFoundError(
        absl::StrCat(name, ": not in the checkpoint at ", checkpoint_.dir()));
  }
  ASSIGN_OR_RETURN(model::TensorView view, checkpoint_.Get(name));
  if (view.info->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": shape ", ShapeString(view.info->shape),
                                                   " in ", view.file, ", expected ",
                                                   ShapeString(shape)));
  }
  switch (view.info->dtype) {
    case model::DType::kF32:
    case model::DType::kF16:
    case model::DType::kBF16:
    case model::DType::kF64:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": dtype ", model::DTypeName(view.info->dtype), " in ", view.file,
                       ", expected a floating-point weight"));
  }
}

absl::StatusOr<at::Tensor> WeightReader::Read(const std::string& name,
                                              const std::vector<int64_t>& shape) const {
  RETURN_IF_ERROR(Check(name, shape));
  ASSIGN_OR_RETURN(model::TensorView view, checkpoint_.Get(name));
  return ViewToTensor(view, dtype_, device_);
}

absl::Status TensorMapReader::Check(const std::string& name,
                                    const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.defined()) {
    return absl::NotFoundError(absl::StrCat(name, ": not among the given tensors"));
  }
  const at::Tensor& t = it->second;
  if (t.sizes().vec() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": shape ", ShapeString(t.sizes().vec()),
                                                   ", expected ", ShapeString(shape)));
  }
  if (!c10::isFloatingType(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": dtype ", c10::toString(t.scalar_type()),
                                                   ", expected a floating-point weight"));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> TensorMapReader::Read(const std::string& name,
                                                 const std::vector<int64_t>& shape) const {
  RETURN_IF_ERROR(Check(name, shape));
  if (!consume_) return tensors_.at(name).to(device_, dtype_);
  auto node = owned_.extract(name);
  return node.mapped().to(device_, dtype_);
}

}  // namespace dflash::nn
