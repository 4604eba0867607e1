// MoE gate (score and hash routing, ties), grouping, SwiGLU clamp, row gather/scatter-add,
// softmax / log-softmax / argmax.
#include <gtest/gtest.h>

#include <cmath>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::bf16d;
using testing::close;
using testing::randn;

double sqrt_softplus(double z) { return std::sqrt(z > 20 ? z : std::log1p(std::exp(z))); }

TEST(MoeGate, ScoreRoutingWithBiasAndTies) {
  const int64_t T = 4;
  const int E = 32, K = 6;
  auto z = randn(T * E, 1, 3.0f, false);
  auto bias = randn(E, 2, 0.5f, false);
  z[3 * E + 0] = 25.0f;  // softplus threshold branch
  // Token 2: exact ties in the biased score between experts 5, 9, 20 (same logit, same bias).
  for (int e : {5, 9, 20}) {
    z[2 * E + e] = 4.0f;
    bias[e] = 1.0f;
  }
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  MoeGateParams p;
  p.logits = z.data();
  p.bias = bias.data();
  p.tokens = T;
  p.n_experts = E;
  p.topk = K;
  p.route_scale = 1.5f;
  p.expert_ids = ids.data();
  p.weights = w.data();
  cpu::moe_gate(p);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return sqrt_softplus(z[t * E + a]) + bias[a] > sqrt_softplus(z[t * E + b]) + bias[b];
    });
    double sum = 0;
    for (int i = 0; i < K; ++i) sum += sqrt_softplus(z[t * E + order[i]]);
    for (int i = 0; i < K; ++i) {
      EXPECT_EQ(ids[t * K + i], order[i]) << t << "," << i;
      EXPECT_NEAR(w[t * K + i], sqrt_softplus(z[t * E + order[i]]) / sum * 1.5, 1e-6);
    }
  }
  EXPECT_EQ(ids[2 * K + 0], 5);
  EXPECT_EQ(ids[2 * K + 1], 9);
  EXPECT_EQ(ids[2 * K + 2], 20);
}

TEST(MoeGate, HashRoutingIgnoresBias) {
  const int E = 16, K = 2;
  auto z = randn(2 * E, 3, 1.0f, false);
  std::vector<int32_t> tid2eid = {0, 1, 2, 3, 15, 7, 4, 4};  // vocab 4
  std::vector<int32_t> tok = {2, 3};
  std::vector<int32_t> ids(2 * K);
  std::vector<float> w(2 * K);
  MoeGateParams p;
  p.logits = z.data();
  p.token_ids = tok.data();
  p.tid2eid = tid2eid.data();
  p.tokens = 2;
  p.n_experts = E;
  p.topk = K;
  p.expert_ids = ids.data();
  p.weights = w.data();
  cpu::moe_gate(p);
  EXPECT_EQ(ids, (std::vector<int32_t>{15, 7, 4, 4}));
  const double a = sqrt_softplus(z[15]), b = sqrt_softplus(z[7]);
  EXPECT_NEAR(w[0], a / (a + b) * 1.5, 1e-6);
  EXPECT_NEAR(w[2], 0.75, 1e-6);  // duplicate expert: two equal halves
}

TEST(MoeGroup, CountingSortByExpert) {
  std::vector<int32_t> ids = {3, 1, 1, 0, 3, 2};  // tokens 0..2, topk 2
  std::vector<int32_t> off(5), tok(6), slot(6);
  MoeGroupParams p;
  p.expert_ids = ids.data();
  p.tokens = 3;
  p.topk = 2;
  p.n_experts = 4;
  p.offsets = off.data();
  p.token_of = tok.data();
  p.slot_of = slot.data();
  cpu::moe_group(p);
  EXPECT_EQ(off, (std::vector<int32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(tok, (std::vector<int32_t>{1, 0, 1, 2, 0, 2}));
  EXPECT_EQ(slot, (std::vector<int32_t>{1, 1, 0, 1, 0, 0}));
}

TEST(Swiglu, ClampWeightAndRounding) {
  const int64_t rows = 3, cols = 40;
  auto g = randn(rows * cols, 4, 8.0f);
  auto u = randn(rows * cols, 5, 8.0f);
  g[0] = 50.0f;
  g[1] = -50.0f;
  u[2] = -30.0f;
  std::vector<float> rw = {0.5f, 1.25f, 2.0f};
  for (float limit : {10.0f, 0.0f}) {
    std::vector<float> out(rows * cols);
    SwigluParams p;
    p.gate = g.data();
    p.up = u.data();
    p.row_weight = rw.data();
    p.out = out.data();
    p.rows = rows;
    p.cols = cols;
    p.limit = limit;
    cpu::swiglu(p);
    std::vector<double> want(rows * cols), err(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        double gv = g[r * cols + c], uv = u[r * cols + c];
        if (limit > 0) {
          uv = std::clamp(uv, -10.0, 10.0);
          gv = std::min(gv, 10.0);
        }
        want[r * cols + c] = rw[r] * (gv / (1 + std::exp(-gv)) * uv);
        err[r * cols + c] = 1e-6 * std::fabs(want[r * cols + c]);  // fp32 exp, divide, two products
      }
    EXPECT_TRUE(testing::correctly_rounded(out, want, testing::Stored::kBf16, 0.0, &err)) << "limit " << limit;
  }
}

TEST(RowsCopy, GatherAndScatterAddWithRepeats) {
  auto src = randn(4 * 8, 6);
  std::vector<int32_t> rows = {2, 0, 2};
  std::vector<float> g(3 * 8);
  RowsCopyParams p;
  p.src = src.data();
  p.dst = g.data();
  p.rows = rows.data();
  p.count = 3;
  p.cols = 8;
  p.gather = true;
  cpu::rows_copy(p);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 8; ++c) EXPECT_EQ(g[i * 8 + c], src[rows[i] * 8 + c]);
  std::vector<float> acc(4 * 8, 1.0f);
  RowsCopyParams s;
  s.src = g.data();
  s.dst = acc.data();
  s.rows = rows.data();
  s.count = 3;
  s.cols = 8;
  cpu::rows_copy(s);
  for (int c = 0; c < 8; ++c) {
    EXPECT_FLOAT_EQ(acc[2 * 8 + c], 1.0f + 2 * src[2 * 8 + c]);
    EXPECT_FLOAT_EQ(acc[0 * 8 + c], 1.0f + src[0 * 8 + c]);
    EXPECT_EQ(acc[1 * 8 + c], 1.0f);
  }
}

TEST(Sampling, SoftmaxLogSoftmaxArgmax) {
  const int64_t rows = 3, n = 1000;
  auto x = randn(rows * n, 7, 5.0f, false);
  x[n + 17] = 80.0f;
  x[n + 18] = 80.0f;  // tie: first wins
  x[2 * n + 500] = std::nanf("");
  for (bool lg : {false, true}) {
    std::vector<float> y(rows * n);
    SoftmaxParams p;
    p.x = x.data();
    p.y = y.data();
    p.rows = 2;
    p.n = n;
    p.temperature = 0.7f;
    p.log = lg;
    cpu::softmax(p);
    std::vector<double> want(2 * n);
    for (int64_t r = 0; r < 2; ++r) {
      double m = -INFINITY, z = 0;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[r * n + i] / 0.7f));
      for (int64_t i = 0; i < n; ++i) z += std::exp(double(x[r * n + i] / 0.7f) - m);
      for (int64_t i = 0; i < n; ++i) {
        const double v = double(x[r * n + i] / 0.7f) - m;
        want[r * n + i] = lg ? v - std::log(z) : std::exp(v) / z;
      }
    }
    std::vector<float> g(y.begin(), y.begin() + 2 * n);
    EXPECT_TRUE(close(g, want, 1e-7, 1e-5)) << "log " << lg;
  }
  std::vector<int32_t> am(rows);
  std::vector<float> mv(rows);
  ArgmaxParams a;
  a.x = x.data();
  a.out = am.data();
  a.max_value = mv.data();
  a.rows = rows;
  a.n = n;
  cpu::argmax(a);
  EXPECT_EQ(am[1], 17);
  EXPECT_EQ(mv[1], 80.0f);
  EXPECT_EQ(am[2], 500);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  EXPECT_EQ(am[0], best);
}

TEST(CpuOps, BackendObjectDispatchesAndThreadsAreSettable) {
  Ops& ops = cpu_ops();
  EXPECT_STREQ(ops.name(), "cpu");
  cpu::set_num_threads(1);
  EXPECT_EQ(cpu::num_threads(), 1);
  std::vector<float> x = {1, 3, 2};
  int32_t out = -1;
  ArgmaxParams a;
  a.x = x.data();
  a.out = &out;
  a.rows = 1;
  a.n = 3;
  ops.argmax(a);
  EXPECT_EQ(out, 1);
  cpu::set_num_threads(0);
}

}  // namespace
}  // namespace tandem::kernels
