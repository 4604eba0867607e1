// TANDEM_CHECK: programmer invariants only. Aborts with file:line. Never reachable from request
// data or file contents: those produce a Status (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

#define TANDEM_CHECK(cond)                                                          \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define TANDEM_CHECK_MSG(cond, msg)                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

#ifndef NDEBUG
#define TANDEM_DCHECK(cond) TANDEM_CHECK(cond)
#else
#define TANDEM_DCHECK(cond) ((void)0)
#endif
