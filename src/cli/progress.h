// Progress display of the weight copy at load (LoadOptions::copy_progress) for the commands.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>

#include <unistd.h>

namespace g4::cli {

// A LoadOptions::copy_progress that redraws "\r<prefix>: copying weights into memory  45% of
// 3.17 GiB" on stderr whenever the whole percentage changes, ending the line at 100%. Empty (no
// display) when stderr is not a terminal (logs get no \r lines) or when the copy is under
// 256 MiB (it takes well under a second).
inline std::function<void(size_t, size_t)> TerminalCopyProgress(const char* prefix) {
  if (!isatty(STDERR_FILENO)) return {};
  return [prefix, last = -1](size_t done, size_t total) mutable {
    if (total < (size_t{256} << 20)) return;
    const int pct = static_cast<int>(static_cast<double>(done) * 100.0 / static_cast<double>(total));
    if (pct == last) return;
    last = pct;
    std::fprintf(stderr, "\r%s: copying weights into memory %3d%% of %.2f GiB", prefix, pct,
                 static_cast<double>(total) / (1024.0 * 1024.0 * 1024.0));
    if (done >= total) std::fprintf(stderr, "\n");
  };
}

}  // namespace g4::cli
