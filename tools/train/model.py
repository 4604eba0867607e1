"""DeepSeek-V4 (0731 layout) at small widths, for training: target model + DSpark draft.

Written from the spec (/work/shared/spec/dsv4-architecture.md, dspark.md) and the official
reference's numerics. It is the *prefill* (whole sequence, start_pos 0) path of the reference,
vectorized for training, with the reference's quantization-aware simulations:
  * every FP8/FP4-weight linear quantizes its activation to FP8 e4m3 per 128 along K (UE8M0 scale)
    and uses the weight after a round trip through the file format (FP8 128x128 / MXFP4 per 32);
  * KV (window, compressed, DSpark context and block KV) gets the FP8 round trip on the non-rope
    dims (block 64); indexer q/k get Hadamard + FP4 round trip (block 32);
  * BF16 tensors in the file are used after a bf16 round trip; F32 ones as they are.
All quantizer round trips pass gradients straight through. Parameter names equal the official
tensor names (no `model.` prefix) except the routed experts, which are stacked per layer as
ffn.experts_w{1,2,3} [E, out, in] and split into ffn.experts.{e}.w{1,2,3} by export.py.

Training-only extras (not in the file): the gate bias is updated aux-loss-free from the routed
load; the indexer learns from a KL loss against the main attention's mass on compressed entries
(its inputs are detached, as in DeepSeek's DSA recipe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, asdict
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import quant as Q


# ---------------------------------------------------------------------------------------------
# config (official config.json key names)
# ---------------------------------------------------------------------------------------------
@dataclass
class Cfg:
    vocab_size: int = 8192
    hidden_size: int = 384
    num_hidden_layers: int = 8
    num_attention_heads: int = 6
    head_dim: int = 128
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 256
    o_lora_rank: int = 128
    o_groups: int = 3
    sliding_window: int = 128
    compress_ratios: List[int] = field(default_factory=lambda: [0, 0, 4, 128, 4, 128, 4, 128, 0, 0, 0])
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    rope_original_max_position: int = 65536
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    index_n_heads: int = 4
    index_head_dim: int = 128
    index_topk: int = 32
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 256
    num_hash_layers: int = 2
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 0
    eos_token_id: int = 1
    # DSpark
    num_draft_stages: int = 3
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 0
    dspark_target_layer_ids: List[int] = field(default_factory=lambda: [5, 6, 7])
    dspark_markov_rank: int = 64

    def check(self):
        D = self.hidden_size
        assert len(self.compress_ratios) == self.num_hidden_layers + self.num_draft_stages
        assert all(r == 0 for r in self.compress_ratios[self.num_hidden_layers:])
        # GEMM K dims of FP8/FP4 linears must be multiples of 128 (activation blocks)
        for k in [D, self.q_lora_rank, self.o_groups * self.o_lora_rank, self.moe_intermediate_size,
                  D * len(self.dspark_target_layer_ids)]:
            assert k % 128 == 0, k
        assert (self.num_attention_heads * self.head_dim // self.o_groups) % 128 == 0
        assert self.num_attention_heads % self.o_groups == 0
        assert (self.head_dim - self.qk_rope_head_dim) % 64 == 0
        assert self.index_head_dim & (self.index_head_dim - 1) == 0 and self.index_head_dim % 32 == 0

    @classmethod
    def from_config_json(cls, j: dict) -> "Cfg":
        """Inverse of to_config_json (official config.json -> Cfg)."""
        rs = j.get("rope_scaling") or {}
        n_stages = len(j["compress_ratios"]) - j["num_hidden_layers"]
        keep = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in j.items() if k in keep}
        kw.update(rope_factor=rs.get("factor", 16.0), rope_original_max_position=rs.get("original_max_position_embeddings", 65536),
                  rope_beta_fast=rs.get("beta_fast", 32.0), rope_beta_slow=rs.get("beta_slow", 1.0),
                  num_draft_stages=n_stages)
        return cls(**kw)

    def to_inference_json(self) -> dict:
        """inference/config.json: the reference ModelArgs names (what the official model.py reads)."""
        return {
            "vocab_size": self.vocab_size, "dim": self.hidden_size, "moe_inter_dim": self.moe_intermediate_size,
            "n_layers": self.num_hidden_layers, "n_hash_layers": self.num_hash_layers,
            "n_mtp_layers": self.num_draft_stages, "n_heads": self.num_attention_heads,
            "n_routed_experts": self.n_routed_experts, "n_shared_experts": 1,
            "n_activated_experts": self.num_experts_per_tok, "score_func": "sqrtsoftplus",
            "route_scale": self.routed_scaling_factor, "swiglu_limit": self.swiglu_limit,
            "q_lora_rank": self.q_lora_rank, "head_dim": self.head_dim, "rope_head_dim": self.qk_rope_head_dim,
            "norm_eps": self.rms_norm_eps, "o_groups": self.o_groups, "o_lora_rank": self.o_lora_rank,
            "window_size": self.sliding_window, "original_seq_len": self.rope_original_max_position,
            "rope_theta": int(self.rope_theta), "rope_factor": int(self.rope_factor),
            "beta_fast": int(self.rope_beta_fast), "beta_slow": int(self.rope_beta_slow),
            "index_n_heads": self.index_n_heads, "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk, "hc_mult": self.hc_mult, "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps, "dtype": "fp8", "scale_fmt": "ue8m0", "expert_dtype": "fp4",
            "compress_rope_theta": int(self.compress_rope_theta), "compress_ratios": list(self.compress_ratios),
            "dspark_block_size": self.dspark_block_size, "dspark_noise_token_id": self.dspark_noise_token_id,
            "dspark_target_layer_ids": list(self.dspark_target_layer_ids),
            "dspark_markov_rank": self.dspark_markov_rank,
        }

    def to_config_json(self) -> dict:
        """config.json with the official key layout (0731 style)."""
        return {
            "architectures": ["DeepseekV4ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "hc_eps": self.hc_eps,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "index_head_dim": self.index_head_dim,
            "index_n_heads": self.index_n_heads,
            "index_topk": self.index_topk,
            "initializer_range": 0.02,
            "max_position_embeddings": 1048576,
            "model_type": "deepseek_v4",
            "moe_intermediate_size": self.moe_intermediate_size,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_hash_layers": self.num_hash_layers,
            "num_key_value_heads": 1,
            "num_nextn_predict_layers": 1,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": {"beta_fast": int(self.rope_beta_fast), "beta_slow": int(self.rope_beta_slow),
                             "factor": int(self.rope_factor),
                             "original_max_position_embeddings": self.rope_original_max_position,
                             "type": "yarn"},
            "rope_theta": int(self.rope_theta),
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sqrtsoftplus",
            "sliding_window": self.sliding_window,
            "swiglu_limit": self.swiglu_limit,
            "tie_word_embeddings": False,
            "topk_method": "noaux_tc",
            "torch_dtype": "bfloat16",
            "transformers_version": "4.57.1",
            "use_cache": True,
            "vocab_size": self.vocab_size,
            "compress_rope_theta": int(self.compress_rope_theta),
            "compress_ratios": list(self.compress_ratios),
            "expert_dtype": "fp4",
            "dspark_block_size": self.dspark_block_size,
            "dspark_noise_token_id": self.dspark_noise_token_id,
            "dspark_target_layer_ids": list(self.dspark_target_layer_ids),
            "dspark_markov_rank": self.dspark_markov_rank,
        }


# ---------------------------------------------------------------------------------------------
# numerics helpers
# ---------------------------------------------------------------------------------------------
def lin_fp8(x, w):
    """FP8 block-scaled linear: act_quant(x, 128) then GEMM with the FP8 round-tripped weight.
    bf16 output (the reference fp8_gemm writes the default dtype)."""
    xq = Q.fake_quant_fp8_act(x.to(torch.bfloat16), 128)
    wq = Q.fake_quant_fp8_weight(w, 128).to(torch.bfloat16)
    return F.linear(xq, wq)


def lin_bf16(x, w):
    return F.linear(x.to(torch.bfloat16), Q.bf16_round_t(w).to(torch.bfloat16))


def lin_f32_bf16w(x, w):
    """Reference keeps some BF16 file weights as fp32 params and computes in fp32."""
    return F.linear(x.float(), Q.bf16_round_t(w).float())


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (Q.bf16_round_t(self.weight) * xf).to(dt)


def rope_freqs(cfg: Cfg, ratio: int, max_len: int, device):
    """cos/sin [max_len, rd/2] for a layer of compress ratio `ratio` (0: base rope_theta, no YaRN;
    else compress_rope_theta + YaRN). Same formulas as the reference's precompute_freqs_cis."""
    rd = cfg.qk_rope_head_dim
    base = cfg.rope_theta if ratio == 0 else cfg.compress_rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if ratio != 0:
        orig = cfg.rope_original_max_position

        def corr_dim(rot):
            return rd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr_dim(cfg.rope_beta_fast)), 0)
        high = min(math.ceil(corr_dim(cfg.rope_beta_slow)), rd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(rd // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    t = torch.arange(max_len, dtype=torch.float32)
    ang = torch.outer(t, freqs)
    # the reference builds complex polar(1, ang) in fp32; cos/sin of the fp32 angle
    return torch.cos(ang).to(device), torch.sin(ang).to(device)


def apply_rope(x, cos, sin, inverse=False):
    """Rotate interleaved pairs of x[..., rd] (fp32 math, result in x.dtype).
    cos/sin broadcastable to x[..., rd/2]."""
    dt = x.dtype
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    if inverse:
        sin = -sin
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack([y0, y1], dim=-1).flatten(-2).to(dt)


def rope_tail(x, cos, sin, rd, inverse=False):
    return torch.cat([x[..., :-rd], apply_rope(x[..., -rd:], cos, sin, inverse)], dim=-1)


def kv_fp8_sim(kv, rd):
    """FP8 round trip (block 64, UE8M0) on the non-rope dims; rope dims untouched."""
    return torch.cat([Q.fake_quant_fp8_act(kv[..., :-rd], 64), kv[..., -rd:]], dim=-1)


_HADAMARD = {}


def hadamard(x):
    """Sylvester Hadamard over the last dim, scaled by n^-0.5 (fast_hadamard_transform)."""
    n = x.shape[-1]
    key = (n, x.device)
    if key not in _HADAMARD:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HADAMARD[key] = (h * n ** -0.5).to(x.device)
    return (x.float() @ _HADAMARD[key]).to(x.dtype)


def sink_attention(scores, sink, values_list):
    """scores: list of [B,H,Q,Sk_i] fp32 (masked with -inf), sink [H]; values_list: [B?,Sk_i,d].
    softmax over all keys plus a per-head null logit; returns [B,Q,H,d] fp32."""
    B, H, Qn = scores[0].shape[:3]
    s = torch.cat(scores + [sink.view(1, H, 1, 1).expand(B, H, Qn, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    out = 0
    off = 0
    for sc, v in zip(scores, values_list):
        n = sc.shape[-1]
        out = out + torch.einsum("bhqs,bsd->bqhd", p[..., off:off + n], v.float())
        off += n
    return out


# ---------------------------------------------------------------------------------------------
# mHC
# ---------------------------------------------------------------------------------------------
def hc_split_sinkhorn(mixes, scale, base, hc, iters, eps):
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hc_pre(h, fn, scale, base, cfg: Cfg):
    """h [.., hc, D] bf16 -> x [.., D] bf16, post [.., hc], comb [.., hc, hc] (fp32)."""
    xf = h.flatten(-2).float()
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + cfg.rms_norm_eps)
    mixes = F.linear(xf, fn) * rs
    pre, post, comb = hc_split_sinkhorn(mixes, scale, base, cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps)
    y = (pre.unsqueeze(-1) * h.float()).sum(-2)
    return y.to(torch.bfloat16), post, comb


def hc_post(f, res, post, comb):
    """h_new[k] = post[k] * f + sum_j comb[j][k] * res[j] (fp32 math, bf16 out)."""
    y = post.unsqueeze(-1) * f.float().unsqueeze(-2) + torch.einsum("...jk,...jd->...kd", comb, res.float())
    return y.to(torch.bfloat16)


def hc_head(h, fn, scale, base, cfg: Cfg):
    xf = h.flatten(-2).float()
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + cfg.rms_norm_eps)
    mixes = F.linear(xf, fn) * rs
    pre = torch.sigmoid(mixes * scale + base) + cfg.hc_eps
    return (pre.unsqueeze(-1) * h.float()).sum(-2).to(torch.bfloat16)


def init_hc_params(mod, prefix, cfg: Cfg, n_mix):
    hcD = cfg.hc_mult * cfg.hidden_size
    setattr(mod, f"{prefix}_fn", nn.Parameter(torch.randn(n_mix, hcD) * (0.02 / math.sqrt(hcD))))
    base = torch.zeros(n_mix)
    if n_mix > cfg.hc_mult:
        hc = cfg.hc_mult
        base[:hc] = math.log(1.0 / (hc - 1))          # pre ~ 1/hc each -> x ~ mean of streams
        base[hc:2 * hc] = 0.0                         # post = 1
        eye = torch.eye(hc) * 4.0                     # comb ~ identity (streams keep their residual)
        base[2 * hc:] = eye.flatten()
        setattr(mod, f"{prefix}_scale", nn.Parameter(torch.full((3,), 0.1)))
    else:
        setattr(mod, f"{prefix}_scale", nn.Parameter(torch.full((1,), 0.1)))
    setattr(mod, f"{prefix}_base", nn.Parameter(base))


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def lin_init(out, inn, std=None):
    std = std if std is not None else inn ** -0.5
    return nn.Parameter(torch.randn(out, inn) * std)


class Compressor(nn.Module):
    def __init__(self, cfg: Cfg, ratio: int, head_dim: int, rotate: bool):
        super().__init__()
        self.cfg, self.ratio, self.hd, self.rotate = cfg, ratio, head_dim, rotate
        self.overlap = ratio == 4
        c = 2 if self.overlap else 1
        self.ape = nn.Parameter(torch.zeros(ratio, c * head_dim))
        self.wkv = nn.Module()
        self.wkv.weight = lin_init(c * head_dim, cfg.hidden_size)
        self.wgate = nn.Module()
        self.wgate.weight = lin_init(c * head_dim, cfg.hidden_size, 0.02 * cfg.hidden_size ** -0.5)
        self.norm = RMSNorm(head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        """x [B,T,D] bf16 (T % ratio == 0) -> entries [B, T/ratio, hd] bf16."""
        B, T, _ = x.shape
        r, d, rd = self.ratio, self.hd, self.cfg.qk_rope_head_dim
        n = T // r
        if n == 0:
            return None
        x = x[:, :n * r]                                       # only complete blocks produce entries
        kv = lin_f32_bf16w(x, self.wkv.weight)
        sc = lin_f32_bf16w(x, self.wgate.weight)
        kv = kv.view(B, n, r, -1)
        sc = sc.view(B, n, r, -1) + self.ape
        if self.overlap:
            kv_prev = F.pad(kv[:, :-1, :, :d], (0, 0, 0, 0, 1, 0))
            sc_prev = F.pad(sc[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            kv = torch.cat([kv_prev, kv[..., d:]], dim=2)
            sc = torch.cat([sc_prev, sc[..., d:]], dim=2)
        pooled = (kv * torch.softmax(sc, dim=2)).sum(2)
        out = self.norm(pooled.to(torch.bfloat16))
        pos = torch.arange(n, device=x.device) * r
        out = rope_tail(out, cos[pos][None], sin[pos][None], rd)
        if self.rotate:
            out = Q.fake_quant_fp4_act(hadamard(out), 32)
        else:
            out = kv_fp8_sim(out, rd)
        return out


class Indexer(nn.Module):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.cfg = cfg
        nh, ihd = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = nn.Module()
        self.wq_b.weight = lin_init(nh * ihd, cfg.q_lora_rank)
        self.weights_proj = nn.Module()
        self.weights_proj.weight = lin_init(nh, cfg.hidden_size)
        self.compressor = Compressor(cfg, 4, ihd, True)

    def forward(self, x, qr, cos, sin):
        """Returns index scores [B,T,n] (fp32, invisible entries -inf)."""
        cfg = self.cfg
        B, T, _ = x.shape
        nh, ihd, rd = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        q = lin_fp8(qr, self.wq_b.weight).view(B, T, nh, ihd)
        q = rope_tail(q, cos[:T, None], sin[:T, None], rd)
        q = Q.fake_quant_fp4_act(hadamard(q), 32)
        k = self.compressor(x, cos, sin)                      # [B,n,ihd]
        if k is None:
            return None, None
        w = lin_bf16(x, self.weights_proj.weight).float() * (ihd ** -0.5 * nh ** -0.5)
        s = torch.einsum("bthd,bsd->bths", q.float(), k.float()).relu()
        score = (s * w.unsqueeze(-1)).sum(2)                   # [B,T,n]
        n = k.shape[1]
        vis = torch.arange(n, device=x.device)[None, :] < (torch.arange(1, T + 1, device=x.device) // 4)[:, None]
        return score.masked_fill(~vis, float("-inf")), vis


class Attention(nn.Module):
    def __init__(self, cfg: Cfg, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.ratio = cfg.compress_ratios[layer_id]
        D, H, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.wq_a = nn.Module(); self.wq_a.weight = lin_init(cfg.q_lora_rank, D)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = nn.Module(); self.wq_b.weight = lin_init(H * hd, cfg.q_lora_rank)
        self.wkv = nn.Module(); self.wkv.weight = lin_init(hd, D)
        self.kv_norm = RMSNorm(hd, cfg.rms_norm_eps)
        gin = H * hd // cfg.o_groups
        self.wo_a = nn.Module(); self.wo_a.weight = lin_init(cfg.o_groups * cfg.o_lora_rank, gin)
        self.wo_b = nn.Module()
        self.wo_b.weight = lin_init(D, cfg.o_groups * cfg.o_lora_rank,
                                    0.5 * (cfg.o_groups * cfg.o_lora_rank) ** -0.5 / math.sqrt(cfg.num_hidden_layers))
        if self.ratio:
            self.compressor = Compressor(cfg, self.ratio, hd, False)
            if self.ratio == 4:
                self.indexer = Indexer(cfg)

    def qkv(self, x, cos, sin):
        """Shared projections: q [..,H,hd] bf16 (normed, roped), qr latent, kv [..,hd] (roped, fp8 sim)."""
        cfg = self.cfg
        H, hd, rd = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
        qr = self.q_norm(lin_fp8(x, self.wq_a.weight))
        q = lin_fp8(qr, self.wq_b.weight).unflatten(-1, (H, hd))
        q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + cfg.rms_norm_eps)   # bf16, errata 4
        q = rope_tail(q, cos.unsqueeze(-2), sin.unsqueeze(-2), rd)
        kv = self.kv_norm(lin_fp8(x, self.wkv.weight))
        kv = kv_fp8_sim(rope_tail(kv, cos, sin, rd), rd)
        return q, qr, kv

    def out_proj(self, o, cos, sin):
        """o [..,H,hd] fp32 -> inverse rope -> grouped wo_a (bf16 dequantized copy) -> wo_b."""
        cfg = self.cfg
        rd, G = cfg.qk_rope_head_dim, cfg.o_groups
        o = rope_tail(o.to(torch.bfloat16), cos.unsqueeze(-2), sin.unsqueeze(-2), rd, inverse=True)
        o = o.flatten(-2).unflatten(-1, (G, -1))
        wo_a = Q.fake_quant_fp8_weight(self.wo_a.weight, 128).to(torch.bfloat16).view(G, cfg.o_lora_rank, -1)
        u = torch.einsum("...gd,grd->...gr", o, wo_a)
        return lin_fp8(u.flatten(-2), self.wo_b.weight)

    def forward(self, x, cos, sin, aux):
        cfg = self.cfg
        B, T, _ = x.shape
        dev = x.device
        win = cfg.sliding_window
        scale = cfg.head_dim ** -0.5
        c, s = cos[:T], sin[:T]
        q, qr, kv = self.qkv(x, c, s)
        t_idx = torch.arange(T, device=dev)
        win_mask = (t_idx[None, :] <= t_idx[:, None]) & (t_idx[None, :] > t_idx[:, None] - win)   # [T,T]
        qf = q.float()
        sc_win = torch.einsum("bthd,bsd->bhts", qf, kv.float()) * scale
        sc_win = sc_win.masked_fill(~win_mask, float("-inf"))
        scores, values = [sc_win], [kv]
        ckv = self.compressor(x, cos, sin) if self.ratio else None   # [B,n,hd]
        if ckv is not None:
            n = ckv.shape[1]
            vis = torch.arange(n, device=dev)[None, :] < ((t_idx + 1) // self.ratio)[:, None]  # [T,n]
            sc_c = torch.einsum("bthd,bsd->bhts", qf, ckv.float()) * scale
            if self.ratio == 4:
                iscore, _ = self.indexer(x.detach(), qr.detach(), cos, sin)
                k = min(cfg.index_topk, n)
                top = iscore.topk(k, dim=-1).indices                # [B,T,k]
                sel = torch.zeros(B, T, n, dtype=torch.bool, device=dev).scatter_(-1, top, True)
                sel = sel & vis[None]
                # indexer KL target: main attention mass over visible compressed entries (detached)
                with torch.no_grad():
                    tgt = torch.softmax(sc_c.masked_fill(~vis, float("-inf")), dim=-1)
                    tgt = tgt.sum(1)                                  # sum over heads [B,T,n]
                    tgt = tgt / tgt.sum(-1, keepdim=True).clamp_min(1e-9)
                if self.training and T > 4:                           # queries t >= 3 see >= 1 entry
                    logp = torch.log_softmax(iscore[:, 3:], dim=-1)
                    t_r = tgt[:, 3:]
                    kl = (t_r * (torch.log(t_r.clamp_min(1e-9)) - logp.masked_fill(t_r == 0, 0))).sum(-1)
                    aux["indexer_kl"] = aux.get("indexer_kl", 0.0) + kl.mean()
                mask_c = sel.unsqueeze(1)                              # [B,1,T,n]
            else:
                mask_c = vis[None, None]
            sc_c = sc_c.masked_fill(~mask_c, float("-inf"))
            scores.append(sc_c)
            values.append(ckv)
        o = sink_attention(scores, self.attn_sink, values)          # [B,T,H,hd]
        return self.out_proj(o, c, s)


# ---------------------------------------------------------------------------------------------
# MoE
# ---------------------------------------------------------------------------------------------
def swiglu(g, u, limit):
    u = torch.clamp(u, -limit, limit)
    g = torch.clamp(g, max=limit)
    return F.silu(g) * u


class MoE(nn.Module):
    def __init__(self, cfg: Cfg, layer_id: int, gen: torch.Generator):
        super().__init__()
        self.cfg = cfg
        D, I, E, K = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.num_experts_per_tok
        self.hash = layer_id < cfg.num_hash_layers
        self.gate = nn.Module()
        self.gate.weight = lin_init(E, D, D ** -0.5)
        if self.hash:
            # frozen token -> experts table: K distinct experts per token id
            t = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(cfg.vocab_size)])
            self.gate.register_buffer("tid2eid", t.to(torch.int64))
        else:
            self.gate.bias = nn.Parameter(torch.zeros(E), requires_grad=False)
        out_std = 0.5 * I ** -0.5 / math.sqrt(cfg.num_hidden_layers)
        self.experts_w1 = nn.Parameter(torch.randn(E, I, D) * D ** -0.5)
        self.experts_w3 = nn.Parameter(torch.randn(E, I, D) * D ** -0.5)
        self.experts_w2 = nn.Parameter(torch.randn(E, D, I) * out_std)
        self.shared_experts = nn.Module()
        for name, shape, std in [("w1", (I, D), D ** -0.5), ("w3", (I, D), D ** -0.5), ("w2", (D, I), out_std)]:
            m = nn.Module()
            m.weight = lin_init(*shape, std)
            setattr(self.shared_experts, name, m)
        self.register_buffer("load", torch.zeros(E), persistent=False)

    def forward(self, x, ids):
        cfg = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        E, K, lim = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.swiglu_limit
        logits = lin_f32_bf16w(x, self.gate.weight)
        scores = torch.sqrt(F.softplus(logits))
        if self.hash:
            idx = self.gate.tid2eid[ids.reshape(-1)]
        else:
            idx = (scores + self.gate.bias).topk(K, dim=-1).indices
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * cfg.routed_scaling_factor
        route = torch.zeros(x.shape[0], E, device=x.device, dtype=torch.float32).scatter(1, idx, w)
        if self.training:
            with torch.no_grad():
                self.load += torch.zeros(E, device=x.device).scatter_add_(
                    0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device))
        xq = Q.fake_quant_fp8_act(x.to(torch.bfloat16), 128)
        w1 = Q.fake_quant_mxfp4_weight(self.experts_w1).to(torch.bfloat16)
        w3 = Q.fake_quant_mxfp4_weight(self.experts_w3).to(torch.bfloat16)
        w2 = Q.fake_quant_mxfp4_weight(self.experts_w2).to(torch.bfloat16)
        g = torch.matmul(xq.unsqueeze(0), w1.transpose(1, 2)).float()      # [E,N,I]
        u = torch.matmul(xq.unsqueeze(0), w3.transpose(1, 2)).float()
        a = swiglu(g, u, lim) * route.t().unsqueeze(-1)
        aq = Q.fake_quant_fp8_act(a.to(torch.bfloat16), 128)
        y = torch.matmul(aq, w2.transpose(1, 2)).float().sum(0)           # [N,D] fp32
        se = self.shared_experts
        gs = lin_fp8(xq, se.w1.weight).float()
        us = lin_fp8(xq, se.w3.weight).float()
        y = y + lin_fp8(swiglu(gs, us, lim).to(torch.bfloat16), se.w2.weight).float()
        return y.to(torch.bfloat16).view(shape)

    @torch.no_grad()
    def update_bias(self, rate):
        if self.hash or self.load.sum() == 0:
            self.load.zero_()
            return
        err = self.load.mean() - self.load
        self.gate.bias += rate * torch.sign(err)
        self.load.zero_()


# ---------------------------------------------------------------------------------------------
# blocks and models
# ---------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, cfg: Cfg, layer_id: int, gen, attn_cls=Attention):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn = attn_cls(cfg, layer_id)
        self.ffn = MoE(cfg, layer_id, gen)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        mix = (2 + cfg.hc_mult) * cfg.hc_mult
        init_hc_params(self, "hc_attn", cfg, mix)
        init_hc_params(self, "hc_ffn", cfg, mix)

    def forward(self, h, ids, cos, sin, aux, attn_extra=None):
        cfg = self.cfg
        res = h
        x, post, comb = hc_pre(h, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, cfg)
        x = self.attn_norm(x)
        if attn_extra is None:
            a = self.attn(x, cos, sin, aux)
        else:
            a = self.attn(x, cos, sin, aux, **attn_extra)
        h = hc_post(a, res, post, comb)
        res = h
        x, post, comb = hc_pre(h, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, cfg)
        x = self.ffn_norm(x)
        f = self.ffn(x, ids)
        return hc_post(f, res, post, comb)


class Target(nn.Module):
    def __init__(self, cfg: Cfg, seed: int, max_len: int):
        super().__init__()
        cfg.check()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed + 17)
        D = cfg.hidden_size
        self.embed = nn.Module()
        self.embed.weight = nn.Parameter(torch.randn(cfg.vocab_size, D) * 1.0)
        self.layers = nn.ModuleList([Block(cfg, i, gen) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(D, cfg.rms_norm_eps)
        self.head = nn.Module()
        self.head.weight = nn.Parameter(torch.randn(cfg.vocab_size, D) * D ** -0.5 * 0.5)
        init_hc_params(self, "hc_head", cfg, cfg.hc_mult)
        self.max_len = max_len
        self._rope = {}

    def rope(self, ratio, device):
        key = (0 if ratio == 0 else 1, str(device))
        if key not in self._rope:
            self._rope[key] = rope_freqs(self.cfg, ratio, self.max_len, device)
        return self._rope[key]

    def embed_ids(self, ids):
        e = Q.bf16_round_t(self.embed.weight)[ids].to(torch.bfloat16)
        return e.unsqueeze(-2).expand(*e.shape[:-1], self.cfg.hc_mult, e.shape[-1]).contiguous()

    def logits(self, y, norm):
        return F.linear(norm(y).float(), Q.bf16_round_t(self.head.weight).float())

    def forward(self, ids, want_hidden=False):
        """ids [B,T] -> logits [B,T,V] fp32, aux dict, main_hidden [B,T,3D] bf16 (if asked)."""
        cfg = self.cfg
        aux = {}
        h = self.embed_ids(ids)
        taps = []
        for i, layer in enumerate(self.layers):
            cos, sin = self.rope(cfg.compress_ratios[i], ids.device)
            h = layer(h, ids, cos, sin, aux)
            if want_hidden and i in cfg.dspark_target_layer_ids:
                taps.append(h.float().mean(-2).to(torch.bfloat16))
        y = hc_head(h, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, cfg)
        logits = self.logits(y, self.norm)
        main_hidden = torch.cat(taps, -1) if want_hidden else None
        return logits, aux, main_hidden

    def moe_layers(self):
        return [l.ffn for l in self.layers]


class DSparkAttention(Attention):
    """Window-only attention of a draft stage: block queries see the last <=128 context entries
    (positions < anchor) and all block keys (non-causal inside the block)."""

    def forward(self, x, cos, sin, aux, ctx_kv=None, pos=None, anchors=None):
        # x [B,A,K,D]; ctx_kv [B,T,hd] (already roped/fp8-simmed); pos [B,A,K]; anchors [B,A]
        cfg = self.cfg
        B, A, K, _ = x.shape
        T = ctx_kv.shape[1]
        scale = cfg.head_dim ** -0.5
        c, s = cos[pos], sin[pos]                                   # [B,A,K,rd/2]
        q, _, kv = self.qkv(x, c, s)                                # q [B,A,K,H,hd], kv [B,A,K,hd]
        H = q.shape[-2]
        qf = q.float()
        sc_ctx = torch.einsum("bakhd,btd->bhakt", qf, ctx_kv.float()) * scale
        t_idx = torch.arange(T, device=x.device)
        vis = (t_idx[None, None, :] < anchors[:, :, None]) & \
              (t_idx[None, None, :] >= anchors[:, :, None] - cfg.sliding_window)        # [B,A,T]
        sc_ctx = sc_ctx.masked_fill(~vis[:, None, :, None, :], float("-inf"))
        sc_blk = torch.einsum("bakhd,bajd->bhakj", qf, kv.float()) * scale
        s_all = torch.cat([sc_ctx, sc_blk, self.attn_sink.view(1, H, 1, 1, 1).expand(B, H, A, K, 1)], -1)
        p = torch.softmax(s_all, dim=-1)
        o = torch.einsum("bhakt,btd->bakhd", p[..., :T], ctx_kv.float()) + \
            torch.einsum("bhakj,bajd->bakhd", p[..., T:T + K], kv.float())
        return self.out_proj(o, c, s)


class Draft(nn.Module):
    """The three DSpark stages (mtp.0..2) with main_proj/main_norm (stage 0) and the head extras
    (stage 2). Embedding and LM head are the target's (frozen)."""

    def __init__(self, cfg: Cfg, seed: int):
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed + 29)
        D = cfg.hidden_size
        L = cfg.num_hidden_layers
        self.mtp = nn.ModuleList([Block(cfg, L + s, gen, DSparkAttention) for s in range(cfg.num_draft_stages)])
        st0, stl = self.mtp[0], self.mtp[-1]
        nt = len(cfg.dspark_target_layer_ids)
        st0.main_proj = nn.Module(); st0.main_proj.weight = lin_init(D, nt * D)
        st0.main_norm = RMSNorm(D, cfg.rms_norm_eps)
        stl.norm = RMSNorm(D, cfg.rms_norm_eps)
        init_hc_params(stl, "hc_head", cfg, cfg.hc_mult)
        stl.markov_head = nn.Module()
        stl.markov_head.markov_w1 = nn.Module()
        stl.markov_head.markov_w1.weight = nn.Parameter(torch.randn(cfg.vocab_size, cfg.dspark_markov_rank) * 0.02)
        stl.markov_head.markov_w2 = nn.Module()
        stl.markov_head.markov_w2.weight = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.dspark_markov_rank))
        stl.confidence_head = nn.Module()
        stl.confidence_head.proj = nn.Module()
        stl.confidence_head.proj.weight = nn.Parameter(torch.zeros(1, D + cfg.dspark_markov_rank))

    def forward(self, target: Target, main_hidden, ids, anchors):
        """main_hidden [B,T,nt*D]; ids [B,T] data tokens; anchors [B,A] positions P (1 <= P <= T-1).
        Returns base-corrected logits [B,A,K,V] (fp32, Markov bias from teacher-forced prev tokens
        ids[P+k]), confidence logits [B,A,K], prev-token ids [B,A,K]."""
        cfg = self.cfg
        B, T = ids.shape
        A = anchors.shape[1]
        K = cfg.dspark_block_size
        dev = ids.device
        st0, stl = self.mtp[0], self.mtp[-1]
        main_x = st0.main_norm(lin_fp8(main_hidden, st0.main_proj.weight))        # [B,T,D]
        cos, sin = target.rope(0, dev)
        rd = cfg.qk_rope_head_dim
        offs = torch.arange(K, device=dev)
        pos = anchors.unsqueeze(-1) + offs                                          # [B,A,K]
        blk_ids = torch.full((B, A, K), cfg.dspark_noise_token_id, dtype=torch.long, device=dev)
        blk_ids[:, :, 0] = torch.gather(ids, 1, anchors)
        h = target.embed_ids(blk_ids)                                               # [B,A,K,hc,D]
        aux = {}
        for st in self.mtp:
            ctx = st.attn.kv_norm(lin_fp8(main_x, st.attn.wkv.weight))
            ctx = kv_fp8_sim(rope_tail(ctx, cos[:T], sin[:T], rd), rd)              # [B,T,hd]
            h = st(h, blk_ids, cos, sin, aux, attn_extra=dict(ctx_kv=ctx, pos=pos, anchors=anchors))
        y = hc_head(h, stl.hc_head_fn, stl.hc_head_scale, stl.hc_head_base, cfg)     # [B,A,K,D]
        base = target.logits(y, stl.norm)                                           # [B,A,K,V]
        prev_pos = (pos).clamp(max=T - 1)                                           # prev token of step k = token at P+k
        prev = torch.gather(ids, 1, prev_pos.view(B, -1)).view(B, A, K)
        e = Q.bf16_round_t(stl.markov_head.markov_w1.weight)[prev]                  # [B,A,K,r]
        logits = base + F.linear(e.float(), Q.bf16_round_t(stl.markov_head.markov_w2.weight).float())
        conf = F.linear(torch.cat([y.float(), e.float()], -1),
                        Q.bf16_round_t(stl.confidence_head.proj.weight).float()).squeeze(-1)
        return logits, conf, prev, y, e

    def moe_layers(self):
        return [st.ffn for st in self.mtp]
