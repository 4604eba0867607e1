// Tensor parallelism talks on two planes, behind two small interfaces, so the models are written
// once against them:
//
// - ControlComm: the control plane. Step plans and start-up facts go from rank 0 to the other ranks
//   as bytes on the host (ZeroMQ: src/engine/parallel/zmq_comm.h). One plan per step.
// - DataComm: the data plane. The activations' collectives inside a forward (all-reduce, all-gather,
//   broadcast of fp32 or bf16 arrays). A device backend (src/model/cuda/device_comm.h: NCCL, a
//   peer-memory one-shot all-reduce, the one-rank stand-in) takes device pointers and a stream, is
//   stream-ordered and capturable in a CUDA graph (no host synchronization, no allocation inside a
//   call); the CPU backend takes host pointers, ignores the stream and is synchronous.
//
// Determinism contract of DataComm (every backend): for the same inputs on every rank, every rank
// gets bitwise the same result, and a repeated run gets bitwise the same result again. A backend
// says in its comment in what order it sums (the CPU and the peer-memory path: in rank order, rank 0
// first; NCCL: its ring order, the same on every rank and every run for a fixed message size).
//
// Every rank calls the same collectives in the same order. A collective that cannot complete (a
// peer died, stopped answering, or sent something else) returns kUnavailable naming the peer (host
// backends; device backends report it at the next synchronization or through their watchdog); after
// that the communicator is failed for good and every later call fails fast.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem {

// Element type of a data-plane collective. Sums accumulate in fp32 whatever the element type.
enum class CommDtype : uint8_t { kF32, kBf16 };
inline size_t comm_dtype_bytes(CommDtype t) { return t == CommDtype::kF32 ? 4 : 2; }

// An opaque stream handle: a cudaStream_t on a device backend, ignored (null) on the host one.
using CommStream = void*;

class ControlComm {
 public:
  virtual ~ControlComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Root's `bytes` (any length) replace every other rank's.
  virtual Status broadcast(std::vector<uint8_t>& bytes, int root) = 0;
  virtual Status barrier(std::chrono::milliseconds timeout) = 0;
  // Empty while healthy; otherwise why the communicator failed (the first reason).
  virtual std::string failure() const = 0;
  // Marks the communicator failed (e.g. the launcher saw a worker process exit); wakes waiters.
  virtual void fail(const std::string& reason) = 0;
};

class DataComm {
 public:
  virtual ~DataComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What carries the collectives ("zmq-rank-order", "nccl", "peer-oneshot", "standin", ...), for
  // start-up logs and the runtime audit.
  virtual std::string path() const = 0;

  // In place: data[i] = sum over ranks of data[i] (count elements of `dtype`).
  virtual Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) = 0;
  // out (size() * bytes) = every rank's `in` (bytes each), concatenated in rank order.
  virtual Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) = 0;
  // Root's `bytes` bytes at `data` replace every other rank's.
  virtual Status broadcast(void* data, size_t bytes, int root, CommStream stream) = 0;

  // Convenience for host fp32 callers (the CPU model).
  Status all_reduce_sum(float* data, size_t count) { return all_reduce_sum(data, count, CommDtype::kF32, nullptr); }
};

// The CPU's communicator carries both planes over one set of sockets.
class Comm : public ControlComm, public DataComm {
 public:
  int rank() const override = 0;
  int size() const override = 0;
  using DataComm::all_reduce_sum;
  using ControlComm::broadcast;
  using DataComm::broadcast;
};

}  // namespace tandem
