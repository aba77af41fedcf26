#!/usr/bin/env python3
"""bench/peers/run_peers.py — ferry against DeepSpeed in the same offload
placements, the same model, weights, data, batch, sequence, steps and AdamW:
for each placement it runs three peers one after the other, each in its
own process, and prints their JSON lines in run_ds.py's schema.

  run_peers.py --model PRESET|config.json --data FILE [--weights DIR]
               [--placements offload,zero3_cpu,infinity] [--peers LIST]
               [--batch B] [--seq S] [--steps N] [--device cuda|cpu]
               [--gpt FERRY_GPT] [--python PY] [--lib LIBFERRY] [--set KEY=VALUE]...
               [--work DIR] [--nvme-path DIR]

The placements and what runs them (the ferry configs are examples/configs/,
the DeepSpeed ones deepspeed/ds_*.json):
  offload    ZeRO-Offload: params on the device, the optimizer on the host:
             offload-host.cfg | ds_offload.json (stage 2, offload_optimizer cpu)
  zero3_cpu  ZeRO-3 CPU offload: params and optimizer on the host:
             offload-host.cfg + placement.params=host | ds_zero3_cpu.json
  infinity   ZeRO-Infinity: params and optimizer on NVMe:
             zero-infinity.cfg | ds_infinity.json (stage 3, both nvme)
The peers: ferry-gpt (ferry-gpt train --engine CFG, its own model), ferry-torch
(transformers' LlamaForCausalLM, built as torch_llama.py builds it, trained
through ferry.torch.initialize with the same config) and deepspeed
(deepspeed/run_ds.py). All start from the same weights (--weights, else
ferry-gpt train --steps 0 --save WORK/init first), draw ferry-gpt's batches
and use the config's AdamW (lr 3e-4, betas 0.9/0.999, eps 1e-8, weight decay
0.1 on every tensor, fp32 master and states) and its clip_grad_norm
(1.0, none for infinity, whose groups step during backward); gradient
checkpointing on. On cuda bf16 params and SDPA; on cpu fp32 compute over
bf16 params (ferry's two peers) and eager attention where torch lacks SDPA.

Output, per run: run_ds.py's lines, {"step", "loss", "tokens_per_s", "ms"}
(with "peer" and "placement") and {"final": true, "peer", "placement",
"tokens_per_s", "model_tflops", "peak_bytes", "peak_device_used_bytes",
"peak_rss_bytes", "losses", ...}, or {"skip": true, "peer", "placement",
"reason"} (deepspeed without CUDA), or {"error": ..., "peer", "placement"};
then per placement {"summary": true, "placement", "loss_max_rel_diff" (each
peer's losses against ferry-gpt's), "tokens_per_s_vs_deepspeed",
"rss_vs_deepspeed"}. Exit 0; 1 a peer failed; 2 bad usage.
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_llama as tl  # noqa: E402  (standard library only at import)

# placement: (ferry config under examples/configs, its extra keys, run_ds.py's placement)
PLACEMENTS = {"offload": ("offload-host.cfg", (), "offload"),
              "zero3_cpu": ("offload-host.cfg", ("placement.params=host",), "zero3_cpu"),
              "infinity": ("zero-infinity.cfg", (), "infinity")}
PEERS = ("ferry-gpt", "ferry-torch", "deepspeed")
SKIP = 77


def find_root():
    """The repository (or the GPU bundle's src/ copy's repository): the
    folder holding examples/configs above this file."""
    d = HERE
    for _ in range(5):
        d = os.path.dirname(d)
        if os.path.isdir(os.path.join(d, "examples", "configs")):
            return d
    return os.path.dirname(os.path.dirname(HERE))


def cfg_value(path, key, default):
    """A top-level number of a .cfg (key = value;), as the engine reads it."""
    with open(path) as f:
        m = re.search(r"^\s*%s\s*=\s*([-0-9.eE+]+)\s*;" % re.escape(key), f.read(), re.M)
    return float(m.group(1)) if m else default


def engine_sets(a, placement):
    """The --set keys of both ferry peers: the placement's, the device's,
    the NVMe folder, then the user's."""
    keys = list(PLACEMENTS[placement][1])
    if a.device == "cuda":
        keys += ["device=cuda", "tiers.host.pinned=true"]
    keys += ["tiers.nvme.paths=" + a.nvme_path]
    return keys + list(a.set)


class DevicePeak:
    """The device's memory.used (nvidia-smi, every 0.1 s) while a child
    runs, where there is nvidia-smi and the device is cuda."""

    def __init__(self, cuda):
        self.dev, self.smi = None, None
        if cuda and shutil.which("nvidia-smi"):
            self.smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-lms", "100", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.t = threading.Thread(target=self._read, daemon=True)
            self.t.start()

    def _read(self):
        for line in self.smi.stdout:
            try:
                v = int(float(line.decode().strip()) * (1 << 20))
            except ValueError:
                continue
            self.dev = v if self.dev is None else max(self.dev, v)

    def stop(self):
        if self.smi:
            time.sleep(0.2)
            self.smi.kill()
            self.smi.wait()
            self.t.join(2)
        return self.dev


def run_child(cmd, env, timeout, cuda):
    s = DevicePeak(cuda)
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, timeout=timeout)
        rc, out = r.returncode, r.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = None, (e.stdout or b"").decode("utf-8", "replace") \
            if isinstance(e.stdout, bytes) else (e.stdout or "")
    return rc, out, s.stop()


def json_or_none(line):
    try:
        return json.loads(line) if line.startswith("{") else None
    except ValueError:
        return None


def objs_of(text):
    """The JSON objects among a child's lines."""
    return [o for o in map(json_or_none, text.splitlines()) if o is not None]


def emit(o):
    print(json.dumps(o), flush=True)


def child_env(a):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([a.ferry_python] + ([env["PYTHONPATH"]]
                                                           if env.get("PYTHONPATH") else []))
    if a.lib:
        env["FERRY_LIB"] = a.lib
    return env


def flops_of_config(cfgd, seq):
    """torch_llama.flops_per_token from the config alone (no torch): 6 N +
    6 L C S, N the params but the input embedding."""
    C, F, V = cfgd["hidden_size"], cfgd["intermediate_size"], cfgd["vocab_size"]
    L, H = cfgd["num_hidden_layers"], cfgd["num_attention_heads"]
    hd = C // H
    kv = cfgd.get("num_key_value_heads", H) * hd
    n = L * (2 * C * H * hd + 2 * C * kv + 3 * C * F + 2 * C) + C + V * C
    return 6 * n + 6 * L * H * hd * seq, n


def timing(a, times_s):
    timed = sorted(times_s[1:] or times_s)
    med = timed[len(timed) // 2] if timed else None
    return med, (a.batch * a.seq / med if med else None)


# ---- the peers -------------------------------------------------------------------------


def gpt_peer(a, placement, cfg, env):
    """ferry-gpt train --engine CFG, its lines in run_ds.py's schema."""
    cmd = [a.gpt, "train", "--model", a.model_json, "--weights", a.weights, "--data", a.data,
           "--steps", str(a.steps), "--batch", str(a.batch), "--seq", str(a.seq), "--seed",
           str(a.seed), "--checkpoint", "--device", a.device, "--engine", cfg, "--json"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    for kv in engine_sets(a, placement):
        cmd += ["--set", kv]
    t0 = time.time()
    rc, out, dev_peak = run_child(cmd, env, a.timeout, a.device == "cuda")
    objs = objs_of(out)
    steps = [o for o in objs if "step" in o and "loss" in o and not o.get("final")]
    fin = next((o for o in objs if o.get("final")), None)
    if rc != 0 or fin is None or len(steps) != a.steps:
        return {"error": "ferry-gpt exited %s: %s" % (rc, "\n".join(out.splitlines()[-6:])),
                "command": " ".join(cmd)}, []
    lines = []
    for o in steps:
        tps = o.get("tokens_per_s")
        lines.append({"step": o["step"], "loss": o["loss"], "tokens_per_s": tps,
                      "ms": a.batch * a.seq / tps * 1e3 if tps else None})
    times = [ln["ms"] / 1e3 for ln in lines if ln["ms"]]
    med, tps = timing(a, times)
    fpt, n = flops_of_config(a.cfgd, a.seq)
    res = {"tokens_per_s": tps, "model_tflops": fpt * tps / 1e12 if tps else None,
           "flops_per_token": fpt, "n_params": n, "median_step_ms": med * 1e3 if med else None,
           "losses": [o["loss"] for o in steps],
           "peak_bytes": (fin.get("tier_peak") or {}).get("gpu"),
           "peak_device_used_bytes": dev_peak, "peak_rss_bytes": fin.get("rss_bytes"),
           "setup_s": fin.get("startup_seconds"), "wall_s": time.time() - t0,
           "tier_peak": fin.get("tier_peak"), "budget": fin.get("budget"),
           "dtype": "bf16 params, %s compute" % ("bf16" if a.device == "cuda" else "fp32"),
           "attn": "ferry", "command": " ".join(cmd)}
    return res, lines


def torch_peer_cmd(a, placement, cfg):
    cmd = [a.python, os.path.abspath(__file__), "--one", "ferry-torch", "--placement-one",
           placement, "--engine-cfg", cfg, "--model", a.model_json, "--weights", a.weights,
           "--data", a.data, "--batch", str(a.batch), "--seq", str(a.seq), "--steps",
           str(a.steps), "--seed", str(a.seed), "--device", a.device, "--attn", a.attn,
           "--threads", str(a.threads)]
    for kv in engine_sets(a, placement):
        cmd += ["--set-one", kv]
    return cmd


def ds_peer_cmd(a, placement, clip):
    cmd = [a.python, os.path.join(HERE, "deepspeed", "run_ds.py"), "--placement",
           PLACEMENTS[placement][2], "--model", a.model_json, "--weights", a.weights, "--data",
           a.data, "--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.steps),
           "--seed", str(a.seed), "--decay", "all", "--clip-grad-norm", str(clip),
           "--nvme-path", os.path.join(a.nvme_path, "ds")]
    return cmd + (["--wheels", a.wheels] if a.wheels else [])


def py_peer(a, cmd, env):
    """A python peer that prints the schema itself: its lines and final."""
    t0 = time.time()
    rc, out, dev_peak = run_child(cmd, env, a.timeout, a.device == "cuda")
    objs = objs_of(out)
    if rc == SKIP:
        sk = next((o for o in objs if o.get("skip")), {"reason": out.strip()[-300:]})
        return {"skip": True, "reason": sk.get("reason")}, []
    fin = next((o for o in objs if o.get("final")), None)
    if rc != 0 or fin is None:
        err = next((o["error"] for o in objs if "error" in o), None)
        return {"error": "exit %s: %s" % (rc, err or "\n".join(out.splitlines()[-6:])),
                "command": " ".join(cmd)}, [o for o in objs if "ds_build" in o]
    fin.setdefault("peak_device_used_bytes", dev_peak)
    fin["wall_s"] = time.time() - t0
    fin["command"] = " ".join(cmd)
    return fin, [o for o in objs if ("step" in o and not o.get("final")) or "ds_build" in o]


def summary(placement, finals):
    """Each peer's losses against ferry-gpt's, and ferry over DeepSpeed."""
    ref = (finals.get("ferry-gpt") or {}).get("losses")
    s = {"summary": True, "placement": placement, "loss_max_rel_diff": {},
         "tokens_per_s_vs_deepspeed": {}, "rss_vs_deepspeed": {}}
    ds = finals.get("deepspeed") or {}
    for peer, f in finals.items():
        if ref and f.get("losses") and peer != "ferry-gpt":
            n = min(len(ref), len(f["losses"]))
            s["loss_max_rel_diff"][peer] = max(abs(f["losses"][i] - ref[i]) / abs(ref[i])
                                               for i in range(n)) if n else None
        if peer != "deepspeed" and ds.get("tokens_per_s") and f.get("tokens_per_s"):
            s["tokens_per_s_vs_deepspeed"][peer] = f["tokens_per_s"] / ds["tokens_per_s"]
        if peer != "deepspeed" and ds.get("peak_rss_bytes") and f.get("peak_rss_bytes"):
            s["rss_vs_deepspeed"][peer] = f["peak_rss_bytes"] / ds["peak_rss_bytes"]
    return s


def save_init(a):
    """ferry-gpt's initial weights and config.json into WORK/init."""
    init = os.path.join(a.work, "init")
    cmd = [a.gpt, "train", "--model", a.model, "--data", a.data, "--steps", "0", "--batch", "1",
           "--seq", str(min(a.seq, a.cfgd["max_position_embeddings"])), "--seed", str(a.seed),
           "--save", init]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode or not os.path.isfile(os.path.join(init, "config.json")):
        tl.fail("cannot save the initial weights: %s: %s" % (" ".join(cmd), r.stdout[-600:]))
    return init


def drive(a):
    os.makedirs(a.work, exist_ok=True)
    a.cfgd = tl.config_dict(a.model)
    if a.seq > a.cfgd["max_position_embeddings"]:
        tl.fail("--seq %d is over the model's %d positions" % (
            a.seq, a.cfgd["max_position_embeddings"]), 2)
    if not a.weights:
        a.weights = save_init(a)
    a.model_json = os.path.join(a.weights, "config.json") \
        if os.path.isfile(os.path.join(a.weights, "config.json")) else a.model
    env = child_env(a)
    failed = False
    for placement in a.placements:
        cfg = os.path.join(a.root, "examples", "configs", PLACEMENTS[placement][0])
        clip = cfg_value(cfg, "clip_grad_norm", 0.0)
        finals = {}
        for peer in a.peers:
            head = {"peer": peer, "placement": placement}
            if peer == "ferry-gpt":
                fin, lines = gpt_peer(a, placement, cfg, env)
            elif peer == "ferry-torch":
                fin, lines = py_peer(a, torch_peer_cmd(a, placement, cfg), env)
            else:
                fin, lines = py_peer(a, ds_peer_cmd(a, placement, clip), env)
                # DeepSpeed leaves its swap files: the disk is the next run's
                shutil.rmtree(os.path.join(a.nvme_path, "ds"), ignore_errors=True)
            for ln in lines:
                emit(dict(head, **ln))
            if "error" in fin:
                failed = True
                emit(dict(head, **fin))
            elif fin.get("skip"):
                emit(dict(head, skip=True, reason=fin["reason"]))
            else:
                fin = dict(fin, final=True, peer=peer, placement=placement, steps=a.steps,
                           batch=a.batch, seq=a.seq, clip_grad_norm=clip, decay="all",
                           lr=3e-4, weight_decay=0.1, weights=a.weights,
                           checkpointing=True, engine_config=cfg if peer != "deepspeed"
                           else None)
                finals[peer] = fin
                emit(fin)
        emit(summary(placement, finals))
    return 1 if failed else 0


# ---- ferry.torch (the child: --one ferry-torch) --------------------------------------------


def move_buffers(model, dev):
    """The module's buffers (RoPE's inv_freq) onto dev; the params stay for ferry."""
    for m in model.modules():
        for k, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[k] = b.to(dev)


def torch_one(a):
    """One ferry.torch run: LlamaForCausalLM from the weights, fp32 on the
    host, handed to ferry.torch.initialize with the placement's config."""
    import types
    try:
        import torch
    except ImportError as e:
        tl.fail("cannot import torch: %s" % e)
    try:
        import ferry
        import ferry.torch as ft
    except Exception as e:  # noqa: BLE001 (the reason, whatever it is)
        tl.fail("cannot import ferry.torch (PYTHONPATH, FERRY_LIB): %s" % e)
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        tl.fail("--device cuda: torch %s sees no GPU" % torch.__version__)
    attn = a.attn
    if attn == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        attn = "eager"  # torch 1.13
    cfgd = tl.config_dict(a.model)
    sampler = tl.Sampler(tl.load_tokens(a.data, cfgd["vocab_size"]), a.seed)
    t_setup = time.time()
    ns = types.SimpleNamespace(attn=attn, weights=a.weights, checkpointing=True)
    model, tf_version = tl.build_model(torch, cfgd, ns, torch.float32, torch.device("cpu"))
    fpt, n_params = tl.flops_per_token(model, cfgd, a.seq)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
        move_buffers(model, dev)
    overrides = dict(kv.split("=", 1) for kv in a.set_one)
    eng = ft.initialize(model, ferry.Config(a.engine_cfg, overrides),
                        compute_dtype=None if cuda else torch.float32)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
    setup_s = time.time() - t_setup
    losses, times = [], []
    for step in range(1, a.steps + 1):
        x, y = sampler.batch(a.batch, a.seq)
        sync()
        t0 = time.perf_counter()
        loss = tl.lm_loss(torch, eng, x, y, dev)
        eng.backward(loss)
        eng.step()
        lv = float(loss.item())
        sync()
        dt = time.perf_counter() - t0
        losses.append(lv)
        times.append(dt)
        emit({"step": step, "loss": lv, "tokens_per_s": a.batch * a.seq / dt, "ms": dt * 1e3})
    med, tps = timing(a, times)
    st = eng.stats()
    tiers = st.get("tiers", {}) if isinstance(st, dict) else {}
    eng_gpu = (tiers.get("device") or {}).get("peak")
    fin = {"final": True, "tokens_per_s": tps, "model_tflops": fpt * tps / 1e12 if tps else None,
           "flops_per_token": fpt, "n_params": n_params,
           "median_step_ms": med * 1e3 if med else None, "losses": losses,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "engine_peak_bytes": eng_gpu, "setup_s": setup_s, "attn": attn,
           "dtype": "bf16 params, %s compute" % eng.compute_dtype, "torch": torch.__version__,
           "transformers": tf_version, "post_accumulate_grad_hook": ft._HAS_POST_ACC}
    if cuda:
        fin["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
        fin["peak_bytes"] = fin["torch_peak_bytes"] + (eng_gpu or 0)
        fin["gpu"] = torch.cuda.get_device_name(0)
    else:
        fin["peak_bytes"] = eng_gpu
    eng.close(restore=False)
    emit(fin)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="run_peers.py", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a preset (%s) or a Llama config.json" % ", ".join(tl.PRESETS))
    ap.add_argument("--weights", help="ferry-gpt --save DIR (default: saved into WORK/init)")
    ap.add_argument("--data", help="the training data, as ferry-gpt's --data")
    ap.add_argument("--placements", default=",".join(PLACEMENTS),
                    help="comma-separated (default: all three)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated (default: all)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                    help="ferry-torch's attention (sdpa falls back to eager without it)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads of ferry's peers")
    ap.add_argument("--gpt", default="ferry-gpt", help="the ferry-gpt program")
    ap.add_argument("--python", default=sys.executable,
                    help="the python of ferry-torch and deepspeed (torch, transformers)")
    ap.add_argument("--lib", help="libferry.so for ferry.torch (FERRY_LIB)")
    ap.add_argument("--wheels", help="run_ds.py's --wheels (default: its own)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine key for both ferry peers (budgets, ...)")
    ap.add_argument("--work", default="/tmp/ferry-peers", help="scratch (init/, nvme/)")
    ap.add_argument("--nvme-path", help="the NVMe folder (default WORK/nvme)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per peer run")
    # the ferry.torch child
    ap.add_argument("--one", choices=("ferry-torch",), help=argparse.SUPPRESS)
    ap.add_argument("--placement-one", help=argparse.SUPPRESS)
    ap.add_argument("--engine-cfg", help=argparse.SUPPRESS)
    ap.add_argument("--set-one", action="append", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if min(a.batch, a.seq) < 1 or a.steps < 1:
        ap.error("--batch, --seq and --steps must be positive")
    if not a.model or not a.data:
        ap.error("--model and --data are needed")
    if a.one:
        return torch_one(a)
    a.placements = [p.strip() for p in a.placements.split(",") if p.strip()]
    a.peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in a.placements if p not in PLACEMENTS] + \
        [p for p in a.peers if p not in PEERS]
    if bad or not a.placements or not a.peers:
        ap.error("unknown placement or peer %s (placements %s; peers %s)" % (
            bad, ", ".join(PLACEMENTS), ", ".join(PEERS)))
    a.root = find_root()
    # ferry.torch beside this file: the repository's python/, or the GPU
    # bundle's src/python (the one that matches its libferry.so)
    a.ferry_python = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    a.work = os.path.abspath(a.work)
    a.nvme_path = os.path.abspath(a.nvme_path or os.path.join(a.work, "nvme"))
    if shutil.which(a.gpt):
        a.gpt = shutil.which(a.gpt)
    return drive(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
