"""Export the trained target + DSpark draft to the official DeepSeek-V4 checkpoint format.

Output directory: config.json (official keys), generation_config.json, tokenizer.json,
tokenizer_config.json, model.safetensors.index.json and shards model-0000k-of-0000n.safetensors.
Storage per tensor family (spec section 8.2):
  FP8 e4m3 + 128x128 E8M0 `.scale`: attn wq_a/wq_b/wkv/wo_a/wo_b, indexer wq_b, shared experts,
      mtp.0.main_proj
  MXFP4 (I8 packed, even index = low nibble) + per-32 E8M0 `.scale`: routed experts
  BF16: norms, embed, head, gate.weight, compressor wkv/wgate, indexer weights_proj, Markov and
      confidence heads;  F32: hc_*, attn_sink, compressor ape, gate.bias;  I64: tid2eid.
The safetensors writer is a few lines of our own so dtypes F8_E4M3 / F8_E8M0 / I8 are written
exactly as the official files name them.
"""
from __future__ import annotations

import json
import os
import struct

import torch

import quant as Q

FP8_LINEARS = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
               "attn.wo_b.weight", "attn.indexer.wq_b.weight", "ffn.shared_experts.w1.weight",
               "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight", "main_proj.weight")
F32_SUFFIXES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
                "hc_head_fn", "hc_head_base", "hc_head_scale", "attn.attn_sink", "compressor.ape",
                "gate.bias")


def _raw(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a tensor, any dtype (viewed as uint8)."""
    t = t.detach().contiguous().cpu()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).reshape(-1).numpy().tobytes()


def collect_tensors(target, draft):
    """-> list of (name, dtype_str, shape, bytes) in a fixed order (globals, layers, stages)."""
    out = []
    sd = {}
    for n, p in target.named_parameters():
        sd[n] = p
    for n, b in target.named_buffers():
        if n.endswith("tid2eid"):
            sd[n] = b
    if draft is not None:
        for n, p in draft.named_parameters():
            sd[n] = p

    def add(name, dtype, t):
        out.append((name, dtype, list(t.shape), _raw(t)))

    def emit(name, t):
        if name.endswith(".experts_w1") or name.endswith(".experts_w2") or name.endswith(".experts_w3"):
            which = name[-2:]
            prefix = name[: -len(".experts_w1")]
            for e in range(t.shape[0]):
                packed, scale = Q.quantize_mxfp4_t(t[e].float())
                add(f"{prefix}.experts.{e}.{which}.weight", "I8", packed.view(torch.int8))
                add(f"{prefix}.experts.{e}.{which}.scale", "F8_E8M0", scale)
            return
        if any(name.endswith(s) for s in FP8_LINEARS):
            codes, scale = Q.quantize_fp8_weight_t(t.float(), 128)
            add(name, "F8_E4M3", codes)
            add(name[: -len(".weight")] + ".scale", "F8_E8M0", scale)
            return
        if name.endswith("tid2eid"):
            add(name, "I64", t.to(torch.int64))
            return
        if any(name.endswith(s) for s in F32_SUFFIXES):
            add(name, "F32", t.float())
            return
        add(name, "BF16", t.to(torch.bfloat16))

    def order_key(name):
        # globals first, then layers in numeric order, then mtp stages; stable within
        parts = name.split(".")
        if parts[0] == "layers":
            return (1, int(parts[1]), name)
        if parts[0] == "mtp":
            return (2, int(parts[1]), name)
        return (0, 0, name)

    for name in sorted(sd, key=order_key):
        emit(name, sd[name].detach())
    return out


def write_safetensors(path, tensors, metadata=None):
    header = {}
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = metadata or {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, _, _, data in tensors:
            f.write(data)


def write_checkpoint(out_dir, cfg, target, draft, tokenizer_json_path, max_shard_bytes=12_000_000):
    os.makedirs(out_dir, exist_ok=True)
    tensors = collect_tensors(target, draft)
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        if cur and cur_bytes + len(t[3]) > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += len(t[3])
    if cur:
        shards.append(cur)
    n = len(shards)
    weight_map = {}
    total = 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fname), sh)
        for name, _, _, data in sh:
            weight_map[name] = fname
            total += len(data)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.to_config_json(), f, indent=2)
        f.write("\n")
    os.makedirs(os.path.join(out_dir, "inference"), exist_ok=True)
    with open(os.path.join(out_dir, "inference", "config.json"), "w") as f:
        json.dump(cfg.to_inference_json(), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                   "do_sample": True, "temperature": 1.0, "top_p": 1.0}, f, indent=2)
        f.write("\n")
    if tokenizer_json_path:
        with open(tokenizer_json_path) as src, open(os.path.join(out_dir, "tokenizer.json"), "w") as dst:
            dst.write(src.read())
        bos = {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False, "normalized": True,
               "rstrip": False, "single_word": False}
        eos = dict(bos, content="<｜end▁of▁sentence｜>")
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": False, "add_eos_token": False, "bos_token": bos,
                       "clean_up_tokenization_spaces": False, "eos_token": eos, "legacy": True,
                       "model_max_length": 1048576, "pad_token": eos, "sp_model_kwargs": {},
                       "unk_token": None, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2,
                      ensure_ascii=False)
            f.write("\n")
    return {"tensors": len(tensors), "bytes": total, "shards": n,
            "shard_bytes": [sum(len(t[3]) for t in sh) for sh in shards]}


# ---------------------------------------------------------------------------------------------
# reading back (for the round-trip self-test)
# ---------------------------------------------------------------------------------------------
_DT = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64, "I8": torch.int8,
       "F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8}


def read_checkpoint(out_dir):
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    res = {}
    for fname in sorted(set(idx["weight_map"].values())):
        with open(os.path.join(out_dir, fname), "rb") as f:
            blob = f.read()
        hl = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + hl])
        base = 8 + hl
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            t = torch.frombuffer(bytearray(blob[base + b:base + e]), dtype=_DT[info["dtype"]])
            res[name] = (info["dtype"], t.reshape(info["shape"]) if info["shape"] else t)
    return res


def e4m3_decode(codes_u8):
    c = codes_u8.long()
    ef, m = (c >> 3) & 0xF, c & 7
    mag = torch.where(ef == 0, m.float() * 2.0 ** -9, torch.ldexp((8 + m).float(), (ef - 10).to(torch.int32)))
    mag = torch.where((c & 0x7F) == 0x7F, torch.full_like(mag, float("nan")), mag)
    return torch.where((c & 0x80) != 0, -mag, mag)


def dequant_fp8(codes_u8, scale_u8, block=128):
    w = e4m3_decode(codes_u8)
    s = torch.pow(2.0, scale_u8.float() - 127)
    s = s.repeat_interleave(block, 0).repeat_interleave(block, 1)[: w.shape[0], : w.shape[1]]
    return w * s


def dequant_mxfp4(packed_i8, scale_u8):
    p = packed_i8.view(torch.uint8).long()
    lo, hi = p & 0xF, p >> 4
    codes = torch.stack([lo, hi], -1).flatten(-2)
    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    v = table[codes]
    s = torch.pow(2.0, scale_u8.float() - 127).repeat_interleave(32, -1)
    return v * s
