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
//
// One layout differs between the models: CudaModel's indexer-score all-reduce carries its
// [rows, lds] bf16 score buffer whole, the row stride padded to a multiple of 8 columns
// (lds = round_up(cols, 8): indexer.h), where the CPU's carries [rows, cols]. The padding columns
// are never written nor read (the top-k reads n_cols); they ride along in the sum. padded_rows
// recognizes that layout, unpad_rows drops the padding.
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

// True when `count` values are `ref` values of `rows` rows in CudaModel's padded score layout:
// ref = rows x cols with cols not a multiple of 8, count = rows x round_up(cols, 8). `cols` gets
// the unpadded width.
inline bool padded_rows(size_t count, size_t ref, int64_t rows, size_t* cols) {
  if (rows <= 0 || count == ref) return false;
  const size_t n = static_cast<size_t>(rows);
  if (ref % n != 0 || count % n != 0) return false;
  const size_t c = ref / n, l = count / n;
  if (c == 0 || c % 8 == 0 || l != (c + 7) / 8 * 8) return false;
  *cols = c;
  return true;
}
// [rows, cols] of a [rows, lds] array.
inline std::vector<float> unpad_rows(const std::vector<float>& v, int64_t rows, size_t cols) {
  const size_t n = static_cast<size_t>(rows), lds = v.size() / n;
  std::vector<float> out(n * cols);
  for (size_t r = 0; r < n; ++r)
    for (size_t c = 0; c < cols; ++c) out[r * cols + c] = v[r * lds + c];
  return out;
}

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
    size_t cols = 0;
    TANDEM_RETURN_IF_ERROR(next(false, count, &cols));
    const std::vector<float>& want = script_[calls.size()].result;
    CommCall call;
    call.input = fetch(data, count, dt, device_, s);
    if (cols == 0) {
      store(data, want, dt, device_, s);
    } else {
      // The padded layout: the reference's rows into the first cols columns; the padding keeps
      // this rank's own values (nobody reads them). The recorded input in the reference's layout.
      std::vector<float> out = call.input;
      const size_t lds = count / static_cast<size_t>(step_rows);
      for (size_t r = 0; r < static_cast<size_t>(step_rows); ++r)
        for (size_t c = 0; c < cols; ++c) out[r * lds + c] = want[r * cols + c];
      store(data, out, dt, device_, s);
      call.input = unpad_rows(call.input, step_rows, cols);
    }
    calls.push_back(std::move(call));
    return Status();
  }
  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    TANDEM_RETURN_IF_ERROR(next(true, bytes / 4, nullptr));
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
  int64_t step_rows = 0;  // tokens of the step being run (set by the caller): the padded layout's rows

 private:
  // Checks call i against the reference's; `cols` (reduces) gets the unpadded width when the call
  // carries the reference's values in the padded score layout, else 0.
  Status next(bool gather, size_t count, size_t* cols) const {
    const size_t i = calls.size();
    if (i >= script_.size())
      return Status(StatusCode::kInternal, "collective " + std::to_string(i) + " beyond the reference run's " +
                                               std::to_string(script_.size()));
    if (cols) *cols = 0;
    const bool padded = cols && !gather && !script_[i].gather &&
                        padded_rows(count, script_[i].input.size(), step_rows, cols);
    if (script_[i].gather != gather || (script_[i].input.size() != count && !padded))
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
