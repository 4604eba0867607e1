// The kernels of the device data plane (device_comm.cu): the peer-memory one-shot collective and
// the bf16 <-> fp32 conversions that stage bf16 all-reduces for NCCL. Plain types only, so the
// .cu includes nothing host-only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::devcomm {

inline constexpr int kMaxPeerRanks = 8;
// Every launch of the peer kernel has exactly this many blocks: each block keeps its own epoch
// counter, so the counters of one rank (and of every rank) move together only if the grid never
// changes.
inline constexpr int kPeerBlocks = 32;
inline constexpr int kPeerThreads = 512;

enum class PeerMode : int32_t { kSum = 0, kGather = 1, kBroadcast = 2 };

// One peer-oneshot call (one chunk of at most `capacity` bytes per rank).
struct PeerArgs {
  PeerMode mode = PeerMode::kSum;
  bool bf16 = false;                  // kSum: bf16 elements (else fp32); sums in fp32, rank order
  int32_t rank = 0, size = 1, root = 0;
  int32_t unit = 16;                  // bytes moved per step: 16, or the element size / 1 when unaligned
  const uint8_t* in = nullptr;        // [bytes] this rank's part (kBroadcast: read on the root only)
  uint8_t* out = nullptr;             // kSum/kBroadcast: [bytes] (may be `in`); kGather: size rows of
                                      // out_stride bytes, this call writes bytes [0, bytes) of each row
  size_t bytes = 0;                   // <= capacity, multiple of unit
  size_t out_stride = 0;              // kGather only
  size_t capacity = 0;                // bytes of one parity half of every rank's part of the exchange region
  uint8_t* data[kMaxPeerRanks] = {};  // rank p's halves [2][capacity] (in rank 0's region, as mapped here)
  uint64_t* inbox[kMaxPeerRanks] = {};// rank p's flags [kMaxPeerRanks senders][kPeerBlocks] (likewise)
  uint64_t* epoch = nullptr;          // this rank's [kPeerBlocks] call counters (device, local)
  uint32_t* state = nullptr;          // this rank's device word: nonzero = failed, skip waits
  const volatile uint32_t* host_abort = nullptr;  // mapped pinned: the host sets it to stop waits
  uint32_t* host_error = nullptr;     // mapped pinned: 1 + the rank a wait gave up on
  uint64_t timeout_ns = 0;
};
void launch_peer(const PeerArgs& a, cudaStream_t stream);

// out[i] = float(in[i]) for bf16 in, and the round-to-nearest-even way back (n elements).
void launch_bf16_to_f32(const uint16_t* in, float* out, size_t n, cudaStream_t stream);
void launch_f32_to_bf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream);

}  // namespace tandem::devcomm
