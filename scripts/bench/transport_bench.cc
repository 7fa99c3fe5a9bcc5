// The feature transport alone (the goal "feature transport adds under 3% to the step time"; the
// nccl channel's bandwidth): a producer process (the target's side) and a consumer process
// (the drafter's side) move --batches micro-batches of [--tokens, --feature-dim] features through
// the project's channel, exactly as the workers do (services/target_worker/target_runner.cc,
// services/drafter_worker/drafter_runner.cc), with no model on either side:
//
//   cuda_ipc  producer: ShmRing::WaitFree, the features written into the slot's device buffer
//             (CudaIpcSlots), SynchronizeDevice, ShmRing::Send of the message naming the slot;
//             consumer: ShmRing::Receive, DecodeFeatureMessage, CudaIpcMappings::Open (the
//             features read in place), ShmRing::Release. Both processes on --device.
//   nccl      producer rank 0 on --device, consumer rank 1 on --peer-device (two GPUs: NCCL
//             refuses two ranks on one device): NextFeatureBuffer, write, Send; ReceiveFrame,
//             DecodeFeatureMessage, ReceiveFeatures (waits for the device-to-device transfer),
//             Release.
//   host      features in host memory: EncodeFeatureMessage (features copied into the message,
//             CRC-32 over it), ShmRing::Send; Receive, DecodeFeatureMessage (CRC-32 checked), the
//             features cloned out of the slot (as the drafter does), Release.
//
// On the device transports the producer takes the features' checksum after writing them and sends
// it in the message, and the consumer recomputes it before using them, as the target and drafter
// workers do (common/transport/feature_checksum.h); the host transport's message CRC-32 covers its
// features. Besides, every batch is checked bit for bit on the consumer: both processes draw the
// same two feature tensors from --seed and batch b carries tensor b % 2, so what arrives must equal
// what was sent word for word (not value for value); that check is outside the timed calls. Per
// batch the consumer times its receive (from asking for the batch to holding its features), the
// checksum and its release. Reported (one JSON line, and a table on stderr): medians over the
// batches after --warmup, the consumer's interval between batches, the bytes per batch and the
// channel's throughput, and with --step-ms the consumer's receive + checksum + release as a share
// of a training step of that length (the transport's cost on the drafter's critical path; the
// producer is ahead, so the receive holds no wait for the target).
//
// Usage: transport_bench [--transport cuda_ipc|nccl|host] [--tokens 8192] [--feature-dim 20480]
//          [--dtype bfloat16|float32] [--batches 50] [--warmup 5] [--device 0] [--peer-device 1]
//          [--seed 1] [--step-ms MS] [--json FILE] [--corrupt-batch B]
// --corrupt-batch B flips one bit of batch B's features on the producer after their checksum was
// taken (host: in the message after its CRC-32): the consumer must count it as mismatched by both
// checks (the exit status is 2 when any batch mismatched).
#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <c10/core/Device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/batching/packed_batch.h"
#include "common/transport/cuda_ipc.h"
#include "common/transport/feature_checksum.h"
#include "common/transport/feature_message.h"
#include "common/transport/nccl_channel.h"
#include "common/transport/shm_ring.h"
#include "common/transport/shm_segment.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;

namespace tr = dflash::transport;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "transport_bench (%s): %s\n", who.c_str(), what.c_str());
  std::exit(1);
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Geometry {
  std::string transport;
  int64_t tokens = 0, feature_dim = 0, batches = 0, warmup = 0, seed = 0;
  int64_t corrupt_batch = -1;  // the producer flips one bit of this batch's features
  int device = 0, peer_device = 1;
  tr::FeatureDType dtype = tr::FeatureDType::kBFloat16;
  c10::ScalarType scalar = at::kBFloat16;
  size_t feature_bytes() const {
    return static_cast<size_t>(tokens * feature_dim) * tr::FeatureDTypeSize(dtype);
  }
  bool on_device() const { return transport != "host"; }
};

// One document of `tokens` tokens: what the message carries beside the features.
dflash::batching::PackedBatch OneDocument(int64_t tokens) {
  dflash::batching::PackedBatch b;
  b.input_ids.resize(static_cast<size_t>(tokens));
  b.loss_mask.assign(static_cast<size_t>(tokens), 1);
  b.positions.resize(static_cast<size_t>(tokens));
  b.doc_ids.assign(static_cast<size_t>(tokens), 0);
  for (int64_t i = 0; i < tokens; ++i) {
    b.input_ids[i] = static_cast<int32_t>(16 + i % 1000);
    b.positions[i] = static_cast<int32_t>(i);
  }
  b.cu_seqlens = {0, static_cast<int32_t>(tokens)};
  b.piece_document = {0};
  b.piece_begin = {0};
  b.total_tokens = tokens;
  return b;
}

// The two feature tensors batch b alternates between, the same in both processes (same seed,
// same device type).
std::vector<at::Tensor> Sources(const Geometry& g, const c10::Device& device) {
  at::manual_seed(static_cast<uint64_t>(g.seed));
  std::vector<at::Tensor> out;
  for (int i = 0; i < 2; ++i) {
    out.push_back(
        at::randn({g.tokens, g.feature_dim}, at::TensorOptions().dtype(g.scalar).device(device)));
  }
  return out;
}

// Bit-for-bit equality: the words compared as integers (0.0 / -0.0 and NaNs differ).
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  const c10::ScalarType word = a.element_size() == 2 ? at::kShort : at::kInt;
  return a.view(word).equal(b.view(word));
}

void Synchronize(const Geometry& g, int device) {
  if (!g.on_device()) return;
  if (absl::Status s = tr::SynchronizeDevice(device); !s.ok()) Die("sync", s.ToString());
}

// Runs the producer's side; `before_teardown` runs before the channel is destroyed (the
// consumer may still be reading the last slots until it reports).
void Produce(const Geometry& g, const std::string& channel, int to_consumer,
             const std::function<void()>& before_teardown) {
  const c10::Device device =
      g.on_device() ? c10::Device(c10::kCUDA, g.device) : c10::Device(c10::kCPU);
  const std::vector<at::Tensor> sources = Sources(g, device);
  const dflash::batching::PackedBatch batch = OneDocument(g.tokens);
  std::unique_ptr<tr::ShmRing> ring;
  std::unique_ptr<tr::CudaIpcSlots> slots;
  std::unique_ptr<tr::NcclChannel> nccl;
  std::string handoff = channel;  // what the consumer needs: the ring's name or the descriptor
  std::unique_ptr<tr::DeviceChecksummer> checksummer;
  if (g.on_device()) {
    absl::StatusOr<std::unique_ptr<tr::DeviceChecksummer>> c =
        tr::DeviceChecksummer::Create(g.device);
    if (!c.ok()) Die("producer", c.status().ToString());
    checksummer = *std::move(c);
  }
  if (g.transport == "nccl") {
    absl::StatusOr<std::string> d = tr::NcclChannel::NewDescriptor(
        tr::MaxFeatureMessageBytes(g.tokens, g.feature_dim, g.dtype, false), g.feature_bytes());
    if (!d.ok()) Die("producer", d.status().ToString());
    handoff = *d;
    tr::NcclChannel::Options o;
    o.rank = 0;
    o.device = g.device;
    o.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<tr::NcclChannel>> c = tr::NcclChannel::Create(*d, o);
    if (!c.ok()) Die("producer", c.status().ToString());
    nccl = *std::move(c);
  } else {
    tr::ShmRing::Options o;
    o.slots = 2;
    o.slot_bytes = tr::MaxFeatureMessageBytes(g.tokens, g.feature_dim, g.dtype, !g.on_device());
    if (g.on_device()) {
      absl::StatusOr<std::unique_ptr<tr::CudaIpcSlots>> s =
          tr::CudaIpcSlots::Create(g.device, o.slots, g.feature_bytes());
      if (!s.ok()) Die("producer", s.status().ToString());
      slots = *std::move(s);
    }
    tr::ShmSegment::Unlink(channel);
    absl::StatusOr<std::unique_ptr<tr::ShmRing>> r = tr::ShmRing::Create(channel, o);
    if (!r.ok()) Die("producer", r.status().ToString());
    ring = *std::move(r);
  }
  const uint64_t size = handoff.size();
  if (write(to_consumer, &size, sizeof(size)) != sizeof(size) ||
      write(to_consumer, handoff.data(), size) != static_cast<ssize_t>(size)) {
    Die("producer", "handing the channel to the consumer failed");
  }
  close(to_consumer);

  std::vector<uint8_t> message;
  at::Tensor host_features;
  const absl::Duration timeout = absl::Seconds(60);
  for (int64_t b = 0; b < g.batches; ++b) {
    const at::Tensor& source = sources[b % 2];
    const bool corrupt = b == g.corrupt_batch;  // one bit flipped after the checksum was taken
    absl::StatusOr<uint32_t> encoded;
    if (g.transport == "host") {
      encoded =
          tr::EncodeFeatureMessage(batch, source.data_ptr(), g.feature_dim, g.dtype, &message);
      if (!encoded.ok()) Die("producer", encoded.status().ToString());
      if (corrupt) message[message.size() / 2] ^= 1;  // inside the features: the CRC-32 catches it
      if (absl::Status s = ring->Send(static_cast<uint64_t>(b), message, timeout); !s.ok()) {
        Die("producer", s.ToString());
      }
      continue;
    }
    void* buffer = nullptr;
    if (nccl) {
      absl::StatusOr<void*> next = nccl->NextFeatureBuffer();
      if (!next.ok()) Die("producer", next.status().ToString());
      buffer = *next;
    } else {
      if (absl::Status s = ring->WaitFree(timeout); !s.ok()) Die("producer", s.ToString());
      buffer = slots->slot(static_cast<uint32_t>(b % slots->size()));
    }
    at::from_blob(buffer, {g.tokens, g.feature_dim}, source.options()).copy_(source);
    tr::DeviceFeatureRef ref;
    absl::StatusOr<tr::FeatureChecksum> sum = checksummer->Compute(buffer, g.feature_bytes());
    if (!sum.ok()) Die("producer", sum.status().ToString());
    ref.checksum_sum = sum->sum;
    ref.checksum_weighted = sum->weighted;
    if (corrupt) {
      at::from_blob(buffer, {static_cast<int64_t>(g.feature_bytes())},
                    source.options().dtype(at::kByte))
          .narrow(0, static_cast<int64_t>(g.feature_bytes() / 2), 1)
          .bitwise_xor_(1);
    }
    if (!nccl) {
      Synchronize(g, g.device);  // published only once written
      ref.ipc_handle = slots->handle(static_cast<uint32_t>(b % slots->size()));
    }
    encoded = tr::EncodeFeatureMessageRef(batch, g.feature_dim, g.dtype, ref, &message);
    if (!encoded.ok()) Die("producer", encoded.status().ToString());
    const absl::Status sent = nccl
                                  ? nccl->Send(static_cast<uint64_t>(b), message, g.feature_bytes())
                                  : ring->Send(static_cast<uint64_t>(b), message, timeout);
    if (!sent.ok()) Die("producer", sent.ToString());
  }
  if (nccl) Synchronize(g, g.device);  // the last transfers queued on the device
  before_teardown();
}

struct ConsumerResult {
  std::vector<double> receive, checksum, release, interval;
  int64_t mismatches = 0, checksum_mismatches = 0;
};

ConsumerResult Consume(const Geometry& g, int from_producer) {
  uint64_t size = 0;
  if (read(from_producer, &size, sizeof(size)) != sizeof(size)) {
    Die("consumer", "no channel from the producer");
  }
  std::string handoff(size, '\0');
  if (read(from_producer, handoff.data(), size) != static_cast<ssize_t>(size)) {
    Die("consumer", "short channel handoff");
  }
  close(from_producer);
  const int device_index = g.transport == "nccl" ? g.peer_device : g.device;
  const c10::Device device =
      g.on_device() ? c10::Device(c10::kCUDA, device_index) : c10::Device(c10::kCPU);
  const std::vector<at::Tensor> sources = Sources(g, device);
  std::unique_ptr<tr::ShmRing> ring;
  std::unique_ptr<tr::NcclChannel> nccl;
  std::unique_ptr<tr::CudaIpcMappings> mappings;
  const absl::Duration timeout = absl::Seconds(60);
  if (g.transport == "nccl") {
    tr::NcclChannel::Options o;
    o.rank = 1;
    o.device = device_index;
    o.timeout = timeout;
    absl::StatusOr<std::unique_ptr<tr::NcclChannel>> c = tr::NcclChannel::Create(handoff, o);
    if (!c.ok()) Die("consumer", c.status().ToString());
    nccl = *std::move(c);
  } else {
    absl::StatusOr<std::unique_ptr<tr::ShmRing>> r = tr::ShmRing::Open(handoff, timeout);
    if (!r.ok()) Die("consumer", r.status().ToString());
    ring = *std::move(r);
    if (g.on_device()) mappings = std::make_unique<tr::CudaIpcMappings>(g.device);
  }
  std::unique_ptr<tr::DeviceChecksummer> checksummer;
  if (g.on_device()) {
    absl::StatusOr<std::unique_ptr<tr::DeviceChecksummer>> c =
        tr::DeviceChecksummer::Create(device_index);
    if (!c.ok()) Die("consumer", c.status().ToString());
    checksummer = *std::move(c);
  }
  ConsumerResult out;
  Clock::time_point last_end;
  for (int64_t b = 0; b < g.batches; ++b) {
    const auto t0 = Clock::now();
    absl::StatusOr<absl::Span<const uint8_t>> frame =
        nccl ? nccl->ReceiveFrame(static_cast<uint64_t>(b))
             : ring->Receive(static_cast<uint64_t>(b), timeout);
    if (!frame.ok()) Die("consumer", frame.status().ToString());
    absl::StatusOr<tr::DecodedFeatures> d = tr::DecodeFeatureMessage(*frame);
    if (!d.ok() && d.status().code() == absl::StatusCode::kDataLoss && !nccl) {
      ++out.checksum_mismatches;  // the host message's CRC-32: refused, not compared
      ++out.mismatches;
      if (absl::Status s = ring->Release(); !s.ok()) Die("consumer", s.ToString());
      last_end = Clock::now();
      continue;
    }
    if (!d.ok()) Die("consumer", d.status().ToString());
    const int64_t t = static_cast<int64_t>(d->batch.input_ids.size());
    at::Tensor features;
    const at::TensorOptions options = sources[0].options();
    if (nccl) {
      absl::StatusOr<const void*> base = nccl->ReceiveFeatures(g.feature_bytes());
      if (!base.ok()) Die("consumer", base.status().ToString());
      features = at::from_blob(const_cast<void*>(*base), {t, d->feature_dim}, options);
    } else if (d->device) {
      absl::StatusOr<void*> base = mappings->Open(d->device->ipc_handle);
      if (!base.ok()) Die("consumer", base.status().ToString());
      features = at::from_blob(static_cast<uint8_t*>(*base) + d->device->offset,
                               {t, d->feature_dim}, options);
    } else {
      features =
          at::from_blob(const_cast<uint8_t*>(d->features), {t, d->feature_dim}, options).clone();
    }
    const auto t1 = Clock::now();
    if (d->device) {  // as the drafter: the target's checksum recomputed before training
      absl::StatusOr<tr::FeatureChecksum> sum =
          checksummer->Compute(features.data_ptr(), features.nbytes());
      if (!sum.ok()) Die("consumer", sum.status().ToString());
      if (*sum != tr::FeatureChecksum{d->device->checksum_sum, d->device->checksum_weighted}) {
        ++out.checksum_mismatches;
      }
    }
    const auto t1c = Clock::now();
    if (!SameBits(features, sources[b % 2])) ++out.mismatches;  // synchronizes (equal)
    const auto t2 = Clock::now();
    const absl::Status released = nccl ? nccl->Release() : ring->Release();
    if (!released.ok()) Die("consumer", released.ToString());
    const auto t3 = Clock::now();
    if (b >= g.warmup) {
      out.receive.push_back(Ms(t0, t1));
      out.checksum.push_back(Ms(t1, t1c));
      out.release.push_back(Ms(t2, t3));
      if (b > g.warmup) out.interval.push_back(Ms(last_end, t3));
    }
    last_end = t3;
  }
  Synchronize(g, device_index);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--transport", "--tokens", "--feature-dim", "--dtype", "--batches", "--warmup", "--device",
       "--peer-device", "--seed", "--step-ms", "--json", "--corrupt-batch"},
      "transport_bench");
  Geometry g;
  g.transport = StrFlag(argc, argv, "--transport", "cuda_ipc");
  g.tokens = Flag(argc, argv, "--tokens", 8192);
  g.feature_dim = Flag(argc, argv, "--feature-dim", 20480);
  g.batches = Flag(argc, argv, "--batches", 50);
  g.warmup = Flag(argc, argv, "--warmup", 5);
  g.seed = Flag(argc, argv, "--seed", 1);
  g.device = static_cast<int>(Flag(argc, argv, "--device", 0));
  g.peer_device = static_cast<int>(Flag(argc, argv, "--peer-device", 1));
  g.corrupt_batch = Flag(argc, argv, "--corrupt-batch", -1);
  const std::string dtype = StrFlag(argc, argv, "--dtype", "bfloat16");
  const double step_ms = std::atof(StrFlag(argc, argv, "--step-ms", "0").c_str());
  const std::string json_path = StrFlag(argc, argv, "--json");
  if (g.transport != "cuda_ipc" && g.transport != "nccl" && g.transport != "host") {
    Die("flags", "--transport must be cuda_ipc, nccl or host, not " + g.transport);
  }
  if (dtype == "float32") {
    g.dtype = tr::FeatureDType::kFloat32;
    g.scalar = at::kFloat;
  } else if (dtype != "bfloat16") {
    Die("flags", "--dtype must be bfloat16 or float32, not " + dtype);
  }
  if (g.tokens < 1 || g.feature_dim < 1 || g.batches < 2 || g.warmup < 0 ||
      g.warmup + 2 > g.batches) {
    Die("flags", "need --tokens >= 1, --feature-dim >= 1, 0 <= --warmup <= --batches - 2");
  }
  if (g.transport == "nccl" && g.peer_device == g.device) {
    Die("flags",
        "--transport nccl needs two GPUs: --peer-device must differ from --device (NCCL "
        "refuses two ranks on one device; cuda_ipc is for one GPU)");
  }
  const std::string channel = absl::StrCat("dflash-transport-bench-", getpid());

  // Fork before either process touches CUDA: each makes its own context.
  int handoff[2], results[2];
  if (pipe(handoff) != 0 || pipe(results) != 0) Die("setup", "pipe failed");
  const pid_t child = fork();
  if (child < 0) Die("setup", "fork failed");
  if (child == 0) {
    close(handoff[1]);
    close(results[0]);
    const ConsumerResult r = Consume(g, handoff[0]);
    // Back to the parent: mismatches, then the three series.
    auto put = [&](const void* p, size_t n) {
      if (write(results[1], p, n) != static_cast<ssize_t>(n)) std::_Exit(3);
    };
    put(&r.mismatches, sizeof(r.mismatches));
    put(&r.checksum_mismatches, sizeof(r.checksum_mismatches));
    for (const std::vector<double>* v : {&r.receive, &r.checksum, &r.release, &r.interval}) {
      const uint64_t n = v->size();
      put(&n, sizeof(n));
      put(v->data(), n * sizeof(double));
    }
    close(results[1]);
    std::_Exit(0);
  }
  close(handoff[0]);
  close(results[1]);
  const auto t0 = Clock::now();
  ConsumerResult r;
  auto get = [&](void* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t k = read(results[0], static_cast<char*>(p) + got, n - got);
      if (k <= 0) Die("producer", "the consumer died before reporting (see its message above)");
      got += static_cast<size_t>(k);
    }
  };
  Produce(g, channel, handoff[1], [&] {
    get(&r.mismatches, sizeof(r.mismatches));
    get(&r.checksum_mismatches, sizeof(r.checksum_mismatches));
    for (std::vector<double>* v : {&r.receive, &r.checksum, &r.release, &r.interval}) {
      uint64_t n = 0;
      get(&n, sizeof(n));
      v->resize(n);
      get(v->data(), n * sizeof(double));
    }
  });
  int status = 0;
  waitpid(child, &status, 0);
  const double total_s = Ms(t0, Clock::now()) / 1e3;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("producer", "the consumer failed");

  const double bytes = static_cast<double>(g.feature_bytes());
  const double receive = Median(r.receive), checksum = Median(r.checksum);
  const double release = Median(r.release), interval = Median(r.interval);
  const double share = step_ms > 0 ? (receive + checksum + release) / step_ms : 0;
  const std::string line = absl::StrFormat(
      "{\"transport\": \"%s\", \"tokens\": %d, \"feature_dim\": %d, \"dtype\": \"%s\", "
      "\"feature_bytes\": %d, \"batches\": %d, \"warmup\": %d, \"mismatched_batches\": %d, "
      "\"checksum_mismatches\": %d, \"receive_ms_median\": %.4f, \"checksum_ms_median\": %.4f, "
      "\"release_ms_median\": %.4f, \"interval_ms_median\": %.4f, \"throughput_gb_s\": %.2f, "
      "\"step_ms\": %.3f, \"share_of_step\": %.5f, \"total_s\": %.2f}",
      g.transport, g.tokens, g.feature_dim, dtype, static_cast<int64_t>(bytes), g.batches, g.warmup,
      r.mismatches, r.checksum_mismatches, receive, checksum, release, interval,
      bytes / (interval * 1e6), step_ms, share, total_s);
  std::printf("%s\n", line.c_str());
  const std::string share_cell =
      step_ms > 0 ? absl::StrFormat("%.2f%% of %.1f ms", 100 * share, step_ms) : "-";
  const std::string table = absl::StrFormat(
      "| transport | batch MB | batches | mismatched (bits / checksum) | receive ms | checksum ms "
      "| "
      "release ms | interval ms | GB/s | receive + checksum + release, share of a step |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n"
      "| %s | %.1f | %d | %d / %d | %.3f | %.3f | %.3f | %.3f | %.1f | %s |\n",
      g.transport, bytes / 1e6, g.batches, r.mismatches, r.checksum_mismatches, receive, checksum,
      release, interval, bytes / (interval * 1e6), share_cell);
  std::fputs(table.c_str(), stderr);
  if (!json_path.empty()) std::ofstream(json_path) << line << "\n";
  return r.mismatches == 0 && r.checksum_mismatches == 0 ? 0 : 2;
}
