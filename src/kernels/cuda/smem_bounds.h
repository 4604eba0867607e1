// The most dynamic shared memory each kernel's launcher asks for, at the largest shape the project
// supports. tests/cuda_limits adds each kernel's static shared memory (read from the compiled
// cubins) and checks the sum against every GPU target's per-block limit (99 KB on sm_120/sm_121).
// A launcher that passes dynamic shared memory computes it with a named function or constant of
// its arguments and reports that same value at its largest shape here; a kernel that declares
// `extern __shared__` without an entry fails the check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::kernels::cuda {

// sm_120 / sm_121 (RTX 50, GB10): shared memory one block may opt in to, and one SM's. Launchers
// that size their buffers from the device's limits report their request at these.
inline constexpr int64_t kSm12xSmemPerBlock = 99 * 1024;
inline constexpr int64_t kSm12xSmemPerSm = 100 * 1024;

struct SmemBound {
  // The kernel function's name in the source (every instantiation of a template), or one
  // instantiation as the demangler spells it ("dense_kernel<false, 4, false>").
  std::string kernel;
  int64_t bytes = 0;   // dynamic shared memory its launcher asks for at `shape`
  std::string shape;   // that shape, in words ("dim 1024, block 1024 (the launcher's limits)")
  std::string note;    // why the bound grows, where it matters (may be empty)
  // Launched only on devices whose per-block opt-in shared memory is at least this (0: on every
  // device); the launcher checks the device (e.g. gemm_tc's deep_pipeline()).
  int64_t needs_optin = 0;
  // Launched only on these targets (wgmma/TMA kernels: {90}, gated by tc_device_has_wgmma());
  // elsewhere the kernel is a trap-only stub. Empty: every target.
  std::vector<int> only_sms;
};

// The generic ops' kernels (src/kernels/cuda), at the limits their launchers enforce. The model's
// own kernels report theirs in src/model/cuda/smem_bounds.h (they depend on the config).
std::vector<SmemBound> dynamic_smem_bounds();

// One per op file that launches with dynamic shared memory (defined next to its launcher).
SmemBound sparse_attn_smem_bound();
SmemBound hadamard_smem_bound();
SmemBound sample_rows_smem_bound();               // sample_rows.cu
std::vector<SmemBound> decode_gemm_smem_bounds();  // decode_gemm.cu
std::vector<SmemBound> gemm_tc_smem_bounds();      // gemm_tc.cu
std::vector<SmemBound> gemm_ws_smem_bounds();      // gemm_ws.cu
std::vector<SmemBound> hc_smem_bounds();           // hc_pre.cu (hc_pre and hc_head)

}  // namespace tandem::kernels::cuda
