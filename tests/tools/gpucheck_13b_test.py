#!/usr/bin/env python3
"""tests/tools/gpucheck_13b_test.py — the GPU check's part 13b without a GPU
(ctest tools.gpucheck_13b): tools/gpucheck_13b.py --host-smoke runs the
part's driver on the host backend with a tiny Llama, twice: on this
machine's RAM, then on a RAM just short of run 2's plan, so that run 2
drops layers. Checked: the plans (zero3-offload, the host budget passed to
ferry-gpt, the engine config ferry plan wrote), ferry-gpt's steps, losses and
RSS parsed, the timeline's per-step lanes, the figures, the streamed and
resident losses equal, and every summary row judged where the host backend
measures it. Last a run past its time limit: stopped by SIGINT, the steps it
gave and its timeline are still read.

  gpucheck_13b_test.py ROOT FERRY FERRY_GPT SCRATCH
"""
import json
import os
import shutil
import subprocess
import sys


def smoke(root, ferry, gpt, out, *extra):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(root, "tools/gpucheck_13b.py"), "--host-smoke",
           "--ferry", ferry, "--gpt", gpt, "--root", root, "--out", out, "--budget", "90"]
    r = subprocess.run(cmd + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=110)
    print(r.stdout)
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), r.returncode


def check_run(r, steps):
    p = r["plan"]
    assert r["ok"] and r["steps_done"] == steps and len(r["losses"]) == steps, r
    assert p["placement_keys"] == {"params": "host", "grads": "none", "optimizer": "host"}, p
    assert "--set tiers.host.budget=%d" % p["host_budget"] in r["command"], r["command"]
    assert p["host_budget"] >= p["host_bytes"] and p["rss_bytes"] > p["host_budget"], p
    assert os.path.isfile(p["config"]) and "--write-config" in p["commands"][-1], p
    assert r["timeline_steps"] == steps and len(r["per_step"]) == steps - 1, r
    for row in r["per_step"]:
        assert row["step_s"] > 0 and row["longest"] and row["ratio"] >= 1.0, row
        assert {"h2d", "cpu_adam"} <= set(row), row
    assert r["step_seconds"] > 0 and r["model_tflops"] > 0 and r["tokens_per_s"] > 0, r
    assert r["rss_bytes"] > 0 and r["startup_s"] is not None and r["startup_s"] >= 0, r
    assert r["device_peak_mib"] is None, r  # no nvidia-smi on the host backend


def cut(root, gpt, out):
    """A run past its limit: SIGINT at limit - grace, ferry-gpt ends the step
    in progress and writes the timeline; the figures hold the steps it gave."""
    sys.path.insert(0, os.path.join(root, "tools"))
    import gpucheck_13b as g
    tl = os.path.join(out, "cut.trace.json")
    cfg = os.path.join(out, "13b-run1.cfg")
    cmd = [gpt, "train", "--model", os.path.join(out, "13b-run1.model.json"), "--data",
           os.path.join(root, "docs/FERRY-GPT.md"), "--steps", "100000", "--batch", "2", "--seq",
           "64", "--device", "cpu", "--engine", cfg, "--json", "--set", "device=host",
           "--set", "tiers.host.pinned=false", "--set", "placement.params=host",
           "--set", "timeline=" + tl]
    res = g.run_stream(cmd, 6, os.path.join(out, "logs", "cut.log"), grace=3)
    assert res["interrupted"] and not res["killed"] and res["rc"] == 130, res["rc"]
    with open(tl) as f:
        trace = json.load(f)
    fig = g.run_figures(res, 128, 973184, trace, [], None, 100000)
    n = fig["steps_done"]
    assert 2 <= n < 100000 and not fig["ok"] and fig["step_seconds"] > 0, fig
    assert fig["timeline_steps"] >= n and len(fig["per_step"]) >= n - 1, fig
    assert fig["rss_bytes"] > 0 and fig["tail"], fig


def main(root, ferry, gpt, scratch):
    d, rc = smoke(root, ferry, gpt, os.path.join(scratch, "ram"))
    assert rc == 0 and d["status"] == "pass", d.get("reason")
    f = d["figures"]
    check_run(f["run1"], f["steps"])
    check_run(f["run2"], f["steps2"])
    with open(f["run1"]["plan"]["config"]) as cf:
        cfg = cf.read()
    for want in ('state_dtype = "int8"', 'master = "bf16"', 'clip_grad_norm = 0;'):
        assert want in cfg, (want, cfg)
    assert f["run2"]["model"] == "smoke-8" and f["run2"]["plan"]["layers"] == 8, f["run2"]
    assert f["profile1"]["profile"]["cpu_optimizer_gbps"] > 0, f["profile1"]
    assert "--profile" in f["run1"]["plan"]["commands"][-1], f["run1"]["plan"]
    pr = f["pair"]
    assert pr["steps_differing"] == 0 and pr["resident"]["losses"] == pr["streamed"]["losses"], pr
    rows = d["summary"]
    assert len(rows) == 11, rows
    unmeasured = [r["target"] for r in rows if r["met"] is None]
    assert all("device memory" in t for t in unmeasured) and len(unmeasured) == 2, unmeasured
    # a machine whose RAM holds run 1 but not all 8 layers of run 2
    short = int((f["run2"]["plan"]["rss_bytes"] - 1) / 0.9)
    d2, rc2 = smoke(root, ferry, gpt, os.path.join(scratch, "short"), "--host-mem", str(short))
    f2 = d2["figures"]
    L = f2["run2"]["plan"]["layers"]
    assert rc2 == 0 and 1 <= L < 8 and f2["run2"]["model"] == "smoke-8 (%d of 8 layers)" % L, f2
    tries = f2["run2"]["layer_tries"]
    assert tries[0] == {"layers": 8, "fits": False, "why": tries[0]["why"]}, tries
    assert "90% of the" in tries[0]["why"] and any(t["layers"] == L and t["fits"] for t in tries)
    check_run(f2["run2"], f2["steps2"])
    cut(root, gpt, os.path.join(scratch, "ram"))
    print("tools.gpucheck_13b: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
