// Test-only: another process on the GPU, as on a shared node. Not installed, not a product binary.
//
//   dflash-test-gpu-hog --gpu N --measure --out FILE
//       writes {"free": B, "total": B} (cudaMemGetInfo from a process with its own context) and
//       exits.
//   dflash-test-gpu-hog --gpu N --leave BYTES --out FILE
//       allocates all of the GPU's free memory but BYTES (cudaMalloc, outside any caching
//       allocator), writes {"free_before": B, "held": B, "free": B}, then holds it until SIGTERM
//       or SIGINT (or SIGKILL: the driver frees it when the process ends).
//   dflash-test-gpu-hog --gpu N --hold BYTES --go GO --out FILE
//       makes its CUDA context, writes {"ready": true} to FILE.ready, waits for the file GO to
//       exist, then allocates BYTES (whatever else the GPU's other processes take meanwhile),
//       writes {"free_before": B, "held": B, "free": B} and holds it as above: memory taken from
//       a run that has already been admitted. Fewer bytes held than asked means another process
//       got there first.
//
// FILE is written to FILE.tmp and renamed, so that a reader never sees half of it.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_hog: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

bool WriteJson(const std::string& path, const std::string& body) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << body << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: dflash-test-gpu-hog --gpu N (--measure | --leave BYTES | --hold BYTES --go "
               "GO) --out FILE\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int gpu = 0;
  long long leave = -1, hold = -1;
  bool measure = false;
  std::string out, go;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--measure") {
      measure = true;
    } else if (i + 1 < argc && a == "--gpu") {
      gpu = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--leave") {
      leave = std::atoll(argv[++i]);
    } else if (i + 1 < argc && a == "--hold") {
      hold = std::atoll(argv[++i]);
    } else if (i + 1 < argc && a == "--go") {
      go = argv[++i];
    } else if (i + 1 < argc && a == "--out") {
      out = argv[++i];
    } else {
      return Usage();
    }
  }
  if (out.empty() || (measure ? 1 : 0) + (leave >= 0 ? 1 : 0) + (hold >= 0 ? 1 : 0) != 1 ||
      (hold >= 0) == go.empty()) {
    return Usage();
  }
  // Blocked before any thread exists (the CUDA runtime starts some), so that sigwait gets them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  if (!Check(cudaSetDevice(gpu), "cudaSetDevice") || !Check(cudaFree(nullptr), "context")) {
    return 1;
  }
  size_t free_before = 0, total = 0;
  if (hold >= 0) {
    if (!WriteJson(out + ".ready", "{\"ready\": true}")) return 1;
    // Polled, not watched: the signal file appears once, and 2 ms is far below the time a
    // worker takes to load a model.
    while (access(go.c_str(), F_OK) != 0) usleep(2000);
  }
  if (!Check(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo")) return 1;
  if (measure) {
    return WriteJson(out, "{\"free\": " + std::to_string(free_before) +
                              ", \"total\": " + std::to_string(total) + "}")
               ? 0
               : 1;
  }
  // Pieces of 1 GiB, then smaller ones down to 2 MiB, until only `leave` bytes are free (or
  // `hold` bytes are held): one allocation of everything may fail where pieces fit.
  std::vector<void*> held;
  size_t held_bytes = 0;
  for (size_t piece = size_t{1} << 30; piece >= (size_t{2} << 20); piece /= 2) {
    for (;;) {
      size_t free_now = 0;
      if (!Check(cudaMemGetInfo(&free_now, &total), "cudaMemGetInfo")) return 1;
      if (hold >= 0 ? held_bytes + piece > static_cast<size_t>(hold)
                    : free_now < static_cast<size_t>(leave) + piece) {
        break;
      }
      void* p = nullptr;
      if (cudaMalloc(&p, piece) != cudaSuccess) {
        cudaGetLastError();  // clear it: a smaller piece may still fit
        break;
      }
      held.push_back(p);
      held_bytes += piece;
    }
  }
  size_t free_after = 0;
  if (!Check(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo")) return 1;
  if (!WriteJson(out, "{\"free_before\": " + std::to_string(free_before) +
                          ", \"held\": " + std::to_string(held_bytes) +
                          ", \"free\": " + std::to_string(free_after) + "}")) {
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  for (void* p : held) cudaFree(p);
  return 0;
}
