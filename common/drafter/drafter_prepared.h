// DrafterModel's prepared batch (internal to common/drafter: drafter_model.cc and
// drafter_cached_forward.cc): everything the forward and the loss need, on the model's device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "common/drafter/drafter_attention.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/layers.h"

namespace dflash::drafter {

// Everything the forward and the loss need, on the model's device.
struct DrafterModel::Prepared {
  int64_t t = 0;            // packed rows
  int64_t n = 0;            // anchor blocks
  at::Tensor features;      // [T, K*H] as given (moved to the device)
  at::Tensor input_ids;     // [T] int64
  at::Tensor doc_ids;       // [T] int64
  at::Tensor loss_mask;     // [T] fp32 0/1, when asked for
  at::Tensor anchors;       // [n] int64, -1 padding
  at::Tensor slot0_tokens;  // [n] int64: input_ids[a_j] (MASK for padding); other slots MASK
  nn::RopeTables q_rope;    // [Q, D]: block positions pos[a_j] + k
  nn::RopeTables k_rope;    // [T + Q, D]: context positions, then block positions
  BlockMask mask;
};

}  // namespace dflash::drafter
