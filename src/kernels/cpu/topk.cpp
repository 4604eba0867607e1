// Row-wise top-k selection with a total order: larger score first, NaN above everything, equal
// scores by ascending index (documented tie rule, see ops.h).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {
namespace {
struct Cand {
  float s;
  int32_t i;
};
inline bool before(const Cand& a, const Cand& b) {
  const bool an = std::isnan(a.s), bn = std::isnan(b.s);
  if (an != bn) return an;
  if (!an && a.s != b.s) return a.s > b.s;
  return a.i < b.i;
}
}  // namespace

void topk(const TopkParams& p) {
  validate(p);
  const int64_t lds = ld_or(p.lds, p.n), ldo = ld_or(p.ldo, p.k);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(p.rows, 4.0 * p.n))
  for (int64_t r = 0; r < p.rows; ++r) {
    thread_local std::vector<Cand> buf;
    const int64_t nv = p.n_valid ? std::clamp<int64_t>(p.n_valid[r], 0, p.n) : p.n;
    const int64_t kk = std::min(p.k, nv);
    int32_t* out = p.out + r * ldo;
    if (buf.size() < static_cast<size_t>(nv)) buf.resize(static_cast<size_t>(nv));
    const float* s = p.scores + r * lds;
    for (int64_t i = 0; i < nv; ++i) buf[i] = {s[i], static_cast<int32_t>(i)};
    if (kk < nv) std::nth_element(buf.begin(), buf.begin() + kk, buf.begin() + nv, before);
    std::sort(buf.begin(), buf.begin() + kk, before);
    for (int64_t i = 0; i < kk; ++i) out[i] = buf[i].i + p.index_offset;
    for (int64_t i = kk; i < p.k; ++i) out[i] = -1;
  }
}

}  // namespace tandem::kernels::cpu
