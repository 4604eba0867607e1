// Programmatic dependent launch (PDL): a kernel launched with launch_pdl may start while the
// kernel before it on the stream is still finishing, prefetch what does not depend on it (its
// weights), and wait for it with pdl_wait() before touching the predecessor's data. Works inside
// CUDA graph capture (the launch becomes a programmatic edge); every target (sm_90a, sm_100a,
// sm_120, sm_121) supports it.
//
// Rules for a kernel launched with launch_pdl (pdl_wait / pdl_trigger are no-ops otherwise):
//  1. Call pdl_wait() before reading anything an earlier kernel writes and before writing anything
//     an earlier kernel reads or writes. Only reads of data no kernel of the step writes (weights,
//     constant tables) may come before it.
//  2. Every thread block must reach pdl_wait() before it exits, even one with no work: a grid that
//     finished early would let the next PDL kernel start before this one's predecessor completed.
//  3. pdl_trigger() lets the next PDL kernel's blocks be scheduled once every block of this grid
//     has called it (or exited); those blocks then prefetch and block in their own pdl_wait(), so
//     call it early, after this block's prefetch is issued. It never affects correctness, except
//     where a dependent reads, before its own wait, data that kernels before this one wrote: then
//     this kernel triggers after its wait (moe_decode: the gate + routing kernel, whose dependent
//     runs the shared expert on x's codes before its wait).
// Kernels launched the ordinary way (<<<>>>) after a PDL kernel wait for it to complete, as usual.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda {

// Blocks until every grid this one depends on programmatically has completed and its memory
// operations are visible (griddepcontrol.wait).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Allows the dependent grid to be scheduled (griddepcontrol.launch_dependents).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The first statement of a kernel that reads nothing before its predecessor is done (no weights
// to prefetch): waits for the predecessor (rule 1), then lets the next PDL kernel be scheduled as
// soon as every block of this one is running, so its launch overlaps this kernel's work.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialization allowed; the
// launch status is checked (TANDEM_CUDA_CHECK). Argument types must convert to the kernel's.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// launch_pdl in thread-block clusters of `cluster` CTAs along x (grid.x a multiple of it; 8 is the
// portable size every target schedules), for a kernel declared without __cluster_dims__.
template <typename... KernelArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                        cudaStream_t s, Args&&... args) {
  TANDEM_CHECK(cluster >= 1 && grid.x % cluster == 0);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace tandem::kernels::cuda
