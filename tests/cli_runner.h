// Runs the gemma4rt binary (GEMMA4RT_BINARY, set by CMakeLists.txt) for the CLI tests.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace g4::test_util {

struct CliResult {
  int status;       // exit status, -1 if the command could not run or did not exit normally
  std::string out;  // stdout and stderr together
};

// `gemma4rt ARGS 2>&1` through the shell (args are not escaped).
inline CliResult RunCli(const std::string& args) {
  const std::string cmd = std::string(GEMMA4RT_BINARY) + " " + args + " 2>&1";
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

}  // namespace g4::test_util
