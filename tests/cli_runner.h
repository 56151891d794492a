// Runs the gemma4rt binary (GEMMA4RT_BINARY, set by CMakeLists.txt) for the CLI tests.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace g4::test_util {

struct CliResult {
  int status;       // exit status, -1 if the command could not run or did not exit normally
  std::string out;  // stdout and stderr together
};

// `SCRIPT 2>&1` through the shell (sh -c; `$BIN` in it is the gemma4rt binary).
inline CliResult RunSh(const std::string& script) {
  const std::string cmd = "BIN='" + std::string(GEMMA4RT_BINARY) + "'; " + script + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// `gemma4rt ARGS 2>&1` through the shell (args are not escaped).
inline CliResult RunCli(const std::string& args) { return RunSh("\"$BIN\" " + args); }

// The JSON object `bench --json` printed in `r.out` (from the first line that is "{" to the last
// "}"; logs may come before it), or a null value when there is none.
inline nlohmann::json BenchJson(const CliResult& r) {
  const size_t b = r.out.find("{\n");
  const size_t e = r.out.rfind('}');
  if (b == std::string::npos || e == std::string::npos || e < b) return nullptr;
  return nlohmann::json::parse(r.out.substr(b, e - b + 1), nullptr, /*allow_exceptions=*/false);
}

// The JSON array that bench prints for a -t, cache-type or -ub list (after the children's logs,
// which share the output); null where there is none.
inline nlohmann::json BenchJsonArray(const CliResult& r) {
  const size_t b = r.out.find("\n[\n");
  const size_t e = r.out.rfind(']');
  if (b == std::string::npos || e == std::string::npos || e < b) return nullptr;
  return nlohmann::json::parse(r.out.substr(b + 1, e - b), nullptr, /*allow_exceptions=*/false);
}

}  // namespace g4::test_util
