#!/usr/bin/env python3
"""tests/cli/family_bytes.py — the planner's NVMe bytes per step of each
family against the engine's, through ferry-gpt as a user runs it.

A Llama config.json with 24 thin blocks (26 groups: one group is 4% of the
params, so a group more or less cached shows as less than 5%) trains
through examples/configs/zero-infinity.cfg on the host backend (params,
grads "none" and the optimizer on NVMe) at the planner's minimum budgets
(the zero-infinity candidate's device and host tiers) and at twice its
host budget, for each optimizer layout: fp32 states, int8 states, a bf16
master (fp32 states) and int8 states with a bf16 master. The engine's
bytes per step (ferry-gpt --json: nvme_read_bytes / nvme_write_bytes per
family, the mean of the steps after the second) must be within 5% (--tol)
of `ferry plan`'s nvme_bytes_per_step at the same budgets, for every family
and direction, the params' reads within --tol-reads (a measured 0 against
a plan below 5% of the params' bytes passes); each step's param reads are
printed beside. The
engine caps the params cached in the host pool at the plan's room
(ferry_mem_cap), so the same groups stay at each turn of the loop run after
run: at the minimum, with a bf16 master, the loop fetches while at most
one group waits for the stepper to stage its params from their host copy
(further ahead, the groups kept for it were evicted and read again). The
planner packs each group's chunks by the engine's rule (core/pack.h) and
counts the tail of the group the cap keeps in part at each turn: over six
runs (three of them side by side), each layout read the params within 0.6%
of the plan at both budgets, and every other family and direction was
within 1.3% (a write-back landing in the step before or after).
With --np N (N > 1) the same runs under `mpirun -np N` (dist.zero_stage
--stage, default 2: each rank's optimizer state, and from stage 2 its
grads, are its pieces of each group), each rank's bytes per step against
`ferry plan --gpus N --zero-stage S --rank 0` for rank 0 (ferry-gpt's
other ranks print no steps; tests/plan/test_ranks.c holds every rank's
homes byte for byte); exit 77 when mpirun is missing. The grads' NVMe
accumulators (ranks average into them) are read back by the step except
the groups still in the host pool, which the plan does not model yet:
--print-grad-reads prints their reads without holding them.
H2D and D2H per step are printed beside the plan's (the host backend
counts the memory manager's copies only: no D2H of drained grads). Also
printed: the swap files against their data, ferry-gpt's model states line
and the step time, planned and measured (--check-extra: the files within
1.05 x the data and the line's total the engine's homes).

usage: family_bytes.py --gpt FERRY-GPT --ferry FERRY --root REPO --work DIR
                       [--model config.json] [--steps N] [--chunk SIZE]
                       [--layouts fp32,int8,bf16m,int8m] [--factors 1,2] [--tol 0.05]
                       [--tol-reads 0.05] [--skip N] [--check-extra] [--profile FILE]
                       [--json-out FILE] [--np N] [--stage S]
exit: 0 pass, 1 a family off by more than the tolerance, 2 a run that failed,
77 --np without mpirun.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

FAMILIES = ("params", "grads", "optimizer")
MODEL = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 24, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 2048, "tie_word_embeddings": False, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "hidden_act": "silu"}
# mpirun as the CTest mpirun tests run it (tests/CMakeLists.txt, FERRY_MPI_ENV)
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
           "OMPI_MCA_mpi_yield_when_idle": "1"}  # two ranks on busy cores: no spinning
# The params' reads are held to --tol-reads, the other families to --tol.
# name: (ferry plan flags, ferry-gpt --set keys)
LAYOUTS = {
    "fp32": ([], []),
    "int8": (["--state-dtype", "int8"], ["optimizer.state_dtype=int8"]),
    "bf16m": (["--master", "bf16"], ["precision.master=bf16"]),
    "int8m": (["--state-dtype", "int8", "--master", "bf16"],
              ["optimizer.state_dtype=int8", "precision.master=bf16"]),
}


def run(cmd, what, cwd=None):
    """stdout and stderr of a command that must succeed (ferry plan: or find
    nothing that fits, exit 1)."""
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1) or (p.returncode == 1 and "plan" not in cmd[1:2]):
        sys.stdout.write(p.stderr)
        print("family_bytes: %s exited %d: %s" % (what, p.returncode, " ".join(cmd)))
        sys.exit(2)
    return p.stdout, p.stderr


def ranks(a):
    """--np (1 for callers whose arguments lack it: tests/cli/min_budget_runs.py)."""
    return getattr(a, "np", 1)


def plan(a, layout, gpu, host, rank=None):
    """The plan's JSON and its zero-infinity candidate (with ranks: rank
    `rank`'s, or by default per family the rank with the most)."""
    cmd = [a.ferry, "plan", "--model", a.model, "--device", "host", "--gpu-budget", str(gpu),
           "--host-budget", str(host), "--nvme", "1T", "--batch", "1", "--seq", str(a.seq),
           "--chunk-size", a.chunk, "--checkpointing", "off", "--json"] + LAYOUTS[layout][0] + \
        (["--profile", a.profile] if a.profile else [])
    if ranks(a) > 1:
        cmd += ["--gpus", str(a.np), "--zero-stage", str(a.stage)]
        if rank is not None:
            cmd += ["--rank", str(rank)]
    j = json.loads(run(cmd, "ferry plan")[0])
    for c in j["candidates"]:
        if c["placement"] == "zero-infinity":
            return j, c
    print("family_bytes: no zero-infinity candidate")
    sys.exit(2)


def train_process(a, layout, gpu, host, extra_sets=()):
    """ferry-gpt trains the model at these budgets in this layout (and
    extra_sets, more --set KEY=VALUE): the finished process, stdout and
    stderr as text, whatever its exit."""
    sets = ["chunk_size=" + a.chunk, "tiers.gpu.budget=%d" % gpu, "tiers.host.budget=%d" % host,
            "tiers.nvme.paths=[\"%s\"]" % os.path.join(a.work, "swap"),
            "tiers.nvme.verify=none"] + LAYOUTS[layout][1] + list(extra_sets)
    cmd = [a.gpt, "train", "--model", a.model, "--data", a.data, "--steps", str(a.steps),
           "--batch", "1", "--seq", str(a.seq), "--seed", "1", "--json", "--engine",
           os.path.join(a.root, "examples/configs/zero-infinity.cfg")]
    env = None
    if ranks(a) > 1:  # each rank's lines tagged "[1,R]<stdout>:"
        sets.append("dist.zero_stage=%d" % a.stage)
        cmd = [a.mpirun, "--oversubscribe", "--tag-output", "-np", str(a.np)] + cmd
        env = dict(os.environ, **MPI_ENV)
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=a.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)


def rank_lines(text, rank, np):
    """Rank `rank`'s lines of an mpirun --tag-output text (all of it alone)."""
    if np <= 1:
        return text
    tag = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:")
    out = []
    for line in text.splitlines():
        m = tag.match(line)
        if m and int(m.group(1)) == rank:  # a line written in pieces is tagged inside too
            out.append(re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", line[m.end():]))
    return "\n".join(out)


def train(a, layout, gpu, host, rank=0):
    """Rank `rank`'s steps after --skip, its final line and its model states
    line."""
    p = train_process(a, layout, gpu, host)
    if p.returncode:
        sys.stdout.write(p.stderr)
        print("family_bytes: ferry-gpt exited %d: %s" % (p.returncode, " ".join(p.args)))
        sys.exit(2)
    out, info = rank_lines(p.stdout, rank, ranks(a)), rank_lines(p.stderr, rank, ranks(a))
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    steps = [l for l in lines if "step" in l and not l.get("final")]
    final = [l for l in lines if l.get("final")]
    if len(steps) != a.steps or not final or a.steps <= a.skip:
        print("family_bytes: ferry-gpt ran %d of %d steps" % (len(steps), a.steps))
        sys.exit(2)
    m = re.search(r"model states ([0-9.]+) MiB \(([0-9.]+) bytes/param\)[^\n]*", info)
    return steps[a.skip:], final[0], m


def check(a, layout, factor, base):
    gpu, host = base["tiers"]["gpu"]["bytes"], int(base["tiers"]["host"]["bytes"] * factor)
    # with ranks: rank 0's (ferry-gpt's other ranks print no steps)
    _, c = plan(a, layout, gpu, host, 0 if ranks(a) > 1 else None)
    steps, final, states = train(a, layout, gpu, host)
    if ranks(a) > 1:
        layout = "%s r0" % layout
    pf = c["tiers"]["nvme"]["families"]["params"] or 1
    bad = []
    rows = []
    for d, key in (("read", "nvme_read_bytes"), ("write", "nvme_write_bytes")):
        for f in FAMILIES:
            m = sum(s[key][f] for s in steps) / len(steps)
            p = c["nvme_bytes_per_step"][d][f]
            err = (p - m) / m if m else (0.0 if p < a.tol * pf else float("inf"))
            ok = abs(err) <= (a.tol_reads if (d, f) == ("read", "params") else a.tol)
            if (d, f) == ("read", "grads") and getattr(a, "print_grad_reads", False):
                ok = True  # printed only: see --print-grad-reads
            rows.append({"layout": layout, "host_x": factor, "direction": d, "family": f,
                         "measured": m, "planned": p, "error": err})
            if m or p:
                print("family_bytes: %-5s host x%d %-5s %-9s engine %12.0f plan %12.0f %+6.1f%%%s"
                      % (layout, factor, d, f, m, p, 100 * err, "" if ok else "  FAIL"))
            if not ok:
                bad.append("%s x%d %s %s" % (layout, factor, d, f))
    # the same groups cached at each step: printed (a step of a run on a busy
    # machine may still read a few groups more; the mean above is held)
    reads = [s["nvme_read_bytes"]["params"] for s in steps]
    mean = sum(reads) / len(reads)
    print("family_bytes: %-5s host x%d param reads per step %d to %d (%.1f%% of the mean)"
          % (layout, factor, min(reads), max(reads),
             100 * (max(reads) - min(reads)) / mean if mean else 0.0))
    n = a.steps
    bm = final.get("bytes_moved", {})
    print("family_bytes: %-5s host x%d h2d %.0f/step (engine, all %d steps and set-up) plan %.0f; "
          "d2h %.0f plan %.0f" % (layout, factor, bm.get("h2d", 0) / n, n,
                                  c["traffic_bytes"]["h2d"], bm.get("d2h", 0) / n,
                                  c["traffic_bytes"]["d2h"]))
    bad += extras(a, layout, factor, c, steps, final, states)
    return bad, rows


def extras(a, layout, factor, c, steps, final, states):
    """The swap files against their data, the model states line against the
    engine's homes (all on NVMe here: its data bytes) and the step time
    planned and measured; the first two checked with --check-extra."""
    bad = []
    data, files = final["nvme_data_bytes"], final["nvme_file_bytes"]
    ratio = files / data if data else float("inf")
    print("family_bytes: %-5s host x%d swap files %d bytes for %d of data: %.4f x (target <= 1.05)"
          % (layout, factor, files, data, ratio))
    if a.check_extra and ratio > 1.05:
        bad.append("%s x%d swap files %.4f x the data" % (layout, factor, ratio))
    if not states:
        bad.append("%s x%d no model states line" % (layout, factor))
    else:
        total = float(states.group(1)) * (1 << 20)
        print("family_bytes: %-5s host x%d %s (engine data %.1f MiB)"
              % (layout, factor, states.group(0), data / (1 << 20)))
        if a.check_extra and abs(total - data) > 0.06 * (1 << 20):
            bad.append("%s x%d model states %.1f MiB, homes %.1f MiB"
                       % (layout, factor, total / (1 << 20), data / (1 << 20)))
    tokens = a.seq  # batch 1
    dt = sum(tokens / s["tokens_per_s"] for s in steps) / len(steps)
    print("family_bytes: %-5s host x%d step time measured %.3f s, planned %.3f s (%+.0f%%)"
          % (layout, factor, dt, c["step_seconds"], 100 * (c["step_seconds"] - dt) / dt))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--chunk", default="64K")
    ap.add_argument("--layouts", default="fp32,int8,bf16m,int8m")
    ap.add_argument("--factors", default="1,2")
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--tol-reads", type=float, default=0.05)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the means")
    ap.add_argument("--profile", help="ferry plan --profile FILE (measured bandwidths)")
    ap.add_argument("--check-extra", action="store_true",
                    help="also fail on swap files > 1.05 x data or a wrong model states line")
    ap.add_argument("--json-out")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun -np N)")
    ap.add_argument("--stage", type=int, default=2, help="dist.zero_stage with ranks")
    ap.add_argument("--print-grad-reads", action="store_true",
                    help="print the grads' reads without holding them (NVMe accumulators: the "
                    "engine steps some groups from their host copy; the plan reads them all)")
    a = ap.parse_args()
    a.mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if a.np > 1 and not a.mpirun:
        print("family_bytes: skipped: --np %d needs mpirun" % a.np)
        sys.exit(77)
    for k in ("gpt", "ferry", "root", "work"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    os.makedirs(a.work, exist_ok=True)
    if not a.model:
        a.model = os.path.join(a.work, "thin-llama.json")
        with open(a.model, "w") as f:
            json.dump(MODEL, f)
    a.model = os.path.abspath(a.model)
    with open(a.model) as f:
        vocab = json.load(f)["vocab_size"]
    a.data = os.path.join(a.work, "tokens.u32")
    with open(a.data, "wb") as f:  # deterministic ids below the vocab
        f.write(b"".join(((i * i * 7 + i * 13) % vocab).to_bytes(4, "little")
                         for i in range(8 * (a.seq + 1) * 4)))
    bad, rows = [], []
    for layout in a.layouts.split(","):
        _, base = plan(a, layout, 1 << 40, 1 << 40)
        for x in a.factors.split(","):
            b, r = check(a, layout, int(x), base)
            bad += b
            rows += r
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if bad:
        print("family_bytes: FAIL: off the plan beyond the tolerance: %s" % ", ".join(bad))
        sys.exit(1)
    print("family_bytes: pass")


if __name__ == "__main__":
    main()
