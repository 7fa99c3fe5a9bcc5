// Runs a Python test oracle (HF transformers / tokenizers) once per script version and interpreter,
// writing its outputs into a directory of the build tree that every test process then reads.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/read_file.h"

namespace dflash::testing {

// Runs `python script --out out_dir extra_args` unless out_dir/stamp records this script text,
// interpreter, extra_args and extra_key (what else the outputs depend on, e.g. an input file's
// size and time); returns "" or an error text with the script's log. A file lock beside out_dir
// makes concurrent test processes (ctest -j) wait for one run instead of racing. extra_args is
// pasted into a shell command: quote its paths.
inline std::string RunPythonOracleOnce(const std::string& python, const std::string& script,
                                       const std::filesystem::path& out_dir,
                                       const std::string& extra_args = "",
                                       const std::string& extra_key = "") {
  namespace fs = std::filesystem;
  const std::string script_text = ReadFileText(script);
  if (script_text.empty()) return "cannot read " + script;
  std::string key = script_text + "\npython: " + python;
  if (!extra_args.empty() || !extra_key.empty()) {
    key += "\nargs: " + extra_args + "\nkey: " + extra_key;
  }
  fs::create_directories(out_dir.parent_path());
  const std::string lock_path = out_dir.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) return "cannot lock " + lock_path;
  std::string error;
  if (ReadFileText((out_dir / "stamp").string()) != key) {
    fs::remove_all(out_dir);
    fs::create_directories(out_dir);
    const fs::path log = out_dir / "oracle.log";
    const std::string cmd = "'" + python + "' '" + script + "' --out '" + out_dir.string() + "' " +
                            extra_args + " >'" + log.string() + "' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      error = fs::path(script).filename().string() + " failed (" + cmd + "):\n" +
              ReadFileText(log.string());
    } else {
      std::ofstream(out_dir / "stamp", std::ios::binary) << key;
    }
  }
  ::close(lock);  // releases the flock
  return error;
}

}  // namespace dflash::testing
