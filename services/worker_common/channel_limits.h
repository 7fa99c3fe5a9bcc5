// What the target and drafter sides of a pair agree on about their feature channel
// (common/transport/feature_channel.h) and the checksum of a step's messages.
#pragma once

#include <zlib.h>

#include <cstdint>

#include "absl/time/time.h"

namespace dflash::worker {

// Every wait on the channel (a free slot for the target, the next batch for the drafter) ends
// after this long with DEADLINE_EXCEEDED, and the worker aborts the channel: a stuck peer becomes
// an error, never a hang. Generous, because the peer may be in a long step on a large model.
inline constexpr absl::Duration kChannelTimeout = absl::Minutes(10);
// Batches in flight between the pair: the target runs at most this far ahead of the drafter.
inline constexpr uint32_t kChannelSlots = 2;

// The checksum both sides report for a step: CRC-32 over the CRC-32s of its feature messages,
// in order, so the coordinator can see that the drafter trained on exactly what the target sent.
inline uint32_t ChainChecksum(uint32_t chain, uint32_t message_crc) {
  unsigned char b[4] = {
      static_cast<unsigned char>(message_crc), static_cast<unsigned char>(message_crc >> 8),
      static_cast<unsigned char>(message_crc >> 16), static_cast<unsigned char>(message_crc >> 24)};
  return static_cast<uint32_t>(crc32_z(chain, b, 4));
}

}  // namespace dflash::worker
