// CLI11 parse errors and llama.cpp's multi-letter flags for the commands (main.cc, bench.cc, serve.cc).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "runtime/engine.h"

namespace g4::cli {

// The exit status of a usage error: a command line that cannot be parsed (an unknown subcommand
// or option, a missing or malformed value, flags that exclude each other, a value out of its
// range), as getopt tools and Python's argparse exit; --help exits 0, and an error in running the
// command (a model file that does not exist, a prompt longer than the context) 1.
inline constexpr int kUsageExit = 2;

// A usage error found after parsing: "gemma4rt: error: <status>" on stderr; returns kUsageExit.
inline int FailUsage(const Status& s) {
  std::fprintf(stderr, "gemma4rt: error: %s\n", s.ToString().c_str());
  return kUsageExit;
}

// app.exit(e) (CLI11's message on stderr, or --help's text), except that unexpected arguments are
// listed in the order they were given: Debian 12's CLI11 2.1.2 writes ExtrasError's list reversed
// ("not expected: 2 -n hi -p" for `-p hi -n 2`; its rjoin, fixed in CLI11 2.2). Returns 0 for
// --help, else kUsageExit (not CLI11's own codes, 105 to 114).
inline int ExitOnParseError(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const std::vector<std::string> rest = app.remaining(/*recurse=*/true);
    if (!rest.empty()) {
      std::string list;
      for (const std::string& a : rest) list += (list.empty() ? "" : " ") + a;
      std::fprintf(stderr, "The following argument%s not expected: %s\nRun with --help for more information.\n",
                   rest.size() > 1 ? "s were" : " was", list.c_str());
      return kUsageExit;
    }
  }
  app.exit(e);
  return kUsageExit;
}

// Whether `arg` (as typed: "-p", "--prompt"; not "--prompt=x") names an option of app or of any
// of its subcommands that takes the next argument as its value (not a flag): for the rewrites of
// llama.cpp's spellings, which must leave option values alone (RewriteCacheTypeAliases).
inline bool TakesValue(const CLI::App& app, const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg.find('=') != std::string::npos) return false;
  for (const CLI::Option* o : app.get_options())
    if (!o->get_positional() && o->get_items_expected_min() > 0 && o->check_name(arg)) return true;
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>()))
    if (TakesValue(*sub, arg)) return true;
  return false;
}

// args (program name first) as app is to parse them: llama.cpp's two-letter short flag `flag`
// (and `flag=V`; e.g. -ub, -np: CLI11 short names are one letter) renamed `long_flag`, then its
// cache-type spellings joined into one --cache-type (RewriteCacheTypeAliases); the argument after
// an option of app that takes a value stays as given (TakesValue). InvalidArgument as
// RewriteCacheTypeAliases gives it; cache_type_lists: its lists (bench's sweeps).
inline StatusOr<std::vector<std::string>> RewriteLlamaSpellings(const CLI::App& app, const std::vector<std::string>& args,
                                                                const std::string& flag = "",
                                                                const std::string& long_flag = "",
                                                                bool cache_type_lists = false) {
  auto takes_value = [&app](const std::string& a) { return TakesValue(app, a); };
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!flag.empty() && a == flag) out.push_back(long_flag);
    else if (!flag.empty() && a.rfind(flag + "=", 0) == 0) out.push_back(long_flag + a.substr(flag.size()));
    else out.push_back(a);
    if (i > 0 && i + 1 < args.size() && takes_value(out.back())) out.push_back(args[++i]);
  }
  return RewriteCacheTypeAliases(std::move(out), takes_value, cache_type_lists);
}

}  // namespace g4::cli
