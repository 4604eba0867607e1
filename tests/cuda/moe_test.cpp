// CUDA moe_gate / moe_group / swiglu / rows_copy against the CPU ops. Expert ids, groupings and
// gather/scatter-add results must be identical. Routing weights and SwiGLU involve exp / log1p,
// whose last bits differ between CUDA and glibc: they are held to a float64 reference within a
// stated bound (each function's ulp error, then one rounding per operation), the CPU's results to
// the same reference; a bf16 SwiGLU output must be correctly rounded within that bound.
#include <algorithm>
#include <limits>
#include <numeric>

#include "cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_testing {
namespace {

struct GateOut {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

void check_gate(MoeGateParams p, const std::vector<float>& logits, const std::vector<float>* bias,
                const std::vector<int32_t>* tokens, const std::vector<int32_t>* table) {
  GateOut cpu{std::vector<int32_t>(p.tokens * p.topk), std::vector<float>(p.tokens * p.topk)};
  p.logits = logits.data();
  p.bias = bias ? bias->data() : nullptr;
  p.token_ids = tokens ? tokens->data() : nullptr;
  p.tid2eid = table ? table->data() : nullptr;
  p.expert_ids = cpu.ids.data();
  p.weights = cpu.w.data();
  cpu_ops().moe_gate(p);

  // w_i = s_i / sum_k s_k * route_scale, s = sqrt(softplus(z)) of the chosen experts (the CPU's ids):
  // softplus within 6u relative (exp 2 ulp damped by e/(1+e) <= log1p(e), log1p 1 ulp), sqrt halves
  // it and rounds (4u), the slot-order sum of K adds gamma(K), the division and the scale 2u.
  std::vector<double> want(cpu.w.size()), bound(cpu.w.size());
  for (int64_t t = 0; t < p.tokens; ++t) {
    double sum = 0;
    std::vector<double> sv(static_cast<size_t>(p.topk));
    for (int k = 0; k < p.topk; ++k) {
      const double z = logits[t * p.n_experts + cpu.ids[t * p.topk + k]];
      sv[k] = std::sqrt(z > 20.0 ? z : std::log1p(std::exp(z)));
      sum += sv[k];
    }
    for (int k = 0; k < p.topk; ++k) {
      want[t * p.topk + k] = sv[k] / sum * p.route_scale;
      bound[t * p.topk + k] = 1.25 * (10 * kU + gamma_n(p.topk)) * std::fabs(want[t * p.topk + k]);
    }
  }
  EXPECT_TRUE(within(cpu.w, want, bound)) << "the CPU's routing weights";
  if (!have_gpu()) return;
  DeviceBuffer<float> dl = to_dev(logits), db = bias ? to_dev(*bias) : DeviceBuffer<float>();
  DeviceBuffer<int32_t> dt = tokens ? to_dev(*tokens) : DeviceBuffer<int32_t>();
  DeviceBuffer<int32_t> dtab = table ? to_dev(*table) : DeviceBuffer<int32_t>();
  auto dids = poisoned<int32_t>(cpu.ids.size(), 0x5a);
  auto dw = poisoned<float>(cpu.w.size());
  p.logits = dl.get();
  p.bias = bias ? db.get() : nullptr;
  p.token_ids = tokens ? dt.get() : nullptr;
  p.tid2eid = table ? dtab.get() : nullptr;
  p.expert_ids = dids.get();
  p.weights = dw.get();
  cuda::moe_gate(p, kStream);
  EXPECT_TRUE(same_values(to_host(dids), cpu.ids));
  EXPECT_TRUE(within(to_host(dw), want, bound)) << "routing weights";
}

TEST(CudaMoeGate, ScoreLayersMatchCpu) {
  uint64_t seed = 1;
  for (auto [tokens, E, K] : {std::tuple<int64_t, int, int>{1, 256, 6}, {7, 256, 6}, {64, 256, 6}, {5, 300, 8},
                              {3, 7, 7}, {2, 1024, 32}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " experts " << E << " top " << K);
    std::vector<float> logits = randn(static_cast<size_t>(tokens * E), seed++, 3.0f, false);
    if (tokens >= 7) {
      logits[1 * E + 5] = 25.0f;  // softplus threshold branch
      logits[2 * E + 3] = std::numeric_limits<float>::quiet_NaN();  // NaN is selected first
      logits[3 * E + 9] = -std::numeric_limits<float>::infinity();
    }
    std::vector<float> bias = randn(static_cast<size_t>(E), seed++, 0.1f, false);
    MoeGateParams p;
    p.tokens = tokens;
    p.n_experts = E;
    p.topk = K;
    check_gate(p, logits, &bias, nullptr, nullptr);
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaMoeGate, TiesPickTheLowerExpert) {
  const int E = 256, K = 6;
  const int64_t tokens = 3;
  std::vector<float> logits(static_cast<size_t>(tokens * E), 0.5f);  // row 0: all equal
  for (int e = 0; e < E; ++e) logits[E + e] = static_cast<float>(e % 4);  // row 1: ties of 64
  for (int e = 0; e < E; ++e) logits[2 * E + e] = e % 2 ? -0.0f : 0.0f;   // row 2: +-0
  MoeGateParams p;
  p.tokens = tokens;
  p.n_experts = E;
  p.topk = K;
  check_gate(p, logits, nullptr, nullptr, nullptr);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaMoeGate, HashLayersMatchCpu) {
  const int E = 256, K = 6, vocab = 1000;
  const int64_t tokens = 9;
  std::vector<int32_t> table(static_cast<size_t>(vocab * K));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(mix64(i + 3) % E);
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>(mix64(t + 99) % vocab);
  std::vector<float> logits = randn(static_cast<size_t>(tokens * E), 5, 2.0f, false);
  MoeGateParams p;
  p.tokens = tokens;
  p.n_experts = E;
  p.topk = K;
  check_gate(p, logits, nullptr, &ids, &table);
  TANDEM_REQUIRE_GPU();
}

TEST(CudaMoeGroup, MatchesCpuExactly) {
  TANDEM_REQUIRE_GPU();
  uint64_t seed = 10;
  for (auto [tokens, K, E, distinct] :
       {std::tuple<int64_t, int, int, bool>{1, 6, 256, true}, {5, 6, 256, true}, {300, 6, 256, true},
        {4096, 6, 256, true}, {333, 6, 256, false}, {50, 3, 7, false}, {40, 2, 8192, false}, {0, 6, 256, true}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " top " << K << " experts " << E);
    std::vector<int32_t> eid(static_cast<size_t>(tokens * K));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int i = 0; i < K; ++i) {
        int32_t e = static_cast<int32_t>(mix64(seed * 1000003 + t * K + i) % E);
        if (distinct)
          while (std::find(eid.begin() + t * K, eid.begin() + t * K + i, e) != eid.begin() + t * K + i) e = (e + 1) % E;
        eid[t * K + i] = e;
      }
    }
    ++seed;
    std::vector<int32_t> off(static_cast<size_t>(E + 1)), tok(eid.size()), slot(eid.size());
    MoeGroupParams p;
    p.expert_ids = eid.data();
    p.tokens = tokens;
    p.topk = K;
    p.n_experts = E;
    p.offsets = off.data();
    p.token_of = tok.data();
    p.slot_of = slot.data();
    cpu_ops().moe_group(p);
    DeviceBuffer<int32_t> de = to_dev(eid);
    auto doff = poisoned<int32_t>(off.size(), 0x5a), dtok = poisoned<int32_t>(tok.size(), 0x5a),
         dslot = poisoned<int32_t>(slot.size(), 0x5a);
    p.expert_ids = tokens ? de.get() : nullptr;
    p.offsets = doff.get();
    p.token_of = tokens ? dtok.get() : nullptr;
    p.slot_of = tokens ? dslot.get() : nullptr;
    cuda::moe_group(p, kStream);
    EXPECT_TRUE(same_values(to_host(doff), off));
    EXPECT_TRUE(same_values(to_host(dtok), tok));
    EXPECT_TRUE(same_values(to_host(dslot), slot));
  }
}

TEST(CudaSwiglu, MatchesCpu) {
  struct C {
    int64_t rows, cols, ldg, ldu, ldo;
    float limit;
    bool weight, round;
    int alias;  // 0 none, 1 out = gate, 2 out = up
  };
  uint64_t seed = 20;
  for (const C& c : {C{7, 2048, 0, 0, 0, 10.0f, true, true, 0}, C{1, 2048, 4096, 4096, 0, 10.0f, true, true, 0},
                     C{9, 4096, 0, 0, 0, 10.0f, false, false, 1}, C{3, 100, 103, 105, 101, 0.0f, true, false, 0},
                     C{5, 64, 0, 0, 0, 7.0f, true, true, 2}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " cols " << c.cols << " alias " << c.alias);
    const int64_t ldg = c.ldg ? c.ldg : c.cols, ldu = c.ldu ? c.ldu : c.cols;
    const int64_t ldo = c.alias == 1 ? ldg : c.alias == 2 ? ldu : (c.ldo ? c.ldo : c.cols);
    std::vector<float> g = randn(static_cast<size_t>(c.rows * ldg), seed++, 8.0f, true);
    std::vector<float> u = randn(static_cast<size_t>(c.rows * ldu), seed++, 8.0f, true);
    std::vector<float> w = randu(static_cast<size_t>(c.rows), seed++, 0.05f, 1.0f);
    g[1] = std::numeric_limits<float>::quiet_NaN();
    u[2] = std::numeric_limits<float>::infinity();
    std::vector<float> gc = g, uc = u;
    std::vector<float> oc = poisoned_host<float>(static_cast<size_t>(c.rows * ldo));
    SwigluParams p;
    p.rows = c.rows;
    p.cols = c.cols;
    p.ldg = c.ldg;
    p.ldu = c.ldu;
    p.ldo = c.alias ? 0 : c.ldo;
    if (c.alias == 1) p.ldo = c.ldg;
    if (c.alias == 2) p.ldo = c.ldu;
    p.limit = c.limit;
    p.round_bf16 = c.round;
    p.gate = gc.data();
    p.up = uc.data();
    p.row_weight = c.weight ? w.data() : nullptr;
    p.out = c.alias == 1 ? gc.data() : c.alias == 2 ? uc.data() : oc.data();
    cpu_ops().swiglu(p);
    const std::vector<float>& want = c.alias == 1 ? gc : c.alias == 2 ? uc : oc;

    // float64 reference; an fp32 evaluation is within (expf 2 ulp + 1 + e, the division and two
    // products: kExpRel + 4u) relative, times 1.25 for second order; with round_bf16 the output must
    // be the correct rounding of a value within that bound.
    std::vector<double> ref(want.size(), 0.0), bound(want.size(), 0.0);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.cols; ++i) {
        double gv = g[r * ldg + i], uv = u[r * ldu + i];
        if (c.limit > 0) {
          uv = std::isnan(uv) ? uv : std::clamp<double>(uv, -c.limit, c.limit);
          gv = std::isnan(gv) ? gv : std::min<double>(gv, c.limit);
        }
        double v = gv / (1.0 + std::exp(-gv)) * uv;
        if (c.weight) v *= w[r];
        ref[r * ldo + i] = v;
        bound[r * ldo + i] = 1.25 * (kExpRel + 4 * kU) * std::fabs(v);
      }
    // Columns between rows (strided outputs) are not written: compare the written ones only.
    auto written = [&](const std::vector<float>& out) {
      std::vector<float> v;
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t i = 0; i < c.cols; ++i) v.push_back(out[r * ldo + i]);
      return v;
    };
    std::vector<double> r_rows, b_rows;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.cols; ++i) {
        r_rows.push_back(ref[r * ldo + i]);
        b_rows.push_back(bound[r * ldo + i]);
      }
    auto check = [&](const std::vector<float>& got) {
      const std::vector<float> v = written(got);
      return c.round ? correctly_rounded(v.data(), r_rows.data(), r_rows.size(), Stored::kBf16, 0.0, b_rows.data())
                     : within(v, r_rows, b_rows);
    };
    EXPECT_TRUE(check(want)) << "the CPU's swiglu";
    if (!have_gpu()) continue;
    DeviceBuffer<float> dg = to_dev(g), du = to_dev(u), dw = to_dev(w);
    DeviceBuffer<float> dout = c.alias ? DeviceBuffer<float>() : poisoned<float>(oc.size());
    p.gate = dg.get();
    p.up = du.get();
    p.row_weight = c.weight ? dw.get() : nullptr;
    p.out = c.alias == 1 ? dg.get() : c.alias == 2 ? du.get() : dout.get();
    cuda::swiglu(p, kStream);
    const std::vector<float> got = to_host(c.alias == 1 ? dg : c.alias == 2 ? du : dout);
    EXPECT_TRUE(check(got));
  }
  TANDEM_REQUIRE_GPU();
}

TEST(CudaRowsCopy, GatherAndScatterAddMatchCpuExactly) {
  TANDEM_REQUIRE_GPU();
  struct C {
    int64_t count, cols, lds, ldd, src_rows, dst_rows;
    bool gather;
  };
  uint64_t seed = 30;
  for (const C& c : {C{20, 4096, 0, 0, 50, 20, true}, C{6, 4096, 4100, 4096, 6, 1, false},  // decode: 6 experts -> 1 row
                     C{37, 4096, 0, 0, 37, 10, false},   // repeated rows
                     C{24576, 64, 0, 70, 24576, 4096, false},  // prefill-sized scatter, 6 per row
                     C{13, 33, 35, 34, 40, 13, true}, C{19, 5, 0, 0, 19, 3, false}}) {
    SCOPED_TRACE(::testing::Message() << "count " << c.count << " cols " << c.cols << (c.gather ? " gather" : " scatter"));
    const int64_t lds = c.lds ? c.lds : c.cols, ldd = c.ldd ? c.ldd : c.cols;
    std::vector<float> src = randn(static_cast<size_t>(c.src_rows * lds), seed++, 1.0f, false);
    std::vector<int32_t> rows(static_cast<size_t>(c.count));
    for (int64_t i = 0; i < c.count; ++i)
      rows[i] = static_cast<int32_t>(mix64(seed * 7777 + i) % (c.gather ? c.src_rows : c.dst_rows));
    std::vector<float> dst0 = c.gather ? poisoned_host<float>(static_cast<size_t>(c.dst_rows * ldd))
                                       : randn(static_cast<size_t>(c.dst_rows * ldd), seed++, 1.0f, false);
    std::vector<float> want = dst0;
    RowsCopyParams p;
    p.src = src.data();
    p.dst = want.data();
    p.rows = rows.data();
    p.count = c.count;
    p.cols = c.cols;
    p.lds = c.lds;
    p.ldd = c.ldd;
    p.gather = c.gather;
    cpu_ops().rows_copy(p);
    DeviceBuffer<float> ds = to_dev(src), dd = to_dev(dst0);
    DeviceBuffer<int32_t> dr = to_dev(rows);
    p.src = ds.get();
    p.dst = dd.get();
    p.rows = dr.get();
    cuda::rows_copy(p, kStream);
    EXPECT_TRUE(same_bits(to_host(dd), want));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
