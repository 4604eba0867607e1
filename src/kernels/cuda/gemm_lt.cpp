// cuBLASLt plans (gemm_lt.h): descriptors built on the stack per call, algorithms chosen per
// row-count bucket at prepare(). Every cuBLASLt failure is a Status.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "common/check.h"
#include "kernels/cuda/gemm_lt.h"

namespace tandem::kernels::cuda {
namespace {

static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "cublasLtMatmulAlgo_t layout");

Status lt_error(cublasStatus_t st, const char* what) {
  return make_error(StatusCode::kInternal, "cuBLASLt {} failed ({})", what, static_cast<int>(st));
}

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The descriptors of one call, initialized in place (no allocation).
struct Descs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, c, d;
};

cudaDataType_t in_type(LtKind k) { return k == LtKind::kBf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3; }
cudaDataType_t out_type(const LtShape& s) { return s.kind != LtKind::kBf16 && s.bf16_out ? CUDA_R_16BF : CUDA_R_32F; }

cublasStatus_t init_descs(Descs& d, const LtShape& s, int64_t m, const float* w_scale, const float* x_scale,
                          const float* one) {
  cublasStatus_t st = cublasLtMatmulDescInit(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(&d.op, attr, v, bytes);
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (s.kind == LtKind::kFp8Block) {
    const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof w_scale);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof x_scale);
  } else if (s.kind == LtKind::kFp8Scalar) {
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &one, sizeof one);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one, sizeof one);
  }
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const cudaDataType_t ti = in_type(s.kind), to = out_type(s);
  st = cublasLtMatrixLayoutInit(&d.a, ti, static_cast<uint64_t>(s.k), static_cast<uint64_t>(s.n), s.k);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutInit(&d.b, ti, static_cast<uint64_t>(s.k), static_cast<uint64_t>(m), s.ldx);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutInit(&d.c, to, static_cast<uint64_t>(s.n), static_cast<uint64_t>(m), s.ldy);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutInit(&d.d, to, static_cast<uint64_t>(s.n), static_cast<uint64_t>(m), s.ldy);
  if (st != CUBLAS_STATUS_SUCCESS || s.batch <= 1) return st;
  const int32_t batch = static_cast<int32_t>(s.batch);
  const int64_t sa = s.w_batch_rows * s.k, sb = s.x_batch_stride, sc = s.y_batch_stride;
  cublasLtMatrixLayoutOpaque_t* lays[4] = {&d.a, &d.b, &d.c, &d.d};
  const int64_t strides[4] = {sa, sb, sc, sc};
  for (int i = 0; i < 4; ++i) {
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutSetAttribute(lays[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutSetAttribute(lays[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                            sizeof strides[i]);
  }
  return st;
}

}  // namespace

Result<std::unique_ptr<LtGemm>> LtGemm::create(size_t workspace_bytes) {
  std::unique_ptr<LtGemm> g(new LtGemm());
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t st = cublasLtCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) return make_error(StatusCode::kInternal, "cublasLtCreate failed ({})", static_cast<int>(st));
  g->handle_ = h;
  g->ws_.reset(workspace_bytes);
  g->one_.reset(1);
  const float one = 1.0f;
  TANDEM_CUDA_CHECK(cudaMemcpy(g->one_.get(), &one, sizeof one, cudaMemcpyHostToDevice));
  return g;
}

LtGemm::~LtGemm() {
  if (handle_) cublasLtDestroy(lt(handle_));
}

const LtGemm::Plan* LtGemm::find(const LtShape& s) const {
  for (const Plan& p : plans_)
    if (p.shape == s) return &p;
  return nullptr;
}

Status LtGemm::prepare(const LtShape& s, int64_t max_m, int64_t min_m, bool one_algo) {
  if (find(s)) return Status();
  if (s.n <= 0 || s.k <= 0 || s.ldx < s.k || s.ldy < s.n || s.batch < 1 || min_m < 1 || max_m < min_m)
    return invalid_argument("cuBLASLt shape n {} k {} ldx {} ldy {} batch {}", s.n, s.k, s.ldx, s.ldy, s.batch);
  Plan plan;
  plan.shape = s;
  plan.m_multiple = s.kind == LtKind::kFp8Block ? 4 : 1;
  plan.min_m = (min_m + plan.m_multiple - 1) / plan.m_multiple * plan.m_multiple;
  if (plan.min_m > max_m)
    return make_error(StatusCode::kFailedPrecondition, "no row count in {}..{} is a multiple of {}", min_m, max_m,
                      plan.m_multiple);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t cst = cublasLtMatmulPreferenceCreate(&pref);
  if (cst != CUBLAS_STATUS_SUCCESS) return lt_error(cst, "preference create");
  const uint64_t ws = ws_.bytes();
  cst = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (cst == CUBLAS_STATUS_SUCCESS && one_algo) {
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cst = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none);
  }
  if (cst != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceDestroy(pref);
    return lt_error(cst, "preference attribute");
  }
  // Dummy (never dereferenced) scale pointers: the heuristics only see that they are set.
  const float* dummy = one_.get();
  // The heuristic's answers for m rows (up to 16), split-K removed when one_algo.
  auto candidates = [&](int64_t m, std::vector<cublasLtMatmulAlgo_t>* out) {
    Descs d;
    if (init_descs(d, s, m, dummy, dummy, one_.get()) != CUBLAS_STATUS_SUCCESS) return;
    cublasLtMatmulHeuristicResult_t r[16];
    int n = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt(handle_), &d.op, &d.a, &d.b, &d.c, &d.d, pref, 16, r, &n) !=
        CUBLAS_STATUS_SUCCESS)
      return;
    for (int i = 0; i < n; ++i) {
      if (r[i].state != CUBLAS_STATUS_SUCCESS || r[i].workspaceSize > ws) continue;
      cublasLtMatmulAlgo_t algo = r[i].algo;
      if (one_algo) {
        const int32_t one_split = 1;
        const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split,
                                                 sizeof one_split) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &no_reduction,
                                                 sizeof no_reduction) != CUBLAS_STATUS_SUCCESS)
          continue;
      }
      out->push_back(algo);
    }
  };
  auto check = [&](int64_t m, const cublasLtMatmulAlgo_t& algo) {
    Descs d;
    if (init_descs(d, s, m, dummy, dummy, one_.get()) != CUBLAS_STATUS_SUCCESS) return false;
    cublasLtMatmulHeuristicResult_t r;
    return cublasLtMatmulAlgoCheck(lt(handle_), &d.op, &d.a, &d.b, &d.c, &d.d, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= ws;
  };
  // Bucket ends: 128, 256, ... up to the first >= max_m (the first bucket starts at min_m); the
  // row counts each candidate must pass: its bucket's first and last (for one_algo every bucket's).
  std::vector<int64_t> ends;
  for (int64_t hi = 128;; hi *= 2) {
    if (hi >= plan.min_m) ends.push_back(hi);
    if (hi >= max_m) break;
  }
  // The first candidate (from the heuristic at each of `probe`) that passes check() at every row
  // count of `need`; a note of what failed otherwise.
  std::string failed;
  auto choose = [&](const std::vector<int64_t>& probe, const std::vector<int64_t>& need,
                    cublasLtMatmulAlgo_t* algo) {
    std::vector<cublasLtMatmulAlgo_t> cand;
    for (int64_t m : probe) candidates(m, &cand);
    if (cand.empty()) {
      failed = "no heuristic answer at these row counts";
      return false;
    }
    int64_t worst = need.front();
    for (const cublasLtMatmulAlgo_t& c : cand) {
      bool ok = true;
      for (int64_t m : need)
        if (!check(m, c)) {
          ok = false;
          worst = m;
          break;
        }
      if (ok) {
        *algo = c;
        return true;
      }
    }
    failed = "none of " + std::to_string(cand.size()) + " candidates runs " + std::to_string(worst) + " rows";
    return false;
  };
  Status status;
  if (one_algo) {
    // One algorithm, without split-K, for every row count.
    std::vector<int64_t> need{plan.min_m};
    need.insert(need.end(), ends.begin(), ends.end());
    cublasLtMatmulAlgo_t algo;
    if (choose(need, need, &algo)) {
      for (int64_t e : ends) {
        Bucket bk;
        bk.m_hi = e;
        std::memcpy(bk.algo, &algo, sizeof algo);
        plan.buckets.push_back(bk);
      }
    } else {
      status = make_error(
          StatusCode::kFailedPrecondition,
          "cuBLASLt has no single split-K-free algorithm for kind {} n {} k {} batch {} at {}..{} rows: {}",
          static_cast<int>(s.kind), s.n, s.k, s.batch, plan.min_m, ends.back(), failed);
    }
  } else {
    int64_t lo = plan.min_m;
    for (int64_t hi : ends) {
      cublasLtMatmulAlgo_t algo;
      if (!choose({hi, lo}, {lo, hi}, &algo)) {
        status = make_error(StatusCode::kFailedPrecondition,
                            "cuBLASLt has no algorithm for kind {} n {} k {} batch {} at {}..{} rows: {}",
                            static_cast<int>(s.kind), s.n, s.k, s.batch, lo, hi, failed);
        break;
      }
      Bucket bk;
      bk.m_hi = hi;
      std::memcpy(bk.algo, &algo, sizeof algo);
      plan.buckets.push_back(bk);
      lo = hi + plan.m_multiple;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (!status.ok()) return status;
  plans_.push_back(std::move(plan));
  return Status();
}

bool LtGemm::ready(const LtShape& s, int64_t m) const {
  const Plan* p = find(s);
  return p && !p->buckets.empty() && m >= p->min_m && m <= p->buckets.back().m_hi && m % p->m_multiple == 0;
}

Status LtGemm::run(const LtShape& s, int64_t m, const void* w, const void* x, void* y, const float* w_scale,
                   const float* x_scale, cudaStream_t st) const {
  if (m == 0) return Status();
  if (!ready(s, m))
    return make_error(StatusCode::kFailedPrecondition, "cuBLASLt shape n {} k {} batch {} not prepared for {} rows",
                      s.n, s.k, s.batch, m);
  const Plan* p = find(s);
  const Bucket* b = &p->buckets.front();
  while (b->m_hi < m) ++b;
  Descs d;
  cublasStatus_t cst = init_descs(d, s, m, w_scale, x_scale, one_.get());
  if (cst != CUBLAS_STATUS_SUCCESS) return lt_error(cst, "descriptor");
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, b->algo, sizeof algo);
  cst = cublasLtMatmul(lt(handle_), &d.op, &alpha, w, &d.a, x, &d.b, &beta, y, &d.c, y, &d.d, &algo, ws_.get(),
                       ws_.bytes(), st);
  if (cst != CUBLAS_STATUS_SUCCESS) return lt_error(cst, "matmul");
  return Status();
}

}  // namespace tandem::kernels::cuda
