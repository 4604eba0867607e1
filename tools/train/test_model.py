#!/usr/bin/env python3
"""Tests for the training model and the exporter (CPU, seconds; skipped without torch).

Run: python3 tools/train/test_model.py
  * causality: target logits at positions < s do not depend on tokens >= s (window, CSA with the
    indexer's top-k, HCA, compressor overlap), and a DSpark block's hidden states do not depend on
    tokens after its anchor;
  * export round trip: the written shards, dequantized, reproduce the QAT forward exactly;
  * the exported tensor set passes `tandem check` when a built binary is around (TANDEM_BIN or
    build*/tandem).
"""
import glob
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
    import model as M
    import export as X
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def micro_cfg():
    return M.Cfg(vocab_size=8192, hidden_size=128, num_hidden_layers=3, num_attention_heads=2, head_dim=128,
                 q_lora_rank=128, o_lora_rank=128, o_groups=2, compress_ratios=[0, 4, 128, 0, 0, 0],
                 index_n_heads=2, index_topk=4, n_routed_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=128, num_hash_layers=1, dspark_target_layer_ids=[0, 1, 2],
                 dspark_markov_rank=32, dspark_noise_token_id=8191)   # vocab of data/builtin's tokenizer


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.cfg = micro_cfg()
        cls.T = 256
        cls.target = M.Target(cls.cfg, 0, cls.T + 8).eval()
        cls.draft = M.Draft(cls.cfg, 0).eval()
        g = torch.Generator().manual_seed(1)
        cls.ids = torch.randint(0, 8191, (1, cls.T), generator=g)

    def test_target_is_causal(self):
        s = 200      # > 128: HCA entry 0 and many CSA entries are visible before s
        ids2 = self.ids.clone()
        ids2[0, s:] = (ids2[0, s:] + 7) % 8191
        with torch.no_grad():
            a, _, ha = self.target(self.ids, want_hidden=True)
            b, _, hb = self.target(ids2, want_hidden=True)
        self.assertTrue(torch.allclose(a[0, :s], b[0, :s], atol=1e-5, rtol=0))
        self.assertTrue(torch.equal(ha[0, :s], hb[0, :s]))
        self.assertFalse(torch.allclose(a[0, s:], b[0, s:]))

    def test_draft_block_sees_only_past_context(self):
        P = 150
        anchors = torch.tensor([[P]])
        ids2 = self.ids.clone()
        ids2[0, P + 1:] = (ids2[0, P + 1:] + 11) % 8191
        with torch.no_grad():
            _, _, ha = self.target(self.ids, want_hidden=True)
            _, _, hb = self.target(ids2, want_hidden=True)
            ya = self.draft(self.target, ha, self.ids, anchors)[3]
            yb = self.draft(self.target, hb, ids2, anchors)[3]
            ids3 = self.ids.clone()
            ids3[0, P - 3] = (ids3[0, P - 3] + 5) % 8191          # inside the context window: must matter
            _, _, hc = self.target(ids3, want_hidden=True)
            yc = self.draft(self.target, hc, ids3, anchors)[3]
        self.assertTrue(torch.equal(ya, yb))
        self.assertFalse(torch.equal(ya, yc))

    def test_export_round_trip_is_exact(self):
        import train as TR
        with tempfile.TemporaryDirectory() as d:
            tok = os.path.join(HERE, "..", "..", "data", "builtin", "tokenizer.json")   # any valid tokenizer.json
            info = X.write_checkpoint(d, self.cfg, self.target, self.draft, tok if os.path.exists(tok) else None,
                                      max_shard_bytes=400_000)
            self.assertGreater(info["shards"], 1)
            t2 = M.Target(self.cfg, 5, self.T + 8).eval()
            d2 = M.Draft(self.cfg, 5).eval()
            n, unused = TR.load_exported_into(t2, d2, d)
            self.assertEqual(unused, [])
            self.assertEqual(n, info["tensors"])
            with torch.no_grad():
                a, _, ha = self.target(self.ids, want_hidden=True)
                b, _, hb = t2(self.ids, want_hidden=True)
                self.assertTrue(torch.equal(a, b))
                anchors = torch.tensor([[10, 100, 200]])
                x = self.draft(self.target, ha, self.ids, anchors)
                y = d2(t2, hb, self.ids, anchors)
                self.assertTrue(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]))
            tensors = X.read_checkpoint(d)
            self.assertEqual(tensors["layers.0.ffn.gate.tid2eid"][0], "I64")
            self.assertEqual(tensors["layers.1.ffn.experts.3.w2.weight"][0], "I8")
            self.assertEqual(list(tensors["layers.1.ffn.experts.3.w2.scale"][1].shape), [128, 128 // 32])
            self.assertEqual(tensors["mtp.0.main_proj.scale"][0], "F8_E8M0")
            self.assertEqual(tensors["mtp.2.hc_head_fn"][0], "F32")
            bins = [os.environ.get("TANDEM_BIN", "")] + sorted(glob.glob(os.path.join(HERE, "..", "..", "build*", "tandem")))
            bins = [b for b in bins if b and os.access(b, os.X_OK)]
            if bins:
                r = subprocess.run([bins[0], "check", d], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=1)
