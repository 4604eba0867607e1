// mHC hc_head: the final collapse of the streams (no Sinkhorn, no post).
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/hc_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void hc_head(const HcHeadParams& p) {
  validate(p);
  const int hc = p.hc;
  const int64_t D = p.dim, HD = hc * D;
  TANDEM_CHECK(hc <= 16);
  float* mixes = hc_mixes(p.h, p.fn, p.tokens, hc, HD, p.norm_eps);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.tokens, 2.0 * HD))
  for (int64_t t = 0; t < p.tokens; ++t) {
    float pre[16];
    for (int j = 0; j < hc; ++j) pre[j] = sigmoidf(mixes[t * hc + j] * p.scale[0] + p.base[j]) + p.hc_eps;
    hc_collapse(p.h + t * HD, pre, hc, D, p.y + t * D, p.round_bf16);
  }
}

}  // namespace tandem::kernels::cpu
