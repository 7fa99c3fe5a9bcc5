// The feature transport alone (the goal "feature transport adds under 3% to the step time"; the
// nccl channel's bandwidth): a producer process (the target's side) and a consumer process
// (the drafter's side) move --batches micro-batches of [--tokens, --feature-dim] features through
// the project's feature channel (common/transport/feature_channel.h: FeatureSender and
// FeatureReceiver, the same objects the target and drafter workers use), with no model on either
// side:
//
//   cuda_ipc  producer: NextBuffer (a free slot's device buffer), the features written into it,
//             Send; consumer: Receive (the features read in place), Release. Both processes on
//             --device.
//   nccl      producer rank 0 on --device, consumer rank 1 on --peer-device (two GPUs: NCCL
//             refuses two ranks on one device).
//   host      features in host memory: Send copies them into the message (CRC-32 over it);
//             Receive checks it, the consumer clones the features out of the slot (as the drafter
//             does), Release.
//
// On the device transports the channel takes the features' checksum after they were written and
// sends it in the message, and the receiver recomputes it before handing them out (a mismatch is
// DATA_LOSS); the host transport's message CRC-32 covers its features. Besides, every batch that
// is handed out is checked bit for bit on the consumer: both processes draw the
// same two feature tensors from --seed and batch b carries tensor b % 2, so what arrives must equal
// what was sent word for word (not value for value); that check is outside the timed calls. Per
// batch the consumer times its receive (from asking for the batch to holding its features, less
// the checksum), the checksum and its release. Reported (one JSON line, and a table on stderr):
// medians over the batches after --warmup, the consumer's interval between batches, the bytes per
// batch and the channel's throughput, and with --step-ms the consumer's receive + checksum +
// release as a share of a training step of that length (the transport's cost on the drafter's
// critical path; the producer is ahead, so the receive holds no wait for the target).
//
// Usage: transport_bench [--transport cuda_ipc|nccl|host] [--tokens 8192] [--feature-dim 20480]
//          [--dtype bfloat16|float32] [--batches 50] [--warmup 5] [--device 0] [--peer-device 1]
//          [--seed 1] [--step-ms MS] [--json FILE] [--corrupt-batch B]
// --corrupt-batch B flips one bit of batch B's features on the producer after their checksum was
// taken (host: in the message after its CRC-32), through the channel's after_checksum hook: the
// consumer must count it as refused (DATA_LOSS) and mismatched (the exit status is 2 when any
// batch mismatched). On the device transports the channel is out of step after a refusal, as a
// worker's would be: the consumer stops there.
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
#include "common/transport/feature_channel.h"
#include "common/transport/feature_message.h"
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
  tr::Transport transport = tr::Transport::kCudaIpc;
  int64_t tokens = 0, feature_dim = 0, batches = 0, warmup = 0, seed = 0;
  int64_t corrupt_batch = -1;  // the producer flips one bit of this batch's features
  int device = 0, peer_device = 1;
  tr::FeatureDType dtype = tr::FeatureDType::kBFloat16;
  c10::ScalarType scalar = at::kBFloat16;
  size_t feature_bytes() const {
    return static_cast<size_t>(tokens * feature_dim) * tr::FeatureDTypeSize(dtype);
  }
  bool on_device() const { return tr::DeviceFeatures(transport); }
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
  tr::FeatureChannelOptions o;
  o.transport = g.transport;
  o.name = channel;
  o.gpu = g.on_device() ? g.device : -1;
  o.timeout = absl::Seconds(60);
  o.max_tokens = g.tokens;
  o.feature_dim = g.feature_dim;
  o.dtype = g.dtype;
  if (g.corrupt_batch >= 0) {  // one bit flipped after the checksum was taken
    o.after_checksum = [&](void* features, size_t bytes, uint64_t index) {
      if (static_cast<int64_t>(index) != g.corrupt_batch) return;
      at::from_blob(features, {static_cast<int64_t>(bytes)}, sources[0].options().dtype(at::kByte))
          .narrow(0, static_cast<int64_t>(bytes / 2), 1)
          .bitwise_xor_(1);
    };
  }
  absl::StatusOr<std::unique_ptr<tr::FeatureSender>> sender = tr::FeatureSender::Create(o);
  if (!sender.ok()) Die("producer", sender.status().ToString());
  const std::string handoff = (*sender)->handoff();
  const uint64_t size = handoff.size();
  if (write(to_consumer, &size, sizeof(size)) != sizeof(size) ||
      write(to_consumer, handoff.data(), size) != static_cast<ssize_t>(size)) {
    Die("producer", "handing the channel to the consumer failed");
  }
  close(to_consumer);

  for (int64_t b = 0; b < g.batches; ++b) {
    const at::Tensor& source = sources[b % 2];
    absl::StatusOr<void*> buffer = (*sender)->NextBuffer();
    if (!buffer.ok()) Die("producer", buffer.status().ToString());
    const void* features = source.data_ptr();
    if (*buffer != nullptr) {
      at::from_blob(*buffer, {g.tokens, g.feature_dim}, source.options()).copy_(source);
      features = *buffer;
    }
    absl::StatusOr<uint32_t> sent =
        (*sender)->Send(static_cast<uint64_t>(b), batch, features, nullptr);
    if (!sent.ok()) Die("producer", sent.status().ToString());
  }
  if (g.transport == tr::Transport::kNccl) Synchronize(g, g.device);  // the last transfers
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
  const int device_index = g.transport == tr::Transport::kNccl ? g.peer_device : g.device;
  const c10::Device device =
      g.on_device() ? c10::Device(c10::kCUDA, device_index) : c10::Device(c10::kCPU);
  const std::vector<at::Tensor> sources = Sources(g, device);
  tr::FeatureChannelOptions o;
  o.transport = g.transport;
  o.name = handoff;
  o.gpu = g.on_device() ? device_index : -1;
  o.timeout = absl::Seconds(60);
  o.open_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<tr::FeatureReceiver>> receiver = tr::FeatureReceiver::Create(o);
  if (!receiver.ok()) Die("consumer", receiver.status().ToString());
  ConsumerResult out;
  Clock::time_point last_end;
  for (int64_t b = 0; b < g.batches; ++b) {
    const auto t0 = Clock::now();
    absl::StatusOr<tr::ReceivedFeatures> got = (*receiver)->Receive(static_cast<uint64_t>(b));
    if (!got.ok() && got.status().code() == absl::StatusCode::kDataLoss) {
      // Refused by the message's CRC-32 or the features' checksum. The device transports'
      // channel is then out of step as a worker's would be: the bench stops counting there.
      ++out.checksum_mismatches;
      ++out.mismatches;
      if (g.on_device()) break;
      if (absl::Status r = (*receiver)->Release(); !r.ok()) Die("consumer", r.ToString());
      last_end = Clock::now();
      continue;
    }
    if (!got.ok()) Die("consumer", got.status().ToString());
    const int64_t t = static_cast<int64_t>(got->decoded.batch.input_ids.size());
    at::Tensor features = at::from_blob(const_cast<void*>(got->data), {t, got->decoded.feature_dim},
                                        sources[0].options());
    if (!got->on_device) features = features.clone();
    const auto t1 = Clock::now();
    if (!SameBits(features, sources[b % 2])) ++out.mismatches;  // synchronizes (equal)
    const auto t2 = Clock::now();
    if (absl::Status s = (*receiver)->Release(); !s.ok()) Die("consumer", s.ToString());
    const auto t3 = Clock::now();
    if (b >= g.warmup) {
      out.receive.push_back(Ms(t0, t1) - 1e3 * got->checksum_seconds);
      out.checksum.push_back(1e3 * got->checksum_seconds);
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
  const std::string transport = StrFlag(argc, argv, "--transport", "cuda_ipc");
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
  absl::StatusOr<tr::Transport> parsed = tr::ParseTransport(transport);
  if (!parsed.ok()) Die("flags", "--transport must be cuda_ipc, nccl or host, not " + transport);
  g.transport = *parsed;
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
  if (g.transport == tr::Transport::kNccl && g.peer_device == g.device) {
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
      transport, g.tokens, g.feature_dim, dtype, static_cast<int64_t>(bytes), g.batches, g.warmup,
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
      transport, bytes / 1e6, g.batches, r.mismatches, r.checksum_mismatches, receive, checksum,
      release, interval, bytes / (interval * 1e6), share_cell);
  std::fputs(table.c_str(), stderr);
  if (!json_path.empty()) std::ofstream(json_path) << line << "\n";
  return r.mismatches == 0 && r.checksum_mismatches == 0 ? 0 : 2;
}
