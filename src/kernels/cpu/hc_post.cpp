// mHC hc_post: expand the sub-block output back to the streams, mixing the residual streams
// through comb transposed (sum over its first index). f is loaded through the load epilogue
// (f_add, f_round: HcPostParams), as the CPU's all-reduce epilogue would have left it.
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void hc_post(const HcPostParams& p) {
  validate(p);
  const int hc = p.hc;
  const int64_t D = p.dim;
  TANDEM_CHECK(hc <= 16);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.tokens, 2.0 * hc * hc * D))
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* f = p.f + t * D;
    const float* fa = p.f_add ? p.f_add + t * D : nullptr;
    const float* res = p.res + t * hc * D;
    const float* post = p.post + t * hc;
    const float* C = p.comb + t * hc * hc;
    float* out = p.out + t * hc * D;
    for (int64_t d = 0; d < D; ++d) {
      float r[16];
      for (int j = 0; j < hc; ++j) r[j] = res[j * D + d];
      float fd = fa ? f[d] + fa[d] : f[d];
      if (p.f_round) fd = num::round_bf16(fd);
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k] * r[j];
        const float v = post[k] * fd + s;
        out[k * D + d] = p.round_bf16 ? num::round_bf16(v) : v;
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
