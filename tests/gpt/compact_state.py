#!/usr/bin/python3
"""tests/gpt/compact_state.py — issue 22's end-to-end check of compact
optimizer state: `ferry-gpt train --model small` on
/usr/share/common-licenses/GPL-3 for 300 steps with the AdamW state on NVMe
(examples/configs/offload-nvme.cfg at a 128M host budget, the demo's
settings but --lr 6e-4: at the demo's 2e-3 the fp32 run's loss stops
falling after ~150 steps, its last 50-step window above the one before),
four times, one after the other:

  fp32      optimizer.state_dtype = fp32 (the reference)
  bf16      optimizer.state_dtype = bf16
  int8      optimizer.state_dtype = int8
  int8-m16  optimizer.state_dtype = int8, precision.master = bf16

Checks, for every run: no loss is NaN or infinite; the loss falls
throughout (the mean of each 50-step window is below the previous
window's); and the final loss (the mean of the last 10 steps, as one
step's loss is the loss of one batch) is within 2% of the fp32 run's for
bf16 and int8, within 3% for int8-m16. Prints each run's final loss, last
step's loss, seconds per step and the engine's optimizer bytes per param
and step (--stats-json optim_bytes_per_param).

The test gpt.compact_state runs the same checks on a CI-sized case
(--model tiny --steps 100 --seq 64, about 20 s of CPU); gpt.compact_state.full
(label slow, `./ferry.sh test --slow`) runs the full size above.

usage: compact_state.py --gpt FERRY-GPT --root REPO --work DIR
                        [--data FILE] [--steps N] [--runs fp32,bf16,...]
                        [--model NAME] [--batch N] [--seq N] [--lr LR]
                        [--json-out FILE]
exit: 0 pass, 1 a check failed, 2 usage or a run that did not start.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

WINDOW, FINAL = 50, 10
RUNS = {  # name: (--set values, final-loss tolerance against fp32)
    "fp32": ([], 0.0),  # the defaults: fp32 states, fp32 master
    "bf16": (["optimizer.state_dtype=bf16"], 0.02),
    "int8": (["optimizer.state_dtype=int8"], 0.02),
    "int8-m16": (["optimizer.state_dtype=int8", "precision.master=bf16"], 0.03),
}


def fail(msg):
    print("compact_state: FAIL: " + msg, flush=True)
    return 1


def run(a, name):
    """One training run; its stats (the --stats-json object) and wall seconds."""
    stats = os.path.join(a.work, name + ".stats.json")
    cmd = [a.gpt, "train", "--model", a.model, "--data", a.data, "--engine",
           os.path.join(a.root, "examples/configs/offload-nvme.cfg"),
           "--set", "tiers.host.budget=128M", "--steps", str(a.steps), "--batch", str(a.batch),
           "--seq", str(a.seq), "--lr", a.lr, "--seed", "1", "--stats-json", stats]
    for kv in RUNS[name][0]:
        cmd += ["--set", kv]
    print("compact_state: " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=a.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    secs = time.monotonic() - t0
    if p.returncode != 0:
        print(p.stdout[-2000:] + p.stderr[-4000:])
        print("compact_state: %s: ferry-gpt exited %d" % (name, p.returncode))
        sys.exit(2)
    with open(stats) as f:
        return json.load(f), secs


def check(name, losses, steps):
    """Returns the failures of one run's loss curve."""
    bad = 0
    if len(losses) != steps:
        bad += fail("%s: %d losses for %d steps" % (name, len(losses), steps))
    nonfinite = [i + 1 for i, x in enumerate(losses) if not math.isfinite(x)]
    if nonfinite:
        return bad + fail("%s: loss not finite at steps %s" % (name, nonfinite[:10]))
    means = [sum(losses[i:i + WINDOW]) / WINDOW for i in range(0, len(losses) - WINDOW + 1, WINDOW)]
    print("compact_state: %s: %d-step window means %s" %
          (name, WINDOW, " ".join("%.4f" % m for m in means)), flush=True)
    for i in range(1, len(means)):
        if not means[i] < means[i - 1]:
            bad += fail("%s: window %d (steps %d-%d) mean %.4f not below the previous %.4f" %
                        (name, i + 1, i * WINDOW + 1, (i + 1) * WINDOW, means[i], means[i - 1]))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--runs", default="fp32,bf16,int8,int8-m16")
    ap.add_argument("--lr", default="6e-4")
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    names = a.runs.split(",")
    if any(n not in RUNS for n in names) or "fp32" not in names:
        print("compact_state: --runs: names from %s, fp32 among them" % ",".join(RUNS))
        return 2
    if a.steps < 2 * WINDOW:
        print("compact_state: --steps: at least %d" % (2 * WINDOW))
        return 2
    if not os.access(a.data, os.R_OK):
        print("compact_state: %s: not readable" % a.data)
        return 2
    os.makedirs(os.path.join(a.work, "build"), exist_ok=True)
    bad, res = 0, {}
    for name in names:
        st, secs = run(a, name)
        losses = [float(x) for x in st["losses"]]
        bad += check(name, losses, a.steps)
        final = sum(losses[-FINAL:]) / FINAL
        res[name] = {"final_loss": final, "last_loss": losses[-1], "first_loss": losses[0],
                     "seconds": secs, "seconds_per_step": secs / a.steps,
                     "optim_bytes_per_param": st.get("optim_bytes_per_param"),
                     "nvme_write_bytes_per_step": st["nvme_write_bytes_per_step"]["optimizer"],
                     "nvme_read_bytes_per_step": st["nvme_read_bytes_per_step"]["optimizer"]}
        print("compact_state: %-8s final loss %.4f (mean of the last %d; last %.4f, first %.4f), "
              "%.3f s/step, optimizer %s B/param/step, NVMe optimizer per step read %d, "
              "written %d" % (name, final, FINAL, losses[-1], losses[0], secs / a.steps,
                              res[name]["optim_bytes_per_param"],
                              res[name]["nvme_read_bytes_per_step"],
                              res[name]["nvme_write_bytes_per_step"]), flush=True)
    ref = res["fp32"]["final_loss"]
    for name in names:
        tol = RUNS[name][1]
        d = abs(res[name]["final_loss"] - ref) / ref
        res[name]["vs_fp32"] = d
        if name != "fp32":
            print("compact_state: %-8s final loss %.4f vs fp32 %.4f: %.2f%% (limit %.0f%%)" %
                  (name, res[name]["final_loss"], ref, 100 * d, 100 * tol))
            if d > tol:
                bad += fail("%s: final loss %.4f is %.2f%% from fp32's %.4f (limit %.0f%%)" %
                            (name, res[name]["final_loss"], 100 * d, ref, 100 * tol))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
    print("compact_state: %s" % ("FAILED" if bad else "passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
