"""tools/gpucheck_adam.py — the GPU check's part adam (tools/gpucheck.py runs
it): the CPU AdamW where memory is the wall, on the GPU machine's host.
`ferry bench adam` at THREADS threads on PARAMS parameters, bf16 grads, each
with its same-traffic read-modify-write roofline, in three runs back to
back: fp32 states (fp32 master, bf16 param copy), int8 states (same), and a
bf16 master with int8 states (no copy: the params are the master). The
compact-state targets are the step-time ratios fp32 / int8 >= 1.5 and
fp32 / (bf16 master + int8) >= 2.2. The part uses no GPU, but it measures
the host that the GPU runs stream through, so it runs where the check runs.
"""
import os
import re
import time

import gpucheck as gc

PARAMS = "256M"  # 2^28 (bench sizes are powers of 1024): 4 GiB of fp32 buffers
THREADS = 16
STEPS = 7
# (name, the run's own flags)
RUNS = (("fp32", ("--state-dtype", "fp32", "--master", "fp32", "--param-copy", "bf16")),
        ("int8", ("--state-dtype", "int8", "--master", "fp32", "--param-copy", "bf16")),
        ("bf16_master_int8", ("--state-dtype", "int8", "--master", "bf16")))
TARGETS = {"int8": 1.5, "bf16_master_int8": 2.2}
KEYS = ("simd", "threads", "seconds_per_step", "params_per_s", "bytes_per_param", "gb_per_s",
        "roofline_seconds_per_step", "roofline_gb_per_s", "fraction_of_roofline")


# ---- figures (pure: the selftest covers them) ------------------------------------------


def ratios(runs):
    """{name: fp32 s/step / name's s/step} for the compact runs that ran."""
    f = (runs.get("fp32") or {}).get("seconds_per_step")
    out = {}
    for name in TARGETS:
        s = (runs.get(name) or {}).get("seconds_per_step")
        out[name] = round(f / s, 3) if f and s else None
    return out


def summary_rows(fig, target):
    """The part's rows of the check's summary (target: gpucheck.target)."""
    r = fig.get("ratios", {})
    note = "ferry bench adam, %s params, %d threads, bf16 grads" % (PARAMS, THREADS)
    return [target("adam on the host: fp32 states / int8 states, step time", r.get("int8"),
                   TARGETS["int8"], "min", note=note),
            target("adam on the host: fp32 states / (bf16 master + int8 states), step time",
                   r.get("bf16_master_int8"), TARGETS["bf16_master_int8"], "min", note=note)]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
        return m.group(1).strip() if m else None
    except OSError:
        return None


# ---- the part ----------------------------------------------------------------------------


def adam_part(ck):
    """Runs the part on gpucheck's Check ck and records it."""
    if ck.gpu_skip("adam") or ck.time_skip("adam", 20):
        return
    t0 = time.time()
    deadline = t0 + ck.allow("adam")
    # a rehearsal runs the same commands on a few params
    params = gc.gpucheck_rehearse.size("adam_params", PARAMS)
    steps = gc.gpucheck_rehearse.size("adam_steps", STEPS)
    fig = {"params": params, "threads": THREADS, "steps": steps, "cpu": cpu_model(),
           "cpus": os.cpu_count(), "runs": {}}
    cmds, why = [], []
    for k, (name, flags) in enumerate(RUNS):
        left = deadline - time.time()
        if left < 5:
            why.append("%s: out of the part's time" % name)
            break
        cmd = [ck.prog("ferry"), "bench", "adam", "--params", params, "--threads", str(THREADS),
               "--steps", str(steps), "--grad", "bf16", "--roofline", "--json"] + list(flags)
        # an equal share of what is left for each run still to come
        r = ck.run(cmd, left / (len(RUNS) - k), "adam-" + name)
        cmds.append(r["command"])
        objs = gc.json_lines(r["output"])
        if r["rc"] != 0 or not objs:
            fig["runs"][name] = {"rc": r["rc"], "timed_out": r["timed_out"],
                                 "tail": gc.tail(r["output"], 3)}
            why.append("%s: %s" % (name, "timed out" if r["timed_out"] else
                                   "rc %s (logs/adam-%s.log)" % (r["rc"], name)))
            continue
        fig["runs"][name] = {key: objs[-1].get(key) for key in KEYS}
        fig["runs"][name]["wall_s"] = round(r["wall_s"], 3)
    fig["ratios"] = ratios(fig["runs"])
    fig["targets"] = TARGETS
    ck.res.part("adam", "fail" if why else "pass", " ; ".join(cmds), time.time() - t0, fig,
                log="logs/adam-*.log", reason="; ".join(why) or None)


# ---- self test (gpucheck.py selftest calls it) -------------------------------------------


def selftest():
    runs = {"fp32": {"seconds_per_step": 0.30}, "int8": {"seconds_per_step": 0.20},
            "bf16_master_int8": {"seconds_per_step": 0.12}}
    assert ratios(runs) == {"int8": 1.5, "bf16_master_int8": 2.5}, ratios(runs)
    assert ratios({"fp32": {"seconds_per_step": 0.3}}) == {"int8": None,
                                                           "bf16_master_int8": None}
    rows = summary_rows({"ratios": ratios(runs)}, gc.target)
    assert [r["met"] for r in rows] == [True, True], rows
    rows = summary_rows({}, gc.target)
    assert [r["met"] for r in rows] == [None, None], rows
