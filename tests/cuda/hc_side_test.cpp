// hc_pre_pack's comb on a side stream (kernels/cuda/decode_gemm.h's HcCombSide: comb_kernel beside
// the finishing kernel, a graph branch when captured) against the plain op, bit for bit; prints what
// the capture made of the branch's fork and join (edge types).
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/decode_test_util.h"
#include "kernels/cuda/hc_mix.h"

namespace tandem::kernels::cuda_testing {
namespace {

// hc_pre_pack with the comb on a side stream (HcCombSide: comb_kernel beside the finishing kernel,
// which then skips the Sinkhorn) equals the plain op bit for bit in every output, for both finishing
// shapes, the lane-per-element Sinkhorn (hc 4) and the one-thread one (hc 6), eagerly and captured
// in a graph (the comb a branch forked after each mix and joined before the next: twice in a row).
TEST(CudaHcFinish, CombOnASideStreamEqualsTheFinish) {
  TANDEM_REQUIRE_GPU();
  using cuda::HcFinishShape;
  struct C {
    int hc;
    int64_t dim;
    int iters;
    int64_t tokens;
    HcFinishShape shape;
  };
  cudaStream_t st, side;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const cuda::HcCombSide sd{side, fork, join};
  uint64_t seed = 1300;
  // The captured graph's edges, printed (what the capture made of the fork and the join: a
  // programmatic or a full edge into each kernel).
  auto print_edges = [](cudaGraph_t g) {
    size_t ne = 0;
    TANDEM_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> ed(ne);
    TANDEM_CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    auto name = [](cudaGraphNode_t n) -> std::string {
      cudaGraphNodeType t;
      TANDEM_CUDA_CHECK(cudaGraphNodeGetType(n, &t));
      if (t != cudaGraphNodeTypeKernel) return "node type " + std::to_string(static_cast<int>(t));
      cudaKernelNodeParams kp{};
      TANDEM_CUDA_CHECK(cudaGraphKernelNodeGetParams(n, &kp));
      const char* nm = nullptr;
      if (cudaFuncGetName(&nm, kp.func) != cudaSuccess || !nm) return "kernel";
      const std::string s(nm);
      return s.size() > 60 ? s.substr(0, 60) : s;
    };
    for (size_t i = 0; i < ne; ++i)
      std::printf("[hc comb side] edge %s -> %s: type %d (1 = programmatic), from port %d\n", name(from[i]).c_str(),
                  name(to[i]).c_str(), static_cast<int>(ed[i].type), static_cast<int>(ed[i].from_port));
  };
  const C cases[] = {C{4, 4096, 20, 1, HcFinishShape::kSplit}, C{4, 4096, 20, 5, HcFinishShape::kSplit},
                     C{4, 4096, 20, 5, HcFinishShape::kToken}, C{4, 4096, 20, 40, HcFinishShape::kAuto},
                     C{6, 256, 5, 3, HcFinishShape::kSplit}, C{6, 256, 5, 3, HcFinishShape::kToken},
                     C{4, 384, 1, 2, HcFinishShape::kSplit}};
  for (const C& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " hc " << c.hc << " dim " << c.dim << " iters "
                                      << c.iters << " shape " << static_cast<int>(c.shape));
    const int nmix = (2 + c.hc) * c.hc;
    const int64_t T = c.tokens, D = c.dim, HD = c.hc * D, nb = D / 128;
    DeviceBuffer<float> dh = to_dev(randn(static_cast<size_t>(T * HD), seed++, 1.0f, true));
    DeviceBuffer<float> dfn = to_dev(randn(static_cast<size_t>(nmix * HD), seed++, 0.02f, false));
    DeviceBuffer<float> dscale = to_dev(randu(3, seed++, 0.5f, 2.0f));
    DeviceBuffer<float> dbase = to_dev(randn(static_cast<size_t>(nmix), seed++, 0.5f, false));
    DeviceBuffer<float> dw = to_dev(randn(static_cast<size_t>(D), seed++, 0.5f, true));
    struct Out {
      DeviceBuffer<float> x, post, comb;
      DeviceBuffer<uint8_t> codes, scales;
    };
    auto outs = [&] {
      return Out{poisoned<float>(static_cast<size_t>(T * D)), poisoned<float>(static_cast<size_t>(T * c.hc)),
                 poisoned<float>(static_cast<size_t>(T * c.hc * c.hc)), poisoned<uint8_t>(static_cast<size_t>(T * D)),
                 poisoned<uint8_t>(static_cast<size_t>(T * nb))};
    };
    auto call = [&](Out& o, cudaStream_t s, bool on_side) {
      HcPreParams p;
      p.h = dh.get();
      p.fn = dfn.get();
      p.scale = dscale.get();
      p.base = dbase.get();
      p.tokens = T;
      p.hc = c.hc;
      p.dim = D;
      p.sinkhorn_iters = c.iters;
      p.x = o.x.get();
      p.post = o.post.get();
      p.comb = o.comb.get();
      cuda::HcPrePackArgs k;
      k.norm_weight = dw.get();
      k.codes = o.codes.get();
      k.scales = o.scales.get();
      k.finish = c.shape;
      k.comb_side = on_side ? &sd : nullptr;
      cuda::hc_pre_pack(p, k, s);
      if (on_side) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));  // before the next mix
    };
    auto expect_equal = [&](const Out& o, const Out& ref, const char* what) {
      EXPECT_TRUE(same_bits(to_host(o.comb), to_host(ref.comb))) << what << ": comb";
      EXPECT_TRUE(same_bits(to_host(o.x), to_host(ref.x))) << what << ": x";
      EXPECT_TRUE(same_bits(to_host(o.post), to_host(ref.post))) << what << ": post";
      EXPECT_TRUE(same_values(to_host(o.codes), to_host(ref.codes), static_cast<size_t>(D))) << what << ": codes";
      EXPECT_TRUE(same_values(to_host(o.scales), to_host(ref.scales), static_cast<size_t>(nb))) << what << ": scales";
    };
    Out plain = outs(), eager = outs(), g1 = outs(), g2 = outs();
    call(plain, st, false);
    call(eager, st, true);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(st));
    expect_equal(eager, plain, "eager side comb");
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    call(g1, st, true);
    call(g2, st, true);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    if (&c == &cases[0]) print_edges(g);
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 2; ++r) TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, st));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(st));
    expect_equal(g1, plain, "graph, first call");
    expect_equal(g2, plain, "graph, second call");
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(fork));
  TANDEM_CUDA_CHECK(cudaEventDestroy(join));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(side));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
