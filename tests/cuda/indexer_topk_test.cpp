// The indexer's top-k on the device (src/model/cuda/indexer_topk.cu, with its own first pass)
// against kernels::cpu::topk: the same selected ids (the device returns them ascending, the CPU by
// score), -1 past min(k, visible). Rows with nothing visible, fewer than k, exactly k, one more,
// thousands and a hundred thousand entries (many slices); scores with massive ties (a handful of
// distinct values: the threshold value shared by thousands of entries, taken lowest id first),
// NaN (above everything) and -inf among the visible entries; k = 512 and the tiny models' 16. Three
// calls on the same state (the counters it leaves zero are reused), the third forced to the three
// passes: rows of one slice (up to 2048 columns, also 6 and 96 rows) run as one launch by default,
// and both forms must give the CPU's ids exactly (so each other's).
#include <algorithm>
#include <cstdio>
#include <limits>

#include "cuda/model_kernel_util.h"
#include "model/cuda/indexer_topk.h"

namespace tandem::kernels::cuda_testing {
namespace {

struct Row {
  int32_t visible;
  int kind;  // 0: random normal scores, 1: 6 distinct values, 2: random with NaN and -inf sprinkled
};

std::vector<float> row_scores(int64_t n, const Row& r, uint64_t seed) {
  std::vector<float> v = randn(static_cast<size_t>(n), seed, 3.0f, true);
  const float few[6] = {0.5f, 1.0f, 1.0f, 2.0f, -3.0f, 0.0f};
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(seed * 31 + i);
    if (r.kind == 1) v[i] = few[h % 6];
    if (r.kind == 2 && h % 97 == 0) v[i] = std::numeric_limits<float>::quiet_NaN();
    if (r.kind == 2 && h % 89 == 1) v[i] = -std::numeric_limits<float>::infinity();
  }
  return v;
}

TEST(CudaIndexerTopk, MatchesCpuTopkSet) {
  struct Case {
    int k;
    std::vector<Row> rows;
  };
  const std::vector<Case> cases = {
      {512, {{0, 0}, {1, 0}, {300, 0}, {512, 0}, {513, 0}, {5000, 0}, {5000, 1}, {4097, 2}, {100000, 0}, {100000, 1}}},
      {16, {{3, 0}, {16, 1}, {17, 1}, {2048, 0}, {2049, 2}, {70000, 1}}},
      // one slice per row (n_cols <= 2048: one launch, or the three passes): 6 rows (a verify step)
      {512, {{0, 0}, {513, 1}, {2027, 0}, {1500, 1}, {1200, 2}, {512, 0}}},
      {16, {{3, 0}, {16, 1}, {17, 1}, {700, 2}}},
  };
  // 96 rows of one slice (a verify step of 96 tokens), visibility rising as a sequence's does
  Case verify{512, {}};
  for (int i = 0; i < 96; ++i) verify.rows.push_back({1900 + i, i % 3});
  std::vector<Case> all_cases = cases;
  all_cases.push_back(verify);
  uint64_t seed = 3;
  for (const Case& c : all_cases) {
    const int64_t rows = static_cast<int64_t>(c.rows.size());
    int64_t n_cols = 0;
    for (const Row& r : c.rows) n_cols = std::max<int64_t>(n_cols, r.visible);
    n_cols += 21;  // columns past every row's visibility
    const int64_t lds = (n_cols + 7) / 8 * 8 + 16, ldo = c.k + 5;
    SCOPED_TRACE(::testing::Message() << "k " << c.k << " rows " << rows << " columns " << n_cols);
    DeviceBuffer<uint8_t> counters, work;
    if (have_gpu()) {
      counters.reset(cuda_model::topk_counters_bytes(rows));
      work.reset(cuda_model::topk_work_bytes(rows, n_cols));
      TANDEM_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
    }
    // calls 0, 1: the default launch (one launch for one slice); 2: the three passes, which must give
    // the same ids (both equal the CPU's exactly)
    for (int call = 0; call < 3; ++call) {
      std::vector<float> scores(static_cast<size_t>(rows * n_cols), -std::numeric_limits<float>::infinity());
      std::vector<uint16_t> bits(static_cast<size_t>(rows * lds), 0x7fc1);  // NaN padding: never read
      std::vector<int32_t> vis(static_cast<size_t>(rows));
      for (int64_t t = 0; t < rows; ++t) {
        const Row& r = c.rows[t];
        vis[t] = r.visible;
        const std::vector<float> v = row_scores(r.visible, r, seed++);
        std::copy(v.begin(), v.end(), scores.begin() + t * n_cols);
        for (int64_t e = 0; e < n_cols; ++e) bits[t * lds + e] = num::f32_to_bf16(scores[t * n_cols + e]);
      }
      std::vector<int32_t> top(static_cast<size_t>(rows * c.k)), want(static_cast<size_t>(rows * c.k), -1);
      TopkParams tk;
      tk.scores = scores.data();
      tk.n_valid = vis.data();
      tk.rows = rows;
      tk.n = n_cols;
      tk.k = c.k;
      tk.out = top.data();
      cpu::topk(tk);
      for (int64_t t = 0; t < rows; ++t) {
        const int64_t kk = std::min<int64_t>(c.k, vis[t]);
        std::vector<int32_t> sel(top.begin() + t * c.k, top.begin() + t * c.k + kk);
        std::sort(sel.begin(), sel.end());
        std::copy(sel.begin(), sel.end(), want.begin() + t * c.k);
      }
      if (!have_gpu()) continue;
      DeviceBuffer<uint16_t> dbits = to_dev(bits);
      DeviceBuffer<int32_t> dvis = to_dev(vis);
      auto dout = poisoned<int32_t>(static_cast<size_t>(rows * ldo));
      cuda_model::IndexerTopkArgs a;
      a.scores = dbits.get();
      a.lds = lds;
      a.n_cols = n_cols;
      a.visible = dvis.get();
      a.rows = rows;
      a.k = c.k;
      a.out = dout.get();
      a.ldo = ldo;
      a.state = cuda_model::topk_state(counters.get(), rows, work.get(), work.bytes());
      a.one_launch = call < 2;
      cuda_model::indexer_topk(a, kStream);
      const std::vector<int32_t> all = to_host(dout);
      std::vector<int32_t> got(static_cast<size_t>(rows * c.k));
      for (int64_t t = 0; t < rows; ++t)
        std::copy(all.begin() + t * ldo, all.begin() + t * ldo + c.k, got.begin() + t * c.k);
      EXPECT_TRUE(same_values(got, want, static_cast<size_t>(c.k)))
          << "call " << call << (n_cols <= cuda_model::kTopkSlice && call < 2 ? " (one launch)" : " (three passes)")
          << " (record = row)";
      std::vector<uint8_t> left(counters.bytes());
      TANDEM_CUDA_CHECK(cudaMemcpy(left.data(), counters.get(), left.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::count(left.begin(), left.end(), 0), static_cast<std::ptrdiff_t>(left.size()))
          << "counters left non-zero";
    }
  }
  TANDEM_REQUIRE_GPU();
}

}  // namespace
}  // namespace tandem::kernels::cuda_testing
