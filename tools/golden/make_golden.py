#!/usr/bin/env python3
"""Golden logits from the official DeepSeek-V4 reference (model.py) for Tandem's CPU forward.

Usage (on a machine with PyTorch; a GPU is used when present):
  python3 tools/golden/make_golden.py --ref DIR_WITH_model.py --ckpt TINY_DIR --name NAME \
      --preset PRESET --seed SEED --prompt-len T --decode-len M --token-seed S --out data/golden

DIR_WITH_model.py is a checkout of the official inference code (e.g. the 0731 `model.py`); it is
never committed. Its tilelang kernels are replaced by tools/golden/torch_kernels.py. TINY_DIR is a
checkpoint written by `tandem make-tiny --preset PRESET --seed SEED` (the C++ test regenerates it
from preset+seed, so checkpoints are not committed).

Writes NAME.safetensors and NAME.json into --out:
  prompt [T] I32, decode [M] I32 (random ids, fixed by --token-seed)
  logits [T+M, V] F16: row p = logits after position p (prefill rows 0..T-1 from one whole-prompt
      forward at start_pos 0, decode rows T..T+M-1 from one-token decode calls)
  draft_logits [M-1, K, V] F16, draft_confidence [M-1, K] F32, draft_tokens [M-1, K] I32:
      row i = draft step k = i+1 of `tandem logits` (docs/LOGITS.md): anchor decode[k] at position
      T+k, context = target taps of positions < T+k, greedy Markov chain (temperature 0)
  NAME.json: the token lists in the `tandem logits --tokens-file` format plus metadata and the
      reference's own prefill-vs-decode disagreement (its noise floor).
"""
import argparse
import json
import os
import random
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_kernels  # noqa: E402

DT = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
      "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8}
SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(data[base + a:base + b])
        dt = info["dtype"]
        if dt == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(raw, dtype=DT[dt]) if raw else torch.empty(0, dtype=DT[dt])
        out[name] = (dt, t.reshape(info["shape"]))
    return out


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    names = {torch.float32: "F32", torch.float16: "F16", torch.int32: "I32"}
    for name, t in tensors.items():
        t = t.contiguous().cpu()
        u8 = t.view(torch.uint8).flatten()
        try:
            b = u8.numpy().tobytes()
        except Exception:  # no numpy
            b = bytes(u8.tolist())
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)  # contiguous: readers reject gaps between tensors
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_checkpoint(ckpt_dir):
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    tensors = {}
    for shard in sorted(set(idx["weight_map"].values())):
        tensors.update(read_safetensors(os.path.join(ckpt_dir, shard)))
    return tensors


def fill_model(model, tensors, device):
    params = dict(model.named_parameters())
    done = set()
    for name, (dt, t) in tensors.items():
        if name.endswith(".scale") and name not in params:
            continue  # scale of a weight the reference keeps dequantized (wo_a): used below
        p = params.get(name)
        if p is None:
            raise SystemExit(f"checkpoint tensor {name} has no parameter in the reference model")
        t = t.to(device)
        with torch.no_grad():
            byte_params = (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2, torch.uint8)
            if p.dtype in byte_params or (dt == "I8" and p.dtype == torch.int8):
                p.data.view(torch.uint8).copy_(t.view(torch.uint8).reshape(p.shape))
            elif dt == "F8_E4M3":  # FP8 in file, bf16/fp32 in the reference (wo_a): dequantize
                s = tensors[name[:-len(".weight")] + ".scale"][1].to(device)
                w = torch_kernels._dequant_fp8_weight(t.view(torch.float8_e4m3fn), s)
                p.copy_(w.to(p.dtype))
            else:
                p.copy_(t.to(p.dtype).reshape(p.shape))
        done.add(name)
    missing = [n for n in params if n not in done]
    if missing:
        raise SystemExit(f"reference parameters not in the checkpoint: {missing[:10]}")


def full_forward(model, ids, start_pos):
    """Transformer.forward with logits for every position and the DSpark taps."""
    h = model.embed(ids)
    h = h.unsqueeze(2).repeat(1, 1, model.hc_mult, 1)
    taps = []
    layer = None
    for i, layer in enumerate(model.layers):
        h = layer(h, start_pos, ids)
        if i in model.target_layer_ids:
            taps.append(h.mean(dim=2))
    h = layer.hc_head(h, model.hc_head_fn, model.hc_head_scale, model.hc_head_base)
    logits = model.head(model.norm(h), full_logits=True)
    return logits.float(), (torch.cat(taps, dim=-1) if taps else None)


def hf_to_model_args(c):
    """HF config.json keys -> the reference's ModelArgs names (as inference/config.json has them)."""
    rs = c.get("rope_scaling") or {}
    a = {"vocab_size": c["vocab_size"], "dim": c["hidden_size"], "moe_inter_dim": c["moe_intermediate_size"],
         "n_layers": c["num_hidden_layers"], "n_hash_layers": c["num_hash_layers"],
         "n_mtp_layers": len(c["compress_ratios"]) - c["num_hidden_layers"], "n_heads": c["num_attention_heads"],
         "n_routed_experts": c["n_routed_experts"], "n_shared_experts": c["n_shared_experts"],
         "n_activated_experts": c["num_experts_per_tok"], "score_func": c["scoring_func"],
         "route_scale": c["routed_scaling_factor"], "swiglu_limit": c["swiglu_limit"], "q_lora_rank": c["q_lora_rank"],
         "head_dim": c["head_dim"], "rope_head_dim": c["qk_rope_head_dim"], "norm_eps": c["rms_norm_eps"],
         "o_groups": c["o_groups"], "o_lora_rank": c["o_lora_rank"], "window_size": c["sliding_window"],
         "original_seq_len": rs.get("original_max_position_embeddings", 0), "rope_theta": c["rope_theta"],
         "rope_factor": rs.get("factor", 1), "beta_fast": rs.get("beta_fast", 32), "beta_slow": rs.get("beta_slow", 1),
         "index_n_heads": c["index_n_heads"], "index_head_dim": c["index_head_dim"], "index_topk": c["index_topk"],
         "hc_mult": c["hc_mult"], "hc_sinkhorn_iters": c["hc_sinkhorn_iters"], "hc_eps": c["hc_eps"],
         "dtype": "fp8" if c.get("quantization_config") else "bf16", "scale_fmt": "ue8m0",
         "expert_dtype": c.get("expert_dtype"), "compress_rope_theta": c["compress_rope_theta"],
         "compress_ratios": c["compress_ratios"]}
    for k in ("dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank"):
        if k in c:
            a[k] = c[k]
    return a


def build(ref_dir, ckpt_dir, max_seq_len, device):
    torch_kernels.install()
    sys.path.insert(0, ref_dir)
    import model as ref  # the official model.py
    inf = os.path.join(ckpt_dir, "inference", "config.json")
    if os.path.exists(inf):
        with open(inf) as f:
            cfg = json.load(f)
    else:
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            cfg = hf_to_model_args(json.load(f))
    fields = set(ref.ModelArgs.__dataclass_fields__)
    cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k in fields}
    args = ref.ModelArgs(**cfg, max_batch_size=1, max_seq_len=max_seq_len, temperature=0.0)
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device(device)  # as the official generate.py does
    model = ref.Transformer(args)
    return ref, args, model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--decode-len", type=int, required=True)
    ap.add_argument("--token-seed", type=int, default=1234)
    ap.add_argument("--tokens", help='JSON {"prompt": [...], "decode": [...]} instead of random ids')
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    T, M = a.prompt_len, a.decode_len
    tensors = load_checkpoint(a.ckpt)
    with open(os.path.join(a.ckpt, "config.json")) as f:
        hf = json.load(f)
    V = hf["vocab_size"]
    noise = hf.get("dspark_noise_token_id", -1)
    if a.tokens:
        with open(a.tokens) as f:
            tk = json.load(f)
        prompt, decode = tk["prompt"], tk["decode"]
        T, M = len(prompt), len(decode)
    else:
        rng = random.Random(a.token_seed)
        ids = []
        while len(ids) < T + M:
            t = rng.randrange(3, V)
            if t != noise:
                ids.append(t)
        prompt, decode = ids[:T], ids[T:]
    L = T + M + 16

    # ---- main pass: whole-prompt prefill, then one-token decode; DSpark drafts ----
    ref, args, model = build(a.ref, a.ckpt, L, device)
    fill_model(model, tensors, device)
    has_draft = len(model.mtp) > 0
    rows, dl, dc, dtok = [], [], [], []
    with torch.inference_mode():
        x = torch.tensor([prompt], device=device)
        lg, taps = full_forward(model, x, 0)
        rows.append(lg[0])
        if has_draft:
            model.forward_spec(torch.tensor([decode[0]], device=device), taps, 0)
        for k in range(M):
            lg, taps = full_forward(model, torch.tensor([[decode[k]]], device=device), T + k)
            rows.append(lg[0])
            if has_draft and k + 1 < M:
                out_ids, logits, conf = model.forward_spec(torch.tensor([decode[k + 1]], device=device), taps, T + k)
                dl.append(logits[0].float())
                dc.append(conf[0].float())
                dtok.append(out_ids[0, 1:].int())
    logits = torch.cat(rows, 0)

    # ---- the reference against itself: every position through the one-token decode path ----
    ref, args, model2 = build(a.ref, a.ckpt, L, device)
    fill_model(model2, tensors, device)
    rows2 = []
    with torch.inference_mode():
        for p, t in enumerate(prompt + decode):
            lg, _ = full_forward(model2, torch.tensor([[t]], device=device), p)
            rows2.append(lg[0])
    logits2 = torch.cat(rows2, 0)
    diff = (logits - logits2).abs()
    scale = logits.abs().amax(-1, keepdim=True)
    self_stats = {
        "max_abs": float(diff.max()),
        "max_rel_to_row_max": float((diff / scale).max()),
        "top1_agreement": float((logits.argmax(-1) == logits2.argmax(-1)).float().mean()),
        "rows_bit_identical_prefix": int(next((i for i in range(logits.size(0))
                                               if not torch.equal(logits[i], logits2[i])), logits.size(0))),
    }

    os.makedirs(a.out, exist_ok=True)
    out = {"prompt": torch.tensor(prompt, dtype=torch.int32), "decode": torch.tensor(decode, dtype=torch.int32),
           "logits": logits.to(torch.float16)}
    if dl:
        out["draft_logits"] = torch.stack(dl).to(torch.float16)
        out["draft_confidence"] = torch.stack(dc)
        out["draft_tokens"] = torch.stack(dtok)
    meta = {"preset": a.preset, "seed": str(a.seed), "reference": "official model.py + tools/golden/torch_kernels.py"}
    write_safetensors(os.path.join(a.out, a.name + ".safetensors"), out, meta)
    info = {"preset": a.preset, "seed": a.seed, "prompt": prompt, "decode": decode, "vocab_size": V,
            "torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "reference_self_consistency": self_stats}
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(info, f, indent=1)
    print(a.name, json.dumps(self_stats))


if __name__ == "__main__":
    main()
