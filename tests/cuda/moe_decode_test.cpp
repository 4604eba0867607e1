// moe_decode (model/cuda/moe_decode.h) stage by stage, each stage against float64 or bit-exact
// host arithmetic on the previous stage's device output, so a failure names the stage:
//  gate logits: within the decode GEMV bound (decode_test_util.h) at the gate's k split;
//  routing: ids and weights bit for bit those of the CUDA moe_gate op on the same logits, ids equal
//    to the CPU op's; groups: every local (token, slot) exactly once under its expert, experts
//    ascending, offsets consistent, other ranks' experts absent, each token's combine order;
//  experts up: each SwiGLU row a bf16 value the arithmetic allows: bf16(g), bf16(u) the bf16
//    rounding of some value within the GEMV bound of g64, u64, then the swiglu op's fp32 SwiGLU
//    (relative error < 2^-20 against the exact function of those bf16 inputs), then bf16; checked
//    as an interval (the SwiGLU's range over the box of possible inputs), so any bound width works;
//  act_quant: codes and scales bit for bit the CPU op's on the device rows;
//  experts down: correctly rounded within the GEMV bound of float64 on those codes;
//  combine: bit for bit the host's fp32 sum in ascending expert id plus the shared expert, bf16.
// Then: the gate + routing kernel alone past the routing CTA's shared pairs; every row count gives
// the same bits per token (1, 6, 8, 48, 96 within a 96-token call), a rank's local expert range
// (routed sum only), hash routing, a NaN MXFP4 scale's rows (NaN exactly there), a captured graph
// equal to eager (the kernels' arrival counters are left at zero by every call), and a loose
// end-to-end comparison with the CPU composition (forward.cpp's moe) as a sanity check.
#include <algorithm>
#include <map>
#include <string>
#include <type_traits>

#include "cuda/decode_test_util.h"
#include "kernels/cuda/timeline.cuh"
#include "model/cuda/moe_decode.h"

namespace tandem::kernels::cuda_testing {
namespace {

using cuda_model::MoeDecodeArgs;
using cuda_model::MoeDecodeDims;

// ---- bf16 helpers on exact values ----
double rn_bf16(double v) {  // round a double to the nearest bf16 (ties to even), exactly
  if (v == 0 || !std::isfinite(v)) return v;
  int e = std::ilogb(v);
  if (e < -126) e = -126;
  const double ulp = std::ldexp(1.0, e - 7);
  return std::nearbyint(v / ulp) * ulp;
}
bool in_bf16_range(float got, double lo, double hi) {  // got is RN_bf16 of some real in [lo, hi]
  return num::round_bf16(got) == got && got >= rn_bf16(lo) && got <= rn_bf16(hi);
}
// silu(x) = x / (1 + e^-x) in float64, and its range over [lo, hi] (one minimum, near -1.2785).
double silu64(double x) { return x / (1.0 + std::exp(-x)); }
std::pair<double, double> silu_range(double lo, double hi) {
  constexpr double kArgMin = -1.2784645427610738;  // silu'(x) = 0
  double a = silu64(lo), b = silu64(hi);
  double mn = std::min(a, b), mx = std::max(a, b);
  if (lo < kArgMin && kArgMin < hi) mn = std::min(mn, silu64(kArgMin));
  return {mn, mx};
}

// ---- a random MoE layer ----
struct Layer {
  MoeDecodeDims d;
  HostMatrix gate, w1, w3, w2, s1, s3, s2;
  std::vector<float> bias;
  DeviceBuffer<float> dbias;
  std::vector<int32_t> tid2eid;
  DeviceBuffer<int32_t> dtid2eid;
};

Layer make_layer(int64_t dim, int64_t inter, int E, int topk, uint64_t seed) {
  Layer L;
  L.d.dim = dim;
  L.d.inter = inter;
  L.d.n_experts = E;
  L.d.topk = topk;
  L.gate = random_matrix(WeightFormat::kBf16, E, dim, seed + 1);
  L.w1 = random_matrix(WeightFormat::kMxfp4, E * inter, dim, seed + 2);
  L.w3 = random_matrix(WeightFormat::kMxfp4, E * inter, dim, seed + 3);
  L.w2 = random_matrix(WeightFormat::kMxfp4, E * dim, inter, seed + 4);
  L.s1 = random_matrix(WeightFormat::kFp8Block, inter, dim, seed + 5);
  L.s3 = random_matrix(WeightFormat::kFp8Block, inter, dim, seed + 6);
  L.s2 = random_matrix(WeightFormat::kFp8Block, dim, inter, seed + 7);
  L.bias = randn(static_cast<size_t>(E), seed + 8, 0.3f, false);
  L.dbias = to_dev(L.bias);
  const int vocab = 1000;
  L.tid2eid.resize(static_cast<size_t>(vocab * topk));
  for (int v = 0; v < vocab; ++v) {  // distinct experts per token, as the checkpoint's table
    const int start = static_cast<int>(mix64(seed * 77 + v) % E);
    for (int j = 0; j < topk; ++j) L.tid2eid[v * topk + j] = (start + j) % E;
  }
  L.dtid2eid = to_dev(L.tid2eid);
  return L;
}

struct MoeRun {
  DeviceBuffer<uint8_t> mem;
  cuda_model::MoeDecodeBuffers buf;
  DeviceBuffer<float> dx, y;
  DeviceBuffer<uint8_t> codes, scales;
  DeviceBuffer<int32_t> tokens;
  HostCodes hc;
  std::vector<float> x;
  MoeDecodeArgs args;
};

// A call over `m` tokens (x rows), buffers sized for max_tokens; range: local experts.
void prepare(MoeRun& r, const Layer& L, const std::vector<float>& x, int64_t m, int64_t max_tokens, bool hash,
             int expert_begin, int expert_count, bool routed_only) {
  MoeDecodeDims d = L.d;
  d.max_tokens = max_tokens;
  r.mem = poisoned<uint8_t>(cuda_model::moe_decode_bytes(d), 0x7f);
  r.buf = cuda_model::moe_decode_carve(d, r.mem.get());
  cuda_model::moe_decode_init(d, r.buf, kStream);  // the arrival counters (the data stays poisoned)
  r.x = x;
  r.dx = to_dev(x);
  r.hc = host_act_quant(x, m, d.dim, d.dim);
  r.codes = to_dev(r.hc.codes);
  r.scales = to_dev(r.hc.scales);
  std::vector<int32_t> tok(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) tok[t] = static_cast<int32_t>(mix64(t * 31 + 7) % 1000);
  r.tokens = to_dev(tok);
  r.y = poisoned<float>(static_cast<size_t>(m * d.dim));
  MoeDecodeArgs& a = r.args;
  a = MoeDecodeArgs();
  a.dims = d;
  a.tokens = m;
  a.x = r.dx.get();
  a.x_codes = r.codes.get();
  a.x_scales = r.scales.get();
  a.token_ids = r.tokens.get();
  a.gate = L.gate.dev();
  a.bias = hash ? nullptr : L.dbias.get();
  a.tid2eid = hash ? L.dtid2eid.get() : nullptr;
  a.route_scale = 1.5f;
  const int64_t I = d.inter, D = d.dim;
  a.w1 = L.w1.dev().rows(expert_begin * I, expert_count * I);
  a.w3 = L.w3.dev().rows(expert_begin * I, expert_count * I);
  a.w2 = L.w2.dev().rows(expert_begin * D, expert_count * D);
  a.expert_begin = expert_begin;
  a.expert_count = expert_count;
  a.sh_w1 = L.s1.dev();
  a.sh_w3 = L.s3.dev();
  a.sh_w2 = L.s2.dev();
  a.swiglu_limit = 10.0f;
  a.buf = r.buf;
  a.y = r.y.get();
  a.routed_only = routed_only;
}

template <typename T>
std::vector<T> fetch(const T* p, size_t n) {
  std::vector<T> h(n);
  sync();
  if (n) TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// What the gate + routing kernel left, for the later stages' checks.
struct RouteView {
  std::vector<int32_t> ids, tpair, ptok;
  std::vector<float> wts, pw;
  std::vector<int> pair_expert;  // local expert of each pair position
  int64_t plocal = 0;            // pair positions in use
  bool complete = false;         // every check ran (no ASSERT returned early)
};

// Stages 1-3 (gate logits, routing, groups) of a call whose gate + routing kernel has run.
void check_route(const MoeRun& r, const Layer& L, RouteView& v) {
  const MoeDecodeArgs& a = r.args;
  const int64_t m = a.tokens, D = a.dims.dim, E = a.dims.n_experts;
  const int K = a.dims.topk;
  // 1. gate logits
  const std::vector<float> logits = fetch(a.buf.gate_logits, static_cast<size_t>(m * E));
  // The decode GEMV's bound (tensor-core k16 steps, then fp32 additions of 128-k partials): the
  // gate adds its partials in two levels, so its k split is the longest chain of additions + 1
  // (11 at D = 4096, where the persistent GEMV it replaced had 8 units: the bound's (split + 2) x
  // 2^-24 term grows from 10 to 13 x 2^-24, about 0.04% of the bound, whose k/16 x 2^-19 term
  // dominates; derived from the kernel's order, not from a measured error).
  EXPECT_TRUE(within_bound(logits, E, reference(r.x.data(), D, 0, m, L.gate),
                           decode_factor(D, cuda_model::moe_gate_k_split(D)), false))
      << "gate logits";
  // 2. routing against the moe_gate ops on the same logits
  const std::vector<int32_t> ids = fetch(a.buf.expert_ids, static_cast<size_t>(m * K));
  const std::vector<float> wts = fetch(a.buf.weights, static_cast<size_t>(m * K));
  {
    DeviceBuffer<float> dl = to_dev(logits);
    auto dids = poisoned<int32_t>(ids.size(), 0x5a);
    auto dw = poisoned<float>(wts.size());
    MoeGateParams p;
    p.logits = dl.get();
    p.bias = a.bias;
    p.token_ids = a.tid2eid ? a.token_ids : nullptr;
    p.tid2eid = a.tid2eid;
    p.tokens = m;
    p.n_experts = static_cast<int>(E);
    p.topk = K;
    p.route_scale = a.route_scale;
    p.expert_ids = dids.get();
    p.weights = dw.get();
    cuda::moe_gate(p, kStream);
    EXPECT_TRUE(same_values(to_host(dids), ids)) << "expert ids vs the CUDA moe_gate op";
    EXPECT_TRUE(same_bits(to_host(dw), wts)) << "weights vs the CUDA moe_gate op";
    std::vector<int32_t> cids(ids.size());
    std::vector<float> cw(wts.size());
    std::vector<int32_t> htok = fetch(a.token_ids, static_cast<size_t>(m));
    p.logits = logits.data();
    p.bias = a.bias ? L.bias.data() : nullptr;
    p.token_ids = a.tid2eid ? htok.data() : nullptr;
    p.tid2eid = a.tid2eid ? L.tid2eid.data() : nullptr;
    p.expert_ids = cids.data();
    p.weights = cw.data();
    cpu_ops().moe_gate(p);
    EXPECT_TRUE(same_values(ids, cids)) << "expert ids vs the CPU moe_gate op";
  }
  // 3. groups
  const int64_t A = std::min<int64_t>(E, a.dims.max_tokens * K);
  const std::vector<int32_t> active = fetch(a.buf.active, static_cast<size_t>(2 * A + 2));
  const std::vector<int32_t> ptok = fetch(a.buf.pair_token, static_cast<size_t>(m * K));
  const std::vector<float> pw = fetch(a.buf.pair_weight, static_cast<size_t>(m * K));
  const std::vector<int32_t> tpair = fetch(a.buf.token_pair, static_cast<size_t>(m * K));
  std::map<int, std::vector<int64_t>> want_pairs;  // local expert -> (token, slot) pairs
  for (int64_t p = 0; p < m * K; ++p) {
    const int le = ids[p] - a.expert_begin;
    if (le >= 0 && le < a.expert_count) want_pairs[le].push_back(p);
  }
  const int nact = active[0];
  ASSERT_EQ(nact, static_cast<int>(want_pairs.size())) << "active experts";
  std::vector<int> pair_expert(static_cast<size_t>(m * K), -1);  // local expert of each pair position
  int slot = 0;
  int64_t plocal = 0;
  for (const auto& [le, pairs] : want_pairs) {
    ASSERT_EQ(active[1 + slot], le) << "active expert " << slot;
    const int off = active[1 + A + slot], end = active[1 + A + slot + 1];
    ASSERT_EQ(end - off, static_cast<int>(pairs.size())) << "pairs of expert " << le;
    for (int64_t p : pairs) {
      const int pos = tpair[p];
      ASSERT_TRUE(pos >= off && pos < end) << "token_pair of pair " << p;
      EXPECT_EQ(ptok[pos], p / K);
      EXPECT_EQ(num::f32_bits(pw[pos]), num::f32_bits(wts[p]));
      pair_expert[pos] = le;
    }
    plocal = end;
    ++slot;
  }
  for (int64_t p = 0; p < m * K; ++p) {
    const int le = ids[p] - a.expert_begin;
    if (!(le >= 0 && le < a.expert_count)) {
      EXPECT_EQ(tpair[p], -1) << "pair " << p << " of another rank";
    }
  }
  // The combine's order: each token's pair positions by ascending (expert id, slot).
  const std::vector<int32_t> corder = fetch(a.buf.combine_order, static_cast<size_t>(m * K));
  for (int64_t t = 0; t < m; ++t) {
    std::vector<std::pair<int, int>> order;  // (expert id, slot)
    for (int k = 0; k < K; ++k) order.push_back({ids[t * K + k], k});
    std::sort(order.begin(), order.end());
    for (int j = 0; j < K; ++j)
      ASSERT_EQ(corder[t * K + j], tpair[t * K + order[j].second]) << "combine order of token " << t << " rank " << j;
  }
  v.ids = ids;
  v.wts = wts;
  v.tpair = tpair;
  v.ptok = ptok;
  v.pw = pw;
  v.pair_expert = pair_expert;
  v.plocal = plocal;
  v.complete = true;
}

// The stage checks on one finished call (see the file comment).
void check_stages(const MoeRun& r, const Layer& L) {
  const MoeDecodeArgs& a = r.args;
  const int64_t m = a.tokens, D = a.dims.dim, I = a.dims.inter;
  const int K = a.dims.topk;
  RouteView v;
  check_route(r, L, v);
  if (!v.complete) return;
  const std::vector<int32_t>& ids = v.ids;
  const std::vector<int32_t>& tpair = v.tpair;
  const std::vector<int32_t>& ptok = v.ptok;
  const std::vector<float>& pw = v.pw;
  const std::vector<int>& pair_expert = v.pair_expert;
  const int64_t plocal = v.plocal;
  // 4. experts up (SwiGLU rows)
  const bool shared = a.sh_w1.data != nullptr;
  const int64_t srow0 = m * K, rows = srow0 + (shared ? m : 0);
  const std::vector<float> act = fetch(a.buf.act, static_cast<size_t>(rows * I));
  const double fu = decode_factor(D, cuda_model::moe_decode_units(D, true));
  auto check_up = [&](int64_t row, int64_t token, const HostMatrix& w1, const HostMatrix& w3, int64_t wrow0,
                      const float* weight) -> bool {
    const Ref64 g = reference(r.hc.values.data() + token * D, D, 0, 1, w1, wrow0, I);
    const Ref64 u = reference(r.hc.values.data() + token * D, D, 0, 1, w3, wrow0, I);
    const double L = 10.0;
    for (int64_t j = 0; j < I; ++j) {
      const float got = act[row * I + j];
      // bf16(g) and bf16(u) lie in the roundings of the GEMV bound's ends (rounding is monotone).
      const double g_lo = rn_bf16(g.y[j] - fu * g.a[j]), g_hi = rn_bf16(g.y[j] + fu * g.a[j]);
      const double u_lo = rn_bf16(u.y[j] - fu * u.a[j]), u_hi = rn_bf16(u.y[j] + fu * u.a[j]);
      const auto [s_lo, s_hi] = silu_range(std::min(g_lo, L), std::min(g_hi, L));
      const double c_lo = std::clamp(u_lo, -L, L), c_hi = std::clamp(u_hi, -L, L);
      double lo = std::min({s_lo * c_lo, s_lo * c_hi, s_hi * c_lo, s_hi * c_hi});
      double hi = std::max({s_lo * c_lo, s_lo * c_hi, s_hi * c_lo, s_hi * c_hi});
      if (weight) {
        const double w = *weight, a0 = lo * w, a1 = hi * w;
        lo = std::min(a0, a1);
        hi = std::max(a0, a1);
      }
      // The swiglu op computes g / (1 + expf(-g)) in fp32: below -88.72 expf(-g) overflows to inf and
      // the op (CPU and device alike) gives a signed zero where float64 gives a value near 1e-37.
      if (g_lo < -88.72) {
        lo = std::min(lo, 0.0);
        hi = std::max(hi, 0.0);
      }
      // The swiglu op's fp32 arithmetic (expf within 2 ulp, four correctly rounded operations).
      const double e = std::max(std::fabs(lo), std::fabs(hi)) * std::ldexp(1.0, -20) + std::ldexp(1.0, -126);
      if (!in_bf16_range(got, lo - e, hi + e)) {
        ADD_FAILURE() << "SwiGLU row " << row << " (token " << token << ") column " << j << ": got " << got
                      << ", allowed [" << rn_bf16(lo - e) << ", " << rn_bf16(hi + e) << "]; g64 " << g.y[j] << " +- "
                      << fu * g.a[j] << ", u64 " << u.y[j] << " +- " << fu * u.a[j]
                      << (weight ? ", weight " : "") << (weight ? *weight : 0.0f);
        return false;
      }
    }
    return true;
  };
  for (int64_t pos = 0; pos < plocal; ++pos) {
    if (!check_up(pos, ptok[pos], L.w1, L.w3, (a.expert_begin + pair_expert[pos]) * I, &pw[pos])) break;
  }
  if (shared)
    for (int64_t t = 0; t < m; ++t)
      if (!check_up(srow0 + t, t, L.s1, L.s3, 0, nullptr)) break;
  // 5. act_quant of the SwiGLU rows
  const std::vector<uint8_t> codes = fetch(a.buf.act_codes, static_cast<size_t>(rows * I));
  const std::vector<uint8_t> scales = fetch(a.buf.act_scales, static_cast<size_t>(rows * I / 128));
  std::vector<float> used;
  std::vector<int64_t> used_rows;
  for (int64_t p = 0; p < plocal; ++p) used_rows.push_back(p);
  if (shared)
    for (int64_t t = 0; t < m; ++t) used_rows.push_back(srow0 + t);
  for (int64_t row : used_rows) used.insert(used.end(), act.begin() + row * I, act.begin() + (row + 1) * I);
  const HostCodes hq = host_act_quant(used, static_cast<int64_t>(used_rows.size()), I, I);
  std::vector<uint8_t> got_c, got_s;
  for (int64_t row : used_rows) {
    got_c.insert(got_c.end(), codes.begin() + row * I, codes.begin() + (row + 1) * I);
    got_s.insert(got_s.end(), scales.begin() + row * (I / 128), scales.begin() + (row + 1) * (I / 128));
  }
  EXPECT_TRUE(same_values(got_c, hq.codes)) << "act codes";
  EXPECT_TRUE(same_values(got_s, hq.scales)) << "act scales";
  // 6. experts down
  const std::vector<float> pout = fetch(a.buf.pair_out, static_cast<size_t>(std::max<int64_t>(plocal, 1) * D));
  const std::vector<float> sout = fetch(a.buf.shared_out, static_cast<size_t>(m * D));
  const double fd = decode_factor(I, cuda_model::moe_decode_units(I, false));
  for (size_t q = 0; q < used_rows.size(); ++q) {
    const int64_t row = used_rows[q];
    const bool is_shared = row >= srow0;
    const HostMatrix& w = is_shared ? L.s2 : L.w2;
    const int64_t wrow0 = is_shared ? 0 : (a.expert_begin + pair_expert[row]) * D;
    const Ref64 ref = reference(hq.values.data() + q * I, I, 0, 1, w, wrow0, D);
    const std::vector<float> got(is_shared ? sout.begin() + (row - srow0) * D : pout.begin() + row * D,
                                 is_shared ? sout.begin() + (row - srow0 + 1) * D : pout.begin() + (row + 1) * D);
    const auto res = within_bound(got, D, ref, fd, true);
    if (!res) {
      ADD_FAILURE() << "w2 of row " << row << (is_shared ? " (shared)" : "") << ": " << res.message();
      break;
    }
  }
  // 7. combine
  const std::vector<float> y = fetch(a.y, static_cast<size_t>(m * D));
  for (int64_t t = 0; t < m; ++t) {
    std::vector<std::pair<int, int>> order;  // (expert id, slot)
    for (int k = 0; k < K; ++k) order.push_back({ids[t * K + k], k});
    std::sort(order.begin(), order.end());
    for (int64_t c = 0; c < D; ++c) {
      float acc = 0.0f;
      for (auto [e, k] : order) {
        const int pos = tpair[t * K + k];
        if (pos >= 0) acc += pout[pos * D + c];
      }
      const float want = a.routed_only ? acc : num::round_bf16(acc + sout[t * D + c]);
      if (num::f32_bits(y[t * D + c]) != num::f32_bits(want)) {
        ADD_FAILURE() << "combine token " << t << " column " << c << ": got " << y[t * D + c] << " want " << want;
        return;
      }
    }
  }
}

// The expert kernels split k into moe_decode_units(k) units; the MXFP4 groups' two steps and fp32
// adds stay inside the same bound (2^-18 + k/32 * 2^-24 <= k/16 * 2^-19).

void run_and_check(const Layer& L, int64_t m, bool hash, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "dim " << L.d.dim << " inter " << L.d.inter << " experts " << L.d.n_experts
                                  << " top " << L.d.topk << " tokens " << m << (hash ? " hash" : ""));
  MoeRun r;
  prepare(r, L, act_rows(m, L.d.dim, seed), m, m, hash, 0, L.d.n_experts, false);
  ASSERT_TRUE(cuda_model::moe_decode_supports(r.args));
  cuda_model::moe_decode(r.args, kStream);
  check_stages(r, L);
}

TEST(CudaMoeDecode, EveryStageAtEveryTokenCount) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 100);
  for (int64_t m : {int64_t{1}, int64_t{6}, int64_t{8}, int64_t{48}, int64_t{96}}) run_and_check(L, m, false, 10 + m);
}

// The real widths (k = 4096 up, 2048 down: the k-split paths, 256-k MXFP4 stages), few experts:
// every routed expert one row (1: the one-row loop), a mix of one- and two-row experts (2), and
// experts of several rows (8, 16).
TEST(CudaMoeDecode, FullWidthExperts) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(4096, 2048, 8, 6, 200);
  for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{16}}) run_and_check(L, m, false, 20 + m);
}

// At the real widths, a (token, slot) pair's SwiGLU row, its w2 output and the token's y have the
// same bits whatever the call's other tokens: a 48-token call (every expert many rows: the generic
// MXFP4 loop, two m tiles) against calls of 1, 2, 8 and 16 of its tokens, where most experts have one
// row (the one-row loop) and some none. RowsAreIndependentOfTheTokenCount does the same at 128-k
// stages.
TEST(CudaMoeDecode, FullWidthRowsAreIndependentOfTheTokenCount) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(4096, 2048, 16, 6, 1400);
  const int64_t M = 48, D = L.d.dim, I = L.d.inter;
  const int K = L.d.topk;
  const std::vector<float> x = act_rows(M, D, 141);
  MoeRun all;
  prepare(all, L, x, M, M, false, 0, L.d.n_experts, false);
  cuda_model::moe_decode(all.args, kStream);
  const std::vector<float> y_all = to_host(all.y);
  const std::vector<int32_t> tp_all = fetch(all.buf.token_pair, static_cast<size_t>(M * K));
  const std::vector<float> act_all = fetch(all.buf.act, static_cast<size_t>(M * (K + 1) * I));
  const std::vector<float> po_all = fetch(all.buf.pair_out, static_cast<size_t>(M * K * D));
  int one_row_experts = 0;
  for (auto [i0, m] : {std::pair<int64_t, int64_t>{0, 1}, {29, 1}, {3, 2}, {10, 8}, {31, 16}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << i0 << ".." << i0 + m - 1 << " of " << M);
    MoeRun r;
    prepare(r, L, std::vector<float>(x.begin() + i0 * D, x.begin() + (i0 + m) * D), m, m, false, 0, L.d.n_experts,
            false);
    cuda_model::moe_decode(r.args, kStream);
    const std::vector<int32_t> tp = fetch(r.buf.token_pair, static_cast<size_t>(m * K));
    const std::vector<float> act = fetch(r.buf.act, static_cast<size_t>(m * (K + 1) * I));
    const std::vector<float> po = fetch(r.buf.pair_out, static_cast<size_t>(m * K * D));
    const int A = static_cast<int>(std::min<int64_t>(L.d.n_experts, m * K));  // the buffers' max_active
    const std::vector<int32_t> active = fetch(r.buf.active, static_cast<size_t>(2 * A + 2));
    for (int j = 0; j < active[0]; ++j) one_row_experts += active[1 + A + j + 1] - active[1 + A + j] == 1;
    for (int64_t t = 0; t < m; ++t)
      for (int k = 0; k < K; ++k) {
        const int32_t p = tp[t * K + k], q = tp_all[(i0 + t) * K + k];
        ASSERT_TRUE(p >= 0 && q >= 0) << "token " << t << " slot " << k << ": token_pair " << p << ", " << q;
        EXPECT_TRUE(same_bits(std::vector<float>(act.begin() + p * I, act.begin() + (p + 1) * I),
                              std::vector<float>(act_all.begin() + q * I, act_all.begin() + (q + 1) * I)))
            << "SwiGLU row of token " << t << " slot " << k << " (pair row " << p << ", " << q << " in the 48)";
        EXPECT_TRUE(same_bits(std::vector<float>(po.begin() + p * D, po.begin() + (p + 1) * D),
                              std::vector<float>(po_all.begin() + q * D, po_all.begin() + (q + 1) * D)))
            << "w2 output of token " << t << " slot " << k << " (pair row " << p << ", " << q << " in the 48)";
        if (::testing::Test::HasFailure()) return;
      }
    EXPECT_TRUE(same_bits(to_host(r.y), std::vector<float>(y_all.begin() + i0 * D, y_all.begin() + (i0 + m) * D)))
        << "y";
  }
  EXPECT_GE(one_row_experts, 6) << "the one-row loop ran for too few experts";
}

TEST(CudaMoeDecode, HashRouting) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 300);
  for (int64_t m : {int64_t{1}, int64_t{7}}) run_and_check(L, m, true, 30 + m);
}

// The gate + routing kernel alone past the routing CTA's shared pairs (kRoutePairs = 1024: the
// grouping then reads the ids back from global memory), at the real gate width (k split over 4
// CTAs) and a narrow one, score and hash layers, a local expert range.
TEST(CudaMoeDecode, GateRouteManyPairs) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(4096, 128, 32, 6, 800);
  const Layer N = make_layer(512, 256, 32, 8, 900);
  for (const auto& [layer, m, hash, begin, count] :
       {std::tuple<const Layer*, int64_t, bool, int, int>{&L, 200, false, 0, 32}, {&L, 171, false, 8, 16},
        {&N, 160, true, 0, 32}, {&N, 129, false, 8, 16}, {&N, 128, false, 0, 32}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << layer->d.dim << " experts " << layer->d.n_experts << " top "
                                      << layer->d.topk << " tokens " << m << (hash ? " hash" : "") << " local "
                                      << begin << ".." << begin + count - 1);
    MoeRun r;
    prepare(r, *layer, act_rows(m, layer->d.dim, 80 + m), m, m, hash, begin, count, true);
    ASSERT_TRUE(cuda_model::moe_decode_supports(r.args));
    cuda_model::moe_gate_route(r.args, kStream);
    RouteView v;
    check_route(r, *layer, v);
    EXPECT_TRUE(v.complete);
  }
}

// The lean routing tail (up to 8 tokens and 128 pairs) against the general one (forced by
// general_route) on the same call: both pass the routing and grouping checks, the expert ids,
// weights and logits are the same bits, every pair has the same expert, and the outputs y are the
// same bits. Score and hash layers, a local expert range, 256 experts at 8 tokens (the logits in
// two rounds of 1,024), 16 experts a token at 8 tokens (128 pairs: 4 a lane), 4,096 wide (k split
// over 4 CTAs), 512 experts (the passes over shared memory instead of the sorted pick), a token's
// experts all held by one lane of the sorted pick, a gate repeating an expert within a token (hash).
TEST(CudaMoeDecode, LeanRoutingEqualsTheGeneral) {
  TANDEM_REQUIRE_GPU();
  const Layer A = make_layer(512, 256, 32, 6, 1000);
  const Layer B = make_layer(512, 128, 256, 8, 1100);
  const Layer C = make_layer(512, 128, 64, 16, 1200);
  const Layer W = make_layer(4096, 128, 32, 6, 1300);
  const Layer X = make_layer(512, 128, 512, 6, 1500);  // past the sorted pick's 256 experts
  // Every expert of lane 5 (ids 5 + 32 j) far ahead of the others: a token's 8 experts all come
  // from one lane's sorted keys (the whole network and every pop).
  Layer S = make_layer(512, 128, 256, 8, 1600);
  for (int e = 5; e < 256; e += 32) S.bias[e] += 50.0f;
  S.dbias = to_dev(S.bias);
  Layer R = make_layer(512, 256, 32, 6, 1400);
  for (int v = 0; v < 1000; ++v) R.tid2eid[v * 6 + 3] = R.tid2eid[v * 6 + 1];  // an expert twice per token
  R.dtid2eid = to_dev(R.tid2eid);
  int case_no = 0;
  for (const auto& [layer, m, hash, begin, count] :
       {std::tuple<const Layer*, int64_t, bool, int, int>{&A, 1, false, 0, 32}, {&A, 6, false, 0, 32},
        {&A, 8, false, 8, 16}, {&A, 5, true, 0, 32}, {&B, 8, false, 0, 256}, {&B, 3, false, 64, 128},
        {&C, 8, false, 0, 64}, {&W, 1, false, 0, 32}, {&W, 7, false, 16, 16}, {&X, 2, false, 0, 512},
        {&S, 8, false, 0, 256}, {&S, 8, false, 0, 256}, {&S, 8, false, 0, 256}, {&S, 8, false, 0, 256},
        {&S, 1, false, 128, 128}, {&R, 4, true, 0, 32}}) {
    SCOPED_TRACE(::testing::Message() << "case " << case_no + 1 << ": dim " << layer->d.dim << " experts "
                                      << layer->d.n_experts << " top " << layer->d.topk << " tokens " << m
                                      << (hash ? " hash" : "") << " local " << begin << ".." << begin + count - 1);
    // Each case its own rows (S's four calls: 32 orders of one lane's 8 keys, each sorted by the
    // network; one comparator missing misorders 14-69% of the 8! orders).
    const std::vector<float> x = act_rows(m, layer->d.dim, 90 + m + 1000 * ++case_no);
    const int K = layer->d.topk;
    const size_t P = static_cast<size_t>(m * K);
    MoeRun r[2];  // lean, general
    for (int i = 0; i < 2; ++i) {
      prepare(r[i], *layer, x, m, m, hash, begin, count, false);
      r[i].args.general_route = i == 1;
      ASSERT_TRUE(cuda_model::moe_decode_supports(r[i].args));
      cuda_model::moe_decode(r[i].args, kStream);
      RouteView v;
      check_route(r[i], *layer, v);
      ASSERT_TRUE(v.complete) << (i == 0 ? "lean" : "general");
    }
    const auto& l = r[0].buf;
    const auto& g = r[1].buf;
    const size_t E = static_cast<size_t>(layer->d.n_experts);
    EXPECT_TRUE(same_bits(fetch(l.gate_logits, m * E), fetch(g.gate_logits, m * E))) << "logits";
    EXPECT_TRUE(same_values(fetch(l.expert_ids, P), fetch(g.expert_ids, P))) << "expert ids";
    EXPECT_TRUE(same_bits(fetch(l.weights, P), fetch(g.weights, P))) << "weights";
    const size_t A2 = 2 * static_cast<size_t>(std::min<int64_t>(layer->d.n_experts, m * K)) + 2;
    const std::vector<int32_t> al = fetch(l.active, A2), ag = fetch(g.active, A2);
    ASSERT_EQ(al[0], ag[0]) << "active experts";
    const size_t n = static_cast<size_t>(al[0]);
    EXPECT_TRUE(same_values(std::vector<int32_t>(al.begin(), al.begin() + 1 + n),
                            std::vector<int32_t>(ag.begin(), ag.begin() + 1 + n)))
        << "active expert ids";
    const size_t off0 = 1 + (A2 - 2) / 2;
    EXPECT_TRUE(same_values(std::vector<int32_t>(al.begin() + off0, al.begin() + off0 + n + 1),
                            std::vector<int32_t>(ag.begin() + off0, ag.begin() + off0 + n + 1)))
        << "offsets";
    EXPECT_TRUE(same_bits(to_host(r[0].y), to_host(r[1].y))) << "y";
  }
}

// A token's output bits do not depend on the other tokens of the call or the buffers' size.
TEST(CudaMoeDecode, RowsAreIndependentOfTheTokenCount) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 400);
  const int64_t M = 96, D = L.d.dim;
  const std::vector<float> x = act_rows(M, D, 41);
  MoeRun all;
  prepare(all, L, x, M, M, false, 0, L.d.n_experts, false);
  cuda_model::moe_decode(all.args, kStream);
  const std::vector<float> want = to_host(all.y);
  for (auto [i0, m, cap] : {std::tuple<int64_t, int64_t, int64_t>{0, 1, 1}, {5, 1, 96}, {3, 6, 6}, {17, 8, 16},
                            {40, 48, 48}, {0, 96, 96}}) {
    MoeRun r;
    prepare(r, L, std::vector<float>(x.begin() + i0 * D, x.begin() + (i0 + m) * D), m, cap, false, 0, L.d.n_experts,
            false);
    cuda_model::moe_decode(r.args, kStream);
    EXPECT_TRUE(same_bits(to_host(r.y), std::vector<float>(want.begin() + i0 * D, want.begin() + (i0 + m) * D)))
        << "tokens " << i0 << ".." << i0 + m << " (buffers for " << cap << ")";
  }
}

// Tensor parallelism: each half of the experts on its own "rank", routed sums only; each rank's
// expert outputs are the single-rank call's bit for bit.
TEST(CudaMoeDecode, LocalExpertRange) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 500);
  const int64_t m = 8, D = L.d.dim;
  const int K = L.d.topk;
  const std::vector<float> x = act_rows(m, D, 51);
  MoeRun full;
  prepare(full, L, x, m, m, false, 0, L.d.n_experts, true);
  cuda_model::moe_decode(full.args, kStream);
  const std::vector<int32_t> tp_full = fetch(full.buf.token_pair, static_cast<size_t>(m * K));
  const std::vector<float> po_full = fetch(full.buf.pair_out, static_cast<size_t>(m * K * D));
  for (int half = 0; half < 2; ++half) {
    SCOPED_TRACE(::testing::Message() << "experts " << half * 16 << ".." << half * 16 + 15);
    MoeRun r;
    prepare(r, L, x, m, m, false, half * 16, 16, true);
    ASSERT_TRUE(cuda_model::moe_decode_supports(r.args));
    cuda_model::moe_decode(r.args, kStream);
    check_stages(r, L);
    const std::vector<int32_t> tp = fetch(r.buf.token_pair, static_cast<size_t>(m * K));
    const std::vector<float> po = fetch(r.buf.pair_out, static_cast<size_t>(m * K * D));
    for (int64_t p = 0; p < m * K; ++p) {
      if (tp[p] < 0) continue;
      ASSERT_GE(tp_full[p], 0);
      EXPECT_TRUE(same_bits(std::vector<float>(po.begin() + tp[p] * D, po.begin() + (tp[p] + 1) * D),
                            std::vector<float>(po_full.begin() + tp_full[p] * D, po_full.begin() + (tp_full[p] + 1) * D)))
          << "pair " << p;
    }
  }
}

// A NaN E8M0 scale (0xff) in a routed expert's weights: in w2, that weight row's output is NaN for
// every pair of the expert; in w1, the expert's SwiGLU column is NaN and so every w2 output of its
// pairs; every other output keeps its bits. Both MXFP4 stage widths (128 k: dim 512, inter 256;
// 256 k: dim 1024, inter 2048), at 4 tokens (experts of one and several rows) and at 1 (every expert
// one row: the one-row loop); the NaN group is not the first of its k unit, so the sums of the
// groups before it must turn NaN too.
TEST(CudaMoeDecode, NanWeightScaleMakesItsRowsNan) {
  TANDEM_REQUIRE_GPU();
  for (auto [dim, inter, E, m] : {std::tuple<int64_t, int64_t, int, int64_t>{512, 256, 32, 4}, {1024, 2048, 8, 4},
                                  {512, 256, 32, 1}, {1024, 2048, 8, 1}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim << " inter " << inter << " tokens " << m);
    Layer L = make_layer(dim, inter, E, 6, 700);
    const int64_t D = dim, I = inter;
    const int K = L.d.topk;
    const std::vector<float> x = act_rows(m, D, 71);
    auto run = [&](std::vector<int32_t>* ids, std::vector<int32_t>* tp) {
      MoeRun r;
      prepare(r, L, x, m, m, false, 0, E, true);
      cuda_model::moe_decode(r.args, kStream);
      if (ids) *ids = fetch(r.buf.expert_ids, static_cast<size_t>(m * K));
      if (tp) *tp = fetch(r.buf.token_pair, static_cast<size_t>(m * K));
      return fetch(r.buf.pair_out, static_cast<size_t>(m * K * D));
    };
    // Each run's pair rows through its own token_pair (the order of an expert's pairs is the
    // routing's atomics', not fixed from run to run).
    std::vector<int32_t> ids, tp, tp2, tp1;
    const std::vector<float> clean = run(&ids, &tp);
    const int e = ids[0];  // the first token's first expert
    // Each matrix: the expert's weight row `row`, its third-to-last 32-k group.
    auto poison = [&](HostMatrix& w, int64_t rows_per_expert, int64_t row) {
      const int64_t groups = w.k / 32;
      w.scale[static_cast<size_t>((e * rows_per_expert + row) * groups + groups - 3)] = 0xff;
      w.dscale = to_dev(w.scale);
    };
    const int64_t row2 = 37 % D;
    const std::vector<uint8_t> w2_scale = L.w2.scale;
    poison(L.w2, D, row2);
    const std::vector<float> got2 = run(nullptr, &tp2);
    const int64_t row1 = 5 % I;
    L.w2.scale = w2_scale;  // w2 as before
    L.w2.dscale = to_dev(L.w2.scale);
    poison(L.w1, I, row1);
    const std::vector<float> got1 = run(nullptr, &tp1);
    int bad2 = 0, bad1 = 0;
    for (int64_t p = 0; p < m * K; ++p) {
      ASSERT_GE(tp[p], 0);
      ASSERT_GE(tp2[p], 0);
      ASSERT_GE(tp1[p], 0);
      for (int64_t c = 0; c < D; ++c) {
        const size_t i = static_cast<size_t>(tp[p] * D + c);
        const size_t i2 = static_cast<size_t>(tp2[p] * D + c), i1 = static_cast<size_t>(tp1[p] * D + c);
        const bool nan2 = ids[p] == e && c == row2, nan1 = ids[p] == e;
        const bool ok2 = nan2 ? std::isnan(got2[i2]) : num::f32_bits(got2[i2]) == num::f32_bits(clean[i]);
        const bool ok1 = nan1 ? std::isnan(got1[i1]) : num::f32_bits(got1[i1]) == num::f32_bits(clean[i]);
        if (!ok2 && bad2++ < 3)
          ADD_FAILURE() << "w2 NaN scale (expert " << e << ", row " << row2 << "): pair " << p << " (expert " << ids[p]
                        << ") column " << c << ": " << got2[i2] << ", clean " << clean[i];
        if (!ok1 && bad1++ < 3)
          ADD_FAILURE() << "w1 NaN scale (expert " << e << ", row " << row1 << "): pair " << p << " (expert " << ids[p]
                        << ") column " << c << ": " << got1[i1] << ", clean " << clean[i];
      }
    }
  }
}

// moe_decode runs the shared expert's up projection before the experts-up kernel's dependency wait
// (over the gate + routing kernel's run; the ring then starts over for the routed items), and each
// experts-down CTA's first item, when it is the shared expert's, before the experts-down kernel's
// wait (once the up kernel counted the shared rows quantized; its combine arrival deferred past
// the wait); the three kernels called one by one run them after the wait. Every buffer the call
// writes must have the same
// bits both ways: batch 1 (every routed expert one row), 8 (FP8's half m tile), 16 (one m tile), 17
// (two m tiles, the second of one row), 48 and 96 (two m tiles; at 96 the 384 shared items at full
// width outnumber the grid, so a CTA does two shared items before the wait), and local expert ranges
// down to one expert (a rank with no routed item, whose lead must not release the reduction buffer
// for an item that never comes).
// The pair rows (act, its codes and scales, pair_out) are compared through each call's token_pair:
// the order of an expert's pairs is whatever the routing's shared-memory atomics give
// (moe_decode_route.cu, placement), so two calls may place the same (token, slot) at different rows.
// Each case runs several times on the same buffers (the data poisoned again between runs, the
// counters as the last call left them): a race between the early shared items and the routing, or a
// counter left non-zero, shows up as a difference in some run.
TEST(CudaMoeDecode, EarlySharedExpertEqualsThePlainLaunch) {
  TANDEM_REQUIRE_GPU();
  const Layer F = make_layer(4096, 2048, 8, 6, 1200);
  const Layer N = make_layer(512, 256, 32, 6, 1300);
  constexpr int kReps = 4;
  // An expert no token of x chooses (the routing of a full-range call), for a rank without work.
  auto unchosen = [&](const Layer& L, const std::vector<float>& x, int64_t m) {
    MoeRun r;
    prepare(r, L, x, m, m, false, 0, L.d.n_experts, false);
    cuda_model::moe_gate_route(r.args, kStream);
    const std::vector<int32_t> ids = fetch(r.buf.expert_ids, static_cast<size_t>(m * L.d.topk));
    for (int e = L.d.n_experts - 1; e >= 0; --e)
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) return e;
    return -1;
  };
  struct Case {
    const Layer* layer;
    int64_t m;
    int begin, count;
    bool routed_only;
  };
  std::vector<Case> cases = {{&F, 1, 0, 8, false},  {&F, 8, 0, 8, false},  {&F, 16, 0, 8, false},
                             {&F, 17, 0, 8, false}, {&F, 48, 0, 8, false}, {&F, 96, 0, 8, false},
                             {&F, 1, 3, 1, true},   {&N, 1, 0, 32, false}, {&N, 6, 20, 1, true},
                             {&N, 8, 16, 16, true}, {&N, 17, 0, 32, false}, {&N, 96, 0, 32, false}};
  const int idle = unchosen(N, act_rows(1, N.d.dim, 91), 1);
  ASSERT_GE(idle, 0);
  cases.push_back({&N, 1, idle, 1, true});
  // The rows of `v` (len values each) at the pair positions of tp in (token, slot) order, skipping
  // another rank's pairs (-1); then the shared rows (from row P on), as they are.
  auto by_pair = [](const auto& v, size_t len, const std::vector<int32_t>& tp, size_t shared_rows) {
    std::remove_cvref_t<decltype(v)> out;
    const size_t P = tp.size();
    for (size_t p = 0; p < P; ++p)
      if (tp[p] >= 0) out.insert(out.end(), v.begin() + tp[p] * len, v.begin() + (tp[p] + 1) * len);
    out.insert(out.end(), v.begin() + P * len, v.begin() + (P + shared_rows) * len);
    return out;
  };
  int without_work = 0;
  for (const Case& c : cases) {
    const Layer& L = *c.layer;
    const int64_t m = c.m;
    const std::vector<float> x = act_rows(m, L.d.dim, 90 + m);
    MoeRun early, plain;
    prepare(early, L, x, m, m, false, c.begin, c.count, c.routed_only);
    prepare(plain, L, x, m, m, false, c.begin, c.count, c.routed_only);
    ASSERT_TRUE(cuda_model::moe_decode_supports(early.args));
    const MoeDecodeDims& d = early.args.dims;
    const int K = d.topk;
    const size_t R = static_cast<size_t>(m * (K + 1)), P = static_cast<size_t>(m * K);
    const size_t I = static_cast<size_t>(d.inter), D = static_cast<size_t>(d.dim), MD = static_cast<size_t>(m) * D;
    const size_t A = static_cast<size_t>(std::min<int64_t>(d.n_experts, m * K));
    for (int rep = 0; rep < kReps; ++rep) {
      SCOPED_TRACE(::testing::Message() << "dim " << L.d.dim << " tokens " << m << " local " << c.begin << ".."
                                        << c.begin + c.count - 1 << " run " << rep);
      if (rep > 0) {
        // Poison the data again (not the counters: every call must leave them zero).
        sync();
        for (MoeRun* r : {&early, &plain}) {
          TANDEM_CUDA_CHECK(cudaMemsetAsync(r->mem.get(), 0x7f, cuda_model::moe_decode_data_bytes(d), kStream));
          TANDEM_CUDA_CHECK(cudaMemsetAsync(r->y.get(), 0xff, r->y.bytes(), kStream));
        }
      }
      cuda_model::moe_decode(early.args, kStream);
      cuda_model::moe_gate_route(plain.args, kStream);
      cuda_model::moe_experts_up(plain.args, kStream);
      cuda_model::moe_experts_down(plain.args, kStream);
      const std::vector<int32_t> active = fetch(early.buf.active, 2 * A + 2);
      ASSERT_TRUE(same_values(active, fetch(plain.buf.active, 2 * A + 2))) << "active experts and pair offsets";
      const int local = active[0];
      if (rep == 0) without_work += local == 0;
      const std::vector<int32_t> tpe = fetch(early.buf.token_pair, P), tpp = fetch(plain.buf.token_pair, P);
      std::vector<int32_t> ptok_e = fetch(early.buf.pair_token, P), ptok_p = fetch(plain.buf.pair_token, P);
      std::vector<float> pw_e = fetch(early.buf.pair_weight, P), pw_p = fetch(plain.buf.pair_weight, P);
      for (size_t p = 0; p < P; ++p) {
        ASSERT_EQ(tpe[p] < 0, tpp[p] < 0) << "pair " << p << " local in one call only";
        if (tpe[p] < 0) continue;
        ASSERT_EQ(ptok_e[tpe[p]], static_cast<int32_t>(p / K)) << "early: pair_token of pair " << p;
        ASSERT_EQ(ptok_p[tpp[p]], static_cast<int32_t>(p / K)) << "plain: pair_token of pair " << p;
        ASSERT_EQ(num::f32_bits(pw_e[tpe[p]]), num::f32_bits(pw_p[tpp[p]])) << "pair_weight of pair " << p;
      }
      const std::string rows = " (rows: local pairs in (token, slot) order, then the shared expert's)";
      EXPECT_TRUE(same_bits(by_pair(fetch(early.buf.act, R * I), I, tpe, m),
                            by_pair(fetch(plain.buf.act, R * I), I, tpp, m)))
          << "act (" << local << " experts, " << I << " columns a row)" << rows;
      EXPECT_TRUE(same_values(by_pair(fetch(early.buf.act_codes, R * I), I, tpe, m),
                              by_pair(fetch(plain.buf.act_codes, R * I), I, tpp, m), I))
          << "act codes" << rows;
      EXPECT_TRUE(same_values(by_pair(fetch(early.buf.act_scales, R * (I / 128)), I / 128, tpe, m),
                              by_pair(fetch(plain.buf.act_scales, R * (I / 128)), I / 128, tpp, m), I / 128))
          << "act scales" << rows;
      EXPECT_TRUE(same_bits(by_pair(fetch(early.buf.pair_out, P * D), D, tpe, 0),
                            by_pair(fetch(plain.buf.pair_out, P * D), D, tpp, 0)))
          << "pair outputs (" << D << " columns a row; local pairs in (token, slot) order)";
      EXPECT_TRUE(same_bits(fetch(early.buf.shared_out, MD), fetch(plain.buf.shared_out, MD))) << "shared";
      EXPECT_TRUE(same_bits(to_host(early.y), to_host(plain.y))) << "y";
      if (rep == 0 && c.layer == &N && m == 1 && c.count == 32) check_stages(early, L);
      if (::testing::Test::HasFailure()) return;  // the first failing run tells; the rest repeat it
    }
  }
  EXPECT_GE(without_work, 1) << "no case left the rank without a routed expert";
}

TEST(CudaMoeDecode, GraphReplayEqualsEager) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 600);
  const int64_t m = 6;
  MoeRun r;
  prepare(r, L, act_rows(m, L.d.dim, 61), m, 16, false, 0, L.d.n_experts, false);
  cudaStream_t s = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda_model::moe_decode(r.args, s);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<float> want = to_host(r.y);
  cudaGraph_t g;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  // Poison every data buffer inside the graph; the counters are the kernels' own (zero between calls).
  TANDEM_CUDA_CHECK(cudaMemsetAsync(r.mem.get(), 0x7f, cuda_model::moe_decode_data_bytes(r.args.dims), s));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(r.y.get(), 0xff, r.y.bytes(), s));
  cuda_model::moe_decode(r.args, s);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 3; ++rep) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_TRUE(same_bits(to_host(r.y), want)) << "replay " << rep;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(g));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(s));
}

// The timeline instrument (kernels/cuda/timeline.cuh, bench-kernels' MoE rows): recording changes no
// output bit, and every CTA's record is consistent: its marks in order, the routing done by exactly
// one gate CTA, the experts kernels' item counts adding up to their items (every up item of the
// shared job and of each routed expert's chunks, 2048 / 16 tiles per job-chunk at one tile an item).
TEST(CudaMoeDecode, TimelineChangesNoResult) {
  TANDEM_REQUIRE_GPU();
  namespace timeline = kernels::cuda::timeline;
  const Layer L = make_layer(512, 256, 32, 6, 610);
  const int64_t m = 3;
  MoeRun r;
  prepare(r, L, act_rows(m, L.d.dim, 67), m, 16, false, 0, L.d.n_experts, false);
  cuda_model::moe_decode(r.args, kStream);
  const std::vector<float> want = to_host(r.y);
  const size_t words = static_cast<size_t>(3) * timeline::kCtas * timeline::kSlots;
  DeviceBuffer<uint64_t> rec(words);
  TANDEM_CUDA_CHECK(cudaMemset(rec.get(), 0, words * sizeof(uint64_t)));
  TANDEM_CUDA_CHECK(cudaMemset(r.y.get(), 0xff, r.y.bytes()));
  r.args.timeline = rec.get();
  cuda_model::moe_decode(r.args, kStream);
  EXPECT_TRUE(same_bits(to_host(r.y), want));
  const std::vector<uint64_t> h = fetch(rec.get(), words);
  auto at = [&](int k, int c, int q) { return h[(static_cast<size_t>(k) * timeline::kCtas + c) * timeline::kSlots + q]; };
  // Items of the up kernel: one per 16 output columns of each job-chunk (the shared job and the
  // active experts, each one chunk at 3 tokens).
  const std::vector<int32_t> active = fetch(r.buf.active, 1);
  const int64_t up_items = (1 + active[0]) * (L.d.inter / 16);
  int routers = 0;
  int64_t items[3] = {0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    int ctas = 0;
    for (int c = 0; c < timeline::kCtas; ++c) {
      const uint64_t entry = at(k, c, 1), exit = at(k, c, 15);
      if (!entry) continue;
      ++ctas;
      EXPECT_GE(exit, entry) << "kernel " << k << " CTA " << c;
      if (k == 0) {
        EXPECT_GE(at(k, c, 3), entry);
        EXPECT_GE(exit, at(k, c, 4));
        if (at(k, c, 0) >> 32) {
          ++routers;
          EXPECT_GE(at(k, c, 6), at(k, c, 5));
        }
      } else {
        items[k] += static_cast<int64_t>(at(k, c, 0) >> 32);
        EXPECT_GE(at(k, c, 3), entry);  // routing known: every CTA passes its wait
        for (int i = 0; i < 5 && i < static_cast<int>(at(k, c, 0) >> 32); ++i)
          EXPECT_GE(at(k, c, 5 + 2 * i), at(k, c, 4 + 2 * i)) << "kernel " << k << " CTA " << c << " item " << i;
      }
    }
    EXPECT_GT(ctas, 0) << "kernel " << k;
  }
  EXPECT_EQ(routers, 1);
  EXPECT_EQ(items[1], up_items);
  EXPECT_GT(items[2], 0);
}

// Sanity against the CPU oracle's composition (forward.cpp's moe with the CPU ops): the same
// function with other roundings. Tokens whose routing agrees must agree to a few bf16 steps
// (relative L2 <= 2^-6); the stage checks above are the exact ones.
TEST(CudaMoeDecode, CloseToTheCpuComposition) {
  TANDEM_REQUIRE_GPU();
  const Layer L = make_layer(512, 256, 32, 6, 700);
  const int64_t m = 8, D = L.d.dim, I = L.d.inter, E = L.d.n_experts;
  const int K = L.d.topk;
  const std::vector<float> x = act_rows(m, D, 71);
  MoeRun r;
  prepare(r, L, x, m, m, false, 0, static_cast<int>(E), false);
  cuda_model::moe_decode(r.args, kStream);
  const std::vector<float> got = to_host(r.y);
  const std::vector<int32_t> gids = fetch(r.buf.expert_ids, static_cast<size_t>(m * K));
  auto linear = [&](const HostMatrix& w, int64_t row0, int64_t n, const float* in, int64_t rows, float* out, bool q) {
    GemmParams p;
    p.x = in;
    p.w = w.host().rows(row0, n);
    p.y = out;
    p.m = rows;
    p.n = n;
    p.k = p.w.k;
    p.round_bf16 = q;
    p.quantize_x_block = q ? 128 : 0;
    cpu_ops().gemm(p);
  };
  std::vector<float> logits(static_cast<size_t>(m * E));
  linear(L.gate, 0, E, x.data(), m, logits.data(), false);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w(ids.size());
  MoeGateParams gp;
  gp.logits = logits.data();
  gp.bias = L.bias.data();
  gp.tokens = m;
  gp.n_experts = static_cast<int>(E);
  gp.topk = K;
  gp.route_scale = 1.5f;
  gp.expert_ids = ids.data();
  gp.weights = w.data();
  cpu_ops().moe_gate(gp);
  auto expert = [&](const HostMatrix& w1, const HostMatrix& w3, const HostMatrix& w2, int64_t r1, int64_t r2,
                    const float* in, float weight, bool routed, float* out) {
    std::vector<float> g(static_cast<size_t>(I)), u(g.size());
    linear(w1, r1, I, in, 1, g.data(), true);
    linear(w3, r1, I, in, 1, u.data(), true);
    SwigluParams sp;
    sp.gate = g.data();
    sp.up = u.data();
    sp.row_weight = routed ? &weight : nullptr;
    sp.out = g.data();
    sp.rows = 1;
    sp.cols = I;
    sp.limit = 10.0f;
    sp.round_bf16 = true;
    cpu_ops().swiglu(sp);
    linear(w2, r2, D, g.data(), 1, out, true);
  };
  int64_t agree = 0;
  double num = 0, den = 0;
  for (int64_t t = 0; t < m; ++t) {
    if (!std::equal(ids.begin() + t * K, ids.begin() + (t + 1) * K, gids.begin() + t * K)) continue;
    ++agree;
    std::vector<std::pair<int, int>> order;
    for (int k = 0; k < K; ++k) order.push_back({ids[t * K + k], k});
    std::sort(order.begin(), order.end());
    std::vector<float> acc(static_cast<size_t>(D), 0.0f), o(static_cast<size_t>(D));
    for (auto [e, k] : order) {
      expert(L.w1, L.w3, L.w2, e * I, e * D, x.data() + t * D, w[t * K + k], true, o.data());
      for (int64_t c = 0; c < D; ++c) acc[c] += o[c];
    }
    expert(L.s1, L.s3, L.s2, 0, 0, x.data() + t * D, 1.0f, false, o.data());
    for (int64_t c = 0; c < D; ++c) {
      const double want = num::round_bf16(acc[c] + o[c]);
      num += (got[t * D + c] - want) * (got[t * D + c] - want);
      den += want * want;
    }
  }
  std::printf("[moe-decode] tokens with the CPU's routing: %lld of %lld, relative L2 vs CPU %.3g\n",
              static_cast<long long>(agree), static_cast<long long>(m), std::sqrt(num / std::max(den, 1e-300)));
  EXPECT_GE(agree, m - 1);
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), std::ldexp(1.0, -6));
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
