// Default operations hooks of ModelRunner (model_runner.h): what a CPU runner reports to the audit
// and to the start-up memory plan unless it knows better.
#include "engine/model_runner.h"

#include <fstream>

namespace tandem {

std::string host_cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0 && line.rfind("Model", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    if (!v.empty()) return v;
  }
  return "unknown CPU";
}

DeviceFacts ModelRunner::device_facts() const {
  DeviceFacts f;
  f.device = device();
  f.name = host_cpu_name();
  for (const auto& op : audit_op_classes()) {
    // One process, one rank: there is no collective to run.
    if (op == "all_reduce") f.kernels.push_back({op, "none (single rank)"});
    else if (op == "dspark_draft" && !has_draft()) f.kernels.push_back({op, "none (no draft)"});
    else f.kernels.push_back({op, "cpu-reference"});
  }
  return f;
}

void ModelRunner::plan_memory(const RunnerAllocation& alloc, MemoryPlan& plan) const {
  plan.add(kPoolKv, "host", int64_t{alloc.num_blocks} * kv_bytes_per_block(alloc.block_size, alloc.kv_cache_dtype));
  plan.add(kPoolSlotState, "host", int64_t{alloc.max_slots} * slot_state_bytes());
  if (alloc.num_snapshots > 0)
    plan.add(kPoolPrefixSnapshots, "host", int64_t{alloc.num_snapshots} * slot_state_bytes(),
             "prefix-cache slot snapshots");
}

}  // namespace tandem
