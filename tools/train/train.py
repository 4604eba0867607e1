#!/usr/bin/env python3
"""Train the built-in DeepSeek-V4-architecture model and its DSpark draft, then export it.

One command does everything on one GPU (see docs/TRAINING.md):
  data -> tokenizer -> target (QAT) -> DSpark draft (distillation) -> eval -> export -> self-tests
Checkpoints (model + optimizer + data RNG) go to --work every --ckpt-every seconds and at the end of
each phase; --resume continues from them. Results (perplexity, acceptance, sizes) are written to
--work/train-results.json and the exported checkpoint to --work/checkpoint/; --out receives a
mirror for shipping: the shards plus meta.tar (config, tokenizer, index, results, log), refreshed
after every phase so an interrupted run still returns its latest state.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tarfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import quant as Q  # noqa: E402
import model as M  # noqa: E402
import data as D  # noqa: E402
import export as X  # noqa: E402

PRESETS = {
    # the shipped model: ~45M parameters (FP4 experts), checkpoint ~45 MB
    "builtin": dict(
        cfg=dict(),
        seq_len=512, batch=32, lr=2e-3, draft_lr=2e-3, warmup=100, anchors=32,
        data_bytes=50_000_000, synth_docs=60_000, vocab=8192, tok_bytes=20_000_000,
        target_seconds=330, draft_seconds=110, target_steps=0, draft_steps=0,
        eval_windows=256, gen_prompts=32, gen_prompt_len=192, gen_new=64,
    ),
    # a seconds-long end-to-end check of every code path (tiny dims, few steps)
    "smoke": dict(
        cfg=dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, head_dim=128,
                 q_lora_rank=128, o_lora_rank=128, o_groups=2, compress_ratios=[0, 4, 128, 4, 0, 0, 0],
                 index_n_heads=2, index_topk=8, n_routed_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=128, num_hash_layers=1, dspark_target_layer_ids=[1, 2, 3],
                 dspark_markov_rank=32),
        seq_len=256, batch=4, lr=2e-3, draft_lr=2e-3, warmup=5, anchors=8,
        data_bytes=3_000_000, synth_docs=2000, vocab=1024, tok_bytes=1_000_000,
        target_seconds=0, draft_seconds=0, target_steps=20, draft_steps=10,
        eval_windows=8, gen_prompts=4, gen_prompt_len=64, gen_new=8,
    ),
}


class Logger:
    def __init__(self, path):
        self.f = open(path, "a") if path else None
        self.t0 = time.time()

    def __call__(self, msg):
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def count_params(mod):
    return sum(p.numel() for p in mod.parameters())


def make_opt(params, lr):
    decay = [p for p in params if p.requires_grad and p.dim() >= 2]
    other = [p for p in params if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step, total, warmup, peak):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sample_batch(tokens, B, T, gen):
    n = tokens.numel() - (T + 1)
    starts = torch.randint(0, n, (B,), generator=gen).to(tokens.device)
    idx = starts[:, None] + torch.arange(T + 1, device=tokens.device)
    return tokens[idx].long()


def save_ckpt(path, **state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def plan_steps(fixed_steps, seconds, step_time, cap=100000):
    if fixed_steps:
        return fixed_steps
    return max(10, min(cap, int(seconds / max(step_time, 1e-3))))


# ---------------------------------------------------------------------------------------------
# target
# ---------------------------------------------------------------------------------------------
def train_target(target, tokens, P, args, log, work):
    dev = tokens.device
    ckpt_path = os.path.join(work, "target.pt")
    opt = make_opt(list(target.parameters()), P["lr"])
    gen = torch.Generator().manual_seed(args.seed + 1)
    step, total, hist = 0, None, []
    if args.resume and os.path.exists(ckpt_path):
        st = torch.load(ckpt_path, map_location=dev, weights_only=False)
        target.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, total, hist = st["step"], st["total"], st["hist"]
        log(f"target: resumed at step {step}/{total}")
        if st.get("done"):
            return hist, step, total
    B, T = P["batch"], P["seq_len"]
    if total is None and (args.target_steps or P["target_steps"]):
        total = args.target_steps or P["target_steps"]
    target.train()
    moe = target.moe_layers()
    t_last_ckpt = time.time()
    t_start = time.time()
    timing_steps = 8
    t_probe, probe_step = None, None
    while total is None or step < total:
        if total is None and t_probe is None and step >= 2:
            sync()
            t_probe, probe_step = time.time(), step
        if total is None and t_probe is not None and step == probe_step + timing_steps:
            sync()
            st_time = (time.time() - t_probe) / timing_steps
            total = plan_steps(args.target_steps or P["target_steps"], args.target_seconds
                               if args.target_seconds is not None else P["target_seconds"], st_time)
            log(f"target: {st_time * 1000:.0f} ms/step -> {total} steps")
        lr = lr_at(step, total or 10**9, P["warmup"], P["lr"])
        for g in opt.param_groups:
            g["lr"] = lr
        batch = sample_batch(tokens, B, T, gen)
        logits, aux, _ = target(batch[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        ikl = aux.get("indexer_kl", torch.zeros((), device=dev))
        loss = ce + ikl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        for m in moe:
            m.update_bias(1e-3)
        step += 1
        if step % 25 == 0 or step == 1 or step == total:
            ce_v = ce.item()
            hist.append({"step": step, "ce": ce_v, "indexer_kl": float(ikl.detach()), "lr": lr, "gnorm": float(gn),
                         "elapsed_s": time.time() - t_start})
            tps = step * B * T / (time.time() - t_start)
            log(f"target step {step}/{total} ce {ce_v:.3f} ikl {float(ikl.detach()):.3f} lr {lr:.2e} gn {float(gn):.2f} "
                f"{tps / 1e3:.0f}k tok/s")  # noqa: E501
            if not math.isfinite(ce_v):
                raise RuntimeError("target loss is not finite")
        if time.time() - t_last_ckpt > args.ckpt_every:
            save_ckpt(ckpt_path, model=target.state_dict(), opt=opt.state_dict(), gen=gen.get_state(), step=step,
                      total=total, hist=hist)
            t_last_ckpt = time.time()
    save_ckpt(ckpt_path, model=target.state_dict(), opt=opt.state_dict(), gen=gen.get_state(), step=step,
              total=total, hist=hist, done=True)
    return hist, step, total


@torch.no_grad()
def eval_ppl(target, tokens, T, max_windows, B=16):
    target.eval()
    n = min(max_windows, (tokens.numel() - 1) // T)
    if n == 0:
        return None
    tot, cnt = 0.0, 0
    for i in range(0, n, B):
        k = min(B, n - i)
        idx = (torch.arange(i, i + k, device=tokens.device) * T)[:, None] + torch.arange(T + 1, device=tokens.device)
        batch = tokens[idx].long()
        logits, _, _ = target(batch[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum").item()
        cnt += batch[:, 1:].numel()
    return {"tokens": cnt, "ce": tot / cnt, "ppl": math.exp(tot / cnt)}


# ---------------------------------------------------------------------------------------------
# draft
# ---------------------------------------------------------------------------------------------
def draft_losses(target, draft, batch, anchors, cfg):
    K = cfg.dspark_block_size
    with torch.no_grad():
        t_logits, _, mh = target(batch, want_hidden=True)
    logits, conf, prev, _, _ = draft(target, mh, batch, anchors)
    B, A = anchors.shape
    pos = anchors.unsqueeze(-1) + torch.arange(K, device=batch.device)              # predicting pos+1
    p_t = torch.softmax(torch.gather(t_logits, 1, pos.view(B, -1, 1).expand(-1, -1, t_logits.shape[-1]))
                        .view(B, A, K, -1), -1)
    labels = torch.gather(batch, 1, (pos + 1).view(B, -1)).view(B, A, K)
    logq = torch.log_softmax(logits, -1)
    q = logq.exp()
    ce = -torch.gather(logq, -1, labels.unsqueeze(-1)).squeeze(-1)                    # [B,A,K]
    tv = 0.5 * (p_t - q).abs().sum(-1)
    acc_prob = torch.minimum(p_t, q).sum(-1).detach()
    bce = F.binary_cross_entropy_with_logits(conf, acc_prob, reduction="none")
    w = torch.exp(-torch.arange(K, device=batch.device, dtype=torch.float32) / K)
    w = w / w.sum()
    main = ((0.1 * ce + 0.9 * tv) * w).sum(-1).mean()
    loss = main + bce.mean()
    greedy_match = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, {"ce": ce.mean().item(), "tv": tv.mean().item(), "bce": bce.mean().item(),
                  "match_per_pos": [round(x, 4) for x in greedy_match.tolist()]}


def train_draft(target, draft, tokens, P, args, log, work):
    dev = tokens.device
    cfg = target.cfg
    ckpt_path = os.path.join(work, "draft.pt")
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    opt = make_opt(list(draft.parameters()), P["draft_lr"])
    gen = torch.Generator().manual_seed(args.seed + 2)
    step, total, hist = 0, None, []
    if args.resume and os.path.exists(ckpt_path):
        st = torch.load(ckpt_path, map_location=dev, weights_only=False)
        draft.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, total, hist = st["step"], st["total"], st["hist"]
        log(f"draft: resumed at step {step}/{total}")
        if st.get("done"):
            return hist, step, total
    B, T, A, K = P["batch"], P["seq_len"], P["anchors"], cfg.dspark_block_size
    if total is None and (args.draft_steps or P["draft_steps"]):
        total = args.draft_steps or P["draft_steps"]
    draft.train()
    moe = draft.moe_layers()
    t_last_ckpt = time.time()
    t_start = time.time()
    t_probe, probe_step = None, None
    while total is None or step < total:
        if total is None and t_probe is None and step >= 2:
            sync()
            t_probe, probe_step = time.time(), step
        if total is None and t_probe is not None and step == probe_step + 8:
            sync()
            st_time = (time.time() - t_probe) / 8
            total = plan_steps(args.draft_steps or P["draft_steps"], args.draft_seconds
                               if args.draft_seconds is not None else P["draft_seconds"], st_time)
            log(f"draft: {st_time * 1000:.0f} ms/step -> {total} steps")
        lr = lr_at(step, total or 10**9, P["warmup"], P["draft_lr"])
        for g in opt.param_groups:
            g["lr"] = lr
        batch = sample_batch(tokens, B, T, gen)[:, :-1]
        anchors = torch.randint(1, T - K - 1, (B, A), generator=gen).to(dev)
        loss, info = draft_losses(target, draft, batch, anchors, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        for m in moe:
            m.update_bias(1e-3)
        step += 1
        if step % 25 == 0 or step == 1 or step == total:
            info.update({"step": step, "loss": loss.item(), "lr": lr, "gnorm": float(gn),
                         "elapsed_s": time.time() - t_start})
            hist.append(info)
            log(f"draft step {step}/{total} loss {info['loss']:.3f} ce {info['ce']:.3f} tv {info['tv']:.3f} "
                f"bce {info['bce']:.3f} match {info['match_per_pos']}")
            if not math.isfinite(info["loss"]):
                raise RuntimeError("draft loss is not finite")
        if time.time() - t_last_ckpt > args.ckpt_every:
            save_ckpt(ckpt_path, model=draft.state_dict(), opt=opt.state_dict(), gen=gen.get_state(), step=step,
                      total=total, hist=hist)
            t_last_ckpt = time.time()
    save_ckpt(ckpt_path, model=draft.state_dict(), opt=opt.state_dict(), gen=gen.get_state(), step=step,
              total=total, hist=hist, done=True)
    return hist, step, total


@torch.no_grad()
def greedy_generate(target, prompt, n_new):
    ids = prompt
    for _ in range(n_new):
        logits, _, _ = target(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@torch.no_grad()
def draft_acceptance(target, draft, seqs, start):
    """Greedy DSpark acceptance on target-greedy continuations: for every anchor P >= start the
    drafts are compared with the target's own greedy tokens (exact: the prefix is target-greedy)."""
    cfg = target.cfg
    K = cfg.dspark_block_size
    target.eval()
    draft.eval()
    N, L = seqs.shape
    anchors = torch.arange(start - 1, L - K, device=seqs.device).unsqueeze(0).expand(N, -1).contiguous()
    _, _, mh = target(seqs, want_hidden=True)
    logits, conf, _, _, _ = draft(target, mh, seqs, anchors)
    pos = anchors.unsqueeze(-1) + torch.arange(K, device=seqs.device)
    labels = torch.gather(seqs, 1, (pos + 1).view(N, -1)).view(N, -1, K)
    match = (logits.argmax(-1) == labels)
    run = torch.cumprod(match.int(), -1)                                         # accepted prefix mask
    acc_len = run.sum(-1).float()
    per_pos_uncond = run.float().mean(dim=(0, 1))
    prev_ok = torch.cat([torch.ones_like(run[..., :1]), run[..., :-1]], -1).bool()
    cond = [(match[..., k] & prev_ok[..., k]).sum().item() / max(1, prev_ok[..., k].sum().item()) for k in range(K)]
    c = torch.sigmoid(conf)
    calib = [{"mean_conf": c[..., k][prev_ok[..., k]].mean().item() if prev_ok[..., k].any() else None,
              "accept_rate": cond[k]} for k in range(K)]
    return {"anchors": int(anchors.numel()), "mean_accepted": acc_len.mean().item(),
            "tokens_per_step": 1.0 + acc_len.mean().item(),
            "per_position_unconditional": [round(x, 4) for x in per_pos_uncond.tolist()],
            "per_position_conditional": [round(x, 4) for x in cond], "confidence_calibration": calib}


# ---------------------------------------------------------------------------------------------
# self-tests: torch quantizers vs the scalar vectors; export round trip vs the QAT forward
# ---------------------------------------------------------------------------------------------
def selftest_quant(dev, log):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_vectors.json")
    with open(path) as f:
        V = json.load(f)
    def i32(xs):
        return torch.tensor([x - (1 << 32) if x >= (1 << 31) else x for x in xs], dtype=torch.int32)

    def u2f(xs):
        return i32(xs).view(torch.float32).to(dev)
    bad = {}
    # e4m3 (finite inputs; the torch cast path always clamps first, as act_quant does)
    cases = [c for c in V["f32_to_e4m3"] if math.isfinite(Q.bits_f32(c["in"]))]
    x = u2f([c["in"] for c in cases])
    got = Q.e4m3_code_t(x).cpu().tolist()
    if hasattr(torch, "float8_e4m3fn"):   # and torch's own cast agrees
        f8 = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).cpu().tolist()
        bad["e4m3_torch_cast"] = [hex(c["in"]) for c, g in zip(cases, f8) if g != c["out"]]
    bad["e4m3"] = [hex(c["in"]) for c, g in zip(cases, got) if g != c["out"]]
    cases = [c for c in V["f32_to_e2m1"] if math.isfinite(Q.bits_f32(c["in"]))]
    x = u2f([c["in"] for c in cases]).clamp(-6, 6)
    got = (Q.e2m1_code_t(x) | (torch.signbit(x).to(torch.int32) << 3)).cpu().tolist()
    bad["e2m1"] = [hex(c["in"]) for c, g in zip(cases, got) if g != c["out"]]
    cases = V["ue8m0_scale_exponent"]
    got = [int(Q.ue8m0_exponent_t(u2f([c["amax"]]), c["qmax"], Q.bits_f32(c["floor"]))[0]) for c in cases]
    bad["ue8m0"] = [hex(c["amax"]) for c, g in zip(cases, got) if g != c["exponent"]]
    c = V["quantize_fp8_block"]
    w = u2f(c["w"]).view(c["out"], c["in"])
    codes, scale = Q.quantize_fp8_weight_t(w, c["block"])
    bad["fp8_block"] = [] if (bytes(codes.cpu().flatten().tolist()).hex() == c["data"]
                             and bytes(scale.cpu().flatten().tolist()).hex() == c["scale"]) else ["mismatch"]
    c = V["quantize_mxfp4"]
    w = u2f(c["w"]).view(c["out"], c["in"])
    packed, scale = Q.quantize_mxfp4_t(w)
    bad["mxfp4"] = [] if (bytes(packed.cpu().flatten().tolist()).hex() == c["data"]
                         and bytes(scale.cpu().flatten().tolist()).hex() == c["scale"]) else ["mismatch"]
    # fake-quant round trips (what the QAT forward uses) vs the scalar act_quant reference
    for c in V["act_quant_roundtrip"]:
        x = u2f(c["x"]).view(1, -1)
        y = (Q.fake_quant_fp8_act(x, c["block"]) if c["kind"] == "fp8" else Q.fake_quant_fp4_act(x, c["block"]))
        ok = torch.equal(y.reshape(-1).cpu(), i32(c["y"]).view(torch.float32))  # values (-0 == +0)
        bad[f"act_{c['kind']}_{c['block']}"] = [] if ok else ["mismatch"]
    # weight fake-quant == dequant(quantize) (what export writes)
    g = torch.Generator(device="cpu").manual_seed(5)
    w = (torch.randn(256, 384, generator=g) * 0.05).to(dev)
    codes, scale = Q.quantize_fp8_weight_t(w)
    bad["fp8_fake_vs_export"] = [] if torch.equal(Q.fake_quant_fp8_weight(w).cpu(),
                                                  X.dequant_fp8(codes.cpu(), scale.cpu())) else ["mismatch"]
    packed, scale = Q.quantize_mxfp4_t(w)
    bad["fp4_fake_vs_export"] = [] if torch.equal(Q.fake_quant_mxfp4_weight(w).cpu(),
                                                  X.dequant_mxfp4(packed.cpu().view(torch.int8), scale.cpu())) \
        else ["mismatch"]
    n_bad = sum(len(v) for v in bad.values())
    log(f"selftest quant: {n_bad} mismatches {({k: v[:5] for k, v in bad.items() if v})}")
    return {"mismatches": n_bad, "detail": {k: v[:10] for k, v in bad.items()}}


def load_exported_into(target, draft, ckpt_dir):
    """Fresh modules get the dequantized exported tensors (exact file values)."""
    T = X.read_checkpoint(ckpt_dir)
    used = set()

    def fetch(name):
        dt, t = T[name]
        used.add(name)
        if dt == "F8_E4M3":
            used.add(name[:-len(".weight")] + ".scale")
            return X.dequant_fp8(t, T[name[:-len(".weight")] + ".scale"][1])
        if dt == "I8":
            used.add(name[:-len(".weight")] + ".scale")
            return X.dequant_mxfp4(t, T[name[:-len(".weight")] + ".scale"][1])
        return t.float() if dt != "I64" else t

    for mod in [target, draft]:
        if mod is None:
            continue
        for n, p in mod.named_parameters():
            if n.endswith((".experts_w1", ".experts_w2", ".experts_w3")):
                which = n[-2:]
                prefix = n[:-len(".experts_w1")]
                val = torch.stack([fetch(f"{prefix}.experts.{e}.{which}.weight") for e in range(p.shape[0])])
            else:
                val = fetch(n)
            with torch.no_grad():
                p.copy_(val.to(p.device).view(p.shape))
        for n, b in mod.named_buffers():
            if n.endswith("tid2eid"):
                with torch.no_grad():
                    b.copy_(fetch(n).to(b.device))
    missing = set(T) - used
    return len(T), sorted(missing)


def selftest_export(target, draft, ckpt_dir, batch, P, log):
    cfg = target.cfg
    dev = batch.device
    t2 = M.Target(cfg, 999, target.max_len).to(dev)
    d2 = M.Draft(cfg, 999).to(dev) if draft is not None else None
    n, unused = load_exported_into(t2, d2, ckpt_dir)
    target.eval()
    t2.eval()
    with torch.no_grad():
        l1, _, h1 = target(batch, want_hidden=True)
        l2, _, h2 = t2(batch, want_hidden=True)
        res = {"tensors": n, "unused_tensors": unused[:10],
               "target_logits_max_abs_diff": (l1 - l2).abs().max().item(),
               "target_argmax_agree": (l1.argmax(-1) == l2.argmax(-1)).float().mean().item()}
        if draft is not None:
            draft.eval()
            d2.eval()
            K = cfg.dspark_block_size
            anchors = torch.arange(1, batch.shape[1] - K - 1, 7, device=dev).unsqueeze(0).expand(batch.shape[0], -1)
            a1 = draft(target, h1, batch, anchors)
            a2 = d2(t2, h2, batch, anchors)
            res["draft_logits_max_abs_diff"] = (a1[0] - a2[0]).abs().max().item()
            res["draft_conf_max_abs_diff"] = (a1[1] - a2[1]).abs().max().item()
    log(f"selftest export: {res}")
    return res


# ---------------------------------------------------------------------------------------------
SMALL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "model.safetensors.index.json"]


def publish(out, ck_dir, res_path, log_path):
    import shutil
    for fn in os.listdir(out):
        if fn.endswith(".safetensors"):
            os.remove(os.path.join(out, fn))
    if os.path.isdir(ck_dir):
        for fn in sorted(os.listdir(ck_dir)):
            if fn.endswith(".safetensors"):
                shutil.copyfile(os.path.join(ck_dir, fn), os.path.join(out, fn))
    tmp = os.path.join(out, "meta.tar.tmp")
    with tarfile.open(tmp, "w") as tf:
        for fn in SMALL_FILES + ["inference/config.json"]:
            p = os.path.join(ck_dir, fn)
            if os.path.exists(p):
                tf.add(p, arcname=f"checkpoint/{fn}")
        tf.add(res_path, arcname="train-results.json")
        if os.path.exists(log_path):
            tf.add(log_path, arcname="train.log")
    os.replace(tmp, os.path.join(out, "meta.tar"))


def probe_speed(P, dev, log, steps=6):
    """ms/step and peak memory of a preset's target and draft on random tokens (for planning)."""
    cfgd = dict(P["cfg"])
    cfgd.setdefault("vocab_size", P["vocab"])
    cfgd["dspark_noise_token_id"] = cfgd["vocab_size"] - 1
    cfg = M.Cfg(**cfgd)
    B, T = P["batch"], P["seq_len"]
    tgt = M.Target(cfg, 0, T + 64).to(dev)
    dr = M.Draft(cfg, 0).to(dev)
    toks = torch.randint(0, cfg.vocab_size, (1 << 20,), device=dev, dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    opt = make_opt(list(tgt.parameters()), 1e-4)
    torch.cuda.reset_peak_memory_stats()
    res = {"target_params": count_params(tgt), "draft_params": count_params(dr)}
    for phase in ["target", "draft"]:
        if phase == "draft":
            tgt.eval()
            for p in tgt.parameters():
                p.requires_grad_(False)
            opt = make_opt(list(dr.parameters()), 1e-4)
        times = []
        for i in range(steps):
            sync()
            t0 = time.time()
            b = sample_batch(toks, B, T, gen)
            if phase == "target":
                logits, aux, _ = tgt(b[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1)) + \
                    aux.get("indexer_kl", 0.0)
            else:
                anchors = torch.randint(1, T - cfg.dspark_block_size - 1, (B, P["anchors"]), generator=gen).to(dev)
                loss, _ = draft_losses(tgt, dr, b[:, :-1], anchors, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            times.append(time.time() - t0)
        res[f"{phase}_ms_per_step"] = 1000 * sum(times[2:]) / max(1, len(times) - 2)
    res["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
    log(f"probe: {res}")
    del tgt, dr, opt
    torch.cuda.empty_cache()
    return res


class _FakeEnc:
    def __init__(self, ids):
        self.ids = ids


class FakeTok:
    """Stands in for a `tokenizers.Tokenizer` in --fake-data runs (code-path tests only)."""

    def __init__(self, n):
        self.n = n

    def get_vocab_size(self):
        return self.n

    def token_to_id(self, t):
        return self.n - 1

    def encode(self, s, add_special_tokens=False):
        return _FakeEnc([3 + (ord(c) % (self.n - 4)) for c in s])

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def fake_data(P, work):
    g = torch.Generator().manual_seed(0)
    n = P["vocab"]
    tok_path = os.path.join(work, "fake-tokenizer.json")
    with open(tok_path, "w") as f:
        f.write("{}\n")
    return {"train": torch.randint(0, n, (200_000,), generator=g, dtype=torch.int32),
            "val": torch.randint(0, n, (20_000,), generator=g, dtype=torch.int32),
            "val_synth": torch.randint(0, n, (5_000,), generator=g, dtype=torch.int32),
            "val_chat": torch.randint(0, n, (5_000,), generator=g, dtype=torch.int32),
            "tokenizer": FakeTok(n), "tokenizer_path": tok_path, "files": 0, "nat_bytes": 0, "vocab_base": n}


CHAT_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write twenty Python dataclasses for an online bookshop (Book, Author, Order, Customer, ...), each with "
    "typed fields and a short docstring.",
    "Count from 1 to 40.",
]


@torch.no_grad()
def chat_samples(target, draft, tok, dev, P, log, n_new=96):
    """Greedy answers to a few chat prompts (Python code, docs, counting) and the draft's greedy
    acceptance on each answer."""
    out = []
    eos = tok.token_to_id(D.EOS)
    for q in CHAT_PROMPTS:
        ids = tok.encode(f"{D.BOS}{D.USER}{q}{D.ASSISTANT}{D.THINK_END}", add_special_tokens=False).ids
        seq = greedy_generate(target, torch.tensor([ids], device=dev), n_new)
        gen = seq[0, len(ids):].tolist()
        text = tok.decode(gen[:gen.index(eos)] if eos in gen else gen, skip_special_tokens=False)
        acc = draft_acceptance(target, draft, seq, len(ids))
        out.append({"prompt": q, "answer": text, "stopped": eos in gen, "acceptance": acc})
        log(f"chat {q[:40]!r} -> {text[:200]!r} (accepted/step {acc.get('tokens_per_step')})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="builtin", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="results + exported checkpoint go here")
    ap.add_argument("--work", default="/tmp/tandem-train", help="data cache and training checkpoints")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-seconds", type=float, default=None, help="time budget -> step count (after probe)")
    ap.add_argument("--draft-seconds", type=float, default=None)
    ap.add_argument("--target-steps", type=int, default=0, help="fixed step count (overrides seconds)")
    ap.add_argument("--draft-steps", type=int, default=0)
    ap.add_argument("--ckpt-every", type=float, default=60.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--max-shard-bytes", type=int, default=12_000_000)
    ap.add_argument("--probe", default=None, help="also time this preset on random tokens (planning aid)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--only-selftest", action="store_true")
    ap.add_argument("--fake-data", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    P = PRESETS[args.preset]
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    log_path = os.path.join(args.work, "train.log")
    log = Logger(log_path)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": args.commit,
               "preset": args.preset, "seed": args.seed, "argv": sys.argv,
               "hardware": {"gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
                            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                            "python": platform.python_version()}}
    res_path = os.path.join(args.work, "train-results.json")
    ck_dir = os.path.join(args.work, "checkpoint")

    def dump():
        """Write results and mirror the deliverables to --out: the shards as they are, everything small
        (config, tokenizer, index, results, log) in one meta.tar, so a device run returns few files."""
        with open(res_path, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        publish(args.out, ck_dir, res_path, log_path)

    results["selftest_quant"] = selftest_quant(dev, log)
    dump()
    if args.probe:
        try:
            results["probe_" + args.probe] = probe_speed(PRESETS[args.probe], dev, log)
        except Exception:
            log("probe failed:\n" + traceback.format_exc())
        dump()
    if args.only_selftest:
        return

    # ---- data + tokenizer
    cache = os.path.join(args.work, "data.pt")
    if args.fake_data:   # code-path test without `tokenizers` or text: random tokens
        dd = fake_data(P, args.work)
    elif args.resume and os.path.exists(cache) and os.path.exists(os.path.join(args.work, "tokenizer.json")):
        from tokenizers import Tokenizer
        dd = torch.load(cache, weights_only=False)
        dd["tokenizer"] = Tokenizer.from_file(os.path.join(args.work, "tokenizer.json"))
        log("data: loaded cache")
    else:
        dd = D.build(args.seed, args.work, P["data_bytes"], P["synth_docs"], P["vocab"], P["tok_bytes"], log=log)
        for k in ["train", "val", "val_synth", "val_chat"]:
            raw = dd[k].tobytes()
            dd[k] = torch.frombuffer(bytearray(raw), dtype=torch.int32) if raw else torch.zeros(0, dtype=torch.int32)
        torch.save({k: v for k, v in dd.items() if k != "tokenizer"}, cache)
    tok = dd["tokenizer"]
    cfgd = dict(P["cfg"])
    cfgd["vocab_size"] = tok.get_vocab_size()
    cfgd["dspark_noise_token_id"] = tok.token_to_id(D.NOISE)
    cfg = M.Cfg(**cfgd)
    cfg.check()
    results["config"] = cfg.to_config_json()
    train_tok = dd["train"].to(dev)
    val_tok = dd["val"].to(dev)
    vs_tok = dd["val_synth"].to(dev)
    vc_tok = dd.get("val_chat", torch.zeros(0, dtype=torch.int32)).to(dev)
    results["data"] = {"files": dd["files"], "chars": dd["nat_bytes"], "train_tokens": train_tok.numel(),
                       "val_tokens": val_tok.numel(), "val_synth_tokens": vs_tok.numel(),
                       "val_chat_tokens": vc_tok.numel(),
                       "tokenizer_vocab": cfg.vocab_size, "tokenizer_base": dd["vocab_base"]}
    dump()

    # ---- target
    max_len = P["seq_len"] + 64
    target = M.Target(cfg, args.seed, max_len).to(dev)
    results["params"] = {"target": count_params(target)}
    log(f"target params {results['params']['target'] / 1e6:.2f}M")
    t0 = time.time()
    hist, steps, total = train_target(target, train_tok, P, args, log, args.work)
    results["target_train"] = {"steps": steps, "batch": P["batch"], "seq_len": P["seq_len"],
                               "tokens": steps * P["batch"] * P["seq_len"], "seconds": time.time() - t0,
                               "history": hist}
    results["eval"] = {"val": eval_ppl(target, val_tok, P["seq_len"], P["eval_windows"]),
                       "val_synth": eval_ppl(target, vs_tok, P["seq_len"], P["eval_windows"]),
                       "val_chat": eval_ppl(target, vc_tok, P["seq_len"], P["eval_windows"])}
    log(f"eval: {results['eval']}")
    dump()
    # export the target alone first so something comes back even if the draft phase is cut short
    try:
        d_tmp = M.Draft(cfg, args.seed).to(dev)
        results["export"] = X.write_checkpoint(ck_dir, cfg, target, d_tmp, dd["tokenizer_path"], args.max_shard_bytes)
    except Exception:
        log("export (pre-draft) failed:\n" + traceback.format_exc())
    dump()

    # ---- draft
    draft = M.Draft(cfg, args.seed).to(dev)
    results["params"]["draft"] = count_params(draft)
    log(f"draft params {results['params']['draft'] / 1e6:.2f}M")
    t0 = time.time()
    hist, steps, total = train_draft(target, draft, train_tok, P, args, log, args.work)
    results["draft_train"] = {"steps": steps, "anchors_per_seq": P["anchors"], "seconds": time.time() - t0,
                              "history": hist}
    dump()

    # ---- acceptance on target-greedy continuations (held-out text and counting prompts)
    try:
        n, pl = P["gen_prompts"], P["gen_prompt_len"]
        idx = (torch.arange(n, device=dev) * ((val_tok.numel() - pl - 1) // max(1, n)))[:, None] + \
            torch.arange(pl, device=dev)
        seqs = greedy_generate(target, val_tok[idx].long(), P["gen_new"])
        results["acceptance_val"] = draft_acceptance(target, draft, seqs, pl)
        cp = [f"{D.BOS}{D.USER}Count from {a} to {a + 150}.{D.ASSISTANT}{D.THINK_END}" for a in range(1, 9)]
        enc = [tok.encode(s, add_special_tokens=False).ids for s in cp]
        m = min(len(e) for e in enc)
        cseq = greedy_generate(target, torch.tensor([e[-m:] for e in enc], device=dev), P["gen_new"])
        results["acceptance_counting"] = draft_acceptance(target, draft, cseq, m)
        results["samples"] = [tok.decode(cseq[0].tolist(), skip_special_tokens=False),
                              tok.decode(seqs[0, -P["gen_new"] - 48:].tolist(), skip_special_tokens=False)]
        log(f"acceptance val: {results['acceptance_val']}")
        log(f"acceptance counting: {results['acceptance_counting']}")
        log(f"sample: {results['samples'][0][:300]!r}")
    except Exception:
        log("acceptance eval failed:\n" + traceback.format_exc())
    dump()
    try:
        results["chat_samples"] = chat_samples(target, draft, tok, dev, P, log) if not args.fake_data else []
    except Exception:
        log("chat samples failed:\n" + traceback.format_exc())
    dump()

    # ---- export + round-trip self-test
    results["export"] = X.write_checkpoint(ck_dir, cfg, target, draft, dd["tokenizer_path"], args.max_shard_bytes)
    log(f"export: {results['export']}")
    dump()
    try:
        b = sample_batch(val_tok, 2, P["seq_len"], torch.Generator().manual_seed(7))[:, :-1]
        results["selftest_export"] = selftest_export(target, draft, ck_dir, b, P, log)
    except Exception:
        log("export selftest failed:\n" + traceback.format_exc())
    log("done")
    dump()


if __name__ == "__main__":
    main()
