// The decode-path properties of the CUDA ops as a whole: once warm, a sequence of ops makes no device
// allocation (gemm's quantized-x scratch and the mHC partials included), it can be captured into a
// CUDA graph, and the graph's replay gives bit-identical results to the eager run.
#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

// Inputs and outputs of a decode-like op sequence, all allocated up front.
struct Sequence {
  static constexpr int64_t kTokens = 4, kDim = 4096, kHc = 4, kN = 1024, kE = 256, kTop = 6, kVocab = 5000;
  std::vector<float> h_x = randn(kTokens * kDim, 1, 1.0f, true);
  std::vector<uint8_t> h_w = std::vector<uint8_t>(kN * kDim, 0x38);  // fp8 1.0
  std::vector<uint8_t> h_ws = std::vector<uint8_t>((kN / 128) * (kDim / 128), 120);
  std::vector<float> h_h = randn(kTokens * kHc * kDim, 2, 1.0f, true);
  std::vector<float> h_fn = randn((2 + kHc) * kHc * kHc * kDim, 3, 0.02f, false);
  std::vector<float> h_par = randu(64, 4, 0.5f, 1.5f);
  std::vector<float> h_logits = randn(kTokens * kE, 5, 2.0f, false);
  std::vector<float> h_vocab = randn(kTokens * kVocab, 6, 3.0f, false);
  std::vector<float> h_norm_w = randn(kDim, 7, 0.5f, true);

  DeviceBuffer<float> x = to_dev(h_x), h = to_dev(h_h), fn = to_dev(h_fn), par = to_dev(h_par),
                      logits = to_dev(h_logits), vocab = to_dev(h_vocab), norm_w = to_dev(h_norm_w);
  DeviceBuffer<uint8_t> w = to_dev(h_w), ws = to_dev(h_ws);
  DeviceBuffer<float> y = poisoned<float>(kTokens * kN), xn = poisoned<float>(kTokens * kDim),
                      hx = poisoned<float>(kTokens * kDim), post = poisoned<float>(kTokens * kHc),
                      comb = poisoned<float>(kTokens * kHc * kHc), hy = poisoned<float>(kTokens * kDim),
                      hout = poisoned<float>(kTokens * kHc * kDim), gw = poisoned<float>(kTokens * kTop),
                      sw = poisoned<float>(kTokens * kN), probs = poisoned<float>(kTokens * kVocab),
                      amax_v = poisoned<float>(kTokens);
  DeviceBuffer<int32_t> gid = poisoned<int32_t>(kTokens * kTop), off = poisoned<int32_t>(kE + 1),
                        tok = poisoned<int32_t>(kTokens * kTop), slot = poisoned<int32_t>(kTokens * kTop),
                        amax = poisoned<int32_t>(kTokens), top = poisoned<int32_t>(kTokens * 512);

  void run(cudaStream_t s) {
    GemmParams g;
    g.x = x.get();
    g.w.format = WeightFormat::kFp8Block;
    g.w.data = w.get();
    g.w.scale = ws.get();
    g.w.n = kN;
    g.w.k = kDim;
    g.y = y.get();
    g.m = kTokens;
    g.n = kN;
    g.k = kDim;
    g.round_bf16 = true;
    g.quantize_x_block = 128;
    cuda::gemm(g, s);
    RmsNormParams rn;
    rn.x = x.get();
    rn.y = xn.get();
    rn.weight = norm_w.get();
    rn.rows = kTokens;
    rn.dim = kDim;
    rn.round_bf16 = true;
    cuda::rms_norm(rn, s);
    HcPreParams hp;
    hp.h = h.get();
    hp.fn = fn.get();
    hp.scale = par.get();
    hp.base = par.get() + 3;
    hp.tokens = kTokens;
    hp.hc = kHc;
    hp.dim = kDim;
    hp.x = hx.get();
    hp.post = post.get();
    hp.comb = comb.get();
    cuda::hc_pre(hp, s);
    HcPostParams po;
    po.f = hx.get();
    po.res = h.get();
    po.post = post.get();
    po.comb = comb.get();
    po.out = hout.get();
    po.tokens = kTokens;
    po.hc = kHc;
    po.dim = kDim;
    cuda::hc_post(po, s);
    HcHeadParams hh;
    hh.h = hout.get();
    hh.fn = fn.get();
    hh.scale = par.get();
    hh.base = par.get() + 3;
    hh.tokens = kTokens;
    hh.hc = kHc;
    hh.dim = kDim;
    hh.y = hy.get();
    cuda::hc_head(hh, s);
    MoeGateParams mg;
    mg.logits = logits.get();
    mg.bias = par.get();
    mg.tokens = kTokens;
    mg.n_experts = 32;  // bias has 64 entries
    mg.topk = kTop;
    mg.expert_ids = gid.get();
    mg.weights = gw.get();
    cuda::moe_gate(mg, s);
    MoeGroupParams gr;
    gr.expert_ids = gid.get();
    gr.tokens = kTokens;
    gr.topk = kTop;
    gr.n_experts = kE;
    gr.offsets = off.get();
    gr.token_of = tok.get();
    gr.slot_of = slot.get();
    cuda::moe_group(gr, s);
    SwigluParams sg;
    sg.gate = y.get();
    sg.up = y.get();
    sg.out = sw.get();
    sg.rows = kTokens;
    sg.cols = kN;
    cuda::swiglu(sg, s);
    SoftmaxParams sm;
    sm.x = vocab.get();
    sm.y = probs.get();
    sm.rows = kTokens;
    sm.n = kVocab;
    cuda::softmax(sm, s);
    ArgmaxParams am;
    am.x = vocab.get();
    am.out = amax.get();
    am.max_value = amax_v.get();
    am.rows = kTokens;
    am.n = kVocab;
    cuda::argmax(am, s);
    TopkParams tk;
    tk.scores = vocab.get();
    tk.rows = kTokens;
    tk.n = kVocab;
    tk.k = 512;
    tk.out = top.get();
    cuda::topk(tk, s);
  }

  std::vector<std::vector<float>> float_outputs() {
    return {to_host(y), to_host(xn), to_host(hx), to_host(post), to_host(comb), to_host(hy),
            to_host(hout), to_host(gw), to_host(sw), to_host(probs), to_host(amax_v)};
  }
  std::vector<std::vector<int32_t>> int_outputs() {
    return {to_host(gid), to_host(off), to_host(tok), to_host(slot), to_host(amax), to_host(top)};
  }
  void poison_outputs() {
    for (DeviceBuffer<float>* b : {&y, &xn, &hx, &post, &comb, &hy, &hout, &gw, &sw, &probs, &amax_v}) poison(*b);
    for (DeviceBuffer<int32_t>* b : {&gid, &off, &tok, &slot, &amax, &top}) poison(*b, 0x5a);
  }
};

TEST(CudaOpsWarm, NoAllocationAndGraphReplayEqualsEager) {
  TANDEM_REQUIRE_GPU();
  Sequence seq;
  seq.run(kStream);  // warm-up: scratch grows here
  sync();
  const auto eager_f = seq.float_outputs();
  const auto eager_i = seq.int_outputs();
  const int64_t allocs = cuda::alloc_stats().count;

  for (int i = 0; i < 3; ++i) seq.run(kStream);
  sync();
  EXPECT_EQ(cuda::alloc_stats().count, allocs) << "a warm op sequence allocated device memory";

  // Capture on a stream of our own, replay, compare with the eager results.
  seq.poison_outputs();
  sync();
  cudaStream_t s;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  seq.run(s);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(cuda::alloc_stats().count, allocs) << "capture or replay allocated device memory";
  const auto graph_f = seq.float_outputs();
  const auto graph_i = seq.int_outputs();
  for (size_t i = 0; i < eager_f.size(); ++i) EXPECT_TRUE(same_bits(graph_f[i], eager_f[i])) << "float output " << i;
  for (size_t i = 0; i < eager_i.size(); ++i) EXPECT_TRUE(same_values(graph_i[i], eager_i[i])) << "int output " << i;
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

// The ops without scratch never allocate, not even on their first call.
TEST(CudaOpsWarm, OpsWithoutScratchNeverAllocate) {
  TANDEM_REQUIRE_GPU();
  const int64_t tokens = 3, heads = 4, dim = 512, rows = 64;
  DeviceBuffer<float> x = to_dev(randn(tokens * heads * dim, 1, 1.0f, true));
  DeviceBuffer<float> kv = to_dev(randn(rows * dim, 2, 1.0f, true));
  DeviceBuffer<float> sink = to_dev(randn(heads, 3, 1.0f, false)), out = poisoned<float>(tokens * heads * dim);
  std::vector<int32_t> hidx(tokens * 16);
  for (size_t i = 0; i < hidx.size(); ++i) hidx[i] = static_cast<int32_t>(i % rows);
  DeviceBuffer<int32_t> idx = to_dev(hidx), vis = to_dev(std::vector<int32_t>(tokens, static_cast<int32_t>(rows)));
  DeviceBuffer<int64_t> pos = to_dev(std::vector<int64_t>{5, 6, 7});
  DeviceBuffer<float> inv = to_dev(randu(32, 4, 0.001f, 1.0f)), scores = poisoned<float>(tokens * rows);
  sync();
  const int64_t allocs = cuda::alloc_stats().count;
  for (int it = 0; it < 2; ++it) {
    ActQuantFp8Params aq;
    aq.x = x.get();
    aq.rows = tokens * heads;
    aq.cols = 448;
    aq.ldx = dim;
    aq.block = 64;
    cuda::act_quant_fp8(aq, kStream);
    Fp4ActQuantParams fq;
    fq.x = x.get();
    fq.rows = tokens;
    fq.cols = 128;
    fq.ldx = heads * dim;
    cuda::fp4_act_quant(fq, kStream);
    RoundBf16Params rb;
    rb.x = x.get();
    rb.rows = tokens;
    rb.cols = heads * dim;
    cuda::round_bf16(rb, kStream);
    RopeParams rp;
    rp.x = x.get();
    rp.positions = pos.get();
    rp.inv_freq = inv.get();
    rp.tokens = tokens;
    rp.heads = heads;
    cuda::rope(rp, kStream);
    HadamardParams hd;
    hd.x = x.get();
    hd.rows = tokens * heads * 4;
    hd.n = 128;
    cuda::hadamard(hd, kStream);
    SparseAttnParams sa;
    sa.q = x.get();
    sa.kv = kv.get();
    sa.idx = idx.get();
    sa.sink = sink.get();
    sa.out = out.get();
    sa.tokens = tokens;
    sa.heads = heads;
    sa.dim = dim;
    sa.kv_rows = rows;
    sa.topk = 16;
    cuda::sparse_attn(sa, kStream);
    IndexerScoreParams is;
    is.q = x.get();
    is.k = kv.get();
    is.w = sink.get();
    is.visible = vis.get();
    is.tokens = tokens;
    is.heads = 1;
    is.dim = 128;
    is.entries = rows;
    is.ldk = dim;
    is.scores = scores.get();
    cuda::indexer_score(is, kStream);
    CompressPoolParams cp;
    cp.kv = kv.get();
    cp.score = kv.get();
    cp.rows = 8;
    cp.ld = dim;
    cp.d = 128;
    cp.ratio = 4;
    cp.num_entries = 2;
    cp.out = out.get();
    cuda::compress_pool(cp, kStream);
    RowsCopyParams rc;
    rc.src = out.get();
    rc.dst = kv.get();
    rc.rows = idx.get();
    rc.count = 8;
    rc.cols = dim;
    cuda::rows_copy(rc, kStream);
  }
  sync();
  EXPECT_EQ(cuda::alloc_stats().count, allocs);
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
