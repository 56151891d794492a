// `gemma4rt bench` with lists of thread counts, cache types or prefill chunks: one child process a run.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include <sys/wait.h>
#include <unistd.h>

#include "cli/parse_error.h"

#include "cli/bench_internal.h"

namespace g4::cli::bench_internal {

Status CheckLlamaBenchOnlyFlags(const CLI::App& app, const std::vector<std::string>& args) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"-ngl", "GPU layers; gemma4rt runs on the CPU"},
      {"-pg", "prompt + generation tests; give -p and -n"},
      {"-ts", "tensor split across GPUs"},
      {"-ot", "tensor buffer overrides"},
      {"-oe", "second output format on stderr"},
      {"-nkvo", "KV cache kept off the GPU"},
      {"-dev", "devices; gemma4rt runs on the CPU"},
      {"-mmp", "mmap 0/1; gemma4rt has --mmap and --no-mmap"},
      {"-sm", "GPU split mode"},
      {"-mg", "main GPU"},
      {"-fa", "flash attention; gemma4rt's attention is always one fused pass over the cache"},
      {"-embd", "embeddings mode"},
      {"-nopo", "op offload to the GPU"},
  };
  for (size_t i = 1; i < args.size(); ++i) {
    for (const auto& [flag, what] : kFlags)
      if (args[i] == flag || args[i].rfind(std::string(flag) + "=", 0) == 0)
        return InvalidArgument(std::string(flag) + " is llama-bench's (" + what + "), not a gemma4rt bench flag; "
                               "gemma4rt bench takes -m -t -p -n -d -r -ub -ctk/-ctv -o/--json (see --help)");
    if (i + 1 < args.size() && TakesValue(app, args[i])) ++i;  // its value, as given
  }
  return OkStatus();
}

int RunSweep(const CLI::App& app, const std::vector<std::string>& args, const std::vector<int>& counts,
             const std::vector<std::string>& types, const std::vector<int>& ubatches, bool json) {
  std::vector<std::string> rest;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-t" || a == "--threads" || a == "--cache-type" || a == "--ubatch-size") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--threads=", 0) == 0 || a.rfind("--cache-type=", 0) == 0 || a.rfind("--ubatch-size=", 0) == 0 ||
        (a.size() > 2 && a.rfind("-t", 0) == 0 && a[2] != '-'))
      continue;  // -t1,2, --threads=1,2, --cache-type=f16,bf16, --ubatch-size=256,512 (-ub's rewrite)
    rest.push_back(a);
    if (i + 1 < args.size() && cli::TakesValue(app, a)) rest.push_back(args[++i]);  // its value, as given
  }
  std::vector<std::tuple<int, std::string, int>> runs;
  for (int ub : ubatches)
    for (const std::string& type : types)
      for (int t : counts) runs.emplace_back(ub, type, t);
  std::vector<std::string> objects;
  auto print_objects = [&] {
    if (!json) return;
    std::printf("[\n");
    for (size_t i = 0; i < objects.size(); ++i) std::printf("%s%s\n", objects[i].c_str(), i + 1 < objects.size() ? "," : "");
    std::printf("]\n");
    std::fflush(stdout);
  };
  for (const auto& [ub, type, t] : runs) {
    std::vector<std::string> child{"gemma4rt", "bench"};
    child.insert(child.end(), rest.begin(), rest.end());
    child.insert(child.end(), {"--ubatch-size", std::to_string(ub), "--cache-type", type, "-t", std::to_string(t)});
    std::vector<char*> cargs;
    for (std::string& a : child) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::fflush(nullptr);
    int out[2] = {-1, -1};
    if (json && pipe(out) != 0) return Fail(Internal(std::string("pipe: ") + std::strerror(errno)));
    const pid_t pid = fork();
    if (pid < 0) return Fail(Internal(std::string("fork: ") + std::strerror(errno)));
    if (pid == 0) {
      setenv(kSweepChildEnv, "1", 1);  // a child that would sweep again is refused (BenchMain)
      if (json) {
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
      }
      execv("/proc/self/exe", cargs.data());
      std::fprintf(stderr, "gemma4rt bench: cannot run /proc/self/exe: %s\n", std::strerror(errno));
      _exit(127);
    }
    std::string text;
    if (json) {
      close(out[1]);
      char buf[65536];
      for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buf, static_cast<size_t>(n));
      }
      close(out[0]);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code != 0) {  // the runs that finished still print, as one valid array
      print_objects();
      return code;
    }
    if (json) objects.push_back(std::move(text));
  }
  print_objects();
  return 0;
}

}  // namespace g4::cli::bench_internal
