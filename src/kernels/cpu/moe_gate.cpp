// MoE gate: sqrt-softplus scores, bias-for-selection top-k or hash routing, renormalized and
// scaled routing weights.
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void moe_gate(const MoeGateParams& p) {
  validate(p);
  const int E = p.n_experts, K = p.topk;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.tokens, 30.0 * E))
  for (int64_t t = 0; t < p.tokens; ++t) {
    float* s = thread_scratch(static_cast<size_t>(2 * E), 1);
    float* sel = s + E;
    const float* z = p.logits + t * E;
    for (int e = 0; e < E; ++e) {
      const float sp = z[e] > 20.0f ? z[e] : std::log1p(std::exp(z[e]));  // torch softplus, threshold 20
      s[e] = std::sqrt(sp);
      sel[e] = p.bias ? s[e] + p.bias[e] : s[e];
    }
    int32_t* ids = p.expert_ids + t * K;
    if (p.tid2eid) {
      const int32_t* row = p.tid2eid + static_cast<int64_t>(p.token_ids[t]) * K;
      for (int i = 0; i < K; ++i) {
        TANDEM_CHECK(row[i] >= 0 && row[i] < E);  // validated at load
        ids[i] = row[i];
      }
    } else {
      // K passes of argmax over the remaining experts: larger first, ties by lower id.
      for (int i = 0; i < K; ++i) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
          bool taken = false;
          for (int j = 0; j < i; ++j) taken |= ids[j] == e;
          if (taken) continue;
          if (best < 0 || sel[e] > sel[best] || (std::isnan(sel[e]) && !std::isnan(sel[best]))) best = e;
        }
        ids[i] = best;
      }
    }
    float* w = p.weights + t * K;
    float sum = 0.0f;
    for (int i = 0; i < K; ++i) {
      w[i] = s[ids[i]];
      sum += w[i];
    }
    for (int i = 0; i < K; ++i) w[i] = w[i] / sum * p.route_scale;
  }
}

}  // namespace tandem::kernels::cpu
