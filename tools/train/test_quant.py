#!/usr/bin/env python3
"""Tests for tools/train/quant.py. Run: python3 tools/train/test_quant.py  (torch optional:
the torch cases are skipped without it; train.py --only-selftest runs them on the GPU machine).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import quant as Q  # noqa: E402

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


class ScalarTest(unittest.TestCase):
    def test_e4m3_hand_cases(self):
        cases = [(0.0, 0x00), (-0.0, 0x80)] + list({1.0: 0x38, -1.0: 0xB8, 448.0: 0x7E, 464.0: 0x7E, 1e9: 0x7E,
                 -math.inf: 0xFE, 2.0 ** -9: 0x01, 2.0 ** -10: 0x00, 3 * 2.0 ** -10: 0x02,
                 2.0 ** -6: 0x08, 1.0625: 0x38, 1.1875: 0x3A, 17.0: 0x58, 19.0: 0x5A, 240.0: 0x77}.items())
        for x, code in cases:
            self.assertEqual(Q.f32_to_e4m3(x), code, f"{x} -> {Q.f32_to_e4m3(x):#x}, want {code:#x}")
            if not math.isinf(x) and abs(x) <= 448:
                self.assertTrue(abs(Q.e4m3_to_f32(code) - x) <= abs(x) / 16 + 2.0 ** -10)
        self.assertEqual(Q.f32_to_e4m3(math.nan) & 0x7F, 0x7F)

    def test_e4m3_decode_all_codes_roundtrip(self):
        for b in range(256):
            if (b & 0x7F) == 0x7F:
                continue
            self.assertEqual(Q.f32_to_e4m3(Q.e4m3_to_f32(b)), b)

    def test_e2m1_ties_to_even(self):
        want = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6, 6.0: 7, 7.0: 7, -0.1: 8, -5.0: 14,
                0.2500001: 1, 2.5000002: 5}
        for x, code in want.items():
            self.assertEqual(Q.f32_to_e2m1(x), code, x)
        for c in range(16):
            self.assertEqual(Q.f32_to_e2m1(Q.e2m1_to_f32(c)), c)

    def test_scale_rule(self):
        # 2^ceil(log2(amax * fl32(1/qmax))) with floors
        self.assertEqual(Q.ue8m0_scale_exponent(448.0, 448.0, Q.FP8_AMAX_FLOOR), 0)
        self.assertEqual(Q.ue8m0_scale_exponent(449.0, 448.0, Q.FP8_AMAX_FLOOR), 1)
        self.assertEqual(Q.ue8m0_scale_exponent(0.0, 448.0, Q.FP8_AMAX_FLOOR), -22)
        self.assertEqual(Q.ue8m0_scale_exponent(6.0, 6.0, Q.FP4_AMAX_FLOOR), 0)
        self.assertEqual(Q.ue8m0_scale_exponent(0.0, 6.0, Q.FP4_AMAX_FLOOR), -126)
        self.assertEqual(Q.ue8m0_scale_exponent(math.inf, 448.0, Q.FP8_AMAX_FLOOR), 127)

    def test_mxfp4_nibble_order(self):
        w = [0.0] * 32
        w[0], w[1] = 6.0, -0.5          # scale 1: codes 7 (low nibble) and 9 (high nibble)
        data, scale = Q.quantize_mxfp4(w, 1, 32)
        self.assertEqual(scale[0], 127)
        self.assertEqual(data[0], 0x97)

    def test_fp8_block_scale_layout(self):
        out, inn = 130, 3
        w = [0.0] * (out * inn)
        w[129 * inn + 2] = 896.0          # second row-block: amax 896 -> exponent 1
        w[0] = 1.0
        data, scale = Q.quantize_fp8_block(w, out, inn, 128)
        self.assertEqual(len(scale), 2)
        self.assertEqual(scale[1], 128)
        self.assertEqual(data[129 * inn + 2], 0x7E)

    def test_vectors_file_is_current(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "v.json")
            subprocess.run([sys.executable, os.path.join(HERE, "make_quant_vectors.py"), "--out", p], check=True,
                           capture_output=True)
            with open(p) as f, open(os.path.join(HERE, "quant_vectors.json")) as g:
                self.assertEqual(json.load(f), json.load(g))


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class TorchTest(unittest.TestCase):
    def setUp(self):
        with open(os.path.join(HERE, "quant_vectors.json")) as f:
            self.V = json.load(f)

    @staticmethod
    def f(bits_list):
        import torch
        return torch.tensor([b - (1 << 32) if b >= (1 << 31) else b for b in bits_list],
                            dtype=torch.int32).view(torch.float32)

    def test_e4m3_codes(self):
        cases = [c for c in self.V["f32_to_e4m3"] if math.isfinite(Q.bits_f32(c["in"]))]
        got = Q.e4m3_code_t(self.f([c["in"] for c in cases])).tolist()
        self.assertEqual(got, [c["out"] for c in cases])

    def test_weight_quantizers(self):
        import torch
        c = self.V["quantize_fp8_block"]
        d, s = Q.quantize_fp8_weight_t(self.f(c["w"]).view(c["out"], c["in"]), c["block"])
        self.assertEqual(bytes(d.flatten().tolist()).hex(), c["data"])
        self.assertEqual(bytes(s.flatten().tolist()).hex(), c["scale"])
        c = self.V["quantize_mxfp4"]
        d, s = Q.quantize_mxfp4_t(self.f(c["w"]).view(c["out"], c["in"]))
        self.assertEqual(bytes(d.flatten().tolist()).hex(), c["data"])
        self.assertEqual(bytes(s.flatten().tolist()).hex(), c["scale"])
        del torch

    def test_act_roundtrips(self):
        for c in self.V["act_quant_roundtrip"]:
            x = self.f(c["x"]).view(1, -1)
            y = Q.fake_quant_fp8_act(x, c["block"]) if c["kind"] == "fp8" else Q.fake_quant_fp4_act(x, c["block"])
            # values, not bits: the straight-through form q + (x - x) turns -0.0 into +0.0
            self.assertEqual(y.view(-1).tolist(), self.f(c["y"]).tolist(), c["kind"])

    def test_straight_through(self):
        import torch
        w = torch.randn(128, 256, requires_grad=True)
        Q.fake_quant_fp8_weight(w).sum().backward()
        self.assertTrue(torch.equal(w.grad, torch.ones_like(w)))


if __name__ == "__main__":
    unittest.main(verbosity=1)
