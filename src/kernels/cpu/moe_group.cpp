// Counting sort of (token, slot) routing pairs by expert.
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void moe_group(const MoeGroupParams& p) {
  validate(p);
  const int E = p.n_experts;
  std::memset(p.offsets, 0, sizeof(int32_t) * (E + 1));
  const int64_t n = p.tokens * p.topk;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = p.expert_ids[i];
    TANDEM_CHECK(e >= 0 && e < E);
    ++p.offsets[e + 1];
  }
  for (int e = 0; e < E; ++e) p.offsets[e + 1] += p.offsets[e];
  // Fill using a moving cursor per expert; offsets[e] is restored afterwards.
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = p.expert_ids[i];
    const int32_t pos = p.offsets[e]++;
    p.token_of[pos] = static_cast<int32_t>(i / p.topk);
    p.slot_of[pos] = static_cast<int32_t>(i % p.topk);
  }
  for (int e = E; e > 0; --e) p.offsets[e] = p.offsets[e - 1];
  p.offsets[0] = 0;
}

}  // namespace tandem::kernels::cpu
