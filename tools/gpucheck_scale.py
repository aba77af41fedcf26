"""tools/gpucheck_scale.py — the GPU check's part scale (tools/gpucheck.py
runs it): ferry-gpt's resident llama-1b at batch 8 x seq 2048 against
bench/peers/torch_llama.py (transformers, bf16, SDPA, gradient
checkpointing, fused AdamW) from the same initial weights on the same GPU in
the same run, the MFU of each over the run's own cuBLAS bf16 GEMM peak, and
ferry's attention kernels alone (ferry-gpt-attn) against torch's
scaled_dot_product_attention. Its figures, and its rows of the summary.

The order, inside the part's limit: ferry-gpt writes its initial weights
(train --steps 0 --save, on the host, beside the GPU runs); ferry-cuda-peak
--gemm 8192; the attention pairs at head dim 64 and 128 (T = 2048, and
ferry's at T = 4096 for its memory's growth); ferry-gpt on cuda with the
resident config at batch 8, else 4, else 2 when the larger does not fit
(each try stated); torch_llama.py at the batch that ran.
"""
import json
import os
import re
import threading
import time

import gpucheck as gc

MODEL = "llama-1b"
SEQ = 2048
STEPS = 10
BATCHES = (8, 4, 2)
GEMM_N = 8192
# tiers.gpu.budget of the resident run: the model states (18 bytes a param,
# 20 GB), the engine's grad buffers, the activations and workspace: 60 GiB
# leaves an H100's 80 GB room for the context and the sampling's error.
BUDGET = "60G"
# attention: (head dim, heads) at width 2048, as llama-1b; batch 8, T 2048
ATTN = ((64, 32), (128, 16))
ATTN_BATCH = 8
# the targets of the issue
TARGETS = {"tokens_ratio": 1.0, "mfu": 0.45, "tokens_per_step": 16384, "loss_rel": 2e-2,
           "attn_ratio": 2.0, "attn_mem_growth": 2.5}
OOM_RE = re.compile(r"out of memory|cudaErrorMemoryAllocation|does not fit|exceeds|budget",
                    re.I)


# ---- figures (pure: the selftest covers them) ------------------------------------------


def llama_flops_per_token(cfg, seq):
    """6 N + 6 L C S: N every param but the input embedding (a lookup; the
    head's GEMM counts it once when tied), C S causal attention's QK^T and
    PV forward and backward per token. cfg: a Llama config.json's dict."""
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    L, H = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    hd = C // H
    Q, KV = H * hd, cfg.get("num_key_value_heads", H) * hd
    n = L * (2 * C * Q + 2 * C * KV + 3 * C * F + 2 * C) + C + V * C
    return 6 * n + 6 * L * Q * seq, n


def mfu(tokens_per_s, flops_per_token, peak_tflops):
    if not tokens_per_s or not flops_per_token or not peak_tflops:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def ratio(a, b):
    return a / b if a is not None and b else None


def step_tokens_per_s(text):
    """The median tokens/s of a run's steps after the first (its warm-up)."""
    _, steps = gc.losses_of(text)
    return gc.median([s["tokens_per_s"] for s in steps[1:] if s.get("tokens_per_s")])


def attn_rows(ferry, sdpa):
    """Per head dim: ferry's and SDPA's figures and ferry / SDPA of fwd+bwd."""
    rows = []
    for hd, heads in ATTN:
        f, s = ferry.get(hd, {}), sdpa.get(hd, {})
        rows.append({"head_dim": hd, "heads": heads, "ferry": f, "sdpa": s,
                     "ratio_fwd_bwd": ratio(f.get("fwd_bwd_ms"), s.get("fwd_bwd_ms")),
                     "ratio_fwd": ratio(f.get("fwd_ms"), s.get("fwd_ms"))})
    return rows


def summary_rows(fig, target):
    """The part's rows of the check's summary (target: gpucheck.target)."""
    f, t = fig.get("ferry", {}), fig.get("torch", {})
    name = "scale %s resident, seq %d" % (MODEL, SEQ)
    rows = [target(name + ": tokens per step", f.get("tokens_per_step"),
                   TARGETS["tokens_per_step"], "min", note="batch %s" % f.get("batch")),
            target(name + ": tokens/s ferry / torch_llama.py", fig.get("tokens_per_s_ratio"),
                   TARGETS["tokens_ratio"], "min"),
            target(name + ": MFU (6 N tokens + attention) / measured GEMM peak",
                   f.get("mfu"), TARGETS["mfu"], "min",
                   note="GEMM peak %s TFLOPS" % fig.get("gemm", {}).get("tflops")),
            target(name + ": losses vs torch, max relative difference",
                   fig.get("loss_max_rel_diff"), TARGETS["loss_rel"], "max",
                   note="%d steps from the same weights" % STEPS),
            target(name + ": peak device memory (MiB, nvidia-smi) vs budget + context",
                   f.get("device_mib"), f.get("allowed_mib"), "max",
                   note="budget %s + context" % BUDGET)]
    for r in fig.get("attention", {}).get("rows", []) or attn_rows({}, {}):
        rows.append(target("attention fwd+bwd T=%d hd %d: ferry / torch SDPA" % (
            SEQ, r["head_dim"]), r.get("ratio_fwd_bwd"), TARGETS["attn_ratio"], "max"))
    rows.append(target("attention memory: ferry's peak at T=%d / T=%d (linear 2, T^2 4)" % (
        2 * SEQ, SEQ), fig.get("attention", {}).get("mem_growth"), TARGETS["attn_mem_growth"],
        "max"))
    return rows


# ---- the part ---------------------------------------------------------------------------


def peer_script(ck):
    """torch_llama.py: the bundle's copy, else the repository's."""
    for p in (os.path.join(ck.bundle, "src/bench/peers/torch_llama.py"),
              os.path.join(ck.root, "bench/peers/torch_llama.py")):
        if os.path.isfile(p):
            return p
    return None


def data_file(ck):
    return os.path.join(ck.root, "docs/FERRY-GPT.md")


def save_init(ck, out, limit, rec):
    """ferry-gpt's initial weights and config.json into out (host only)."""
    cmd = [ck.prog("ferry-gpt"), "train", "--model", MODEL, "--data", data_file(ck), "--steps",
           "0", "--batch", "1", "--seq", str(SEQ), "--save", out]
    r = ck.run(cmd, limit, "scale-init")
    rec.update(command=r["command"], rc=r["rc"], wall_s=r["wall_s"], timed_out=r["timed_out"])
    cfg = os.path.join(out, "config.json")
    if r["rc"] == 0 and os.path.isfile(cfg):
        with open(cfg) as f:
            rec["config"] = json.load(f)
    else:
        rec["tail"] = gc.tail(r["output"])


def gemm_peak(ck, limit):
    r = ck.run([ck.prog("ferry-cuda-peak"), "--gemm", str(GEMM_N), "--iters", "20", "--json"],
               limit, "scale-gemm")
    objs = [o for o in gc.json_lines(r["output"]) if o.get("bench") == "cuda_gemm"]
    fig = dict(objs[-1]) if objs else {"tail": gc.tail(r["output"])}
    fig.update(command=r["command"], rc=r["rc"])
    return fig


def attention(ck, python, peer, deadline):
    """ferry-gpt-attn and --sdpa-bench per head dim; ferry's memory at 2 T."""
    ferry, sdpa, notes = {}, {}, []
    exe = ck.prog("ferry-gpt-attn")
    have = os.path.isfile(exe)
    if not have:
        notes.append("ferry-gpt-attn is not in the bundle: ferry's attention not measured")
    for hd, heads in ATTN if have else ():
        for seq in (SEQ, 2 * SEQ) if hd == 128 else (SEQ,):
            left = deadline - time.time()
            if left < 5:
                notes.append("ferry-gpt-attn hd %d T %d: out of time" % (hd, seq))
                continue
            cmd = [exe, "--batch", str(ATTN_BATCH), "--seq", str(seq), "--heads", str(heads),
                   "--kv-heads", str(heads), "--head-dim", str(hd), "--iters", "20", "--json"]
            r = ck.run(cmd, min(left, 30), "scale-attn-%d-%d" % (hd, seq))
            objs = [o for o in gc.json_lines(r["output"]) if "fwd_bwd_ms" in o]
            d = dict(objs[-1]) if objs else {"tail": gc.tail(r["output"], 4)}
            d.update(command=r["command"], rc=r["rc"])
            if seq == SEQ:
                ferry[hd] = d
            else:
                ferry["%d@%d" % (hd, seq)] = d
    left = deadline - time.time()
    if python and peer and left > 10:
        cmd = [python, peer, "--sdpa-bench", "--device", "cuda", "--batch", str(ATTN_BATCH),
               "--seq", str(SEQ), "--head-dim", ",".join(str(h) for h, _ in ATTN), "--heads",
               ",".join(str(n) for _, n in ATTN), "--iters", "20"]
        r = ck.run(cmd, min(left, 60), "scale-sdpa")
        for o in gc.json_lines(r["output"]):
            if "fwd_bwd_ms" in o:
                sdpa[o["head_dim"]] = dict(o, command=r["command"])
        if not sdpa:
            notes.append("--sdpa-bench: " + gc.tail(r["output"], 3))
    else:
        notes.append("SDPA not measured: %s" % ("out of time" if python and peer else
                                                 "no python with torch and transformers"))
    rows = attn_rows(ferry, sdpa)
    big, small = ferry.get("128@%d" % (2 * SEQ), {}), ferry.get(128, {})
    measured = any(r["ratio_fwd_bwd"] is not None for r in rows)
    return {"status": "measured" if measured else "skip",
            "reason": "; ".join(notes) or None, "rows": rows, "ferry_long": big, "notes": notes,
            "mem_growth": ratio(big.get("peak_bytes"), small.get("peak_bytes"))}


def ferry_run(ck, init, batch, limit):
    stats = os.path.join(ck.out, "scale-ferry-b%d.stats.json" % batch)
    cmd = [ck.prog("ferry-gpt"), "train", "--model", os.path.join(init, "config.json"),
           "--weights", init, "--data", data_file(ck), "--steps", str(STEPS), "--batch",
           str(batch), "--seq", str(SEQ), "--checkpoint", "--device", "cuda", "--engine",
           os.path.join(ck.root, "examples/configs/resident.cfg"), "--set", "device=cuda",
           "--set", "tiers.gpu.budget=" + BUDGET, "--set", "tiers.host.pinned=true", "--json",
           "--stats-json", stats]
    r = ck.run(cmd, limit, "scale-ferry-b%d" % batch, sampler=True)
    losses, _ = gc.losses_of(r["output"])
    rec = {"batch": batch, "command": r["command"], "rc": r["rc"], "wall_s": r["wall_s"],
           "timed_out": r["timed_out"], "losses": losses,
           "tokens_per_s": step_tokens_per_s(r["output"]), "peak_mem_used_mib": r["peak_mib"]}
    if r["peak_mib"] is not None and ck.baseline_mib is not None:
        rec["device_mib"] = r["peak_mib"] - ck.baseline_mib
    try:
        with open(stats) as f:
            st = json.load(f)
        rec["tier_peak"], rec["budget"] = st.get("tier_peak"), st.get("budget")
    except (OSError, ValueError):
        pass
    rec["ok"] = r["rc"] == 0 and len(losses) == STEPS
    if not rec["ok"]:
        rec["tail"] = gc.tail(r["output"])
    return rec


def torch_run(ck, python, peer, init, batch, limit):
    """torch_llama.py with the engine config's optimizer (decay on every
    tensor, grad norm clipped at 1.0); ferry's weights when they were saved."""
    model = os.path.join(init, "config.json") if init else MODEL
    cmd = [python, peer, "--model", model, "--data", data_file(ck), "--steps", str(STEPS),
           "--batch", str(batch), "--seq", str(SEQ), "--device", "cuda", "--decay", "all",
           "--clip-grad-norm", "1.0"] + (["--weights", init] if init else [])
    r = ck.run(cmd, limit, "scale-torch", sampler=True)
    losses, _ = gc.losses_of(r["output"])
    fins = [o for o in gc.json_lines(r["output"]) if o.get("final")]
    rec = dict(fins[-1]) if fins else {}
    rec.update(command=r["command"], rc=r["rc"], wall_s=r["wall_s"], losses=losses,
               batch=batch, peak_mem_used_mib=r["peak_mib"], timed_out=r["timed_out"])
    rec["ok"] = r["rc"] == 0 and len(losses) == STEPS
    if not rec["ok"]:
        rec["tail"] = gc.tail(r["output"])
    return rec


def progress(ck, fig, t0, what):
    """The figures so far, in results.json (a check stopped mid-part keeps them)."""
    ck.res.part("scale", "running", "", time.time() - t0, fig, log="logs/scale-*.log",
                reason="running: " + what, quiet=True)


def scale_part(ck):
    """Runs the part on gpucheck's Check ck and records it."""
    if ck.gpu_skip("scale") or ck.time_skip("scale", 60):
        return
    t0 = time.time()
    deadline = t0 + ck.allow("scale")
    init = os.path.join(ck.out, "scale-init")
    init_rec = {}
    saver = threading.Thread(target=save_init, args=(ck, init, max(deadline - t0 - 100, 30),
                                                      init_rec), daemon=True)
    saver.start()
    python, probes = ck.gpu_python(("transformers", "safetensors"))
    peer = peer_script(ck)
    fig = {"model": MODEL, "seq": SEQ, "steps": STEPS, "budget": BUDGET, "python": python,
           "probes": probes, "peer": peer, "init": init_rec}
    fig["gemm"] = gemm_peak(ck, min(45, deadline - time.time()))
    progress(ck, fig, t0, "GEMM peak measured")
    # the attention pairs: at most 90 s, and 30% of what is left
    fig["attention"] = attention(ck, python, peer,
                                 time.time() + min(90, 0.3 * (deadline - time.time())))
    progress(ck, fig, t0, "attention measured")
    saver.join(max(deadline - time.time() - 120, 1))
    cfg = init_rec.get("config")
    tries, ferry, rec = [], {}, None
    for b in BATCHES if cfg else ():
        left = deadline - time.time()
        left -= min(75, 0.3 * left) if python and peer else 0  # torch's share
        if left < 20:
            tries.append({"batch": b, "why": "out of the part's time"})
            break
        rec = ferry_run(ck, init, b, left)
        tries.append({k: rec.get(k) for k in ("batch", "rc", "timed_out", "tail")})
        progress(ck, fig, t0, "ferry-gpt batch %d ended" % b)
        if rec["ok"] or rec["timed_out"] or not OOM_RE.search(rec.get("tail", "")):
            break
    ferry = rec or {}  # the one that ran, or the last that did not fit
    fig["ferry_tries"] = tries
    batch = ferry["batch"] if ferry.get("ok") else BATCHES[0]
    if cfg:
        fpt, n = llama_flops_per_token(cfg, SEQ)
        fig.update(flops_per_token=fpt, n_params=n)
    tp = fig.get("gemm", {}).get("tflops")
    if ferry:
        ferry["tokens_per_step"] = ferry["batch"] * SEQ if ferry["ok"] else None
        ferry["mfu"] = mfu(ferry.get("tokens_per_s"), fig.get("flops_per_token"), tp)
        if ferry["ok"] and ferry.get("device_mib") is not None and ck.context_mib is not None:
            ferry["allowed_mib"] = gc.parse_size_mib(BUDGET) + ck.context_mib
    fig["ferry"] = ferry
    left = deadline - time.time()
    if python and peer and left > 15:
        fig["torch"] = torch_run(ck, python, peer, init if cfg else None, batch, left)
        fig["torch"]["mfu"] = mfu(fig["torch"].get("tokens_per_s"),
                                  fig.get("flops_per_token") or fig["torch"].get("flops_per_token"),
                                  tp)
    else:
        fig["torch"] = {"ok": False, "why": "no python whose torch sees the GPU and imports "
                        "transformers and safetensors" if not (python and peer) else
                        "out of the part's time"}
    if ferry.get("ok") and fig["torch"].get("ok"):
        fig["tokens_per_s_ratio"] = ratio(ferry["tokens_per_s"], fig["torch"].get("tokens_per_s"))
        fig["loss_max_rel_diff"] = gc.max_rel_diff(ferry["losses"], fig["torch"]["losses"])
    why = []
    if not cfg:
        why.append("ferry-gpt could not save %s's initial weights (figures.init)" % MODEL)
    elif not ferry.get("ok"):
        why.append("ferry-gpt on cuda failed at every batch tried (figures.ferry_tries)")
    if not fig["torch"].get("ok"):
        why.append("torch_llama.py: %s" % (fig["torch"].get("why") or "failed (figures.torch)"))
    if fig["gemm"].get("rc") != 0:
        why.append("ferry-cuda-peak --gemm failed")
    cmds = [fig["gemm"].get("command"), ferry.get("command"), fig["torch"].get("command")]
    ck.res.part("scale", "fail" if why else "pass", " ; ".join(c for c in cmds if c),
                time.time() - t0, fig, log="logs/scale-*.log", reason="; ".join(why) or None)


# ---- self test (gpucheck.py selftest calls it) -------------------------------------------


def selftest():
    tl = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
          "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4}
    fpt, n = llama_flops_per_token(tl, 2048)
    # TinyLlama-1.1B: 1,100,048,384 params, 65,536,000 of them the input embedding
    assert n == 1100048384 - 65536000, n
    assert fpt == 6 * n + 6 * 22 * 2048 * 2048, fpt
    assert abs(mfu(10000, 1e10, 200) - 0.5) < 1e-12 and mfu(None, 1, 1) is None
    rows = attn_rows({64: {"fwd_bwd_ms": 3.0, "fwd_ms": 1.0}}, {64: {"fwd_bwd_ms": 2.0,
                                                                    "fwd_ms": 1.0}})
    assert rows[0]["ratio_fwd_bwd"] == 1.5 and rows[1]["ratio_fwd_bwd"] is None, rows
    text = '{"step": 1, "loss": 1, "tokens_per_s": 5}\n{"step": 2, "loss": 1, "tokens_per_s": 10}\n' \
           '{"step": 3, "loss": 1, "tokens_per_s": 30}\n{"step": 4, "loss": 1, "tokens_per_s": 20}\n'
    assert step_tokens_per_s(text) == 20, step_tokens_per_s(text)
    assert OOM_RE.search("cudaMalloc: out of memory") and not OOM_RE.search("bad option")
    rows = summary_rows({}, gc.target)
    assert len(rows) == 8 and all(r["met"] is None for r in rows), rows
    return 0
