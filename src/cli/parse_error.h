// CLI11 parse errors for the commands (main.cc, bench.cc, serve.cc).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace g4::cli {

// app.exit(e) (CLI11's message on stderr, or --help's text; returns the exit code: 0 for --help,
// else CLI11's ExitCodes), except that unexpected arguments are listed in the order they were
// given: Debian 12's CLI11 2.1.2 writes ExtrasError's list reversed ("not expected: 2 -n hi -p"
// for `-p hi -n 2`; its rjoin, fixed in CLI11 2.2).
inline int ExitOnParseError(CLI::App& app, const CLI::ParseError& e) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const std::vector<std::string> rest = app.remaining(/*recurse=*/true);
    if (!rest.empty()) {
      std::string list;
      for (const std::string& a : rest) list += (list.empty() ? "" : " ") + a;
      std::fprintf(stderr, "The following argument%s not expected: %s\nRun with --help for more information.\n",
                   rest.size() > 1 ? "s were" : " was", list.c_str());
      return e.get_exit_code();
    }
  }
  return app.exit(e);
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

}  // namespace g4::cli
