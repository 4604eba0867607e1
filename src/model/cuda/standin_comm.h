// StandinComm: one rank of a tensor-parallel group measured alone on one GPU (bench-model --rank).
// Every collective of the data plane (common/comm.h) is replaced by device work on this rank that
// reads and writes the bytes the real collective delivers here, with the values a group of
// identical ranks would produce: all-reduce multiplies by size() (every rank's partial taken equal
// to this one's), all-gather copies this rank's part into every rank's slot, broadcast keeps the
// local bytes. The cost of the communication itself is added by the caller from the counted calls
// (collectives per step x a measured per-collective latency). Stream-ordered, capturable, no
// allocation; deterministic (a pure function of this rank's data).
#pragma once

#include <cstdint>
#include <string>

#include "common/comm.h"

namespace tandem::cuda_model {

class StandinComm final : public DataComm {
 public:
  StandinComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string path() const override { return "standin"; }

  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) override;
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override;
  Status broadcast(void* data, size_t bytes, int root, CommStream stream) override;
  using DataComm::all_reduce_sum;

  // Calls made since the last reset (host-side: a captured step counts once, when captured).
  struct Counts {
    int64_t all_reduce = 0, all_gather = 0, broadcast = 0;
    int64_t bytes = 0;  // payload bytes of those calls (all-gather: this rank's part)
    int64_t total() const { return all_reduce + all_gather + broadcast; }
  };
  Counts counts() const { return counts_; }
  void reset_counts() { counts_ = Counts(); }

 private:
  int rank_, size_;
  Counts counts_;
};

}  // namespace tandem::cuda_model
