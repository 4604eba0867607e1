// KV compressor gated pooling (per-channel softmax over the tokens of a block; ratio 4 overlaps
// the previous block's first half of the channels).
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void compress_pool(const CompressPoolParams& p) {
  validate(p);
  const int64_t coff = p.overlap ? 2 : 1;
  const int64_t ld = ld_or(p.ld, coff * p.d), ldo = ld_or(p.ldo, p.d);
  const int64_t d = p.d;
  const int ratio = p.ratio;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.num_entries, 8.0 * coff * ratio * d))
  for (int64_t e = 0; e < p.num_entries; ++e) {
    const int64_t j = p.first_entry + e;
    float* out = p.out + e * ldo;
    // Candidate list: (row, channel offset) pairs in the reference's order: previous block's
    // A half first (overlap), then the current block.
    const int ncand = static_cast<int>(coff * ratio);
    int64_t rows[256];
    int64_t choff[256];
    bool present[256];
    TANDEM_CHECK(ncand <= 256);
    for (int c = 0; c < ncand; ++c) {
      if (p.overlap && c < ratio) {
        present[c] = j > 0;
        rows[c] = ratio * (j - 1) + c - p.first_pos;
        choff[c] = 0;
      } else {
        const int i = p.overlap ? c - ratio : c;
        present[c] = true;
        rows[c] = ratio * j + i - p.first_pos;
        choff[c] = p.overlap ? d : 0;
      }
    }
    float* sbuf = thread_scratch(static_cast<size_t>(ncand) * 2, 1);
    for (int64_t ch = 0; ch < d; ++ch) {
      float m = -std::numeric_limits<float>::infinity();
      for (int c = 0; c < ncand; ++c) {
        float s = -std::numeric_limits<float>::infinity();
        if (present[c]) {
          const int64_t col = choff[c] + ch;
          s = p.score[rows[c] * ld + col];
          if (p.ape) s += p.ape[((p.first_pos + rows[c]) % ratio) * coff * d + col];
        }
        sbuf[c] = s;
        m = s > m ? s : m;
      }
      float z = 0.0f;
      for (int c = 0; c < ncand; ++c) {
        sbuf[c] = present[c] ? std::exp(sbuf[c] - m) : 0.0f;
        z += sbuf[c];
      }
      float acc = 0.0f;
      for (int c = 0; c < ncand; ++c)
        if (present[c]) acc += p.kv[rows[c] * ld + choff[c] + ch] * (sbuf[c] / z);
      out[ch] = p.round_bf16 ? num::round_bf16(acc) : acc;
    }
  }
}

}  // namespace tandem::kernels::cpu
