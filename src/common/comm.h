// Comm: the collectives tensor parallelism needs, behind one small interface so the model is
// written once against it. The CPU backend (src/engine/parallel/zmq_comm.h) runs them over
// ZeroMQ; an NCCL backend implements the same calls on device buffers later.
//
// Every rank calls the same collectives in the same order. A collective that cannot complete
// (a peer died, stopped answering, or sent something else) returns kUnavailable naming the
// peer; after that the communicator is failed for good and every later call fails fast.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = sum over ranks of data[i], summed in rank order (rank 0 first), so every
  // rank gets the same bits and the result does not depend on arrival order.
  virtual Status all_reduce_sum(float* data, size_t count) = 0;
  // out (size() * bytes) = every rank's `in` (bytes each), concatenated in rank order.
  virtual Status all_gather(const void* in, size_t bytes, void* out) = 0;
  // Root's `bytes` (any length) replace every other rank's.
  virtual Status broadcast(std::vector<uint8_t>& bytes, int root) = 0;
  virtual Status barrier(std::chrono::milliseconds timeout) = 0;

  // Empty while healthy; otherwise why the communicator failed (the first reason).
  virtual std::string failure() const = 0;
  // Marks the communicator failed (e.g. the launcher saw a worker process exit); wakes waiters.
  virtual void fail(const std::string& reason) = 0;
};

}  // namespace tandem
