// mHC hc_pre: RMS over all streams, the mixing projection, sigmoid pre/post, Sinkhorn-normalized
// combination matrix (hc_split_sinkhorn), and the pre-weighted collapse of the streams.
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/hc_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void hc_pre(const HcPreParams& p) {
  validate(p);
  const int hc = p.hc;
  const int64_t D = p.dim, HD = hc * D;
  const int nmix = (2 + hc) * hc;
  float* mixes = hc_mixes(p.h, p.fn, p.tokens, nmix, HD, p.norm_eps);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.tokens, 2.0 * HD))
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* mix = mixes + t * nmix;
    float pre[16];
    float* post = p.post + t * hc;
    float* C = p.comb + t * hc * hc;
    TANDEM_CHECK(hc <= 16);
    for (int j = 0; j < hc; ++j) {
      pre[j] = sigmoidf(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
      post[j] = 2.0f * sigmoidf(mix[j + hc] * p.scale[1] + p.base[j + hc]);
    }
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k) C[j * hc + k] = mix[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
    // softmax over each row, + eps
    for (int j = 0; j < hc; ++j) {
      float m = C[j * hc];
      for (int k = 1; k < hc; ++k) m = C[j * hc + k] > m ? C[j * hc + k] : m;
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) {
        C[j * hc + k] = std::exp(C[j * hc + k] - m);
        s += C[j * hc + k];
      }
      for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / s + p.hc_eps;
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] = C[j * hc + k] / (s + p.hc_eps);
      }
    };
    col_norm();
    for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += C[j * hc + k];
        for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / (s + p.hc_eps);
      }
      col_norm();
    }
    hc_collapse(p.h + t * HD, pre, hc, D, p.x + t * D, true);
  }
}

}  // namespace tandem::kernels::cpu
