// G4_CHECK: internal invariants only. A failure is a bug in gemma4rt, never a user's fault, and
// stops the process with file:line. User input is validated with Status (status.h) instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define G4_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: internal check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                          \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
