#!/usr/bin/python3
"""tests/gpt/scaled_proof.py — issue 21's scaled proof on the host backend:
llama-100m (examples/gpt/configs/llama-100m.json, ~112M params) trained for
3 steps with examples/configs/zero-infinity.cfg (tiers.gpu.budget 32M,
tiers.host.budget 64M, params, grads and optimizer state on NVMe), against
the same 3 steps resident (examples/configs/resident.cfg, clipping off as in
zero-infinity.cfg). Checks:

  - the model states (16 bytes a parameter: bf16 params and grads, fp32
    master, exp_avg, exp_avg_sq) are >= 25x the host budget and >= 50x the
    device budget;
  - the per-step losses are bit-identical (the %.9g text of each fp32);
  - the engine's tier peaks are within their budgets;
  - the offloaded run's peak RSS (/usr/bin/time -v) is below a third of
    the model states, and within budgets + the trainer's activations and
    scratch + 64 MiB.

With --bench it also asks `ferry plan` for the same model and budgets and
prints (and with --json-out writes) the measured NVMe bytes per step per
family and direction beside the planner's prediction, with the error, which
must be within 5% each.

usage: scaled_proof.py --gpt FERRY-GPT --ferry FERRY --root REPO --work DIR
                       [--bench] [--json-out FILE] [--steps N]
exit: 0 pass, 1 a check failed, 2 usage or a run that did not start.
"""
import argparse
import json
import os
import re
import subprocess
import sys

MIB = 1 << 20
BATCH, SEQ, SEED = 1, 64, 1
FAMILIES = ("params", "grads", "optimizer")


def fail(msg):
    print("scaled_proof: FAIL: " + msg)
    sys.exit(1)


def make_data(path):
    """Deterministic uint16 tokens below the model's vocab (4096)."""
    ids = [(i * i * 7 + i * 13) % 4096 for i in range(16384)]
    with open(path, "wb") as f:
        f.write(b"".join(int(t).to_bytes(2, "little") for t in ids))


def run_gpt(a, name, cfg, extra):
    """One ferry-gpt run under /usr/bin/time -v; (stats, peak RSS bytes)."""
    stats = os.path.join(a.work, name + ".stats.json")
    cmd = ["/usr/bin/time", "-v", a.gpt, "train", "--model",
           os.path.join(a.root, "examples/gpt/configs/llama-100m.json"), "--data",
           os.path.join(a.work, "tokens.u16"), "--steps", str(a.steps), "--batch", str(BATCH),
           "--seq", str(SEQ), "--seed", str(SEED), "--engine",
           os.path.join(a.root, "examples/configs", cfg), "--stats-json", stats] + extra
    print("scaled_proof: " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=a.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr)
        print("scaled_proof: %s: ferry-gpt exited %d" % (name, p.returncode))
        sys.exit(2)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    if not m:
        fail("%s: no 'Maximum resident set size' from /usr/bin/time -v" % name)
    with open(stats) as f:
        return json.load(f), int(m.group(1)) * 1024


def plan_json(a, nparams_hint):
    cmd = [a.ferry, "plan", "--model", os.path.join(a.root, "examples/gpt/configs/llama-100m.json"),
           "--device", "host", "--gpu-budget", "32M", "--host-budget", "64M", "--nvme", "1T",
           "--batch", str(BATCH), "--seq", str(SEQ), "--chunk-size", "4M", "--json"]
    print("scaled_proof: " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1):
        sys.stdout.write(p.stderr)
        fail("ferry plan exited %d" % p.returncode)
    j = json.loads(p.stdout)
    for c in j.get("candidates", []):
        if c.get("name") == "zero-infinity" or c.get("placement") == "zero-infinity":
            return j, c
    fail("ferry plan --json has no zero-infinity candidate")


def check_model(a, stats, nparams):
    states = 16 * nparams
    host_b, gpu_b = 64 * MIB, 32 * MIB
    print("scaled_proof: %d params, model states %.1f MiB = %.1fx the host budget, %.1fx the "
          "device budget" % (nparams, states / MIB, states / host_b, states / gpu_b))
    if states < 25 * host_b or states < 50 * gpu_b:
        fail("model states %.1f MiB are not 25x the host budget and 50x the device budget"
             % (states / MIB))
    return states


def check_peaks(stats):
    for t in ("gpu", "host"):
        peak, budget = stats["tier_peak"][t], stats["budget"][t]
        print("scaled_proof: %s tier peak %.1f MiB of %.1f MiB" % (t, peak / MIB, budget / MIB))
        if peak > budget:
            fail("%s tier peak %d above its budget %d" % (t, peak, budget))


def check_rss(stats, rss, states):
    allowed = 32 * MIB + 64 * MIB + stats["activation_bytes"] + stats["scratch_bytes"] + 64 * MIB
    print("scaled_proof: peak RSS %.1f MiB (/usr/bin/time -v); a third of the model states "
          "%.1f MiB; budgets + activations %.1f + scratch %.1f + 64 MiB = %.1f MiB"
          % (rss / MIB, states / 3 / MIB, stats["activation_bytes"] / MIB,
             stats["scratch_bytes"] / MIB, allowed / MIB))
    if rss >= states / 3:
        fail("peak RSS %.1f MiB is not below a third of the model states" % (rss / MIB))
    if rss > allowed:
        fail("peak RSS %.1f MiB above the prediction %.1f MiB" % (rss / MIB, allowed / MIB))


def compare_nvme(a, stats, nparams):
    _, cand = plan_json(a, nparams)
    pred = cand["nvme_bytes_per_step"]
    rows = []
    for d, key in (("read", "nvme_read_bytes_per_step"), ("write", "nvme_write_bytes_per_step")):
        for f in FAMILIES:
            m, p = stats[key][f], pred[d][f]
            err = (m - p) / p if p else (0.0 if m == 0 else float("inf"))
            rows.append({"direction": d, "family": f, "measured": m, "predicted": p,
                         "error": err})
            print("scaled_proof: nvme %-5s %-9s measured %10.1f MiB/step, plan %10.1f MiB/step, "
                  "error %+.1f%%" % (d, f, m / MIB, p / MIB, 100 * err))
    bad = [r for r in rows if abs(r["error"]) > 0.05]
    if bad:
        fail("NVMe bytes per step off the plan by more than 5%%: %s" % bad)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    for k in ("gpt", "ferry", "root", "work"):  # the runs happen in the work folder
        setattr(a, k, os.path.abspath(getattr(a, k)))
    os.makedirs(a.work, exist_ok=True)
    make_data(os.path.join(a.work, "tokens.u16"))
    res, _ = run_gpt(a, "resident", "resident.cfg", ["--set", "clip_grad_norm=0"])
    off, rss = run_gpt(a, "zero_infinity", "zero-infinity.cfg", [])
    nparams = off["params"] if "params" in off else res.get("params", 0)
    if not nparams:
        fail("--stats-json has no params count")
    states = check_model(a, off, nparams)
    if len(off["losses"]) != a.steps or off["losses"] != res["losses"]:
        fail("losses differ:\n  resident      %s\n  zero-infinity %s" % (res["losses"],
                                                                       off["losses"]))
    print("scaled_proof: losses bit-identical: %s" % off["losses"])
    check_peaks(off)
    check_rss(off, rss, states)
    out = {"params": nparams, "model_state_bytes": states, "peak_rss_bytes": rss,
           "losses": off["losses"], "tier_peak": off["tier_peak"], "budget": off["budget"]}
    if a.bench:
        out["nvme_per_step"] = compare_nvme(a, off, nparams)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    print("scaled_proof: pass")


if __name__ == "__main__":
    main()
