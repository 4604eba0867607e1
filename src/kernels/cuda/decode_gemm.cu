// Decode GEMV on the tensor cores: the launcher (decode_gemm.h has the contract and the numerics,
// decode_gemm_body.cuh the device code and its design).
#include <algorithm>
#include <atomic>
#include <bit>

#include "common/check.h"
#include "kernels/cuda/decode_gemm_body.cuh"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {
namespace gemv {
namespace {

template <Kind KIND, int MT, bool HALF>
__global__ void __launch_bounds__(kThreads, MT == 6 && KIND == Kind::kFp8Codes ? 1 : 2)
    decode_gemm_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  decode_gemv_body<KIND, MT, HALF>(a, smem);
}

Kind kind_of(const DecodeGemmArgs& a) {
  if (a.x_codes) return Kind::kFp8Codes;
  return a.seg[0].w.format == WeightFormat::kBf16 ? Kind::kBf16F32 : Kind::kFp8F32;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void validate_args(const DecodeGemmArgs& a, Kind kind) {
  TANDEM_CHECK(a.num_segments >= 1 && a.num_segments <= kMaxDecodeSegments);
  TANDEM_CHECK(a.m > 0 && a.k > 0);
  const WeightFormat f = kind == Kind::kBf16F32 ? WeightFormat::kBf16 : WeightFormat::kFp8Block;
  for (int i = 0; i < a.num_segments; ++i) {
    const DecodeSegment& s = a.seg[i];
    TANDEM_CHECK_MSG(s.w.format == f && s.w.k == a.k && s.w.n > 0 && s.y, "decode_gemm: segments must share format and k");
    TANDEM_CHECK_MSG(decode_gemm_supports(s.w, kind == Kind::kFp8Codes), "decode_gemm: unsupported weight");
    TANDEM_CHECK(s.x_col0 >= 0 && s.x_col0 + a.k <= a.ldx);
    if (kind == Kind::kFp8Codes) TANDEM_CHECK(s.x_col0 % 128 == 0);
    else TANDEM_CHECK(s.x_col0 % 4 == 0);
  }
  if (kind == Kind::kFp8Codes) {
    TANDEM_CHECK_MSG(a.x_scales && aligned16(a.x_codes) && a.ldx % 16 == 0, "decode_gemm: FP8 codes layout");
  } else {
    TANDEM_CHECK_MSG(a.x && aligned16(a.x) && a.ldx % 4 == 0, "decode_gemm: fp32 activation layout");
  }
}

template <Kind KIND, int MT, bool HALF = false>
void launch_kind(const Plan& p, bool pdl, cudaStream_t s) {
  auto* kern = decode_gemm_kernel<KIND, MT, HALF>;
  static std::atomic<bool> attr_set{false};  // set on the first (eager) call, never inside a capture
  if (!attr_set.load()) {
    decode_allow_smem(reinterpret_cast<const void*>(kern));
    attr_set = true;
  }
  const dim3 grid(static_cast<unsigned>(p.grid));
  if (pdl) {
    launch_pdl(kern, grid, dim3(kThreads), p.smem, s, p.ka);
  } else {
    kern<<<grid, kThreads, p.smem, s>>>(p.ka);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

template <Kind KIND>
void launch_mt(const Plan& p, bool pdl, cudaStream_t s) {
  switch (p.mt) {
    case 1: return p.half ? launch_kind<KIND, 1, true>(p, pdl, s) : launch_kind<KIND, 1>(p, pdl, s);
    case 2: return launch_kind<KIND, 2>(p, pdl, s);
    case 3: return launch_kind<KIND, 3>(p, pdl, s);
    default: return launch_kind<KIND, 6>(p, pdl, s);
  }
}

}  // namespace

// Units of k for one weight: enough warp tasks for a small weight (about 2048: 16 warps on each
// of 132 SMs), each unit at least 256 k and a whole number of stages. Depends on the weight
// (format, rows, k) alone.
int units_for(Kind kind, int64_t n, int64_t k) {
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const int64_t stage_k = kind == Kind::kBf16F32 ? 64 : 128;
  int u = 1;
  while (u < kMaxUnits && tiles * u < 2048 && (k / stage_k) % (2 * u) == 0 && k / (2 * u) >= 256) u *= 2;
  return u;
}

// Ring depth: as deep as half an SM's shared memory allows (6 stages = 12 KB per warp in flight,
// 96 KB per CTA; 4 with the larger reduction buffers of 3 and 6 m tiles), at least 2.
size_t plan_smem(int mt, const DecodeLaunchLimits& lim, int* ring_out) {
  const int64_t red = static_cast<int64_t>(kWarps - 1) * mt * kNT * 4 * 32 * 4;
  int ring = static_cast<int>((lim.smem_half - red) / (kWarps * kStageBytes));
  ring = std::clamp(ring, kMinRing, mt <= 2 ? kMaxRing : 4);
  while (ring > kMinRing && kWarps * ring * kStageBytes + red > lim.smem_per_block) --ring;
  *ring_out = ring;
  return static_cast<size_t>(kWarps * ring * kStageBytes + red);
}

Plan plan(const DecodeGemmArgs& a) {
  Plan p;
  p.kind = kind_of(a);
  validate_args(a, p.kind);
  KernelArgs& ka = p.ka;
  ka.x_codes = a.x_codes;
  ka.x_scales = a.x_scales;
  ka.ld_scales = a.ld_scales > 0 ? a.ld_scales : a.ldx / 128;
  ka.x = a.x;
  ka.ldx = a.ldx;
  ka.m = a.m;
  ka.k = a.k;
  ka.rowb = a.k * (p.kind == Kind::kBf16F32 ? 2 : 1);
  ka.num_segments = a.num_segments;
  ka.tl = a.timeline;
  const int64_t stage_k = p.kind == Kind::kBf16F32 ? 64 : 128;
  int64_t items = 0;
  for (int i = 0; i < a.num_segments; ++i) {
    const DecodeSegment& d = a.seg[i];
    Seg& sg = ka.seg[i];
    sg.w = static_cast<const uint8_t*>(d.w.data);
    sg.scale = d.w.scale;
    sg.sld = d.w.scale_ld > 0 ? d.w.scale_ld : (a.k + 127) / 128;
    sg.y = d.y;
    sg.ldy = d.ldy > 0 ? d.ldy : d.w.n;
    sg.x_col0 = d.x_col0;
    sg.n = static_cast<int32_t>(d.w.n);
    sg.tiles = static_cast<int32_t>((d.w.n + kTileRows - 1) / kTileRows);
    sg.units = units_for(p.kind, d.w.n, a.k);
    TANDEM_CHECK(std::has_single_bit(static_cast<uint32_t>(sg.units)));
    sg.units_log2 = std::countr_zero(static_cast<uint32_t>(sg.units));
    sg.ku = a.k / sg.units;
    sg.unit_bytes = ka.rowb / sg.units;
    sg.tpi = kWarps / sg.units;
    sg.nst = static_cast<int32_t>(sg.ku / stage_k);
    sg.item0 = items;
    sg.round_bf16 = d.round_bf16;
    sg.accumulate = d.accumulate;
    items += (sg.tiles + sg.tpi - 1) / sg.tpi;
  }
  ka.chunks = (a.m + kDecodeRowsPerCall - 1) / kDecodeRowsPerCall;
  ka.total = items * ka.chunks;
  const int64_t mc = std::min<int64_t>(a.m, kDecodeRowsPerCall);
  p.mt = mc <= 16 ? 1 : mc <= 32 ? 2 : mc <= 48 ? 3 : 6;
  p.half = a.m <= 8;
  const DecodeLaunchLimits& lim = decode_launch_limits();
  p.smem = plan_smem(p.mt, lim, &ka.ring);
  TANDEM_CHECK_MSG(p.smem <= static_cast<size_t>(lim.smem_per_block), "decode_gemm: shared memory of the device");
  p.grid = std::min<int64_t>(ka.total, decode_max_ctas(lim, static_cast<int64_t>(p.smem)));
  return p;
}

}  // namespace gemv

int64_t decode_max_ctas(const DecodeLaunchLimits& lim, int64_t smem_bytes) {
  return std::clamp<int64_t>(lim.smem_per_sm / (smem_bytes + 1024), 1, 2) * lim.sms;
}

DecodeLaunchLimits decode_limits_of(int sms, int smem_per_block, int smem_per_sm) {
  DecodeLaunchLimits l;
  l.sms = sms;
  l.smem_per_block = smem_per_block;
  l.smem_per_sm = smem_per_sm;
  // Two CTAs per SM (this kernel's and the next one's): half the SM, less the 1 KB the runtime
  // reserves per CTA, and never more than one block may have.
  l.smem_half = std::min(l.smem_per_block, l.smem_per_sm / 2 - 1024);
  return l;
}

const DecodeLaunchLimits& decode_launch_limits() {
  constexpr int kMaxDevices = 64;
  static DecodeLaunchLimits cache[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  int dev = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CHECK(dev >= 0 && dev < kMaxDevices);
  if (!ready[dev].load(std::memory_order_acquire)) {
    int sms = 0, per_block = 0, per_sm = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    cache[dev] = decode_limits_of(sms, per_block, per_sm);  // identical values if two threads race here
    ready[dev].store(true, std::memory_order_release);
  }
  return cache[dev];
}

void decode_allow_smem(const void* kernel) {
  cudaFuncAttributes fa{};
  TANDEM_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  const int dynamic = decode_launch_limits().smem_per_block - static_cast<int>(fa.sharedSizeBytes);
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
}

bool decode_gemm_supports(const WeightRef& w, bool fp8_act) {
  if (!w.data || w.n <= 0 || w.n >= (int64_t{1} << 31) || (reinterpret_cast<uintptr_t>(w.data) & 15u) != 0) return false;
  if (w.format == WeightFormat::kFp8Block) return w.scale && w.k % 128 == 0;
  if (w.format == WeightFormat::kBf16) return !fp8_act && w.k % 64 == 0;
  return false;
}

int decode_gemm_units(const WeightRef& w, bool fp8_act) {
  using gemv::Kind;
  const Kind kind = fp8_act ? Kind::kFp8Codes : (w.format == WeightFormat::kBf16 ? Kind::kBf16F32 : Kind::kFp8F32);
  return gemv::units_for(kind, w.n, w.k);
}

int decode_gemm_k_split(const DecodeGemmArgs& a) {
  const gemv::Kind kind = gemv::kind_of(a);
  int u = 1;
  for (int i = 0; i < a.num_segments; ++i) u = std::max(u, gemv::units_for(kind, a.seg[i].w.n, a.k));
  return u;
}

void decode_gemm(const DecodeGemmArgs& a, cudaStream_t s) {
  using gemv::Kind;
  if (a.m == 0) return;
  const gemv::Plan p = gemv::plan(a);
  switch (p.kind) {
    case Kind::kFp8Codes: return gemv::launch_mt<Kind::kFp8Codes>(p, a.pdl, s);
    case Kind::kBf16F32: return gemv::launch_mt<Kind::kBf16F32>(p, a.pdl, s);
    case Kind::kFp8F32: return gemv::launch_mt<Kind::kFp8F32>(p, a.pdl, s);
  }
}

std::vector<SmemBound> decode_gemm_smem_bounds() {
  // The ring is sized from the device: at sm_120/sm_121's limits, the largest of the m-tile counts.
  const DecodeLaunchLimits lim = decode_limits_of(1, kSm12xSmemPerBlock, kSm12xSmemPerSm);
  size_t most = 0;
  int most_mt = 0, most_ring = 0;
  for (int mt : {1, 2, 3, 6}) {
    int ring = 0;
    const size_t b = gemv::plan_smem(mt, lim, &ring);
    if (b > most) most = b, most_mt = mt, most_ring = ring;
  }
  return {{"decode_gemm_kernel", static_cast<int64_t>(most),
           std::to_string(most_mt) + " m tiles, ring " + std::to_string(most_ring) +
               " (sized from the device: at sm_120/sm_121's 99 KB per block, 100 KB per SM)",
           ""}};
}

}  // namespace tandem::kernels::cuda
