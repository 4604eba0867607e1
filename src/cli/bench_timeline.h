// Per-CTA phase timestamps (kernels/cuda/timeline.cuh) read back and summarised, for the benches
// that record them: `bench-kernels --only moe` (the decode MoE alone, and the decode GEMV) and
// `bench-model` (one layer's decode MoE inside the captured batch-1 step).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::bench_timeline {

// A kernel's timeline description: its name, its marks (slot, label) and whether slots 4 + 2i /
// 5 + 2i are items (its thread 0's item i: first stage ready, tile-0 epilogue done).
struct TlKernel {
  const char* name;
  std::vector<std::pair<int, const char*>> marks;
  bool items;
};

// The decode MoE's three kernels (moe_decode.h's MoeDecodeArgs::timeline regions, in order).
const std::vector<TlKernel>& moe_kernels();

// `h`: the records of kernels.size() regions of timeline::kCtas records each, as copied back from
// the device. Times are us from the first kernel's first mark-3 reading (its dependency release);
// prints one line per kernel (each mark's min / median / max over its CTAs) and returns the same
// with every CTA's record.
nlohmann::json report(const std::vector<uint64_t>& h, const std::vector<TlKernel>& kernels, const std::string& name,
                      int64_t m);

}  // namespace tandem::bench_timeline
