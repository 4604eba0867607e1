// A testing hook on the CPU GEMM (kernels::cpu::gemm): the layer-by-layer test's emulation of the
// tensor cores' accumulation (tests/cuda/tc_emulation.h) replaces the GEMMs of one CPU run with it.
// Apart from ops.h so that nothing but the GEMM and the tests that set it depends on it.
#pragma once

#include "kernels/ops.h"

namespace tandem::kernels::cpu {

// While set, gemm() offers every validated call with m, n > 0 to the hook first and computes only
// the calls it declines (returns false). nullptr (the default) removes it. A production run never
// sets it (one pointer test per call). Process-wide, like set_gemm_isa; set it between calls only.
using GemmHook = bool (*)(const GemmParams& p);
void set_gemm_hook(GemmHook hook);

}  // namespace tandem::kernels::cpu
