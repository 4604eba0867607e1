// The kernel-limits rules (limits.h).
#include "cuda_limits/limits.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tandem::cubin {

std::string demangle(const std::string& m) {
  int st = 0;
  char* d = abi::__cxa_demangle(m.c_str(), nullptr, nullptr, &st);
  std::string out = st == 0 && d ? d : m;
  std::free(d);
  return out;
}

namespace {

// "sm_120" -> 120, "sm_90a" -> 90, anything else -> -1.
int ptxas_sm(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return -1;
  size_t i = 3;
  int v = 0;
  while (i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i]))) v = v * 10 + (arch[i++] - '0');
  if (i == 3) return -1;
  if (i < arch.size() && !(i + 1 == arch.size() && (arch[i] == 'a' || arch[i] == 'f'))) return -1;
  return v;
}

}  // namespace

std::string bound_base(const std::string& kernel) { return kernel.substr(0, kernel.find('<')); }

bool bound_matches(const std::string& mangled, const std::string& kernel) {
  if (kernel.find('<') == std::string::npos) return mangled_names(mangled, kernel);
  // One instantiation: the demangled name holds "::name<args>(" (or starts with "name<args>(").
  if (!mangled_names(mangled, bound_base(kernel))) return false;
  const std::string d = demangle(mangled);
  return d.find("::" + kernel + "(") != std::string::npos || d.find(" " + kernel + "(") != std::string::npos ||
         d.rfind(kernel + "(", 0) == 0;
}

LimitsReport check_limits(const std::vector<Cubin>& cubins, const std::vector<kernels::cuda::SmemBound>& bounds,
                          const std::vector<int>& check_sms) {
  LimitsReport r;
  auto checked = [&](int sm) { return std::find(check_sms.begin(), check_sms.end(), sm) != check_sms.end(); };
  // Largest code per kernel on each SM, over every cubin (a kernel can sit in several files).
  std::map<std::string, std::map<int, int64_t>> code;
  for (const Cubin& c : cubins)
    for (const Kernel& k : c.kernels) {
      int64_t& v = code[k.name][c.fatbin_sm];
      v = std::max(v, k.code_bytes);
    }
  // Base names with bounds per instantiation: each instantiation needs its own.
  std::set<std::string> per_instantiation;
  for (const auto& b : bounds)
    if (b.kernel.find('<') != std::string::npos) per_instantiation.insert(bound_base(b.kernel));
  std::map<std::pair<int, std::string>, KernelRow> rows;
  std::set<std::pair<int, std::string>> matched;  // (sm, bound kernel)
  std::set<std::pair<int, std::string>> unbound;  // (sm, kernel) lacking its instantiation's bound
  for (const Cubin& c : cubins) {
    const int sm = c.fatbin_sm;
    if (!checked(sm)) continue;
    if (c.elf_sm != sm)
      r.failures.push_back(fmt::format("{}: the cubin's ELF header says sm_{}, its fatbin entry sm_{}", c.origin,
                                       c.elf_sm, sm));
    const int target = ptxas_sm(c.ptxas_arch);
    if (target != sm)
      r.failures.push_back(fmt::format(
          "{}: compiled by ptxas for '{}', not for sm_{}: this entry may hold instructions sm_{} lacks", c.origin,
          c.ptxas_arch.empty() ? "(no ptxas target recorded)" : c.ptxas_arch, sm, sm));
    const int64_t limit = max_smem_per_block(sm);
    if (limit < 0) {
      r.failures.push_back(fmt::format("{}: no shared-memory limit known for sm_{}", c.origin, sm));
      continue;
    }
    for (const Kernel& k : c.kernels) {
      KernelRow row;
      row.sm = sm;
      row.kernel = k.name;
      row.static_smem = k.static_smem;
      row.limit = limit;
      bool found = false;
      for (const auto& b : bounds) {
        if (!bound_matches(k.name, b.kernel)) continue;
        matched.insert({sm, b.kernel});
        found = true;
        // A gated launch: not made on this target, so its request does not count here.
        std::string gate;
        if (!b.only_sms.empty() && std::find(b.only_sms.begin(), b.only_sms.end(), sm) == b.only_sms.end())
          gate = fmt::format("launched only on sm_{}", fmt::join(b.only_sms, "/sm_"));
        else if (b.needs_optin > limit)
          gate = fmt::format("launched only where a block may opt in to {} B", b.needs_optin);
        if (!gate.empty()) {
          if (row.dynamic_smem == 0 && row.not_launched.empty()) row.not_launched = gate + " (" + b.shape + ")";
          continue;
        }
        if (b.bytes >= row.dynamic_smem) {
          row.dynamic_smem = b.bytes;
          row.not_launched.clear();
          row.bound = b.shape + (b.note.empty() ? "" : "; " + b.note);
        }
      }
      if (!found && per_instantiation.count(function_name(k.name))) unbound.insert({sm, k.name});
      auto [it, fresh] = rows.try_emplace({sm, k.name}, row);
      if (!fresh && row.static_smem > it->second.static_smem) it->second = row;
    }
  }
  for (const auto& [sm, name] : unbound)
    r.failures.push_back(fmt::format(
        "sm_{}: {}: an instantiation without a dynamic shared memory bound (its siblings have one each)", sm,
        demangle(name)));
  for (auto& [key, row] : rows) {
    if (row.not_launched.empty() && row.total() > row.limit)
      r.failures.push_back(fmt::format(
          "sm_{}: {}: static {} B + dynamic {} B{} = {} B > {} B ({} KB) per block", row.sm, demangle(row.kernel),
          row.static_smem, row.dynamic_smem, row.bound.empty() ? "" : " (" + row.bound + ")", row.total(), row.limit,
          row.limit / 1024));
    const auto& per_sm = code[row.kernel];
    const int64_t mine = per_sm.count(row.sm) ? per_sm.at(row.sm) : 0;
    for (const auto& [other, bytes] : per_sm)
      if (row.not_launched.empty() && other != row.sm && mine <= kEmptyKernelCodeBytes &&
          bytes > kEmptyKernelCodeBytes) {
        r.failures.push_back(fmt::format(
            "sm_{}: {}: {} B of code (an empty or trap-only body) where sm_{} has {} B: an architecture guard "
            "without a portable path?",
            row.sm, demangle(row.kernel), mine, other, bytes));
        break;
      }
    r.rows.push_back(row);
  }
  for (int sm : check_sms)
    for (const auto& b : bounds)
      if (!matched.count({sm, b.kernel}))
        r.failures.push_back(fmt::format(
            "the dynamic shared memory bound for '{}' matches no kernel in the sm_{} code (renamed or removed?)",
            b.kernel, sm));
  return r;
}

std::vector<SourceKernel> kernels_with_dynamic_smem_in(const std::string& text, const std::string& file) {
  // Comments out, line numbers kept.
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l.substr(0, l.find("//")));
  std::string code;
  std::vector<size_t> line_start;
  for (const auto& l : lines) {
    line_start.push_back(code.size());
    code += l + "\n";
  }
  auto line_of = [&](size_t pos) {
    return static_cast<size_t>(std::upper_bound(line_start.begin(), line_start.end(), pos) - line_start.begin());
  };
  auto ident_at = [&](size_t& p) {
    while (p < code.size() && std::isspace(static_cast<unsigned char>(code[p]))) ++p;
    const size_t b = p;
    while (p < code.size() && (std::isalnum(static_cast<unsigned char>(code[p])) || code[p] == '_')) ++p;
    return code.substr(b, p - b);
  };
  std::vector<SourceKernel> out;
  for (size_t at = code.find("extern __shared__"); at != std::string::npos;
       at = code.find("extern __shared__", at + 1)) {
    SourceKernel k;
    k.where = fmt::format("{}:{}", file, line_of(at));
    const size_t g = code.rfind("__global__", at);
    const size_t dev = code.rfind("__device__", at);
    if (g == std::string::npos || (dev != std::string::npos && dev > g)) {
      k.kernel = "(not directly in a __global__ function)";
      out.push_back(k);
      continue;
    }
    // __global__ [void] [__launch_bounds__(...)] [__cluster_dims__(...)] [__maxnreg__(...)] name(
    size_t p = g + 10;
    for (std::string id = ident_at(p); !id.empty(); id = ident_at(p)) {
      if (id == "__launch_bounds__" || id == "__cluster_dims__" || id == "__maxnreg__") {
        int depth = 0;
        for (; p < code.size(); ++p) {
          if (code[p] == '(') ++depth;
          if (code[p] == ')' && --depth == 0) break;
        }
        ++p;
        continue;
      }
      size_t q = p;
      while (q < code.size() && std::isspace(static_cast<unsigned char>(code[q]))) ++q;
      if (q < code.size() && code[q] == '(') {
        k.kernel = id;
        break;
      }
    }
    if (k.kernel.empty()) k.kernel = "(unparsed __global__ declaration)";
    out.push_back(k);
  }
  return out;
}

std::vector<SourceKernel> kernels_with_dynamic_smem(const std::string& src_dir) {
  namespace fs = std::filesystem;
  std::vector<SourceKernel> out;
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(src_dir))
    if (e.is_regular_file() && (e.path().extension() == ".cu" || e.path().extension() == ".cuh"))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    auto k = kernels_with_dynamic_smem_in(ss.str(), fs::relative(f, src_dir).string());
    out.insert(out.end(), k.begin(), k.end());
  }
  return out;
}

}  // namespace tandem::cubin
