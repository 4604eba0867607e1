// The benchmark ceilings' kernels (kernels/cuda/bandwidth.h): the streaming copy moves every byte
// (random bytes, a size that leaves a remainder after the unrolled passes, the poisoned tail past
// it untouched), and the streaming reads (whole buffer, and the decode GEMV's tile pattern at every
// tile shape) leave their source unchanged and launch without error.
#include "cuda/cuda_test_util.h"
#include "kernels/cuda/bandwidth.h"

namespace tandem::kernels::cuda_testing {
namespace {

TEST(CudaBandwidth, StreamCopyAndReadMoveEveryByte) {
  TANDEM_REQUIRE_GPU();
  // 3 MB + 384 bytes: not a multiple of the grid's unrolled stride, so the remainder loop runs.
  const size_t bytes = (size_t{3} << 20) + 384, tail = 256;
  std::vector<uint8_t> src(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(mix64(i * 7 + 3));
  DeviceBuffer<uint8_t> ds = to_dev(src);
  auto dd = poisoned<uint8_t>(bytes + tail, 0x5a);
  cuda::stream_copy(ds.get(), dd.get(), bytes, kStream);
  std::vector<uint8_t> got = to_host(dd);
  EXPECT_TRUE(same_values(std::vector<uint8_t>(got.begin(), got.begin() + bytes), src)) << "copied bytes";
  EXPECT_TRUE(same_values(std::vector<uint8_t>(got.begin() + bytes, got.end()), std::vector<uint8_t>(tail, 0x5a)))
      << "bytes past the copy";
  DeviceBuffer<uint64_t> sink(1);
  TANDEM_CUDA_CHECK(cudaMemset(sink.get(), 0, sizeof(uint64_t)));
  cuda::stream_read(ds.get(), bytes, sink.get(), kStream);
  EXPECT_TRUE(same_values(to_host(ds), src)) << "the read's source";
  // 32 rows of 16,384 bytes: every tile shape's row count and 4-step span divide them.
  for (int tr : {16, 8, 4, 2, 1}) {
    cuda::stream_read_tiles(ds.get(), 32, 16384, tr, sink.get(), kStream);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(kStream));
    EXPECT_TRUE(same_values(to_host(ds), src)) << "the tile read's source, " << tr << " rows per step";
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
