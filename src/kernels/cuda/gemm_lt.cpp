// cuBLASLt plans (gemm_lt.h): descriptors built on the stack per call, algorithms chosen per
// row-count bucket at prepare().
#include <cublasLt.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "kernels/cuda/gemm_lt.h"

namespace tandem::kernels::cuda {
namespace {

static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "cublasLtMatmulAlgo_t layout");

#define TANDEM_LT_CHECK(call)                                                                          \
  do {                                                                                                 \
    const cublasStatus_t tandem_lt_st_ = (call);                                                       \
    if (tandem_lt_st_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s:%d: cuBLASLt error %d in %s\n", __FILE__, __LINE__,                    \
                   static_cast<int>(tandem_lt_st_), #call);                                            \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)

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
  plan.min_m = min_m;
  cublasLtMatmulPreference_t pref = nullptr;
  TANDEM_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_.bytes();
  TANDEM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  if (one_algo) {
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    TANDEM_LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none));
  }
  // Dummy (never dereferenced) scale pointers: the heuristics only see that they are set.
  const float* dummy = one_.get();
  auto heuristic = [&](int64_t m, cublasLtMatmulAlgo_t* algo) {
    Descs d;
    if (init_descs(d, s, m, dummy, dummy, one_.get()) != CUBLAS_STATUS_SUCCESS) return false;
    cublasLtMatmulHeuristicResult_t r[4];
    int n = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt(handle_), &d.op, &d.a, &d.b, &d.c, &d.d, pref, 4, r, &n) !=
            CUBLAS_STATUS_SUCCESS ||
        n < 1)
      return false;
    for (int i = 0; i < n; ++i) {
      if (r[i].state != CUBLAS_STATUS_SUCCESS || r[i].workspaceSize > ws) continue;
      *algo = r[i].algo;
      return true;
    }
    return false;
  };
  auto check = [&](int64_t m, const cublasLtMatmulAlgo_t& algo) {
    Descs d;
    if (init_descs(d, s, m, dummy, dummy, one_.get()) != CUBLAS_STATUS_SUCCESS) return false;
    cublasLtMatmulHeuristicResult_t r;
    return cublasLtMatmulAlgoCheck(lt(handle_), &d.op, &d.a, &d.b, &d.c, &d.d, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= ws;
  };
  // Bucket ends: 128, 256, ... up to the first >= max_m (the first bucket starts at min_m).
  std::vector<int64_t> ends;
  for (int64_t hi = 128;; hi *= 2) {
    if (hi >= min_m) ends.push_back(hi);
    if (hi >= max_m) break;
  }
  Status status;
  if (one_algo) {
    // One algorithm, without split-K, for every row count: each output's summation order is then the
    // kernel's K loop whatever m is, so a row's result does not depend on the rows around it.
    cublasLtMatmulAlgo_t algo;
    bool ok = heuristic(ends.back(), &algo);
    if (ok) {
      const int32_t one_split = 1;
      const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
      ok = cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split,
                                                sizeof one_split) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &no_reduction,
                                                sizeof no_reduction) == CUBLAS_STATUS_SUCCESS;
    }
    ok = ok && check(min_m, algo);
    for (int64_t e : ends) ok = ok && check(e, algo);
    if (ok) {
      for (int64_t e : ends) {
        Bucket bk;
        bk.m_hi = e;
        std::memcpy(bk.algo, &algo, sizeof algo);
        plan.buckets.push_back(bk);
      }
    } else {
      status = make_error(StatusCode::kFailedPrecondition,
                          "cuBLASLt has no single split-K-free algorithm for kind {} n {} k {} batch {} at {}..{} rows",
                          static_cast<int>(s.kind), s.n, s.k, s.batch, min_m, ends.back());
    }
  } else {
    int64_t lo = min_m;
    for (int64_t hi : ends) {
      cublasLtMatmulAlgo_t algo;
      bool ok = heuristic(hi, &algo) && check(lo, algo);
      if (!ok) ok = heuristic(lo, &algo) && check(hi, algo);
      if (!ok) {
        status = make_error(StatusCode::kFailedPrecondition,
                            "cuBLASLt has no algorithm for kind {} n {} k {} batch {} at {}..{} rows",
                            static_cast<int>(s.kind), s.n, s.k, s.batch, lo, hi);
        break;
      }
      Bucket bk;
      bk.m_hi = hi;
      std::memcpy(bk.algo, &algo, sizeof algo);
      plan.buckets.push_back(bk);
      lo = hi + 1;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (!status.ok()) return status;
  plans_.push_back(std::move(plan));
  return Status();
}

bool LtGemm::ready(const LtShape& s, int64_t m) const {
  const Plan* p = find(s);
  return p && !p->buckets.empty() && m >= p->min_m && m <= p->buckets.back().m_hi;
}

void LtGemm::run(const LtShape& s, int64_t m, const void* w, const void* x, void* y, const float* w_scale,
                 const float* x_scale, cudaStream_t st) const {
  if (m == 0) return;
  const Plan* p = find(s);
  TANDEM_CHECK_MSG(p && m >= p->min_m && m <= p->buckets.back().m_hi, "LtGemm::run: shape not prepared for this many rows");
  const Bucket* b = &p->buckets.front();
  while (b->m_hi < m) ++b;
  Descs d;
  TANDEM_LT_CHECK(init_descs(d, s, m, w_scale, x_scale, one_.get()));
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, b->algo, sizeof algo);
  TANDEM_LT_CHECK(cublasLtMatmul(lt(handle_), &d.op, &alpha, w, &d.a, x, &d.b, &beta, y, &d.c, y, &d.d, &algo,
                                 ws_.get(), ws_.bytes(), st));
}

}  // namespace tandem::kernels::cuda
