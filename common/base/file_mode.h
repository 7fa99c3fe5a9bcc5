// Permissions of what the processes write (the run store, checkpoints and logs are not
// readable by other users unless configured). Each process applies its configured umask once at
// start, before any thread (`umask` in the coordinator's and workers' configs, default 077:
// private to the service's user); writers that set a mode explicitly take it from here.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dflash {

// `octal` ("077", "022"; at most 0777) as a mode; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<mode_t> ParseUmask(const std::string& octal);

// ParseUmask, then makes it the process's umask.
absl::Status ApplyUmask(const std::string& octal);

// Mode for a new regular file: 0666 without the applied umask (0644 before any ApplyUmask).
mode_t NewFileMode();

// A secret's file (a TLS private key): all of it; INVALID_ARGUMENT naming the file and `what`
// when it cannot be read, is empty, is readable or writable by others, writable by its group,
// or readable by a group other than this process's (chmod 600 it). Read access for the process's
// own group is allowed: Kubernetes mounts a Secret as mode 0440 with the pod's fsGroup.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// A bearer token's file: its first line, trimmed; INVALID_ARGUMENT naming the file
// when it cannot be read, is empty, or is readable by group or others (chmod 600 it).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace dflash
