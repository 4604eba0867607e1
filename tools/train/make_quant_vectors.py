#!/usr/bin/env python3
"""Writes tools/train/quant_vectors.json: byte-exact test vectors for the quantizers.

Produced by the pure-Python scalar layer of quant.py (no torch/numpy needed); a C++ test reads the
same file and checks src/common/numeric.h against it, test_quant.py checks the torch layer.
All floats are stored as float32 bit patterns (unsigned ints) so nothing is lost in JSON.
Byte arrays are lowercase hex strings. Deterministic: same file every run.

Usage: python3 tools/train/make_quant_vectors.py [--out tools/train/quant_vectors.json]
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant as Q  # noqa: E402


class Lcg:
    """Tiny deterministic PRNG (64-bit LCG, top bits) so the vectors need no numpy."""

    def __init__(self, seed: int):
        self.s = (seed * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)

    def next_u32(self) -> int:
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        return self.s >> 32

    def uniform(self) -> float:
        return self.next_u32() / 2**32

    def normal(self) -> float:
        u1 = max(self.uniform(), 1e-12)
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2)


def bits(x: float) -> int:
    return Q.f32_bits(Q.f32(x))


def scalar_cases():
    sub = 2.0 ** -9  # smallest e4m3 subnormal
    e4m3_inputs = [
        0.0, -0.0, sub, -sub, sub / 2, sub * 0.5000001, sub * 1.5, sub * 2.5, sub * 3.5, 2.0 ** -6,
        2.0 ** -6 * 1.0625, 2.0 ** -6 * 1.1875, 1.0, 1.0625, 1.125, 1.1875, 1.0625 + 2**-20, -1.0625,
        3.0, 3.14159265, 17.0, 18.0, 19.0, 240.0, 248.0, 256.0, 416.0, 432.0, 440.0, 447.0, 448.0,
        449.0, 464.0, 479.0, 480.0, 1e6, -1e6, 1e-12, -1e-12, math.inf, -math.inf, math.nan,
        1e-45, 2.0 ** -10, 2.0 ** -10 * 3, 0.0703125, 0.01953125, 7.5, 15.5, 0.3,
    ]
    rng = Lcg(1)
    for _ in range(64):
        e4m3_inputs.append(rng.normal() * 2.0 ** int(rng.uniform() * 24 - 12))
    e4m3 = [{"in": bits(x), "out": Q.f32_to_e4m3(Q.f32(x))} for x in e4m3_inputs]

    e2m1_inputs = [0.0, -0.0, 0.1, -0.1, 0.25, 0.2500001, 0.5, 0.75, 0.7499999, 1.0, 1.25, 1.2500001,
                   1.5, 1.75, 2.0, 2.5, 2.5000002, 3.0, 3.5, 3.4999998, 4.0, 5.0, 5.0000005, 6.0,
                   6.5, 7.0, 100.0, -100.0, -2.5, -3.5, -5.0, -0.25, -0.75, math.inf, -math.inf,
                   1e-30, -1e-30]
    for _ in range(32):
        e2m1_inputs.append(rng.normal() * 3)
    e2m1 = [{"in": bits(x), "out": Q.f32_to_e2m1(Q.f32(x))} for x in e2m1_inputs]

    bf16_inputs = [0.0, -0.0, 1.0, 1.00390625, 1.005859375, 1.0078125, 3.14159265, -2.7182818,
                   1e-40, 3.4e38, 3.3961775e38, math.inf, -math.inf, 65504.0, 1.001953125]
    for _ in range(32):
        bf16_inputs.append(rng.normal() * 10)
    bf16 = [{"in": bits(x), "out": Q.f32_to_bf16(Q.f32(x))} for x in bf16_inputs]

    scale_cases = []
    for amax in [0.0, 1e-30, 1e-5, 1e-4, 1.0, 448.0, 896.0, 448.0 * 2**-10, 447.9, 448.1, 6.0, 12.0,
                 5.9999, 6.0001, 3.0, 0.75, 1e30, math.inf, Q.FP4_AMAX_FLOOR, 2.0 ** -125, 0.123]:
        scale_cases.append({"amax": bits(amax), "qmax": 448.0, "floor": bits(Q.FP8_AMAX_FLOOR),
                            "exponent": Q.ue8m0_scale_exponent(amax, Q.E4M3_MAX, Q.FP8_AMAX_FLOOR)})
        scale_cases.append({"amax": bits(amax), "qmax": 6.0, "floor": bits(Q.FP4_AMAX_FLOOR),
                            "exponent": Q.ue8m0_scale_exponent(amax, Q.E2M1_MAX, Q.FP4_AMAX_FLOOR)})
    return e4m3, e2m1, bf16, scale_cases


def weight_cases():
    rng = Lcg(2)
    # FP8 block weight with ragged edge tiles; the bottom-right tile is all zero (floor scale).
    out, inn = 136, 144
    w = []
    for n in range(out):
        for k in range(inn):
            if n >= 128 and k >= 128:
                w.append(0.0)
            elif n < 128 and k < 128:
                w.append(Q.f32(rng.normal() * 0.02))
            else:
                w.append(Q.f32(rng.normal() * 3.0))
    w[5 * inn + 7] = 448.0 * 2.0 ** -4  # exact multiple of qmax in one tile: scale edge case
    data, scale = Q.quantize_fp8_block(w, out, inn, 128)
    fp8 = {"out": out, "in": inn, "block": 128, "w": [bits(x) for x in w],
           "data": data.hex(), "scale": scale.hex()}

    # MXFP4: 3 rows x 96; row 1 holds ties and saturations, row 2 has an all-zero group.
    out4, in4 = 3, 96
    w4 = []
    for n in range(out4):
        for k in range(in4):
            if n == 1:
                w4.append([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -5.0, -6.0,
                           -0.0, 0.1, 3.0, 4.0][k % 16] * (2.0 if k >= 32 else 1.0))
            elif n == 2 and k < 32:
                w4.append(0.0)
            else:
                w4.append(Q.f32(rng.normal() * 0.05))
    d4, s4 = Q.quantize_mxfp4(w4, out4, in4)
    mx = {"out": out4, "in": in4, "w": [bits(x) for x in w4], "data": d4.hex(), "scale": s4.hex()}
    return fp8, mx


def act_cases():
    rng = Lcg(3)
    cases = []
    for kind, block, n in [("fp8", 128, 256), ("fp8", 64, 192), ("fp4", 32, 128)]:
        x = [Q.f32(rng.normal() * (10.0 if i < block else 0.01)) for i in range(n)]
        if kind == "fp8":
            y = Q.act_quant_fp8_ref(x, block)
        else:
            y = Q.act_quant_fp4_ref(x, block)
        cases.append({"kind": kind, "block": block, "x": [bits(v) for v in x], "y": [bits(v) for v in y]})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_vectors.json"))
    args = ap.parse_args()
    e4m3, e2m1, bf16, scales = scalar_cases()
    fp8, mx = weight_cases()
    doc = {
        "about": "Byte-exact quantizer vectors from tools/train/quant.py (mirrors src/common/numeric.h). "
                 "Floats are float32 bit patterns; byte arrays are hex.",
        "f32_to_e4m3": e4m3,
        "f32_to_e2m1": e2m1,
        "f32_to_bf16": bf16,
        "ue8m0_scale_exponent": scales,
        "quantize_fp8_block": fp8,
        "quantize_mxfp4": mx,
        "act_quant_roundtrip": act_cases(),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
