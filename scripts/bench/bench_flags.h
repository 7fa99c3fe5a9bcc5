// Command-line flags of the benchmark programs: "--name value" pairs, read by name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace dflash::bench {

inline std::string StrFlag(int argc, char** argv, const char* name, const std::string& def = "") {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return def;
}

inline int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string s = StrFlag(argc, argv, name);
  return s.empty() ? def : std::atoll(s.c_str());
}

// Exits (status 1) naming the first argument that is not a known flag followed by its value: a
// mistyped flag is refused, never silently left at its default.
inline void RequireKnownFlags(int argc, char** argv, std::initializer_list<const char*> known,
                              const char* program) {
  for (int i = 1; i < argc; i += 2) {
    bool ok = false;
    for (const char* k : known) ok = ok || std::strcmp(argv[i], k) == 0;
    if (!ok || i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s '%s' (flags:", program,
                   ok ? "no value after" : "unknown argument", argv[i]);
      for (const char* k : known) std::fprintf(stderr, " %s", k);
      std::fprintf(stderr, ")\n");
      std::exit(1);
    }
  }
}

// Exits (status 1) naming `flag` unless `value` is one of `allowed`: a misspelt choice (e.g.
// "--dtype fp16") is refused, never read as the default.
inline void RequireOneOf(const std::string& value, std::initializer_list<const char*> allowed,
                         const char* flag, const char* program) {
  for (const char* a : allowed) {
    if (value == a) return;
  }
  std::fprintf(stderr, "%s: %s '%s' is not one of:", program, flag, value.c_str());
  for (const char* a : allowed) std::fprintf(stderr, " %s", a);
  std::fprintf(stderr, "\n");
  std::exit(1);
}

}  // namespace dflash::bench
