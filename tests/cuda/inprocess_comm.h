// Test communicators for N tensor-parallel ranks in one process (threads), on the CPU model (host
// pointers) or CudaModel (device pointers on the rank's stream):
//  - InProcessComm: the ranks meet at every collective; sums are fp32 in rank order, rank 0
//    first, on the host (the data-plane contract's order); every collective's input and result is
//    recorded. Device work is serialized by a baton: the group's mutex, which a rank holds while it
//    runs (run_on_rank) and gives up only while waiting at a collective (its stream synchronized),
//    because the ranks' models share the CUDA ops' per-device scratch.
//  - ForcedComm: one rank alone whose collectives return the results another run recorded
//    (teacher forcing), so each collective's input can be compared with that run's at the same
//    point with the same upstream values.
// Not capturable (they synchronize the stream): eager steps only.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/comm.h"
#include "common/numeric.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::testing {

// One recorded collective: what this rank contributed and what it got back (fp32 values).
struct CommCall {
  bool gather = false;
  std::vector<float> input, result;
};

struct InProcessGroup {
  explicit InProcessGroup(int n, bool device) : size(n), on_device(device), slots(n) {}
  const int size;
  const bool on_device;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<std::vector<float>> slots;

  // Runs fn as rank work: holds the baton except while fn waits at a collective.
  void run_on_rank(const std::function<void()>& fn) {
    std::lock_guard<std::mutex> lock(mu);
    fn();
  }
  // The caller holds mu; waits for every rank (giving mu up meanwhile) and holds it again after.
  void barrier() {
    std::unique_lock<std::mutex> lk(mu, std::adopt_lock);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return generation != gen; });
    }
    lk.release();
  }
};

// Host copies of rank data (device or host memory), fp32 values.
inline std::vector<float> fetch(const void* p, size_t count, CommDtype dt, bool device, cudaStream_t s) {
  std::vector<uint8_t> raw(count * comm_dtype_bytes(dt));
  if (device) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    TANDEM_CUDA_CHECK(cudaMemcpy(raw.data(), p, raw.size(), cudaMemcpyDeviceToHost));
  } else if (!raw.empty()) {
    std::memcpy(raw.data(), p, raw.size());
  }
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    if (dt == CommDtype::kF32) {
      std::memcpy(&v[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      v[i] = num::bf16_to_f32(h);
    }
  }
  return v;
}
inline void store(void* p, const std::vector<float>& v, CommDtype dt, bool device, cudaStream_t s) {
  std::vector<uint8_t> raw(v.size() * comm_dtype_bytes(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == CommDtype::kF32) {
      std::memcpy(raw.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = num::f32_to_bf16(v[i]);
      std::memcpy(raw.data() + 2 * i, &h, 2);
    }
  }
  if (device) {
    // On the rank's (non-blocking) stream, complete before `raw` goes away.
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(p, raw.data(), raw.size(), cudaMemcpyHostToDevice, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  } else if (!raw.empty()) {
    std::memcpy(p, raw.data(), raw.size());
  }
}

class InProcessComm final : public DataComm {
 public:
  InProcessComm(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  std::string path() const override { return "in-process-rank-order"; }
  using DataComm::all_reduce_sum;

  Status all_reduce_sum(void* data, size_t count, CommDtype dt, CommStream stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    CommCall call;
    call.input = fetch(data, count, dt, g_.on_device, s);
    g_.slots[rank_] = call.input;
    g_.barrier();
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < g_.size; ++r)  // rank order, rank 0 first
      for (size_t i = 0; i < count; ++i) sum[i] = r == 0 ? g_.slots[0][i] : sum[i] + g_.slots[r][i];
    g_.barrier();  // every rank has read the slots before any rank's next collective rewrites them
    store(data, sum, dt, g_.on_device, s);
    call.result = fetch(data, count, dt, g_.on_device, s);
    calls.push_back(std::move(call));
    return Status();
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    TANDEM_CHECK(bytes % 4 == 0);
    CommCall call;
    call.gather = true;
    call.input = fetch(in, bytes / 4, CommDtype::kF32, g_.on_device, s);
    g_.slots[rank_] = call.input;
    g_.barrier();
    for (int r = 0; r < g_.size; ++r) call.result.insert(call.result.end(), g_.slots[r].begin(), g_.slots[r].end());
    g_.barrier();
    store(out, call.result, CommDtype::kF32, g_.on_device, s);
    calls.push_back(std::move(call));
    return Status();
  }
  Status broadcast(void*, size_t, int, CommStream) override {
    return Status(StatusCode::kUnimplemented, "in-process test comm: broadcast is not used by the models");
  }

  std::vector<CommCall> calls;

 private:
  InProcessGroup& g_;
  int rank_;
};

class ForcedComm final : public DataComm {
 public:
  // `script`: the calls of the same rank in the reference run (their results are returned).
  ForcedComm(int rank, int size, const std::vector<CommCall>& script, bool device)
      : rank_(rank), size_(size), script_(script), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string path() const override { return "forced"; }
  using DataComm::all_reduce_sum;

  Status all_reduce_sum(void* data, size_t count, CommDtype dt, CommStream stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    TANDEM_RETURN_IF_ERROR(next(false, count));
    CommCall call;
    call.input = fetch(data, count, dt, device_, s);
    store(data, script_[calls.size()].result, dt, device_, s);
    calls.push_back(std::move(call));
    return Status();
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    TANDEM_RETURN_IF_ERROR(next(true, bytes / 4));
    CommCall call;
    call.gather = true;
    call.input = fetch(in, bytes / 4, CommDtype::kF32, device_, s);
    store(out, script_[calls.size()].result, CommDtype::kF32, device_, s);
    calls.push_back(std::move(call));
    return Status();
  }
  Status broadcast(void*, size_t, int, CommStream) override {
    return Status(StatusCode::kUnimplemented, "forced test comm: broadcast is not used by the models");
  }

  std::vector<CommCall> calls;

 private:
  Status next(bool gather, size_t count) const {
    const size_t i = calls.size();
    if (i >= script_.size())
      return Status(StatusCode::kInternal, "collective " + std::to_string(i) + " beyond the reference run's " +
                                               std::to_string(script_.size()));
    if (script_[i].gather != gather || script_[i].input.size() != count)
      return Status(StatusCode::kInternal, "collective " + std::to_string(i) + ": " + (gather ? "gather" : "reduce") +
                                               " of " + std::to_string(count) + " where the reference has " +
                                               (script_[i].gather ? "gather" : "reduce") + " of " +
                                               std::to_string(script_[i].input.size()));
    return Status();
  }
  int rank_, size_;
  const std::vector<CommCall>& script_;
  bool device_;
};

}  // namespace tandem::testing
