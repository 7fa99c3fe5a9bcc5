// What the target and drafter sides of a pair agree on about their feature channel.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace dflash::worker {

// Every wait on the channel (a free slot for the target, the next batch for the drafter) ends
// after this long with DEADLINE_EXCEEDED, and the worker aborts the channel: a stuck peer becomes
// an error, never a hang. Generous, because the peer may be in a long step on a large model.
inline constexpr absl::Duration kChannelTimeout = absl::Minutes(10);
// Batches in flight between the pair: the target runs at most this far ahead of the drafter.
inline constexpr uint32_t kChannelSlots = 2;

// The transport the coordinator resolved (RunContext::transport) as this worker can run it:
// host (features in the shared-memory ring) anywhere, cuda_ipc (features stay on the GPU the pair
// shares) and nccl (features from GPU to GPU, common/transport/nccl_channel.h) when this worker
// has a GPU.
inline absl::Status CheckTransport(const std::string& transport, int gpu) {
  if (transport == "host") return absl::OkStatus();
  if (transport == "cuda_ipc" || transport == "nccl") {
    if (gpu >= 0) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("placement.transport: ", transport,
                     " needs the target and drafter workers on GPUs; this worker runs on the CPU"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("placement.transport: '", transport, "' is none of host, cuda_ipc, nccl"));
}

// The checksum both sides report for a step: CRC-32 over the CRC-32s of its feature messages,
// in order, so the coordinator can see that the drafter trained on exactly what the target sent.
inline uint32_t ChainChecksum(uint32_t chain, uint32_t message_crc) {
  unsigned char b[4] = {
      static_cast<unsigned char>(message_crc), static_cast<unsigned char>(message_crc >> 8),
      static_cast<unsigned char>(message_crc >> 16), static_cast<unsigned char>(message_crc >> 24)};
  return static_cast<uint32_t>(crc32_z(chain, b, 4));
}

}  // namespace dflash::worker
