// Grouped routed experts for prefill (moe_prefill.h): routing sort, tile table and slot-order
// quantization, the up (w1/w3 + SwiGLU) and down (w2) grouped MXFP4 GEMMs on kernels/cuda/
// tc_gemm.cuh's portable main loop (sm_90 dispatches to moe_prefill_ws.cu), and the combine in
// ascending expert order.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <mutex>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/tc_gemm.cuh"
#include "model/cuda/moe_prefill.h"
#include "model/cuda/moe_prefill_ws.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

namespace kc = kernels::cuda;
namespace tc = kernels::cuda::tc;
using kc::add_rn;
using kc::clamp_std;
using kc::div_rn;
using kc::min_std;
using kc::mul_rn;
using kc::round_bf16;

namespace {

int sort_bits(int n_local) {
  int b = 1;
  while ((1 << b) <= n_local) ++b;  // keys 0..n_local
  return b;
}
size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// ---------------------------------------------------------------- routing
__global__ void route_keys_kernel(const int32_t* eids, int64_t pairs, int expert_begin, int n_local, uint32_t* keys,
                                  int32_t* ids) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = eids[p] - expert_begin;
  keys[p] = e >= 0 && e < n_local ? static_cast<uint32_t>(e) : static_cast<uint32_t>(n_local);
  ids[p] = static_cast<int32_t>(p);
}

// offsets[e] = first sorted slot with key >= e (e = 0..n_local), then tiles of kMoeTileRows slots
// per local expert in expert order. One block.
__global__ void tiles_kernel(const uint32_t* keys, int64_t pairs, int n_local, int32_t* offsets, int32_t* tiles,
                             int32_t* tile_count) {
  __shared__ int32_t s_first[1025];
  for (int e = threadIdx.x; e <= n_local; e += blockDim.x) {
    int64_t lo = 0, hi = pairs;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (keys[mid] < static_cast<uint32_t>(e)) lo = mid + 1;
      else hi = mid;
    }
    offsets[e] = static_cast<int32_t>(lo);
    s_first[e] = static_cast<int32_t>(lo);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t t = 0;
    for (int e = 0; e < n_local; ++e) {
      for (int32_t s = s_first[e]; s < s_first[e + 1]; s += kMoeTileRows) {
        tiles[2 * t] = e;
        tiles[2 * t + 1] = s;
        ++t;
      }
    }
    *tile_count = t;
  }
}

// ---------------------------------------------------------------- grouped GEMMs
struct GroupArgs {
  const uint8_t* a;          // up: x codes, down: act codes; [pairs, k], row = sorted slot
  const float* a_scale;      // [k / 128, a_scale_ld]
  int64_t a_scale_ld;
  const uint8_t* b;          // up: w1, down: w2 (packed e2m1 [rows, k / 2])
  const uint8_t* b_scale;    // [rows, k / 32] E8M0
  const uint8_t* b3;         // up: w3
  const uint8_t* b3_scale;
  int64_t k;                 // K of this GEMM (up: dim, down: inter)
  int64_t n;                 // weight rows per expert (up: inter, down: dim)
  const int32_t* slot_pair;  // [pairs] sorted slot -> pair
  const int32_t* offsets;    // [n_local + 1]
  const int32_t* tiles;      // [max_tiles][2]
  const int32_t* tile_count;
  int topk;
  const float* route_w;      // up: [pairs]
  float limit;
  uint16_t* act;             // up out: [pairs, n] bf16 (row = sorted slot)
  float* pair_out;           // down out: [pairs, n] (row = pair)
};

// Operand source of one grouped tile. A: this thread's 4 rows r0 + 32 i (chunk c), each a sorted
// slot's row of the x or act codes, -1 = past the expert's pairs. B: this thread's 2 raw rows
// rb + 64 i (32-element group q) of the expert's weights.
template <bool kUp, int kStages>
struct GroupOp {
  using L = tc::Smem<true, kStages>;
  const uint8_t* a;
  int64_t k;
  int64_t arow[4];
  const float* ascale;     // scale of A row threadIdx.x (k block 0), threads < 128
  int64_t ascale_ld;
  bool ascale_valid;
  const uint8_t* brow[2];  // raw row (k block 0)
  const uint8_t* bsc[2];   // E8M0 row (k block 0)
  bool bvalid[2];
  int r0, c, rb, q;

  __device__ void load(uint8_t* smem, int stage, int kb) const {
    const uint32_t sa = tc::smem_u32(smem + L::kA + stage * tc::kTileBytes);
    const int64_t off = static_cast<int64_t>(kb) * tc::kBK + c * 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      tc::cp_async16(sa + tc::swz(r0 + 32 * i, c), a + (arow[i] >= 0 ? arow[i] * k + off : 0), arow[i] >= 0);
    const uint32_t sr = tc::smem_u32(smem + L::kRaw + stage * tc::kRawBytes);
    const uint32_t ss = tc::smem_u32(smem + L::kRawScale + stage * tc::kTileRows * 16);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rb + 64 * i;
      tc::cp_async16(sr + r * 64 + q * 16, brow[i] + (bvalid[i] ? kb * 64 + q * 16 : 0), bvalid[i]);
      tc::cp_async4(ss + (r * 4 + q) * 4, bsc[i] + (bvalid[i] ? kb * 4 : 0), bvalid[i]);
    }
    if (threadIdx.x < tc::kTileRows) {
      const uint32_t sas = tc::smem_u32(smem + L::kAScale + stage * tc::kTileRows * 4) + threadIdx.x * 4;
      tc::cp_async4(sas, ascale + (ascale_valid ? kb * ascale_ld : 0), ascale_valid);
    }
  }

  __device__ void convert(uint8_t* smem, int stage, int buf) const {
    const uint8_t* raw = smem + L::kRaw + stage * tc::kRawBytes;
    const uint32_t* rsc = reinterpret_cast<const uint32_t*>(smem + L::kRawScale + stage * tc::kTileRows * 16);
    uint8_t* dst = smem + L::kB + buf * tc::kTileBytes;
    float* cs = reinterpret_cast<float*>(smem + L::kColScale + buf * tc::kTileRows * 4);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rb + 64 * i;
      const uint4 v = *reinterpret_cast<const uint4*>(raw + r * 64 + q * 16);
      const uint32_t sc = rsc[r * 4 + q];
      const int ref = tc::mxfp4_block_ref(sc);
      const int d = static_cast<int>((sc >> (8 * q)) & 0xffu) - ref;
      uint4 o0, o1;
      tc::mxfp4_group_to_e4m3(v, d, o0, o1);
      *reinterpret_cast<uint4*>(dst + tc::swz(r, 2 * q)) = o0;
      *reinterpret_cast<uint4*>(dst + tc::swz(r, 2 * q + 1)) = o1;
      if (q == 0) cs[r] = tc::pow2_any(ref - 127);
    }
  }
};

// Up: tile columns interleave w1 and w3 in chunks of 8 (chunk 2j: w1 rows n0 + 8j.., chunk 2j+1:
// w3 rows n0 + 8j..), so a thread holds g and u of the same intermediate column: 64 intermediate
// columns per CTA. Down: 128 w2 rows per CTA.
template <bool kUp, bool kWgmma, int kStages>
__global__ void __launch_bounds__(tc::kThreads, 1) group_kernel(GroupArgs a) {
  const int t = blockIdx.y;
  if (t >= *a.tile_count) return;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  const int e = a.tiles[2 * t], slot0 = a.tiles[2 * t + 1];
  const int slot_end = a.offsets[e + 1];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kUp ? tc::kTileRows / 2 : tc::kTileRows);

  GroupOp<kUp, kStages> op;
  op.a = a.a;
  op.k = a.k;
  op.r0 = threadIdx.x >> 3;
  op.c = threadIdx.x & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = slot0 + op.r0 + 32 * i;
    op.arow[i] = s < slot_end ? s : -1;
  }
  {
    const int s = slot0 + static_cast<int>(threadIdx.x);
    op.ascale_valid = threadIdx.x < tc::kTileRows && s < slot_end;
    const int64_t row = op.ascale_valid ? s : 0;
    op.ascale = a.a_scale + row;
    op.ascale_ld = a.a_scale_ld;
  }
  op.rb = threadIdx.x >> 2;
  op.q = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int cc = op.rb + 64 * i;  // tile column
    int64_t col;                     // weight row within the expert
    bool w3 = false;
    if constexpr (kUp) {
      w3 = (cc >> 3) & 1;
      col = n0 + 8 * (cc >> 4) + (cc & 7);
    } else {
      col = n0 + cc;
    }
    op.bvalid[i] = col < a.n;
    const int64_t row = static_cast<int64_t>(e) * a.n + (op.bvalid[i] ? col : 0);
    op.brow[i] = (w3 ? a.b3 : a.b) + row * (a.k / 2);
    op.bsc[i] = (w3 ? a.b3_scale : a.b_scale) + row * (a.k / 32);
  }

  float acc[64];
  tc::mainloop<kWgmma, tc::Elem::kMxfp4, kStages>(smem, op, static_cast<int>(a.k / tc::kBK), acc);

  if constexpr (kUp) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (i & 4) continue;  // odd chunks (w3) are read with their even partner
      const int row = tc::acc_row<kWgmma>(i), cc = tc::acc_col<kWgmma>(i);
      const int s = slot0 + row;
      const int64_t col = n0 + 8 * (cc >> 4) + (cc & 7);
      if (s >= slot_end || col >= a.n) continue;
      // The reference: g, u are bf16 outputs of their linears; clamp; silu(g) * u * weight -> bf16.
      float g = round_bf16(acc[i]), u = round_bf16(acc[i + 4]);
      if (a.limit > 0.0f) {
        u = clamp_std(u, -a.limit, a.limit);
        g = min_std(g, a.limit);
      }
      float v = mul_rn(div_rn(g, add_rn(1.0f, expf(-g))), u);
      v = mul_rn(a.route_w[a.slot_pair[s]], v);
      a.act[static_cast<int64_t>(s) * a.n + col] = num::f32_to_bf16(v);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int s = slot0 + tc::acc_row<kWgmma>(i);
      const int64_t col = n0 + tc::acc_col<kWgmma>(i);
      if (s >= slot_end) continue;
      float* yp = a.pair_out + static_cast<int64_t>(a.slot_pair[s]) * a.n + col;
      if (col < a.n) yp[0] = round_bf16(acc[i]);
      if (col + 1 < a.n) yp[1] = round_bf16(acc[i + 1]);
    }
  }
}

template <bool kUp, bool kWgmma, int kStages>
void set_group_attr() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(group_kernel<kUp, kWgmma, kStages>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, tc::Smem<true, kStages>::kAlloc));
}

bool deep_pipeline() {
  int dev = 0, v = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v >= tc::Smem<true, 4>::kAlloc;
}

std::once_flag g_attr_once;
void init_attrs() {
  std::call_once(g_attr_once, [] {
    set_group_attr<true, false, 2>();
    set_group_attr<true, true, 2>();
    set_group_attr<false, false, 2>();
    set_group_attr<false, true, 2>();
    if (deep_pipeline()) {
      set_group_attr<true, false, 4>();
      set_group_attr<true, true, 4>();
      set_group_attr<false, false, 4>();
      set_group_attr<false, true, 4>();
    }
  });
}

template <bool kUp>
void launch_group(const GroupArgs& g, dim3 grid, bool wg, cudaStream_t st) {
  if (deep_pipeline()) {
    constexpr int kS = 4;
    if (wg) group_kernel<kUp, true, kS><<<grid, tc::kThreads, tc::Smem<true, kS>::kAlloc, st>>>(g);
    else group_kernel<kUp, false, kS><<<grid, tc::kThreads, tc::Smem<true, kS>::kAlloc, st>>>(g);
  } else {
    constexpr int kS = 2;
    if (wg) group_kernel<kUp, true, kS><<<grid, tc::kThreads, tc::Smem<true, kS>::kAlloc, st>>>(g);
    else group_kernel<kUp, false, kS><<<grid, tc::kThreads, tc::Smem<true, kS>::kAlloc, st>>>(g);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------- combine
__global__ void combine_kernel(const float* pair_out, const int32_t* eids, const float* shared, int64_t tokens,
                               int topk, int64_t dim, int expert_begin, int n_local, float* y) {
  const int64_t t = blockIdx.x;
  if (t >= tokens) return;
  int order[16], n = 0;
  for (int j = 0; j < topk; ++j) {
    const int e = eids[t * topk + j] - expert_begin;
    if (e < 0 || e >= n_local) continue;
    // insertion in ascending expert id (ids are distinct within a token)
    int b = n++;
    while (b > 0 && eids[t * topk + order[b - 1]] > eids[t * topk + j]) {
      order[b] = order[b - 1];
      --b;
    }
    order[b] = j;
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc = add_rn(acc, pair_out[(t * topk + order[i]) * dim + d]);
    y[t * dim + d] = shared ? round_bf16(add_rn(acc, shared[t * dim + d])) : acc;
  }
}

}  // namespace

size_t moe_prefill_scratch_bytes(int64_t max_tokens, int topk, int n_local, int64_t dim, int64_t inter) {
  MoePrefillScratch s = moe_prefill_scratch(nullptr, max_tokens, topk, n_local, dim, inter);
  return reinterpret_cast<size_t>(s.act_scales) + align256(sizeof(float) * (inter / 128) * ((s.max_pairs() + 3) / 4 * 4));
}

MoePrefillScratch moe_prefill_scratch(void* base, int64_t max_tokens, int topk, int n_local, int64_t dim,
                                      int64_t inter) {
  MoePrefillScratch s;
  s.max_tokens = max_tokens;
  s.topk = topk;
  s.n_local = n_local;
  s.dim = dim;
  s.inter = inter;
  const int64_t P = s.max_pairs();
  size_t temp = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr),
                                                    static_cast<const int32_t*>(nullptr),
                                                    static_cast<int32_t*>(nullptr), static_cast<int>(std::max<int64_t>(P, 1)),
                                                    0, sort_bits(n_local)));
  s.sort_temp_bytes = temp;
  const uintptr_t p = reinterpret_cast<uintptr_t>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* at = reinterpret_cast<uint8_t*>(p + off);  // null base: offsets only (moe_prefill_scratch_bytes)
    off += align256(bytes);
    return at;
  };
  s.keys = reinterpret_cast<uint32_t*>(take(sizeof(uint32_t) * 2 * P));
  s.pairs = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * 2 * P));
  s.sort_temp = take(temp);
  s.offsets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (n_local + 1)));
  s.tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * 2 * s.max_tiles()));
  s.tile_count = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  s.x_codes = take(static_cast<size_t>(P * dim));
  s.x_scales = reinterpret_cast<float*>(take(sizeof(float) * (dim / 128) * ((P + 3) / 4 * 4)));
  s.act = reinterpret_cast<uint16_t*>(take(sizeof(uint16_t) * P * inter));
  s.act_codes = take(static_cast<size_t>(P * inter));
  s.act_scales = reinterpret_cast<float*>(take(0));
  return s;
}

bool mxfp4_blocks_fit_e4m3(const uint8_t* scale, int64_t rows, int64_t k) {
  if (k % 128) return false;
  const int64_t groups = k / 32;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* s = scale + r * groups;
    for (int64_t b = 0; b < groups; b += 4) {
      const uint8_t lo = std::min(std::min(s[b], s[b + 1]), std::min(s[b + 2], s[b + 3]));
      const uint8_t hi = std::max(std::max(s[b], s[b + 1]), std::max(s[b + 2], s[b + 3]));
      if (hi == 255 || hi - lo > 11) return false;
    }
  }
  return true;
}

namespace {
bool aligned(const void* p, uintptr_t a) { return p && reinterpret_cast<uintptr_t>(p) % a == 0; }
int64_t max_tiles_of(const MoePrefillArgs& a) {
  return (a.tokens * a.topk + kMoeTileRows - 1) / kMoeTileRows + a.n_local;
}
}  // namespace

bool moe_prefill_supported(const MoePrefillArgs& a, const MoePrefillScratch& s) {
  using kernels::WeightFormat;
  return a.w1.format == WeightFormat::kMxfp4 && a.w2.format == WeightFormat::kMxfp4 &&
         a.w3.format == WeightFormat::kMxfp4 && a.dim % 128 == 0 && a.inter % 128 == 0 && a.topk <= 16 &&
         a.n_local >= 1 && a.n_local <= 1024 && a.tokens <= s.max_tokens && a.topk == s.topk &&
         a.n_local == s.n_local && a.dim == s.dim && a.inter == s.inter && s.keys != nullptr &&
         a.w1.n == a.n_local * a.inter && a.w3.n == a.n_local * a.inter && a.w2.n == a.n_local * a.dim &&
         a.w1.k == a.dim && a.w3.k == a.dim && a.w2.k == a.inter && aligned(a.x, 16) && aligned(a.w1.data, 16) &&
         aligned(a.w3.data, 16) && aligned(a.w2.data, 16) && aligned(a.w1.scale, 4) && aligned(a.w3.scale, 4) &&
         aligned(a.w2.scale, 4) && aligned(a.pair_out, 8) && max_tiles_of(a) <= 65535;  // grid.y of the groups
}

namespace {
int64_t slot_ld(const MoePrefillArgs& a) { return (a.tokens * a.topk + 3) / 4 * 4; }
GroupArgs group_args(const MoePrefillArgs& a, const MoePrefillScratch& s) {
  GroupArgs g{};
  g.slot_pair = s.pairs + s.max_pairs();
  g.offsets = s.offsets;
  g.tiles = s.tiles;
  g.tile_count = s.tile_count;
  g.topk = a.topk;
  g.route_w = a.weights;
  g.limit = a.limit;
  return g;
}
MoeWsArgs ws_args(const MoePrefillArgs& a, const MoePrefillScratch& s) {
  MoeWsArgs w;
  w.pairs = a.tokens * a.topk;
  w.slot_pair = s.pairs + s.max_pairs();
  w.offsets = s.offsets;
  w.tiles = s.tiles;
  w.tile_count = s.tile_count;
  w.max_tiles = max_tiles_of(a);
  w.n_local = a.n_local;
  w.topk = a.topk;
  w.route_w = a.weights;
  w.limit = a.limit;
  return w;
}
}  // namespace

void moe_prefill_init() {
  kc::tc_init();
  init_attrs();
  if (kc::tc_device_has_wgmma()) moe_ws_init();
}

void moe_prefill_route(const MoePrefillArgs& a, const MoePrefillScratch& s, cudaStream_t st) {
  if (a.tokens == 0) return;
  TANDEM_CHECK(moe_prefill_supported(a, s));
  const int64_t P = a.tokens * a.topk;
  // Sort the pairs by local expert (stable: ascending pair id within an expert), then the tiles.
  route_keys_kernel<<<kc::ceil_div(P, 256), 256, 0, st>>>(a.expert_ids, P, a.expert_begin, a.n_local, s.keys,
                                                           s.pairs);
  TANDEM_CUDA_LAUNCH_CHECK();
  size_t temp = s.sort_temp_bytes;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys, s.keys + s.max_pairs(), s.pairs,
                                                    s.pairs + s.max_pairs(), static_cast<int>(P), 0,
                                                    sort_bits(a.n_local), st));
  tiles_kernel<<<1, 1024, 0, st>>>(s.keys + s.max_pairs(), P, a.n_local, s.offsets, s.tiles, s.tile_count);
  TANDEM_CUDA_LAUNCH_CHECK();
  // Each local slot's token quantized into the slot's row (the reference's act_quant before w1/w3;
  // a token routed to several local experts is quantized once per slot, identically): the up GEMM
  // then reads contiguous rows.
  kc::Fp8QuantArgs qx;
  qx.x = a.x;
  qx.ldx = a.dim;
  qx.rows = P;
  qx.cols = a.dim;
  qx.rows_limit = s.offsets + a.n_local;
  qx.src_rows = s.pairs + s.max_pairs();
  qx.src_div = a.topk;
  qx.codes = s.x_codes;
  qx.scales = s.x_scales;
  qx.scale_ld = slot_ld(a);
  kc::quantize_fp8_act(qx, st);
}

void moe_prefill_up(const MoePrefillArgs& a, const MoePrefillScratch& s, kc::TcBackend backend, cudaStream_t st) {
  if (a.tokens == 0) return;
  TANDEM_CHECK(moe_prefill_supported(a, s));
  moe_prefill_init();
  backend = kc::tc_resolve(backend);
  const int64_t max_tiles = max_tiles_of(a);
  TANDEM_CHECK(max_tiles <= 65535);
  if (backend == kc::TcBackend::kWgmmaWs) {
    MoeWsArgs w = ws_args(a, s);
    w.up = true;
    w.a = s.x_codes;
    w.a_scale = s.x_scales;
    w.a_scale_ld = slot_ld(a);
    w.b = a.w1;
    w.b3 = a.w3;
    w.k = a.dim;
    w.n = a.inter;
    w.act = s.act;
    moe_group_ws(w, st);
    return;
  }
  GroupArgs g = group_args(a, s);
  g.a = s.x_codes;
  g.a_scale = s.x_scales;
  g.a_scale_ld = slot_ld(a);
  g.b = static_cast<const uint8_t*>(a.w1.data);
  g.b_scale = a.w1.scale;
  g.b3 = static_cast<const uint8_t*>(a.w3.data);
  g.b3_scale = a.w3.scale;
  g.k = a.dim;
  g.n = a.inter;
  g.act = s.act;
  launch_group<true>(g, dim3(kc::ceil_div(a.inter, tc::kTileRows / 2), static_cast<unsigned>(max_tiles)),
                     backend != kc::TcBackend::kMmaSync, st);
}

void moe_prefill_down(const MoePrefillArgs& a, const MoePrefillScratch& s, kc::TcBackend backend,
                      cudaStream_t st) {
  if (a.tokens == 0) return;
  TANDEM_CHECK(moe_prefill_supported(a, s));
  moe_prefill_init();
  backend = kc::tc_resolve(backend);
  const int64_t P = a.tokens * a.topk, ald = slot_ld(a);
  // act quantized per 128 (the reference's act_quant before w2), local pairs only.
  kc::Fp8QuantArgs qa;
  qa.xb = s.act;
  qa.ldx = a.inter;
  qa.rows = P;
  qa.cols = a.inter;
  qa.rows_limit = s.offsets + a.n_local;
  qa.codes = s.act_codes;
  qa.scales = s.act_scales;
  qa.scale_ld = ald;
  kc::quantize_fp8_act(qa, st);
  const int64_t max_tiles = max_tiles_of(a);
  TANDEM_CHECK(max_tiles <= 65535);
  if (backend == kc::TcBackend::kWgmmaWs) {
    MoeWsArgs w = ws_args(a, s);
    w.up = false;
    w.a = s.act_codes;
    w.a_scale = s.act_scales;
    w.a_scale_ld = ald;
    w.b = a.w2;
    w.k = a.inter;
    w.n = a.dim;
    w.pair_out = a.pair_out;
    moe_group_ws(w, st);
    return;
  }
  GroupArgs g = group_args(a, s);
  g.a = s.act_codes;
  g.a_scale = s.act_scales;
  g.a_scale_ld = ald;
  g.b = static_cast<const uint8_t*>(a.w2.data);
  g.b_scale = a.w2.scale;
  g.k = a.inter;
  g.n = a.dim;
  g.pair_out = a.pair_out;
  launch_group<false>(g, dim3(kc::ceil_div(a.dim, tc::kTileRows), static_cast<unsigned>(max_tiles)),
                      backend != kc::TcBackend::kMmaSync, st);
}

void moe_prefill(const MoePrefillArgs& a, const MoePrefillScratch& s, kc::TcBackend backend, cudaStream_t st) {
  moe_prefill_route(a, s, st);
  moe_prefill_up(a, s, backend, st);
  moe_prefill_down(a, s, backend, st);
}

void moe_combine_local(const float* pair_out, const int32_t* expert_ids, const float* shared, int64_t tokens,
                       int topk, int64_t dim, int expert_begin, int n_local, float* y, cudaStream_t s) {
  if (tokens == 0) return;
  TANDEM_CHECK(topk <= 16);
  combine_kernel<<<static_cast<unsigned>(tokens), 256, 0, s>>>(pair_out, expert_ids, shared, tokens, topk, dim,
                                                               expert_begin, n_local, y);
  TANDEM_CUDA_LAUNCH_CHECK();
}

std::vector<kc::SmemBound> moe_prefill_smem_bounds() {
  // Two stages everywhere, four where the device has room (deep_pipeline()); the wgmma variants
  // only on sm_90 (the backend is wgmma only there).
  const int64_t s2 = tc::Smem<true, 2>::kAlloc, s4 = tc::Smem<true, 4>::kAlloc;
  const std::string deep = "launched only where deep_pipeline() sees the room";
  std::vector<kc::SmemBound> out;
  for (const char* up : {"true", "false"}) {
    const std::string k = std::string("group_kernel<") + up;
    const std::string shape = std::string(up) == "true" ? "up, 128-row tile, " : "down, 128-row tile, ";
    out.push_back({k + ", false, 2>", s2, shape + "2 stages", ""});
    out.push_back({k + ", false, 4>", s4, shape + "4 stages", deep, s4});
    out.push_back({k + ", true, 2>", s2, shape + "2 stages (wgmma)", "", 0, {90}});
    out.push_back({k + ", true, 4>", s4, shape + "4 stages (wgmma)", deep, s4, {90}});
  }
  return out;
}

}  // namespace tandem::cuda_model
