// Shape and pointer checks shared by every backend. These are programmer invariants: anything a
// file or a request controls is validated before it reaches an op.
#include "common/check.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
bool pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }
}  // namespace

void validate(const ActQuantFp8Params& p) {
  TANDEM_CHECK(p.rows >= 0 && p.cols >= 0 && p.block > 0 && p.cols % p.block == 0);
  TANDEM_CHECK(p.rows == 0 || p.x != nullptr);
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.cols);
}
void validate(const Fp4ActQuantParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.cols >= 0 && p.block > 0 && p.block % 2 == 0 && p.cols % p.block == 0);
  TANDEM_CHECK(p.rows == 0 || p.x != nullptr);
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.cols);
}
void validate(const RoundBf16Params& p) {
  TANDEM_CHECK(p.rows >= 0 && p.cols >= 0 && (p.rows == 0 || p.x != nullptr));
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.cols);
}
void validate(const GemmParams& p) {
  TANDEM_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0 && p.batch >= 1);
  TANDEM_CHECK(p.w.k == p.k && p.w.data != nullptr);
  TANDEM_CHECK(p.m == 0 || p.n == 0 || (p.x != nullptr && p.y != nullptr));
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.k);
  TANDEM_CHECK(p.ldy == 0 || p.ldy >= p.n);
  TANDEM_CHECK((p.batch - 1) * p.w_batch_rows + p.n <= p.w.n);
  TANDEM_CHECK(p.quantize_x_block >= 0 && (p.quantize_x_block == 0 || p.k % p.quantize_x_block == 0));
  if (p.w.format == WeightFormat::kFp8Block) {
    TANDEM_CHECK(p.w.scale != nullptr);
    TANDEM_CHECK(p.w_batch_rows % kFp8WeightBlock == 0);
  }
  if (p.w.format == WeightFormat::kMxfp4) {
    TANDEM_CHECK(p.w.scale != nullptr);
    TANDEM_CHECK(p.k % kMxfp4WeightGroup == 0);
  }
}
void validate(const RmsNormParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.dim > 0 && p.x != nullptr && p.y != nullptr);
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.dim);
  TANDEM_CHECK(p.ldy == 0 || p.ldy >= p.dim);
  TANDEM_CHECK(!(p.weight && p.weight_bf16));
}
void validate(const RopeParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.heads >= 1 && p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.rope_offset >= 0);
  TANDEM_CHECK(p.tokens == 0 || (p.x && p.positions && p.inv_freq));
}
void validate(const HadamardParams& p) {
  TANDEM_CHECK(p.rows >= 0 && pow2(p.n) && (p.rows == 0 || p.x));
  TANDEM_CHECK(p.ldx == 0 || p.ldx >= p.n);
}
void validate(const CompressPoolParams& p) {
  TANDEM_CHECK(p.ratio > 0 && p.d > 0 && p.overlap == (p.ratio == 4));
  TANDEM_CHECK(p.num_entries >= 0 && p.first_entry >= 0);
  TANDEM_CHECK(p.num_entries == 0 || (p.kv && p.score && p.out));
  const int64_t coff = p.overlap ? 2 : 1;
  TANDEM_CHECK(p.ld == 0 || p.ld >= coff * p.d);
  TANDEM_CHECK(p.ldo == 0 || p.ldo >= p.d);
  if (p.num_entries > 0) {
    const int64_t j0 = p.first_entry, j1 = p.first_entry + p.num_entries - 1;
    const int64_t need_lo = (p.overlap && j0 > 0) ? p.ratio * (j0 - 1) : p.ratio * j0;
    const int64_t need_hi = p.ratio * j1 + p.ratio;  // exclusive
    TANDEM_CHECK_MSG(p.first_pos <= need_lo && p.first_pos + p.rows >= need_hi,
                     "compress_pool: token rows do not cover the entries' blocks");
  }
}
void validate(const IndexerScoreParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.heads > 0 && p.dim > 0 && p.entries >= 0);
  TANDEM_CHECK(p.tokens == 0 || (p.q && p.w && p.visible && p.scores));
  TANDEM_CHECK(p.entries == 0 || p.k);
  TANDEM_CHECK(p.ldk == 0 || p.ldk >= p.dim);
  TANDEM_CHECK(p.lds == 0 || p.lds >= p.entries);
}
void validate(const TopkParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.n >= 0 && p.k >= 0 && (p.rows == 0 || (p.scores && p.out)));
  TANDEM_CHECK(p.lds == 0 || p.lds >= p.n);
  TANDEM_CHECK(p.ldo == 0 || p.ldo >= p.k);
}
void validate(const SparseAttnParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.heads > 0 && p.dim > 0 && p.topk >= 0 && p.block > 0);
  TANDEM_CHECK(p.tokens == 0 || (p.q && p.idx && p.sink && p.out));
  TANDEM_CHECK(p.kv_rows == 0 || p.kv);
  TANDEM_CHECK(p.ldkv == 0 || p.ldkv >= p.dim);
  TANDEM_CHECK(p.ldi == 0 || p.ldi >= p.topk);
}
void validate(const HcPreParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.hc > 0 && p.dim > 0 && p.sinkhorn_iters >= 1);
  TANDEM_CHECK(p.tokens == 0 || (p.h && p.fn && p.scale && p.base && p.x && p.post && p.comb));
}
void validate(const HcPostParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.hc > 0 && p.dim > 0);
  TANDEM_CHECK(p.tokens == 0 || (p.f && p.res && p.post && p.comb && p.out));
}
void validate(const HcHeadParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.hc > 0 && p.dim > 0);
  TANDEM_CHECK(p.tokens == 0 || (p.h && p.fn && p.scale && p.base && p.y));
}
void validate(const MoeGateParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.n_experts > 0 && p.topk > 0 && p.topk <= p.n_experts);
  TANDEM_CHECK(p.tokens == 0 || (p.logits && p.expert_ids && p.weights));
  TANDEM_CHECK(p.tid2eid == nullptr || p.token_ids != nullptr);
}
void validate(const MoeGroupParams& p) {
  TANDEM_CHECK(p.tokens >= 0 && p.topk > 0 && p.n_experts > 0 && p.offsets);
  TANDEM_CHECK(p.tokens == 0 || (p.expert_ids && p.token_of && p.slot_of));
}
void validate(const SwigluParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.cols >= 0 && (p.rows == 0 || (p.gate && p.up && p.out)));
}
void validate(const RowsCopyParams& p) {
  TANDEM_CHECK(p.count >= 0 && p.cols >= 0 && (p.count == 0 || (p.src && p.dst && p.rows)));
}
void validate(const SoftmaxParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.n > 0 && p.temperature > 0.0f && (p.rows == 0 || (p.x && p.y)));
}
void validate(const ArgmaxParams& p) {
  TANDEM_CHECK(p.rows >= 0 && p.n > 0 && (p.rows == 0 || (p.x && p.out)));
}

}  // namespace tandem::kernels
