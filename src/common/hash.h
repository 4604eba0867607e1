// mix64: the splitmix64 step (add the golden-ratio increment, then the finalizer). One 64-bit
// value in, a well-mixed one out: per-request RNG streams keyed by (seed, position), default
// seeds, and the prefix cache's block-hash chain are all built from it.
#pragma once

#include <cstdint>

namespace tandem {

inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace tandem
