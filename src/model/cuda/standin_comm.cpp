// StandinComm (standin_comm.h): counts the calls and launches the stand-in device work.
#include "model/cuda/standin_comm.h"

#include "model/cuda/standin_kernels.h"

namespace tandem::cuda_model {

Status StandinComm::all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) {
  ++counts_.all_reduce;
  counts_.bytes += static_cast<int64_t>(count * comm_dtype_bytes(dtype));
  standin_scale(data, static_cast<int64_t>(count), dtype == CommDtype::kBf16, static_cast<float>(size_),
                static_cast<cudaStream_t>(stream));
  return Status();
}

Status StandinComm::all_gather(const void* in, size_t bytes, void* out, CommStream stream) {
  ++counts_.all_gather;
  counts_.bytes += static_cast<int64_t>(bytes);
  standin_gather(in, bytes, size_, out, static_cast<cudaStream_t>(stream));
  return Status();
}

Status StandinComm::broadcast(void* data, size_t bytes, int root, CommStream stream) {
  ++counts_.broadcast;
  counts_.bytes += static_cast<int64_t>(bytes);
  if (root < 0 || root >= size_) return invalid_argument("broadcast: root {} outside [0, {})", root, size_);
  return Status();  // the root's bytes are this rank's own
}

}  // namespace tandem::cuda_model
