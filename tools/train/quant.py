"""Quantizers for the trainer: FP8 e4m3fn, E8M0 (UE8M0) scales, FP4 e2m1, MXFP4 packing.

Two layers that must agree bit for bit:
  * a pure-Python scalar reference (no numpy/torch) that mirrors src/common/numeric.{h,cpp}
    exactly: RNE rounding on the integer mantissa, saturation, sign kept on zero, the
    reference kernels' power-of-two scale 2^ceil(log2(amax * fl32(1/qmax))) with an amax floor;
  * torch versions (vectorized) used by the QAT forward and by export.py.
make_quant_vectors.py writes quant_vectors.json from the scalar layer; test_quant.py checks the
torch layer against it (on the GPU machine) and the scalar layer against hand-worked cases.
"""
from __future__ import annotations

import math
import struct

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_AMAX_FLOOR = struct.unpack("<f", struct.pack("<f", 1e-4))[0]
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MXFP4_GROUP = 32


# ---------------------------------------------------------------------------------------------
# scalar reference (mirrors src/common/numeric.h)
# ---------------------------------------------------------------------------------------------
def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (RNE, subnormals, overflow -> inf)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def f32_to_bf16(x: float) -> int:
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 0x40) & 0xFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


def bf16_to_f32(h: int) -> float:
    return bits_f32(h << 16)


def _round_mini(u: int, mbits: int, emin: int):
    """Same algorithm as numeric.cpp round_mini: u = f32 bits with sign cleared, finite."""
    ef = u >> 23
    mant = u & 0x7FFFFF
    e = ef - 127 if ef else -126
    if ef:
        mant |= 0x800000
    te = max(e, emin)
    s = 23 - mbits + (te - e)
    if s >= 32:
        r = 0
    else:
        r = mant >> s
        rem = mant & ((1 << s) - 1)
        half = 1 << (s - 1)
        if rem > half or (rem == half and (r & 1)):
            r += 1
    if r >= (2 << mbits):
        r >>= 1
        te += 1
    return r, te


def e4m3_to_f32(b: int) -> float:
    ef = (b >> 3) & 0xF
    m = b & 7
    if (b & 0x7F) == 0x7F:
        return math.nan
    v = m * 2.0 ** -9 if ef == 0 else (8 + m) * 2.0 ** (ef - 10)
    return -v if b & 0x80 else v


def f32_to_e4m3(x: float) -> int:
    """f32 -> e4m3fn byte: RNE, saturate to +-448 (incl. inf), NaN -> 0x7f|sign, sign kept on 0."""
    u = f32_bits(x)
    sign = (u >> 24) & 0x80
    u &= 0x7FFFFFFF
    if u > 0x7F800000:
        return sign | 0x7F
    if u == 0x7F800000:
        return sign | 0x7E
    r, te = _round_mini(u, 3, -6)
    if r < 8:
        return sign | r
    ef = te + 7
    if ef > 15:
        return sign | 0x7E
    code = (ef << 3) | (r - 8)
    if code > 0x7E:
        code = 0x7E
    return sign | code


def e2m1_to_f32(nibble: int) -> float:
    v = E2M1_VALUES[nibble & 7]
    return -v if nibble & 8 else v


def f32_to_e2m1(x: float) -> int:
    """f32 -> e2m1 nibble: RNE (ties to even code), saturate to +-6, NaN -> 0, sign kept on 0."""
    u = f32_bits(x)
    sign = (u >> 28) & 0x8
    u &= 0x7FFFFFFF
    if u > 0x7F800000:
        return 0
    if u == 0x7F800000:
        return sign | 7
    r, te = _round_mini(u, 1, 0)
    if r < 2:
        return sign | r
    ef = te + 1
    if ef > 3:
        return sign | 7
    return sign | (ef << 1) | (r - 2)


def e8m0_to_f32(b: int) -> float:
    if b == 255:
        return math.nan
    return 2.0 ** (b - 127)


def log2_ceil_bits(x: float) -> int:
    u = f32_bits(x)
    e = ((u >> 23) & 0xFF) - 127
    return e + (1 if (u & 0x7FFFFF) else 0)


def ue8m0_scale_exponent(amax: float, qmax: float, amax_floor: float) -> int:
    """2^e with e = ceil(log2(fl32(amax * fl32(1/qmax)))), amax floored (NaN -> floor), e <= 127."""
    amax = f32(amax)
    if not (amax >= amax_floor):
        amax = f32(amax_floor)
    inv = f32(1.0 / qmax)
    e = log2_ceil_bits(f32(amax * inv))
    return min(e, 127)


def quantize_fp8_block(w, out: int, inn: int, block: int = 128):
    """W[out][in] (flat row-major list of floats) -> (e4m3 bytes [out*in], E8M0 [bo*bi])."""
    bo, bi = (out + block - 1) // block, (inn + block - 1) // block
    data = bytearray(out * inn)
    scale = bytearray(bo * bi)
    for tb in range(bo):
        for kb in range(bi):
            n0, n1 = tb * block, min(out, tb * block + block)
            k0, k1 = kb * block, min(inn, kb * block + block)
            amax = 0.0
            for n in range(n0, n1):
                for k in range(k0, k1):
                    amax = max(amax, abs(f32(w[n * inn + k])))
            e = ue8m0_scale_exponent(amax, E4M3_MAX, FP8_AMAX_FLOOR)
            s = 2.0 ** e
            scale[tb * bi + kb] = e + 127
            for n in range(n0, n1):
                for k in range(k0, k1):
                    v = f32(f32(w[n * inn + k]) / s)
                    v = min(max(v, -E4M3_MAX), E4M3_MAX)
                    data[n * inn + k] = f32_to_e4m3(v)
    return bytes(data), bytes(scale)


def quantize_mxfp4(w, out: int, inn: int):
    """W[out][in] flat -> (packed bytes [out*in/2], even k = low nibble; E8M0 [out*in/32])."""
    assert inn % MXFP4_GROUP == 0
    groups = inn // MXFP4_GROUP
    data = bytearray(out * inn // 2)
    scale = bytearray(out * groups)
    for n in range(out):
        for g in range(groups):
            ks = range(g * MXFP4_GROUP, (g + 1) * MXFP4_GROUP)
            amax = max(abs(f32(w[n * inn + k])) for k in ks)
            e = ue8m0_scale_exponent(amax, E2M1_MAX, FP4_AMAX_FLOOR)
            s = 2.0 ** e
            scale[n * groups + g] = e + 127
            for k in ks:
                v = f32(f32(w[n * inn + k]) / s)
                v = min(max(v, -E2M1_MAX), E2M1_MAX)
                nib = f32_to_e2m1(v)
                idx = (n * inn + k) >> 1
                if k & 1:
                    data[idx] = (data[idx] & 0x0F) | (nib << 4)
                else:
                    data[idx] = (data[idx] & 0xF0) | nib
    return bytes(data), bytes(scale)


def act_quant_fp8_ref(x, block: int):
    """Reference act_quant(inplace) round trip on a flat list (len % block == 0): returns floats."""
    out = []
    for b0 in range(0, len(x), block):
        blk = [f32(v) for v in x[b0:b0 + block]]
        amax = max(abs(v) for v in blk)
        s = 2.0 ** ue8m0_scale_exponent(amax, E4M3_MAX, FP8_AMAX_FLOOR)
        for v in blk:
            q = min(max(f32(v / s), -E4M3_MAX), E4M3_MAX)
            out.append(e4m3_to_f32(f32_to_e4m3(q)) * s)
    return out


def act_quant_fp4_ref(x, block: int = 32):
    out = []
    for b0 in range(0, len(x), block):
        blk = [f32(v) for v in x[b0:b0 + block]]
        amax = max(abs(v) for v in blk)
        s = 2.0 ** ue8m0_scale_exponent(amax, E2M1_MAX, FP4_AMAX_FLOOR)
        for v in blk:
            q = min(max(f32(v / s), -E2M1_MAX), E2M1_MAX)
            out.append(e2m1_to_f32(f32_to_e2m1(q)) * s)
    return out


# ---------------------------------------------------------------------------------------------
# torch versions (imported lazily so the scalar layer works without torch)
# ---------------------------------------------------------------------------------------------
def _torch():
    import torch
    return torch


def ue8m0_exponent_t(amax, qmax: float, amax_floor: float):
    """Vectorized ue8m0_scale_exponent: amax float32 tensor -> int32 exponent tensor."""
    torch = _torch()
    a = amax.float()
    a = torch.where(a >= amax_floor, a, torch.full_like(a, amax_floor))  # NaN -> floor too
    inv = torch.tensor(1.0 / qmax, dtype=torch.float32, device=a.device)  # rounds to fl32(1/qmax)
    p = (a * inv).contiguous()
    u = p.view(torch.int32)
    e = ((u >> 23) & 0xFF) - 127 + ((u & 0x7FFFFF) != 0).to(torch.int32)
    return torch.clamp(e, max=127)


def pow2_t(e):
    """2^e for an int32 tensor e in [-126, 127] as float32 (exact)."""
    torch = _torch()
    return ((e + 127).to(torch.int32) << 23).view(torch.float32)


def _e4m3_quantum_exp(a):
    """Exponent of the e4m3 grid spacing at |v| = a: 2^(max(floor(log2 a), -6) - 3)."""
    torch = _torch()
    _, e = torch.frexp(a)                   # a = m * 2^e, m in [0.5, 1)  ->  floor(log2 a) = e - 1
    return torch.clamp(e - 1, min=-6) - 3


def e4m3_round_t(v):
    """Value of clamp(v, +-448) after RNE to e4m3fn (v float32), by exact arithmetic: the grid
    spacing is a power of two, so v / spacing is exact and torch.round (half to even) is RNE.
    Sign is kept on zero. Needs no float8 dtype; equals torch's float8_e4m3fn cast."""
    torch = _torch()
    v = v.float().clamp(-E4M3_MAX, E4M3_MAX)
    qe = _e4m3_quantum_exp(v.abs())
    return torch.ldexp(torch.round(torch.ldexp(v, -qe)), qe)


def e4m3_code_t(v):
    """e4m3fn byte codes of clamp(v, +-448) (RNE, sign kept on zero) as uint8."""
    torch = _torch()
    r = e4m3_round_t(v)
    a = r.abs()
    sub = a < 2.0 ** -6
    _, e = torch.frexp(torch.where(sub, torch.ones_like(a), a))
    E = e - 1                                                      # exact exponent of a normal r
    mant = torch.ldexp(a, -E) - 1.0                                # in [0, 1), multiple of 1/8
    normal_code = ((E + 7) << 3) | torch.round(mant * 8).to(torch.int32)
    sub_code = torch.round(torch.ldexp(a, torch.full_like(E, 9))).to(torch.int32)
    code = torch.where(sub, sub_code, normal_code) | (torch.signbit(v.float()).to(torch.int32) << 7)
    return code.to(torch.uint8)


def e2m1_code_t(v):
    """Magnitude code 0..7 of e2m1 RNE (ties to even code) for |v| (saturating at 6)."""
    torch = _torch()
    a = v.abs()
    code = ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32)
            + (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32)
            + (a > 5.0).to(torch.int32))
    return code


def e2m1_round_t(v):
    torch = _torch()
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=v.device)
    mag = table[e2m1_code_t(v).long()]
    return torch.where(torch.signbit(v), -mag, mag)


def fake_quant_fp8_act(x, block: int = 128, amax_floor: float = FP8_AMAX_FLOOR):
    """act_quant(x, block, ue8m0, inplace) round trip along the last dim, straight-through grad.

    Computed in fp32 and returned in x's dtype (exact: e4m3 * 2^k fits bf16)."""
    torch = _torch()
    shape = x.shape
    xf = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    with torch.no_grad():
        amax = xf.abs().amax(-1, keepdim=True)
        s = pow2_t(ue8m0_exponent_t(amax, E4M3_MAX, amax_floor))
        q = e4m3_round_t(xf / s) * s
    y = q + (xf - xf.detach())          # forward value is exactly q; gradient passes straight through
    return y.reshape(shape).to(x.dtype)


def fake_quant_fp4_act(x, block: int = 32):
    """fp4_act_quant(x, 32, inplace) round trip along the last dim, straight-through grad."""
    torch = _torch()
    shape = x.shape
    xf = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    with torch.no_grad():
        amax = xf.abs().amax(-1, keepdim=True)
        s = pow2_t(ue8m0_exponent_t(amax, E2M1_MAX, FP4_AMAX_FLOOR))
        q = e2m1_round_t((xf / s).clamp(-E2M1_MAX, E2M1_MAX)) * s
    y = q + (xf - xf.detach())          # forward value is exactly q; gradient passes straight through
    return y.reshape(shape).to(x.dtype)


def _fp8_block_scales_t(w, block: int):
    torch = _torch()
    out, inn = w.shape
    bo, bi = (out + block - 1) // block, (inn + block - 1) // block
    wp = torch.zeros(bo * block, bi * block, dtype=torch.float32, device=w.device)
    wp[:out, :inn] = w.float()
    tiles = wp.view(bo, block, bi, block)
    amax = tiles.abs().amax(dim=(1, 3))
    e = ue8m0_exponent_t(amax, E4M3_MAX, FP8_AMAX_FLOOR)  # [bo, bi]
    s_full = pow2_t(e).repeat_interleave(block, 0).repeat_interleave(block, 1)[:out, :inn]
    return e, s_full


def fake_quant_fp8_weight(w, block: int = 128):
    """Weight round trip through the official FP8 128x128 block format, straight-through grad."""
    torch = _torch()
    with torch.no_grad():
        _, s = _fp8_block_scales_t(w, block)
        q = e4m3_round_t(w.float() / s) * s
    return q.to(w.dtype) + (w - w.detach())


def quantize_fp8_weight_t(w, block: int = 128):
    """W[out,in] -> (uint8 e4m3 codes [out,in], uint8 E8M0 scales [ceil(out/b), ceil(in/b)])."""
    torch = _torch()
    e, s = _fp8_block_scales_t(w.detach(), block)
    codes = e4m3_code_t(w.detach().float() / s)
    return codes, (e + 127).to(torch.uint8)


def _mxfp4_scales_t(w):
    torch = _torch()
    out, inn = w.shape
    g = w.float().reshape(out, inn // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(-1)
    e = ue8m0_exponent_t(amax, E2M1_MAX, FP4_AMAX_FLOOR)  # [out, in/32]
    return g, e


def fake_quant_mxfp4_weight(w):
    """Weight round trip through MXFP4 (per-32 E8M0 along in), straight-through grad.

    Works on [..., out, in] (leading expert dim allowed)."""
    torch = _torch()
    with torch.no_grad():
        shape = w.shape
        g = w.float().reshape(*shape[:-1], shape[-1] // MXFP4_GROUP, MXFP4_GROUP)
        amax = g.abs().amax(-1, keepdim=True)
        s = pow2_t(ue8m0_exponent_t(amax, E2M1_MAX, FP4_AMAX_FLOOR))
        q = (e2m1_round_t((g / s).clamp(-E2M1_MAX, E2M1_MAX)) * s).reshape(shape)
    return q.to(w.dtype) + (w - w.detach())


def quantize_mxfp4_t(w):
    """W[out,in] -> (uint8 packed [out, in/2] even k = low nibble, uint8 E8M0 [out, in/32])."""
    torch = _torch()
    out, inn = w.shape
    g, e = _mxfp4_scales_t(w.detach())
    s = pow2_t(e).unsqueeze(-1)
    v = (g / s).clamp(-E2M1_MAX, E2M1_MAX)
    code = e2m1_code_t(v) | (torch.signbit(v).to(torch.int32) << 3)
    code = code.reshape(out, inn)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed, (e + 127).to(torch.uint8)


def bf16_round_t(w):
    """Straight-through round trip through bf16 (what a BF16 tensor in the file holds)."""
    torch = _torch()
    return w.detach().to(torch.bfloat16).to(w.dtype) + (w - w.detach())
