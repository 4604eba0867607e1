// The start-up memory plan: headroom check and report (runtime_facts.h). The floor exists because
// the seed deployments lost their service when the host's MemAvailable ran out under load on
// unified-memory GB10 nodes; refusing at start-up with the numbers is cheaper than an OOM later.
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "engine/runtime_facts.h"

namespace tandem {

int64_t MemoryPlan::planned_bytes(const std::string& domain) const {
  int64_t n = 0;
  for (const auto& p : pools)
    if (p.domain == domain) n += p.bytes;
  return n;
}

int64_t MemoryPlan::to_allocate_bytes(const std::string& domain) const {
  int64_t n = 0;
  for (const auto& p : pools)
    if (p.domain == domain && !p.already_counted) n += p.bytes;
  return n;
}

const MemoryDomain* MemoryPlan::find_domain(const std::string& domain) const {
  for (const auto& d : domains)
    if (d.domain == domain) return &d;
  return nullptr;
}

Result<int64_t> read_host_mem_available(const std::string& meminfo_path) {
  std::ifstream f(meminfo_path);
  if (!f) return make_error(StatusCode::kNotFound, "cannot read {}", meminfo_path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    int64_t kib = -1;
    std::string unit;
    in >> kib >> unit;
    if (kib < 0 || unit != "kB") return make_error(StatusCode::kDataLoss, "{}: unreadable line '{}'", meminfo_path, line);
    return kib * 1024;
  }
  return make_error(StatusCode::kNotFound, "{} has no MemAvailable line", meminfo_path);
}

HostMemoryReport read_host_memory(const std::string& meminfo_path) {
  HostMemoryReport r;
  r.source = meminfo_path + " MemAvailable";
  std::ifstream f(meminfo_path);
  std::string line;
  while (std::getline(f, line)) {
    int64_t* dst = line.rfind("MemAvailable:", 0) == 0 ? &r.available_bytes
                   : line.rfind("MemTotal:", 0) == 0   ? &r.total_bytes
                                                       : nullptr;
    if (!dst) continue;
    std::istringstream in(line.substr(line.find(':') + 1));
    int64_t kib = -1;
    std::string unit;
    in >> kib >> unit;
    if (kib >= 0 && unit == "kB") *dst = kib * 1024;
  }
  return r;
}

std::string add_gpu_domain(MemoryPlan& plan, const GpuMemoryReport& gpu, const HostMemoryReport& host) {
  plan.gpu_unified = gpu.integrated;
  if (!gpu.integrated) {
    plan.gpu_domain = gpu.device;
    plan.gpu_total_bytes = gpu.total_bytes;
    plan.domains.push_back({gpu.device, gpu.free_bytes, gpu.total_bytes, "cudaMemGetInfo"});
    return plan.gpu_domain;
  }
  plan.gpu_domain = "host";
  plan.gpu_total_bytes = gpu.total_bytes > 0 ? gpu.total_bytes : host.total_bytes;
  MemoryDomain* d = nullptr;
  for (auto& x : plan.domains)
    if (x.domain == "host") d = &x;
  if (!d) {
    plan.domains.push_back({"host", -1, -1, ""});
    d = &plan.domains.back();
  }
  d->available_bytes = host.available_bytes;
  d->total_bytes = host.total_bytes;
  d->source = fmt::format("{}; unified with {} (its free {} not used)", host.source, gpu.device,
                          gpu.free_bytes >= 0 ? format_bytes(gpu.free_bytes) : "unknown");
  return plan.gpu_domain;
}

Result<int64_t> kv_budget_from_utilization(const MemoryPlan& plan, double utilization) {
  if (plan.gpu_domain.empty() || plan.gpu_total_bytes <= 0)
    return make_error(StatusCode::kFailedPrecondition,
                      "--gpu-memory-utilization needs the GPU's total memory, which the runner did not report "
                      "(set --kv-cache-memory)");
  const int64_t cap = static_cast<int64_t>(utilization * static_cast<double>(plan.gpu_total_bytes));
  int64_t others = 0;
  std::string parts;
  for (const auto& p : plan.pools) {
    if (p.domain != plan.gpu_domain || p.name == kPoolKv || p.name == kPoolPrefixSnapshots) continue;
    others += p.bytes;
    parts += fmt::format("{}{} {}", parts.empty() ? "" : " + ", p.name, format_bytes(p.bytes));
  }
  const std::string of = plan.gpu_unified ? fmt::format("the unified memory's {} (GPU and host)",
                                                        format_bytes(plan.gpu_total_bytes))
                                          : fmt::format("{}'s {}", plan.gpu_domain, format_bytes(plan.gpu_total_bytes));
  if (cap - others <= 0)
    return make_error(StatusCode::kResourceExhausted,
                      "--gpu-memory-utilization {} of {} = {} leaves no KV cache: the other pools take {} ({})",
                      utilization, of, format_bytes(cap), format_bytes(others), parts.empty() ? "none" : parts);
  return cap - others;
}

std::string format_bytes(int64_t b) {
  const double x = static_cast<double>(b);
  if (b < 0) return "-" + format_bytes(-b);
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", x / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", x / (1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", x / 1024);
  return fmt::format("{} B", b);
}

Status check_memory_headroom(const MemoryPlan& plan) {
  std::string shortfalls;
  for (const auto& d : plan.domains) {
    if (d.available_bytes < 0) continue;
    const int64_t need = plan.to_allocate_bytes(d.domain);
    const int64_t left = d.available_bytes - need;
    if (left >= plan.headroom_floor_bytes) continue;
    shortfalls += fmt::format("{}{}: {} available ({}) - {} to allocate = {} left, under the floor of {}",
                              shortfalls.empty() ? "" : "; ", d.domain, format_bytes(d.available_bytes), d.source,
                              format_bytes(need), format_bytes(left), format_bytes(plan.headroom_floor_bytes));
  }
  if (shortfalls.empty()) return Status();
  return make_error(StatusCode::kResourceExhausted,
                    "memory headroom: {} (lower --gpu-memory-utilization / --kv-cache-memory / --max-num-seqs / "
                    "--max-num-batched-tokens, or --memory-headroom-floor)",
                    shortfalls);
}

std::string format_memory_report(const MemoryPlan& plan) {
  std::string out = "memory plan:\n";
  for (const auto& p : plan.pools)
    out += fmt::format("  {:<18} {:<8} {:>12}{}{}\n", p.name, p.domain, format_bytes(p.bytes),
                       p.already_counted ? "  (already resident)" : "", p.note.empty() ? "" : "  " + p.note);
  for (const auto& d : plan.domains) {
    const int64_t need = plan.to_allocate_bytes(d.domain);
    if (d.available_bytes < 0) {
      out += fmt::format("  {}: planned {}, availability unknown\n", d.domain, format_bytes(plan.planned_bytes(d.domain)));
      continue;
    }
    out += fmt::format("  {}: planned {} (to allocate {}), available {} ({}), left {}, floor {}\n", d.domain,
                       format_bytes(plan.planned_bytes(d.domain)), format_bytes(need), format_bytes(d.available_bytes),
                       d.source, format_bytes(d.available_bytes - need), format_bytes(plan.headroom_floor_bytes));
  }
  return out;
}

}  // namespace tandem
