// launch_pdl (kernels/cuda/launch.cuh): a PDL chain whose first kernel lets its dependents start
// at once and then writes late must still be seen complete by each consumer, eagerly and as a
// replayed CUDA graph (the PDL launches become programmatic graph edges).
#include "cuda/cuda_test_util.h"
#include "kernels/cuda/launch_check.h"

namespace tandem::kernels::cuda_testing {
namespace {

void expect_all(const std::vector<int>& v, int want, const char* what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != want && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << v.size() << " wrong; first at " << first << " = "
                     << (v.empty() ? 0 : v[first]) << ", want " << want;
}

TEST(CudaLaunch, PdlChainWaitsForItsProducer) {
  TANDEM_REQUIRE_GPU();
  const int n = 1 << 16;
  DeviceBuffer<int> a(n), b(n), c(n);
  cudaStream_t s = kStream;
  for (int value : {7, 1000}) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(a.get(), 0xff, a.bytes(), s));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xff, b.bytes(), s));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(c.get(), 0xff, c.bytes(), s));
    cuda::pdl_check_chain(a.get(), b.get(), c.get(), n, value, 200, s);
    expect_all(to_host(b), value + 1, "eager b");
    expect_all(to_host(c), value + 2, "eager c");
  }
}

TEST(CudaLaunch, PdlChainInsideAGraph) {
  TANDEM_REQUIRE_GPU();
  const int n = 1 << 16;
  DeviceBuffer<int> a(n), b(n), c(n);
  cudaStream_t s = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(a.get(), 0xff, a.bytes(), s));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xff, b.bytes(), s));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(c.get(), 0xff, c.bytes(), s));
  cuda::pdl_check_chain(a.get(), b.get(), c.get(), n, 42, 200, s);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 5; ++rep) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<int> hb(n), hc(n);
    TANDEM_CUDA_CHECK(cudaMemcpy(hb.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
    TANDEM_CUDA_CHECK(cudaMemcpy(hc.data(), c.get(), c.bytes(), cudaMemcpyDeviceToHost));
    expect_all(hb, 43, "graph b");
    expect_all(hc, 44, "graph c");
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
