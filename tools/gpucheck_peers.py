#!/usr/bin/env python3
"""tools/gpucheck_peers.py — the GPU check's part peers (tools/gpucheck.py
runs it): ferry against DeepSpeed on the same GPU, through
bench/peers/run_peers.py. llama-1b at batch 4 x seq 2048 (8192 tokens a
step), then llama-2-7b where time and RAM are left, each in the offload
placements (ZeRO-Offload, ZeRO-3 CPU offload, ZeRO-Infinity on NVMe) by
three peers: ferry-gpt (its CUDA model, examples/configs/), ferry.torch
(transformers' LlamaForCausalLM under the GPU machine's torch) and DeepSpeed
0.19.8 (bench/peers/deepspeed/: the carried wheels and libaio, the configs
ds_*.json committed there; its CPU Adam and AIO ops built just in time by its
first run, the build's seconds in its figures), from the weights ferry-gpt
saves.

Resumable: each run's figures are appended to OUTDIR/peers.jsonl as soon
as it ends; a run already there (passed, or a skip) is not run again, so a
second check with the same OUTDIR (or GPUCHECK_PEERS_DONE naming a kept
peers.jsonl, copied in first) runs what is left. Failed runs are retried.

Without a GPU, `gpucheck_peers.py --host-smoke --gpt FERRY_GPT --lib
LIBFERRY --out DIR` runs the same driver on the CPU with llama-tiny (ctest
tools.gpucheck_peers): DIR/results.json with the runs and the rows.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import gpucheck as gc

GIB = 1 << 30
# model: (batch, seq, steps, placements); 8192 tokens a step (the issue's
# at least 8k); llama-2-7b: its optimizer state (16 bytes a param, 108 GB)
# fills a 128 GiB host, and on a 64 GiB disk NVMe cannot hold it
MODELS = (("llama-1b", 4, 2048, 20, ("offload", "zero3_cpu", "infinity")),
          ("llama-2-7b", 2, 4096, 10, ("offload", "zero3_cpu")))
SMOKE = (("llama-tiny", 2, 64, 3, ("offload", "zero3_cpu", "infinity")),)
PEERS = ("ferry-gpt", "ferry-torch", "deepspeed")
# the ferry peers' budgets per model and placement (tiers.gpu.budget holds
# ferry-gpt's activations and workspace too; host: 16 bytes a param of fp32
# master, grads and two states, and the bf16 params for zero3_cpu)
BUDGETS = {("llama-1b", "offload"): ("24G", "40G"), ("llama-1b", "zero3_cpu"): ("16G", "40G"),
           ("llama-1b", "infinity"): ("16G", "12G"),
           ("llama-2-7b", "offload"): ("48G", "112G"), ("llama-2-7b", "zero3_cpu"): ("24G", "112G")}
PARAMS = {"llama-1b": 1.1e9, "llama-2-7b": 6.74e9, "llama-tiny": 1e6}
MIN_RUN_S = 30  # no run starts with less left
RUN_CAP_S = 200  # one run's limit (DeepSpeed's first includes its op builds)
# the targets: tokens/s over DeepSpeed's, RSS ratio, losses
TARGETS = {"gpt_tokens": 1.5, "gpt_tokens_infinity": 2.0, "torch_tokens": 1.2, "rss": 0.5,
           "loss_rel": 2e-2}


# ---- figures (pure: the selftest covers them) ------------------------------------------


def run_key(model, placement, peer):
    return "%s/%s/%s" % (model, placement, peer)


def load_done(path):
    """{key: record} of the runs a peers.jsonl holds as done (pass or skip);
    a later line of the same key wins."""
    done = {}
    try:
        with open(path) as f:
            for line in f:
                o = gc.json_lines(line)
                if o and o[0].get("key") and o[0].get("status") in ("pass", "skip"):
                    done[o[0]["key"]] = o[0]
                elif o and o[0].get("key"):
                    done.pop(o[0]["key"], None)
    except OSError:
        pass
    return done


def record(key, rc, text, wall_s, command):
    """A run's record from run_peers.py's lines: status pass (a final line),
    skip (a skip line) or fail."""
    objs = gc.json_lines(text)
    fin = next((o for o in objs if o.get("final")), None)
    sk = next((o for o in objs if o.get("skip")), None)
    rec = {"key": key, "wall_s": round(wall_s, 3), "rc": rc, "command": command}
    if fin and rc == 0:
        rec.update(status="pass", final=fin)
    elif sk and rc == 0:
        rec.update(status="skip", reason=sk.get("reason"))
    else:
        err = next((o.get("error") for o in objs if o.get("error")), None)
        rec.update(status="fail", reason=err or gc.tail(text, 4) or "exit %s" % rc)
    builds = [o["ds_build"] for o in objs if "ds_build" in o]
    if builds:
        rec["ds_build"] = builds[-1]
    return rec


def rows_of(runs, model, placement):
    """ferry over DeepSpeed for one model and placement: tokens/s, RSS and
    the losses' max relative difference."""
    f = {p: (runs.get(run_key(model, placement, p)) or {}).get("final") or {} for p in PEERS}
    ds = f["deepspeed"]

    def ratio(a, b):
        return a / b if a and b else None
    out = {"model": model, "placement": placement}
    for p in ("ferry-gpt", "ferry-torch"):
        out[p] = {"tokens_per_s_vs_deepspeed": ratio(f[p].get("tokens_per_s"),
                                                     ds.get("tokens_per_s")),
                  "rss_vs_deepspeed": ratio(f[p].get("peak_rss_bytes"), ds.get("peak_rss_bytes")),
                  "loss_max_rel_diff_vs_deepspeed": gc.max_rel_diff(f[p].get("losses") or [],
                                                                    ds.get("losses") or [])}
    return out


def summary_rows(fig, target):
    """The part's rows of the check's summary (target: gpucheck.target)."""
    rows = []
    got = {(r["model"], r["placement"]): r for r in fig.get("rows", [])}
    model, placements = MODELS[0][0], MODELS[0][4]
    for pl in placements:
        r = got.get((model, pl)) or rows_of({}, model, pl)
        g, t = r["ferry-gpt"], r["ferry-torch"]
        name = "peers %s %s: " % (model, pl)
        rows += [target(name + "tokens/s ferry-gpt / DeepSpeed", g["tokens_per_s_vs_deepspeed"],
                        TARGETS["gpt_tokens_infinity" if pl == "infinity" else "gpt_tokens"],
                        "min"),
                 target(name + "tokens/s ferry.torch / DeepSpeed",
                        t["tokens_per_s_vs_deepspeed"], TARGETS["torch_tokens"], "min"),
                 target(name + "peak host RSS ferry-gpt / DeepSpeed", g["rss_vs_deepspeed"],
                        TARGETS["rss"], "max"),
                 target(name + "losses ferry-gpt vs DeepSpeed, max relative difference",
                        g["loss_max_rel_diff_vs_deepspeed"], TARGETS["loss_rel"], "max"),
                 target(name + "losses ferry.torch vs DeepSpeed, max relative difference",
                        t["loss_max_rel_diff_vs_deepspeed"], TARGETS["loss_rel"], "max")]
    return rows


def ram_needed(model):
    """Host bytes the model's optimizer state and master need (16 bytes a
    param) plus 8 GiB for the rest."""
    return int(16 * PARAMS.get(model, 0) + 8 * GIB)


def ram_available():
    """The RAM the runs are chosen against: GPUCHECK_RAM_AVAILABLE (bytes)
    when set, the GPU machine's in a rehearsal, else MemAvailable."""
    if os.environ.get("GPUCHECK_RAM_AVAILABLE"):
        return int(os.environ["GPUCHECK_RAM_AVAILABLE"])
    if gc.gpucheck_rehearse.ON:
        return gc.gpucheck_rehearse.GPU_HOST_RAM
    return gc.gpucheck_13b.read_meminfo().get("MemAvailable")


# ---- the driver -------------------------------------------------------------------------


class Mode:
    """What differs between the GPU run and the host smoke."""

    def __init__(self, gpu, root, out, gpt, lib, python, env=None, models=MODELS):
        self.gpu, self.root, self.out = gpu, root, out
        self.gpt, self.lib, self.python, self.env = gpt, lib, python, env
        self.models = models
        self.device = "cuda" if gpu else "cpu"
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.done_path = os.path.join(out, "peers.jsonl")
        self.data = os.path.join(root, "docs", "FERRY-GPT.md")
        self.runner = runner_script(root)
        # prepare.sh's wheels and libaio: carried beside the bundle, not in it
        self.wheels = os.path.join(root, "bench", "peers", "deepspeed", "wheels")


def runner_script(root):
    """run_peers.py: the bundle's copy (beside the python tests' binding),
    else the repository's."""
    for p in (os.path.join(root, "gpucheck", "src", "bench", "peers", "run_peers.py"),
              os.path.join(root, "bench", "peers", "run_peers.py")):
        if os.path.isfile(p):
            return p
    return None


def save_init(mode, model, seq, limit):
    init = os.path.join(mode.out, "peers-init-" + model)
    if os.path.isfile(os.path.join(init, "model.safetensors")):
        return init, None
    cmd = [mode.gpt, "train", "--model", model, "--data", mode.data, "--steps", "0", "--batch",
           "1", "--seq", str(seq), "--save", init]
    r = gc.run_cmd(cmd, limit, env=mode.env, log=os.path.join(mode.logs, "peers-init-%s.log"
                                                               % model))
    if r["rc"] != 0:
        return None, "ferry-gpt could not save %s's weights: %s" % (model, gc.tail(r["output"], 3))
    return init, None


def one_run(mode, model, init, batch, seq, steps, placement, peer, limit):
    budget = BUDGETS.get((model, placement))
    cmd = [sys.executable, mode.runner, "--model", os.path.join(init, "config.json"),
           "--weights", init, "--data", mode.data, "--placements", placement, "--peers", peer,
           "--batch", str(batch), "--seq", str(seq), "--steps", str(steps), "--device",
           mode.device, "--gpt", mode.gpt, "--python", mode.python or sys.executable,
           "--work", os.path.join(mode.out, "peers-work"), "--timeout", str(int(limit - 5))]
    if mode.lib:
        cmd += ["--lib", mode.lib]
    if os.path.isdir(mode.wheels):
        cmd += ["--wheels", mode.wheels]
    if budget and mode.gpu:
        cmd += ["--set", "tiers.gpu.budget=" + budget[0], "--set", "tiers.host.budget=" + budget[1]]
    if not mode.gpu:
        cmd += ["--threads", "1"]
    key = run_key(model, placement, peer)
    r = gc.run_cmd(cmd, limit, env=mode.env, cwd=mode.root,
                   log=os.path.join(mode.logs, "peers-%s.log" % key.replace("/", "-")))
    return record(key, r["rc"], r["output"], r["wall_s"], " ".join(cmd))


def drive(mode, deadline, progress=None):
    """Every (model, placement, peer) not done yet, in order, each appended
    to peers.jsonl as it ends. Returns (figures, reasons it failed)."""
    note = progress or (lambda fig, what: None)
    seed = os.environ.get("GPUCHECK_PEERS_DONE")
    if seed and os.path.isfile(seed) and not os.path.exists(mode.done_path):
        shutil.copy(seed, mode.done_path)
    done = load_done(mode.done_path)
    fig = {"device": mode.device, "python": mode.python, "runner": mode.runner, "runs": {},
           "done_before": sorted(done), "not_run": [], "targets": TARGETS}
    why = []
    if not mode.runner:
        return fig, ["bench/peers/run_peers.py is neither in the bundle nor the repository"]
    for model, batch, seq, steps, placements in mode.models:
        keys = [run_key(model, pl, p) for pl in placements for p in PEERS]
        if all(k in done for k in keys):
            fig["runs"].update({k: done[k] for k in keys})
            continue
        mem = ram_available() if mode.gpu else None
        if mem is not None and mem < ram_needed(model):
            fig["not_run"].append({"model": model, "why": "%.0f GiB of RAM available, %.0f "
                                   "needed" % (mem / GIB, ram_needed(model) / GIB)})
            continue
        init, err = save_init(mode, model, seq, max(deadline - time.time() - MIN_RUN_S, 5))
        if err:
            why.append(err)
            continue
        for pl in placements:
            for peer in PEERS:
                key = run_key(model, pl, peer)
                if key in done:
                    fig["runs"][key] = done[key]
                    continue
                if mode.gpu and not mode.python and peer != "ferry-gpt":
                    fig["not_run"].append({"key": key, "why": "no python whose torch sees "
                                           "the GPU and imports transformers (probes)"})
                    why.append("%s: no python with torch on the GPU and transformers" % key)
                    continue
                left = deadline - time.time()
                if left < MIN_RUN_S:
                    fig["not_run"].append({"key": key, "why": "out of the part's time: a "
                                           "rerun goes on from here"})
                    continue
                rec = one_run(mode, model, init, batch, seq, steps, pl, peer,
                              min(left, RUN_CAP_S))
                with open(mode.done_path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                fig["runs"][key] = rec
                if rec["status"] == "fail":
                    why.append("%s: %s" % (key, str(rec["reason"])[-300:]))
                note(fig, key + " ended")
    fig["rows"] = [rows_of(fig["runs"], m, pl) for m, _, _, _, pls in mode.models for pl in pls]
    if not why:
        why += first_model_not_run(fig["not_run"], mode.models[0][0])
    return fig, why


def first_model_not_run(not_run, first):
    """The reason the part fails when the first model's runs did not all
    run: out of time (a rerun goes on), or the RAM (its not_run entry names
    the model) - a part that ran nothing never passes."""
    ram = [n for n in not_run if n.get("model") == first]
    if ram:
        return ["%s not run: %s" % (first, ram[0]["why"])]
    if first in {n.get("key", "").split("/")[0] for n in not_run}:
        return ["out of time before every %s run ended: rerun to go on" % first]
    return []


# ---- the part ----------------------------------------------------------------------------


def peers_part(ck):
    """Runs the part on gpucheck's Check ck and records it."""
    if ck.gpu_skip("peers") or ck.time_skip("peers", 60):
        return
    t0 = time.time()
    deadline = t0 + ck.allow("peers")
    python, probes = ck.gpu_python(("transformers", "safetensors"))
    mode = Mode(True, ck.root, ck.out, ck.prog("ferry-gpt"),
                os.path.join(ck.bundle, "lib", "libferry.so"), python, env=ck.env)
    mode.runner = runner_script(ck.root) if not os.path.isfile(os.path.join(
        ck.bundle, "src/bench/peers/run_peers.py")) else os.path.join(
        ck.bundle, "src/bench/peers/run_peers.py")

    def progress(fig, what):
        ck.res.part("peers", "running", "", time.time() - t0, fig, log="logs/peers-*.log",
                    reason="running: " + what, quiet=True)

    fig, why = drive(mode, deadline, progress)
    fig["probes"] = probes
    ck.res.part("peers", "fail" if why else "pass", mode.runner or "", time.time() - t0, fig,
                log="logs/peers-*.log", reason="; ".join(why) or None)


def host_smoke(a):
    """The driver on the CPU with llama-tiny: results.json with the runs and rows."""
    os.makedirs(a.out, exist_ok=True)
    mode = Mode(False, os.path.abspath(a.root), os.path.abspath(a.out), os.path.abspath(a.gpt),
                os.path.abspath(a.lib), a.python, models=SMOKE)
    t0 = time.time()
    fig, why = drive(mode, t0 + a.budget)
    doc = {"part": "peers", "mode": "host-smoke", "status": "fail" if why else "pass",
           "reason": "; ".join(why) or None, "wall_s": round(time.time() - t0, 3),
           "figures": fig, "summary": summary_rows(fig, gc.target)}
    with open(os.path.join(mode.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("gpucheck_peers host smoke: %s in %.1f s%s" % (
        doc["status"], doc["wall_s"], "  (" + doc["reason"] + ")" if why else ""))
    return 0 if not why else 1


# ---- self test (gpucheck.py selftest calls it) -------------------------------------------


def selftest():
    import tempfile
    fin = '{"final": true, "tokens_per_s": 300.0, "peak_rss_bytes": 40, "losses": [2.0, 1.0]}'
    r = record("m/offload/ferry-gpt", 0, 'noise\n{"step": 1}\n' + fin, 1.0, "x")
    assert r["status"] == "pass" and r["final"]["tokens_per_s"] == 300.0, r
    s = record("m/offload/deepspeed", 0, '{"skip": true, "reason": "no CUDA"}', 1.0, "x")
    assert s["status"] == "skip" and s["reason"] == "no CUDA", s
    e = record("k", 1, '{"ds_build": {"cpu_adam_s": 3}}\n{"error": "boom"}', 1.0, "x")
    assert e["status"] == "fail" and e["reason"] == "boom" and e["ds_build"]["cpu_adam_s"] == 3
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "peers.jsonl")
        with open(p, "w") as f:
            for rec in (r, s, e, dict(s, key="k", status="skip"), dict(e, key=s["key"])):
                f.write(json.dumps(rec) + "\n")
        done = load_done(p)
    assert sorted(done) == ["k", "m/offload/ferry-gpt"], sorted(done)  # a later fail undoes
    ds = {"final": {"tokens_per_s": 100.0, "peak_rss_bytes": 100, "losses": [2.0, 1.02]}}
    rows = rows_of({r["key"]: r, "m/offload/deepspeed": ds}, "m", "offload")
    g = rows["ferry-gpt"]
    assert g["tokens_per_s_vs_deepspeed"] == 3.0 and g["rss_vs_deepspeed"] == 0.4, g
    assert abs(g["loss_max_rel_diff_vs_deepspeed"] - 0.02 / 1.02) < 1e-12, g
    assert rows["ferry-torch"]["tokens_per_s_vs_deepspeed"] is None, rows
    rows = summary_rows({}, gc.target)
    assert len(rows) == 15 and all(x["met"] is None for x in rows), rows
    assert MODELS[0][1] * MODELS[0][2] >= 8192 and ram_needed("llama-1b") > 16 * 1.1e9
    ram = {"model": "llama-1b", "why": "20 GiB of RAM available, 25 needed"}
    assert first_model_not_run([ram], "llama-1b") == ["llama-1b not run: 20 GiB of RAM "
                                                      "available, 25 needed"]
    assert "out of time" in first_model_not_run([{"key": "llama-1b/offload/x"}], "llama-1b")[0]
    assert first_model_not_run([dict(ram, model="llama-2-7b")], "llama-1b") == []
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="gpucheck_peers.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-smoke", action="store_true", required=True,
                    help="run the part's driver on the CPU with llama-tiny")
    ap.add_argument("--gpt", required=True, help="ferry-gpt")
    ap.add_argument("--lib", required=True, help="libferry.so (ferry.torch's)")
    ap.add_argument("--python", default=os.environ.get("FERRY_PEER_PYTHON", "python3"),
                    help="ferry.torch's and DeepSpeed's python (default $FERRY_PEER_PYTHON)")
    ap.add_argument("--root", default=".", help="the repository")
    ap.add_argument("--out", default="build/gpucheck-peers-smoke")
    ap.add_argument("--budget", type=float, default=100, help="seconds for the whole smoke")
    return host_smoke(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
