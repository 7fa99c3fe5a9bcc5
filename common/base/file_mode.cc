#include "common/base/file_mode.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dflash {
namespace {

std::atomic<mode_t> applied{022};

}  // namespace

absl::StatusOr<mode_t> ParseUmask(const std::string& octal) {
  mode_t mask = 0;
  bool ok = !octal.empty() && octal.size() <= 4;
  for (char c : octal) {
    if (c < '0' || c > '7') ok = false;
    mask = static_cast<mode_t>(mask * 8 + static_cast<mode_t>(c - '0'));
  }
  if (!ok || mask > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("umask: '", octal, "' is not an octal mode of at most 0777 (e.g. 077)"));
  }
  return mask;
}

absl::Status ApplyUmask(const std::string& octal) {
  absl::StatusOr<mode_t> mask = ParseUmask(octal);
  if (!mask.ok()) return mask.status();
  ::umask(*mask);
  applied.store(*mask);
  return absl::OkStatus();
}

mode_t NewFileMode() { return static_cast<mode_t>(0666 & ~applied.load()); }

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the ", what));
  }
  const bool own_group_reads = (st.st_mode & 070) == 040 && st.st_gid == ::getegid();
  if ((st.st_mode & 007) != 0 || ((st.st_mode & 070) != 0 && !own_group_reads)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the ", what, " is readable by others; chmod 600 it"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the ", what));
  }
  if (absl::StripAsciiWhitespace(contents).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the ", what, " is empty"));
  }
  return contents;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadSecretFile(path, "token file");
  if (!contents.ok()) return contents.status();
  const std::string line = contents->substr(0, contents->find('\n'));
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the token file is empty"));
  }
  return token;
}

}  // namespace dflash
