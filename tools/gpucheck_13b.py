#!/usr/bin/env python3
"""tools/gpucheck_13b.py — the GPU check's part 13b (tools/gpucheck.py runs
it): ferry-gpt trains llama-2-13b on cuda held to tiers.gpu.budget = 22G
with the params and the optimizer state in host RAM (int8 states, a bf16
master), then llama-1b streamed against resident, whose losses must be
equal bit for bit, then llama-2-7b with fp32 states (or the most layers of
it the RAM holds). Each training run is planned first by `ferry plan` (the
placement zero3-offload, the host budget it needs, the step time and peak
RSS it predicts from this machine's measured compute rate, copy bandwidths
and CPU AdamW), and its figures are judged against the issue's targets: model
TFLOPS (6 N tokens / step time), each step against its longest component
(compute from nvidia-smi's utilization.gpu, H2D, D2H and the CPU AdamW from
the engine's timeline), device peak against the budget plus the context,
peak RSS and step time against the plan, launch to first step.

Without a GPU, `gpucheck_13b.py --host-smoke --bin BUILD/bin --out DIR` runs
the same driver on the host backend with tiny shapes (ctest
tools.gpucheck_13b): the configs written, ferry-gpt's output and timeline
parsed, the figures and the targets' verdicts in DIR/results.json.
"""
import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

import gpucheck as gc

GIB = 1 << 30
MIB = 1 << 20
# llama-2-7b's shape (examples/gpt/config.c), written as a config.json so
# that run 2 can drop layers when the machine's RAM does not hold all 32
LLAMA_2_7B = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "intermediate_size": 11008, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False}
# the host smoke's model: llama-tiny's shape (5 layers; run 2 uses 8)
SMOKE_MODEL = dict(LLAMA_2_7B, vocab_size=256, hidden_size=128, num_hidden_layers=5,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=344,
                   max_position_embeddings=256)
# the targets
TARGETS = {"tflops": 250.0, "step_over_longest": 1.15, "rss_rel": 0.10, "step_rel": 0.20,
           "first_step_s": 60.0}
# A run's share of the part's time: run 1 at most RUN1_MAX s, leaving
# PAIR_RESERVE for the llama-1b pair and RUN2_MIN for run 2; each run gets
# GRACE s between SIGINT (ferry-gpt ends the step, releases the engine,
# writes the timeline) and SIGKILL.
RUN1_MAX, PAIR_RESERVE, RUN2_MIN, GRACE = 150, 50, 45, 20
# ferry-gpt's note at its first step (stderr), kept when a run is cut
STARTUP_RE = re.compile(r"ferry-gpt: start-up ([0-9.]+) s")


class Mode:
    """What differs between the GPU run and the host smoke: programs, device,
    shapes, budgets."""

    def __init__(self, gpu, bindir, root, out, env=None, host_mem=None):
        self.gpu = gpu
        self.bindir, self.root, self.out = bindir, root, out
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.env = env
        self.device = "cuda" if gpu else "host"
        self.gpt_device = "cuda" if gpu else "cpu"
        self.budget = "22G" if gpu else "64M"
        self.batch, self.seq = (8, 2048) if gpu else (2, 64)
        # run 1's steps (the 4), run 2's (3: its start-up is the longer)
        self.steps, self.steps2 = 4, 3
        # llama-1b streamed against resident: small shapes, 3 steps
        self.pair = {"batch": 2, "seq": 256, "steps": 3, "gpu_budget": "24G",
                     "stream_gpu_budget": "8G", "host_budget": "24G"} if gpu else \
            {"batch": 2, "seq": 32, "steps": 3, "gpu_budget": "256M",
             "stream_gpu_budget": "64M", "host_budget": "256M"}
        self.host_margin = GIB if gpu else 16 * MIB
        # the smoke's model is 1M params: 1M chunks, not the plan's 64M
        self.plan_extra = [] if gpu else ["--chunk-size", "1M"]
        self.cache = {}  # the GEMM peak and copy bandwidths, measured once
        self.progs = {}  # a program's path other than bindir/NAME
        self.data = os.path.join(root, "docs/FERRY-GPT.md")
        self.host_mem = host_mem  # the smoke's stand-in for a smaller machine
        self.refresh()

    def refresh(self):
        """The RAM: /proc/meminfo now (a run's memory is back once it ended)."""
        self.meminfo = {"MemTotal": self.host_mem, "MemAvailable": self.host_mem} \
            if self.host_mem else read_meminfo()

    def prog(self, name):
        return self.progs.get(name) or os.path.join(self.bindir, name)

    def log(self, name):
        return os.path.join(self.logs, name + ".log")

    def model_json(self, name, cfg):
        p = os.path.join(self.out, name + ".model.json")
        with open(p, "w") as f:
            json.dump(cfg, f, indent=1)
        return p


# ---- the machine ------------------------------------------------------------------------


def read_meminfo():
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                w = v.split()
                if w and w[0].isdigit():
                    out[k] = int(w[0]) * (1024 if len(w) > 1 and w[1] == "kB" else 1)
    except OSError:
        pass
    return out


def raise_memlock():
    """RLIMIT_MEMLOCK's soft limit up to the hard one, in this process, so
    that the programs it starts inherit it (the pinned host tier needs it)."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    except (ValueError, OSError):
        pass


def machine(mode):
    mi = mode.meminfo
    try:
        du = shutil.disk_usage(mode.out)
        disk = {"free_bytes": du.free, "total_bytes": du.total}
    except OSError:
        disk = {}
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {"mem_total_bytes": mi.get("MemTotal"), "mem_available_bytes": mi.get("MemAvailable"),
            "disk": disk, "cpus": os.cpu_count(),
            "memlock_hard": None if hard == resource.RLIM_INFINITY else hard}


# ---- running a program: lines with their times, RSS, a clean stop ------------------------


def smi_time(field):
    """nvidia-smi's timestamp ("2026/12/06 12:34:56.789", local time) as
    seconds since the epoch, or None."""
    try:
        day, _, frac = field.strip().partition(".")
        return time.mktime(time.strptime(day, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
    except (ValueError, OverflowError):
        return None


class GpuSampler:
    """nvidia-smi's memory.used (MiB) and utilization.gpu (%) of GPU 0 every
    100 ms, each at the time nvidia-smi gives it (the time it is read when
    it gives none); nothing without nvidia-smi. Line-buffered through
    stdbuf where there is one, so a stop loses no sample."""

    def __init__(self):
        self.samples = []
        self.p = None
        if not shutil.which("nvidia-smi"):
            return
        cmd = ["nvidia-smi", "--query-gpu=timestamp,memory.used,utilization.gpu",
               "--format=csv,noheader,nounits", "-lms", "100", "-i", "0"]
        if shutil.which("stdbuf"):
            cmd = ["stdbuf", "-oL"] + cmd
        try:
            self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
            gc.LIVE.add(self.p)
        except OSError:
            self.p = None
            return
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.add(line.decode("utf-8", "replace"), time.time())

    def add(self, line, now):
        f = [x.strip() for x in line.split(",")]
        t = smi_time(f[0]) if f else None
        if t is not None:
            f = f[1:]
        try:
            mem = float(f[0])
        except (ValueError, IndexError):
            return
        try:
            util = float(f[1])
        except (ValueError, IndexError):
            util = None
        self.samples.append((now if t is None else t, mem, util))

    def stop(self):
        if self.p:
            time.sleep(0.25)
            gc.kill_group(self.p)
            self.p.wait()
            gc.LIVE.discard(self.p)
            self.t.join(2)
        return self.samples


def vm_hwm(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_stream(cmd, limit, log, env=None, cwd=None, grace=GRACE):
    """Runs cmd, its output lines timed as they come (seconds from launch),
    its VmHWM sampled; past limit - grace it gets SIGINT (ferry-gpt ends the
    step in progress and releases the engine), past limit SIGKILL."""
    t0 = time.time()
    res = {"command": shlex.join(cmd), "rc": None, "lines": [], "interrupted": False,
           "killed": False, "hwm_bytes": None, "t0": t0}
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                             cwd=cwd, start_new_session=True)
    except OSError as e:
        res["error"] = "cannot run %s: %s" % (cmd[0], e)
        res["wall_s"] = 0.0
        with open(log, "w") as f:
            f.write("$ %s\n%s\n" % (res["command"], res["error"]))
        return res
    gc.LIVE.add(p)

    def read():
        for raw in p.stdout:
            res["lines"].append((time.time() - t0, raw.decode("utf-8", "replace").rstrip("\n")))

    th = threading.Thread(target=read, daemon=True)
    th.start()
    while p.poll() is None:
        now = time.time() - t0
        h = vm_hwm(p.pid)
        if h is not None:
            res["hwm_bytes"] = max(res["hwm_bytes"] or 0, h)
        if now > limit - grace and not res["interrupted"]:
            res["interrupted"] = True
            try:
                os.kill(p.pid, signal.SIGINT)
            except OSError:
                pass
        if now > limit:
            res["killed"] = True
            gc.kill_group(p)
            break
        time.sleep(0.1)
    p.wait()
    th.join(5)
    gc.LIVE.discard(p)
    res["rc"] = p.returncode
    res["wall_s"] = round(time.time() - t0, 3)
    with open(log, "w") as f:
        f.write("$ %s\n" % res["command"])
        for t, line in res["lines"]:
            f.write("[%8.3f] %s\n" % (t, line))
        if res["interrupted"]:
            f.write("[gpucheck: SIGINT at %.0f s%s]\n" % (
                limit - grace, ", SIGKILL at %.0f s" % limit if res["killed"] else ""))
    gc.gpucheck_rehearse.stop_if_no_gpu(cmd, res["rc"], output_of(res))
    return res


def output_of(res):
    return "\n".join(line for _, line in res["lines"])


# ---- the plan ----------------------------------------------------------------------------


def plan_cmd(mode, model, batch, seq, extra, host_budget=None, profile=None):
    cmd = [mode.prog("ferry"), "plan", "--model", model, "--device", mode.device,
           "--gpu-budget", mode.budget, "--batch", str(batch), "--seq", str(seq),
           "--checkpointing", "on", "--json"] + mode.plan_extra + extra
    if host_budget:
        cmd += ["--host-budget", str(host_budget)]
    else:  # the machine's RAM: what fits at all
        cmd += ["--host-mem", str(mode.meminfo.get("MemTotal") or 128 * GIB)]
    if profile:
        cmd += ["--profile", profile]
    return cmd


def run_plan(mode, cmd, log):
    r = gc.run_cmd(cmd, 60, env=mode.env, cwd=mode.root, log=mode.log(log))
    return json_object(r["output"]), r


def json_object(text):
    """The JSON object text holds (one line or several), or None."""
    objs = gc.json_lines(text)
    if objs:
        return objs[-1]
    try:
        return json.loads(text[text.index("{"):])
    except ValueError:
        return None


def candidate(plan, name="zero3-offload"):
    for c in (plan or {}).get("candidates", []):
        if c.get("placement") == name:
            return c
    return None


def host_budget_for(cand, margin):
    """The host tier's budget: the plan's host bytes, 4% and margin more,
    rounded up to a MiB."""
    b = int(cand["tiers"]["host"]["bytes"])
    need = b + (b * 4 + 99) // 100 + margin
    return (need + MIB - 1) // MIB * MIB


def plan_run(mode, name, model, extra, profile, batch=None, seq=None):
    """Plans model with zero3-offload: the host budget it needs, then the
    plan at that budget with the profile, and the engine config it writes.
    Returns a dict: cand (the zero3-offload candidate), host_budget,
    config, params, rss_bytes, step_seconds, fits, why, commands."""
    batch, seq = batch or mode.batch, seq or mode.seq
    rec = {"model": model, "commands": []}
    p0, r0 = run_plan(mode, plan_cmd(mode, model, batch, seq, extra, profile=profile),
                      "13b-plan-%s-ram" % name)
    rec["commands"].append(shlex.join(plan_cmd(mode, model, batch, seq, extra, profile=profile)))
    c0 = candidate(p0)
    if not c0 and profile:  # a profile plan refuses: plan on its defaults, say so
        rec["profile_refused"] = gc.tail(r0["output"], 3)
        profile = None
        p0, r0 = run_plan(mode, plan_cmd(mode, model, batch, seq, extra), "13b-plan-%s-ram" % name)
        c0 = candidate(p0)
    if not c0:
        rec.update(fits=False, why="ferry plan failed: " + gc.tail(r0["output"], 3))
        return rec
    hb = host_budget_for(c0, mode.host_margin)
    cfg = os.path.join(mode.out, "13b-%s.cfg" % name)
    cmd = plan_cmd(mode, model, batch, seq, extra, host_budget=hb, profile=profile) + \
        ["--write-config", cfg]
    p1, r1 = run_plan(mode, cmd, "13b-plan-" + name)
    rec["commands"].append(shlex.join(cmd))
    c1 = candidate(p1)
    if not c1:
        rec.update(fits=False, why="ferry plan at host budget %d failed: %s" % (
            hb, gc.tail(r1["output"], 3)))
        return rec
    rec.update(params=p1["params"], host_budget=hb, config=cfg if os.path.isfile(cfg) else None,
               cand=c1, fits=bool(c1["fits"]), why=c1.get("why"),
               recommended=p1.get("placement"), placement_keys=c1["placement_keys"],
               step_seconds=c1["step_seconds"], components=c1.get("components"),
               rss_bytes=c1["rss_bytes"]["total"], host_bytes=c1["tiers"]["host"]["bytes"],
               gpu_bytes=c1["tiers"]["gpu"]["bytes"], nvme_file_bytes=c1.get("nvme_file_bytes"),
               bandwidths=p1.get("bandwidths"))
    if not rec["config"]:
        rec.update(fits=False, why="ferry plan --write-config wrote nothing: " +
                   gc.tail(r1["output"], 3))
    return rec


def fits_machine(mode, rec):
    """A run fits when the plan fits and its RSS is at most 90% of the RAM
    available now."""
    avail = mode.meminfo.get("MemAvailable") or mode.meminfo.get("MemTotal")
    if not rec.get("fits"):
        return False, rec.get("why") or "the plan does not fit"
    if avail and rec["rss_bytes"] > 0.9 * avail:
        return False, "planned RSS %.1f GiB > 90%% of the %.1f GiB available" % (
            rec["rss_bytes"] / GIB, avail / GIB)
    return True, None


def plan_fp32_run(mode, base, profile, extra):
    """Run 2's model: base (a config.json's dict) with all its layers when
    the machine holds it, else the most layers that fit (binary search)."""
    L0 = base["num_hidden_layers"]
    tried = []

    def at(L):
        cfg = mode.model_json("13b-fp32-L%d" % L, dict(base, num_hidden_layers=L))
        rec = plan_run(mode, "fp32-L%d" % L, cfg, extra, profile)
        ok, why = fits_machine(mode, rec)
        tried.append({"layers": L, "fits": ok, "why": why})
        rec.update(layers=L, layers_of=L0)
        return rec, ok

    rec, ok = at(L0)
    if ok:
        return rec, tried
    lo, hi, best = 1, L0 - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        r, ok = at(mid)
        if ok:
            best, lo = r, mid + 1
        else:
            hi = mid - 1
    return (best or rec), tried


# ---- the profile: this machine's figures for the plan ------------------------------------


def run_json(mode, cmd, limit, log, keep, gpu_optional=False):
    """cmd's last JSON line that keep accepts, with the command; else its
    exit status and tail."""
    r = gc.run_cmd(cmd, max(limit, 1), env=mode.env, cwd=mode.root, log=mode.log(log),
                   gpu_optional=gpu_optional)
    objs = [o for o in gc.json_lines(r["output"]) if keep(o)]
    if r["rc"] == 0 and objs:
        return dict(objs[-1], command=shlex.join(cmd))
    return {"rc": r["rc"], "tail": gc.tail(r["output"], 3), "command": shlex.join(cmd)}


def compute_rate(mode, model, batch, seq, deadline, tag):
    """TFLOP/s of the model's own GEMMs (`ferry bench compute`, where the
    build has it), else on cuda the cuBLAS bf16 peak at 8192^3
    (ferry-cuda-peak --gemm): {tflops, tflops_fp32, source, ...}."""
    cmd = [mode.prog("ferry"), "bench", "compute", "--model", model, "--device", mode.device,
           "--batch", str(batch), "--seq", str(seq), "--checkpointing", "on", "--iters", "5",
           "--json"]
    c = run_json(mode, cmd, min(60, deadline - time.time()), "13b-compute-" + tag,
                 lambda o: o.get("result") == "step" and o.get("tflops"), gpu_optional=True)
    if c.get("tflops"):
        return dict(c, source=shlex.join(cmd[1:]))
    if not mode.gpu:
        return dict(c, tflops=None)
    g = run_json(mode, [mode.prog("ferry-cuda-peak"), "--gemm", "8192", "--iters", "20", "--json"],
                 min(45, deadline - time.time()), "13b-gemm-" + tag,
                 lambda o: o.get("bench") == "cuda_gemm", gpu_optional=True)
    return dict(g, bench_compute=c,
                source="ferry-cuda-peak --gemm 8192 (bf16, fp32 compute; ferry bench compute "
                       "gave none)")


def measure_profile(mode, model, adam_args, deadline, tag):
    """This machine's figures for ferry plan --profile: cpu_optimizer_gbps
    from `ferry bench adam` with the run's state layout on every core,
    device_tflops (compute_rate), and on cuda h2d/d2h_gbps (ferry-cuda-peak
    --size 1G, pinned; measured once). Returns (profile path or None,
    figures)."""
    prof = {"format": "ferry-profile", "version": 1, "machine": "gpucheck part 13b",
            "sources": {}}
    adam = [mode.prog("ferry"), "bench", "adam", "--params",
            gc.gpucheck_rehearse.size("profile_adam_params", "256M") if mode.gpu else "1M",
            "--threads", "0", "--steps", "3", "--json"] + adam_args
    figs = {"adam": run_json(mode, adam, min(60, deadline - time.time()), "13b-adam-" + tag,
                             lambda o: o.get("gb_per_s", 0) > 0)}
    if figs["adam"].get("gb_per_s"):
        prof["cpu_optimizer_gbps"] = figs["adam"]["gb_per_s"]
        prof["sources"]["cpu_optimizer_gbps"] = shlex.join(adam[1:])
    figs["compute"] = compute_rate(mode, model, mode.batch, mode.seq, deadline, tag)
    if figs["compute"].get("tflops"):
        prof["device_tflops"] = figs["compute"]["tflops"]
        prof["sources"]["device_tflops"] = figs["compute"]["source"]
    if figs["compute"].get("tflops_fp32"):
        prof["device_tflops_fp32"] = figs["compute"]["tflops_fp32"]
        prof["sources"]["device_tflops_fp32"] = figs["compute"]["source"]
    if mode.gpu and "copy" not in mode.cache:
        c = gc.run_cmd([mode.prog("ferry-cuda-peak"), "--size", "1G", "--iters", "5", "--json"],
                       max(min(30, deadline - time.time()), 1), env=mode.env, cwd=mode.root,
                       log=mode.log("13b-copy"), gpu_optional=True)
        mode.cache["copy"] = {x["direction"]: x.get("gb_per_s") for x in gc.json_lines(c["output"])
                              if x.get("bench") == "cuda_peak"}
    figs["copy"] = mode.cache.get("copy", {})
    for d in ("h2d", "d2h"):
        if figs["copy"].get(d):
            prof[d + "_gbps"] = figs["copy"][d]
            prof["sources"][d + "_gbps"] = "ferry-cuda-peak --size 1G (pinned)"
    if not prof["sources"]:
        return None, figs
    path = os.path.join(mode.out, "13b-profile-%s.json" % tag)
    with open(path, "w") as f:
        json.dump(prof, f, indent=1)
    figs["profile"] = prof
    return path, figs


# ---- figures (pure: the selftest covers them) ---------------------------------------------


def trace_steps(trace):
    """Per step of an engine timeline (the steps end where the step lane's
    ferry_step spans end): its seconds and the busy seconds (the union of the
    spans) of H2D, D2H, the CPU optimizer (every "optimizer k" lane together)
    and NVMe read and write within it."""
    names, spans = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e.get("args", {}).get("name", str(e["tid"]))
        elif e.get("ph") == "X":
            spans.setdefault(e["tid"], []).append((e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6,
                                                   e.get("name", "")))
    if not spans:
        return []
    lanes = {}
    for tid, v in spans.items():
        for a, b, nm in v:
            key = span_component(names.get(tid, str(tid)), nm)
            if key:
                lanes.setdefault(key, []).append((a, b))
    ends = sorted(b for tid, v in spans.items() if names.get(tid) == "step"
                  for a, b, nm in v if nm == "ferry_step")
    start = min(a for v in spans.values() for a, _, _ in v)
    out, lo = [], start
    for hi in ends:
        row = {"seconds": hi - lo, "busy_s": {}}
        for key, v in lanes.items():
            row["busy_s"][key] = union_within(v, lo, hi)
        out.append(row)
        lo = hi
    return out


def span_component(lane, name):
    """The component a timeline span counts in: on an "optimizer k" lane the
    update ("optimizer": cpu_adam) or a grad accumulation; H2D's copies (not
    the stepper's "params enqueue", host time); D2H, NVMe, compute."""
    if lane.startswith("optimizer"):
        return "cpu_adam" if name == "optimizer" else \
            "accumulate" if name.startswith("accumulate") else None
    if lane == "H2D":
        return None if name == "params enqueue" else "h2d"
    return {"D2H": "d2h", "NVMe read": "nvme_read", "NVMe write": "nvme_write",
            "compute": "compute"}.get(lane)


def union_within(spans, lo, hi):
    total, end = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def step_windows(steps, tokens_per_step):
    """(start, end) of each step line's step in seconds from launch: a line
    is printed at its step's end, which lasted tokens / tokens_per_s."""
    out = []
    for s in steps:
        tps = s.get("tokens_per_s")
        dt = tokens_per_step / tps if tps else None
        out.append((s["_t"] - dt, s["_t"]) if dt else None)
    return out


def compute_busy(samples, t0, window):
    """GPU busy seconds within window (seconds from launch t0): the mean of
    nvidia-smi's utilization.gpu samples in it times its length."""
    if not window:
        return None
    a, b = window
    us = [u for t, _, u in samples if u is not None and a <= t - t0 <= b]
    return sum(us) / len(us) / 100.0 * (b - a) if us else None


def rel(measured, planned):
    """|measured / planned - 1|, or None."""
    if measured is None or not planned:
        return None
    return abs(measured / planned - 1.0)


def run_figures(res, tokens_per_step, n_params, trace, samples, baseline_mib, want_steps):
    """The figures of one training run: steps, step time (median after the
    first), model TFLOPS (6 N tokens / step time), tokens/s, per-step
    components and step / longest component, peak RSS, device peak, launch
    to first step."""
    out = output_of(res)
    objs = gc.json_lines(out)
    t_of = {}
    for t, line in res["lines"]:
        if line.startswith("{"):
            t_of.setdefault(line, t)
    steps = []
    for line, o in ((ln, o) for _, ln in res["lines"] if ln.startswith("{")
                    for o in gc.json_lines(ln)):
        if "step" in o and "loss" in o and not o.get("final"):
            steps.append(dict(o, _t=t_of[line]))
    final = next((o for o in objs if o.get("final")), {})
    fig = {"command": res["command"], "rc": res["rc"], "wall_s": res.get("wall_s"),
           "interrupted": res["interrupted"], "killed": res["killed"],
           "losses": [s["loss"] for s in steps], "steps_done": len(steps),
           "steps_asked": want_steps, "tokens_per_step": tokens_per_step, "params": n_params}
    secs = [tokens_per_step / s["tokens_per_s"] if s.get("tokens_per_s") else None for s in steps]
    fig["step_seconds_each"] = secs
    later = [x for x in secs[1:] if x]
    fig["step_seconds"] = gc.median(later) if later else None
    st = fig["step_seconds"]
    fig["tokens_per_s"] = tokens_per_step / st if st else None
    fig["model_tflops"] = 6.0 * n_params * tokens_per_step / st / 1e12 if st and n_params else None
    # launch to the first step: ferry-gpt's own startup_seconds when it
    # prints one, else the first step line's time less that step's length
    su = next((o["startup_seconds"] for o in objs if "startup_seconds" in o), None)
    note = next((float(m.group(1)) for m in map(STARTUP_RE.search, out.splitlines()) if m), None)
    wins = step_windows(steps, tokens_per_step)
    fig["first_step_line_s"] = steps[0]["_t"] if steps else None
    if su is not None:
        fig["startup_s"], fig["startup_source"] = su, "ferry-gpt startup_seconds"
    elif note is not None:
        fig["startup_s"], fig["startup_source"] = note, "ferry-gpt's start-up note"
    elif wins and wins[0]:
        fig["startup_s"] = max(wins[0][0], 0.0)
        fig["startup_source"] = "first step line - its length"
    else:
        fig["startup_s"] = None
    fig["rss_bytes"] = final.get("rss_bytes") or final.get("peak_rss_bytes") or res["hwm_bytes"]
    fig["rss_source"] = "ferry-gpt rss_bytes (VmHWM)" if final.get("rss_bytes") else \
        "VmHWM sampled" if res["hwm_bytes"] else None
    # the engine's own figures: tier peaks, bytes moved, the time steps waited
    fig["engine_peak_bytes"] = final.get("peak_bytes") or (steps[-1].get("peak_bytes")
                                                           if steps else None)
    fig["bytes_moved"], fig["stall_pct"] = final.get("bytes_moved"), final.get("stall_pct")
    mems = [m for _, m, _ in samples]
    fig["device_peak_mib"] = max(mems) - baseline_mib if mems and baseline_mib is not None \
        else None
    fig["gpu_samples"] = len(samples)
    # per step after the first: the timeline's lanes, compute from nvidia-smi
    per = trace_steps(trace) if trace else []
    fig["timeline_steps"] = len(per)
    rows = []
    for k in range(1, max(len(per), len(steps))):
        row = {"step": k + 1}
        if k < len(per):
            row.update(per[k]["busy_s"], timeline_s=per[k]["seconds"])
        c = compute_busy(samples, res["t0"], wins[k] if k < len(wins) else None)
        if c is not None and "compute" not in row:  # a timeline's compute lane first
            row["compute"], row["compute_from"] = c, "nvidia-smi utilization.gpu"
        row["step_s"] = row.get("timeline_s") or (secs[k] if k < len(secs) else None)
        comp = {n: row[n] for n in ("compute", "h2d", "d2h", "cpu_adam", "accumulate",
                                    "nvme_read", "nvme_write") if row.get(n)}
        if comp and row["step_s"]:
            row["longest"] = max(comp, key=comp.get)
            row["ratio"] = row["step_s"] / comp[row["longest"]]
        rows.append(row)
    fig["per_step"] = rows
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    fig["step_over_longest_max"] = max(ratios) if ratios else None
    for n in ("compute", "h2d", "d2h", "cpu_adam", "accumulate"):
        v = [r[n] for r in rows if r.get(n) is not None]
        fig[n + "_busy_s"] = gc.median(v) if v else None
    fig["ok"] = res["rc"] == 0 and len(steps) == want_steps
    if not fig["ok"]:
        fig["tail"] = gc.tail(out)
    return fig


def losses_equal(a, b, want):
    """The number of steps whose losses differ (every bit: they print as
    %.9g), None unless both runs gave want steps."""
    if len(a) != want or len(b) != want:
        return None
    return sum(1 for x, y in zip(a, b) if repr(x) != repr(y))


def summary_rows(fig, target):
    """The part's rows of the check's summary (target: gpucheck.target)."""
    r1, r2 = fig.get("run1", {}), fig.get("run2", {})
    p1, p2 = r1.get("plan", {}), r2.get("plan", {})
    ctx, budget = fig.get("context_mib"), fig.get("budget", "22G")
    name1 = "13b %s, %s budget, int8 states + bf16 master" % (r1.get("model", "llama-2-13b"),
                                                              budget)
    rows = [target(name1 + ": model TFLOPS (6 N tokens / step time)", r1.get("model_tflops"),
                   TARGETS["tflops"], "min",
                   note="batch x seq %s" % r1.get("tokens_per_step"))]
    for name, r, p in ((name1, r1, p1), ("13b %s fp32 states" % r2.get("model", "llama-2-7b"),
                                         r2, p2)):
        rows += [target(name + ": step time / longest component (worst step after the first)",
                        r.get("step_over_longest_max"), TARGETS["step_over_longest"]),
                 target(name + ": peak device memory (MiB, nvidia-smi) vs budget + context",
                        r.get("device_peak_mib"), r.get("allowed_mib"),
                        note="%s + context %s MiB" % (budget, ctx)),
                 target(name + ": peak RSS vs plan, |measured / planned - 1|",
                        rel(r.get("rss_bytes"), p.get("rss_bytes")), TARGETS["rss_rel"]),
                 target(name + ": step time vs plan, |measured / planned - 1|",
                        rel(r.get("step_seconds"), p.get("step_seconds")), TARGETS["step_rel"])]
        if r is r1:
            rows.append(target(name + ": launch to first step (s)", r.get("startup_s"),
                               TARGETS["first_step_s"]))
    pr = fig.get("pair", {})
    rows.append(target("13b %s streamed vs resident on %s: steps whose losses differ" % (
        pr.get("model", "llama-1b"), fig.get("device", "cuda")), pr.get("steps_differing"), 0))
    return rows


# ---- the runs ----------------------------------------------------------------------------


def gpt_cmd(mode, model, cfg, plan, steps, batch, seq, timeline):
    k = plan["placement_keys"]
    cmd = [mode.prog("ferry-gpt"), "train", "--model", model, "--data", mode.data, "--steps",
           str(steps), "--batch", str(batch), "--seq", str(seq), "--seed", "1", "--checkpoint",
           "--device", mode.gpt_device, "--engine", cfg, "--json",
           "--set", "placement.params=" + k["params"], "--set", "placement.grads=" + k["grads"],
           "--set", "placement.optimizer=" + k["optimizer"],
           "--set", "tiers.host.budget=%d" % plan["host_budget"], "--set", "timeline=" + timeline]
    if not mode.gpu:  # the host backend: nothing to pin (plan writes pinned = true)
        cmd += ["--set", "device=host", "--set", "tiers.host.pinned=false"]
    elif not memlock_allows(plan["host_budget"]):  # a run on pageable memory, not none
        cmd += ["--set", "tiers.host.memlock_fallback=pageable"]
    return cmd


def memlock_allows(nbytes):
    """Whether RLIMIT_MEMLOCK's hard limit (drive's raise_memlock lifts the
    soft one to it) lets nbytes and 1 GiB more be pinned."""
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return hard == resource.RLIM_INFINITY or hard >= nbytes + GIB


def train_run(mode, tag, model, plan, steps, limit, baseline_mib, context_mib):
    timeline = os.path.join(mode.out, "13b-%s.trace.json" % tag)
    if os.path.exists(timeline):
        os.remove(timeline)
    cmd = gpt_cmd(mode, model, plan["config"], plan, steps, mode.batch, mode.seq, timeline)
    sampler = GpuSampler() if mode.gpu else None
    res = run_stream(cmd, limit, mode.log("13b-" + tag), env=mode.env, cwd=mode.root)
    samples = sampler.stop() if sampler else []
    trace = None
    if os.path.isfile(timeline):
        try:
            with open(timeline) as f:
                trace = json.load(f)
        except (OSError, ValueError):
            trace = None
    fig = run_figures(res, mode.batch * mode.seq, plan.get("params"), trace, samples,
                      baseline_mib, steps)
    fig["timeline"] = timeline if trace else None
    if "tiers.host.memlock_fallback=pageable" in cmd:
        fig["note"] = "RLIMIT_MEMLOCK's hard limit is below the host budget: pageable memory"
    if fig["device_peak_mib"] is not None and context_mib is not None:
        fig["allowed_mib"] = gc.parse_size_mib(mode.budget) + context_mib
    return fig


def pair_run(mode, deadline):
    """llama-1b (the smoke: its tiny model) resident (examples/configs/
    resident.cfg) against streamed (the same with placement host/host/host):
    the per-step losses bit for bit."""
    pr = mode.pair
    model = "llama-1b" if mode.gpu else mode.model_json("13b-pair", SMOKE_MODEL)
    base = [mode.prog("ferry-gpt"), "train", "--model", model, "--data", mode.data, "--steps",
            str(pr["steps"]), "--batch", str(pr["batch"]), "--seq", str(pr["seq"]), "--seed", "1",
            "--device", mode.gpt_device, "--engine",
            os.path.join(mode.root, "examples/configs/resident.cfg"), "--json",
            "--set", "device=" + mode.device,
            "--set", "tiers.host.pinned=" + ("true" if mode.gpu else "false")]
    runs = {"resident": base + ["--set", "tiers.gpu.budget=" + pr["gpu_budget"]],
            "streamed": base + ["--set", "tiers.gpu.budget=" + pr["stream_gpu_budget"],
                                "--set", "placement.params=host", "--set", "placement.grads=host",
                                "--set", "placement.optimizer=host",
                                "--set", "tiers.host.budget=" + pr["host_budget"]]}
    fig = {"model": "llama-1b" if mode.gpu else "llama-tiny shape", "batch": pr["batch"],
           "seq": pr["seq"], "steps": pr["steps"]}
    for i, (name, cmd) in enumerate(runs.items()):
        left = (deadline - time.time()) / (2 - i)
        if left < 10:
            fig[name] = {"ok": False, "why": "out of the part's time"}
            continue
        res = run_stream(cmd, left, mode.log("13b-1b-" + name), env=mode.env, cwd=mode.root,
                         grace=min(GRACE, left / 3))
        losses, _ = gc.losses_of(output_of(res))
        fig[name] = {"command": res["command"], "rc": res["rc"], "wall_s": res["wall_s"],
                     "losses": losses, "ok": res["rc"] == 0 and len(losses) == pr["steps"]}
        if not fig[name]["ok"]:
            fig[name]["tail"] = gc.tail(output_of(res))
    fig["steps_differing"] = losses_equal(fig["resident"].get("losses", []),
                                          fig["streamed"].get("losses", []), pr["steps"])
    fig["max_rel_diff"] = gc.max_rel_diff(fig["streamed"].get("losses", []),
                                          fig["resident"].get("losses", []))
    return fig


def stage_run1(mode, fig, why, deadline, baseline_mib, context_mib):
    """Run 1: llama-2-13b (the smoke: the tiny model), int8 states, a bf16
    master, at most RUN1_MAX s, leaving the pair's and run 2's shares."""
    model = "llama-2-13b" if mode.gpu else mode.model_json("13b-run1", SMOKE_MODEL)
    prof, fig["profile1"] = measure_profile(
        mode, model, ["--grad", "fp32", "--state-dtype", "int8", "--master", "bf16"], deadline,
        "int8")
    plan = plan_run(mode, "run1", model, ["--state-dtype", "int8", "--master", "bf16"], prof)
    fig["run1"] = {"model": "llama-2-13b" if mode.gpu else "llama-tiny shape", "plan": plan}
    ok, w = fits_machine(mode, plan)
    left = deadline - time.time()
    if not ok:
        why.append("run 1 not run: " + w)
    elif left < 30:
        why.append("run 1: out of the part's time")
    else:
        limit = min(RUN1_MAX, left - PAIR_RESERVE - RUN2_MIN) if mode.gpu else left / 3
        fig["run1"].update(train_run(mode, "run1", model, plan, mode.steps, max(limit, 30),
                                     baseline_mib, context_mib))
        if not fig["run1"]["ok"]:
            why.append("run 1 (%s) did not give its %d steps (figures.run1.tail)" % (
                fig["run1"]["model"], mode.steps))


def stage_pair(mode, fig, why, deadline):
    left = deadline - time.time()
    if left <= 25:
        fig["pair"] = {"why": "out of the part's time"}
        why.append("llama-1b pair: out of the part's time")
        return
    fig["pair"] = pair_run(mode, time.time() + min(PAIR_RESERVE if mode.gpu else left / 2,
                                                   left - 10))
    if fig["pair"]["steps_differing"] != 0:
        why.append("llama-1b streamed vs resident: %s" % (
            "losses differ" if fig["pair"]["steps_differing"] else "a run failed"))


def stage_run2(mode, fig, why, deadline, baseline_mib, context_mib):
    """Run 2: llama-2-7b (the smoke: 8 tiny layers) with fp32 states, or as
    many of its layers as the RAM available now holds."""
    base = LLAMA_2_7B if mode.gpu else dict(SMOKE_MODEL, num_hidden_layers=8)
    mode.refresh()
    prof, fig["profile2"] = measure_profile(
        mode, mode.model_json("13b-fp32", base), ["--grad", "fp32", "--param-copy", "bf16"],
        deadline, "fp32")
    plan, tried = plan_fp32_run(mode, base, prof, [])
    L, L0 = plan.get("layers"), base["num_hidden_layers"]
    fig["run2"] = {"model": ("llama-2-7b" if mode.gpu else "smoke-8") + (
        " (%d of %d layers)" % (L, L0) if L and L != L0 else ""), "plan": plan,
        "layer_tries": tried, "machine": machine(mode)}
    ok, w = fits_machine(mode, plan)
    left = deadline - time.time()
    if not ok:
        why.append("run 2 not run: " + w)
    elif left < 30:
        why.append("run 2: out of the part's time")
    else:
        fig["run2"].update(train_run(mode, "run2", plan["model"], plan, mode.steps2, left - 2,
                                     baseline_mib, context_mib))
        if not fig["run2"]["ok"]:
            why.append("run 2 (%s) did not give its %d steps (figures.run2.tail)" % (
                fig["run2"]["model"], mode.steps2))


def drive(mode, deadline, baseline_mib=None, context_mib=None, progress=None):
    """The part's work in order: run 1, the llama-1b pair, run 2, each
    recorded through progress(figures, what) as it ends. Returns (figures,
    reasons it failed)."""
    note = progress or (lambda fig, what: None)
    raise_memlock()
    fig = {"machine": machine(mode), "device": mode.device, "budget": mode.budget,
           "batch": mode.batch, "seq": mode.seq, "steps": mode.steps, "steps2": mode.steps2,
           "context_mib": context_mib, "baseline_mib": baseline_mib, "targets": TARGETS}
    why = []
    mode.fig, mode.why = fig, why  # (a rehearsal's stop keeps them)
    stage_run1(mode, fig, why, deadline, baseline_mib, context_mib)
    note(fig, "run 1 ended")
    stage_pair(mode, fig, why, deadline)
    note(fig, "llama-1b pair ended")
    stage_run2(mode, fig, why, deadline, baseline_mib, context_mib)
    return fig, why


# ---- the part ------------------------------------------------------------------------------


def part_13b(ck):
    """Runs the part on gpucheck's Check ck and records it."""
    if ck.gpu_skip("13b") or ck.time_skip("13b", 60):
        return
    t0 = time.time()
    deadline = t0 + ck.allow("13b")
    # (a rehearsal plans against the GPU machine's RAM, so that its runs start)
    mode = Mode(True, os.path.join(ck.bundle, "bin"), ck.root, ck.out, env=ck.env,
                host_mem=gc.gpucheck_rehearse.GPU_HOST_RAM if ck.rehearse else None)

    def progress(fig, what):
        ck.res.part("13b", "running", "", time.time() - t0, fig, log="logs/13b-*.log",
                    reason="running: " + what, quiet=True)

    try:
        fig, why = drive(mode, deadline, ck.baseline_mib, ck.context_mib, progress)
    except gc.gpucheck_rehearse.NeedsGpu as e:  # a rehearsal: the plans and profile made
        e.figures, e.failed = getattr(mode, "fig", None), getattr(mode, "why", [])
        raise
    cmds = [fig.get(r, {}).get("command") for r in ("run1", "run2")]
    ck.res.part("13b", "fail" if why else "pass", " ; ".join(c for c in cmds if c),
                time.time() - t0, fig, log="logs/13b-*.log", reason="; ".join(why) or None)


def host_smoke(a):
    """The driver on the host backend with tiny shapes: results.json with
    the part's figures and summary rows."""
    os.makedirs(a.out, exist_ok=True)
    mode = Mode(False, os.path.abspath(a.bin), os.path.abspath(a.root), os.path.abspath(a.out),
                host_mem=a.host_mem)
    mode.progs = {"ferry": a.ferry, "ferry-gpt": a.gpt}
    t0 = time.time()
    fig, why = drive(mode, t0 + a.budget)
    rows = summary_rows(fig, gc.target)
    doc = {"part": "13b", "mode": "host-smoke", "status": "fail" if why else "pass",
           "reason": "; ".join(why) or None, "wall_s": round(time.time() - t0, 3),
           "figures": fig, "summary": rows}
    with open(os.path.join(mode.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("gpucheck_13b host smoke: %s in %.1f s%s" % (doc["status"], doc["wall_s"],
                                                     "  (" + doc["reason"] + ")" if why else ""))
    for r in rows:
        print("  %-5s %s = %s (limit %s)" % ({True: "met", False: "not", None: "n/m"}[r["met"]],
                                              r["target"], r["value"], r["limit"]))
    return 0 if not why else 1


# ---- self test (gpucheck.py selftest calls it) -----------------------------------------------


def selftest():
    ev = [{"ph": "M", "tid": 1, "name": "thread_name", "args": {"name": "H2D"}},
          {"ph": "M", "tid": 5, "name": "thread_name", "args": {"name": "step"}},
          {"ph": "M", "tid": 6, "name": "thread_name", "args": {"name": "optimizer 0"}},
          {"ph": "M", "tid": 7, "name": "thread_name", "args": {"name": "optimizer 1"}},
          {"ph": "X", "tid": 5, "ts": 0, "dur": 1e5, "name": "fetch"},
          {"ph": "X", "tid": 5, "ts": 9e5, "dur": 1e5, "name": "ferry_step"},
          {"ph": "X", "tid": 5, "ts": 19e5, "dur": 1e5, "name": "ferry_step"},
          {"ph": "X", "tid": 1, "ts": 12e5, "dur": 4e5, "name": "H2D"},
          {"ph": "X", "tid": 1, "ts": 14e5, "dur": 4e5, "name": "H2D"},
          {"ph": "X", "tid": 6, "ts": 15e5, "dur": 2e5, "name": "optimizer"},
          {"ph": "X", "tid": 7, "ts": 16e5, "dur": 2e5, "name": "optimizer"},
          {"ph": "X", "tid": 7, "ts": 11e5, "dur": 1e5, "name": "accumulate"},
          {"ph": "X", "tid": 1, "ts": 10e5, "dur": 2e5, "name": "params enqueue"}]
    per = trace_steps({"traceEvents": ev})
    assert len(per) == 2 and abs(per[1]["seconds"] - 1.0) < 1e-9, per
    assert abs(per[1]["busy_s"]["h2d"] - 0.6) < 1e-9, per
    assert abs(per[1]["busy_s"]["cpu_adam"] - 0.3) < 1e-9, per
    assert abs(per[1]["busy_s"]["accumulate"] - 0.1) < 1e-9, per
    assert union_within([(0, 2), (1, 3)], 1.5, 2.5) == 1.0
    lines = [(5.0, '{"step": 1, "loss": 2.5, "tokens_per_s": 100}'), (6.0, "noise"),
             (7.0, '{"step": 2, "loss": 2.25, "tokens_per_s": 200}'),
             (9.0, '{"step": 3, "loss": 2.0, "tokens_per_s": 100}'),
             (9.5, '{"final": true, "rss_bytes": 1000}')]
    res = {"command": "x", "rc": 0, "lines": lines, "interrupted": False, "killed": False,
           "hwm_bytes": 900, "t0": 100.0, "wall_s": 10}
    samples = [(107.5, 500.0, 50.0), (108.5, 700.0, 100.0), (109.5, 600.0, None)]
    f = run_figures(res, 200, 1e9, {"traceEvents": ev}, samples, 100.0, 3)
    assert f["ok"] and f["losses"] == [2.5, 2.25, 2.0], f
    assert f["step_seconds_each"] == [2.0, 1.0, 2.0] and f["step_seconds"] == 2.0, f
    assert f["model_tflops"] == 6e9 * 200 / 2.0 / 1e12 and f["tokens_per_s"] == 100, f
    res2 = dict(res, lines=[(1.0, "ferry-gpt: start-up 2.50 s (from the launch to the first "
                                  "step)")] + lines[:2])
    g2 = run_figures(res2, 200, 1e9, None, [], None, 3)
    assert g2["startup_s"] == 2.5 and not g2["ok"] and g2["rss_bytes"] == 900, g2
    assert f["startup_s"] == 3.0 and f["rss_bytes"] == 1000 and f["device_peak_mib"] == 600, f
    assert abs(f["per_step"][0]["ratio"] - 1.0 / 0.6) < 1e-9, f["per_step"]
    assert abs(f["per_step"][1]["compute"] - 1.5) < 1e-9, f["per_step"]  # 75% of 2 s
    g = GpuSampler.__new__(GpuSampler)
    g.samples = []
    for line in ("2026/12/06 12:34:56.250, 1500, 97", "1400", "[N/A], x"):
        g.add(line, 5.0)
    t = time.mktime(time.strptime("2026/12/06 12:34:56", "%Y/%m/%d %H:%M:%S")) + 0.25
    assert g.samples == [(t, 1500.0, 97.0), (5.0, 1400.0, None)], g.samples
    assert json_object('note\n{"a":\n 1}\n') == {"a": 1} and json_object("none") is None
    assert losses_equal([1.0, 2.0], [1.0, 2.0], 2) == 0
    assert losses_equal([1.0, 2.0], [1.0, 2.0000001], 2) == 1
    assert losses_equal([1.0], [1.0], 2) is None
    assert rel(110, 100) is not None and abs(rel(110, 100) - 0.1) < 1e-12 and rel(None, 1) is None
    assert host_budget_for({"tiers": {"host": {"bytes": 100 * MIB}}}, MIB) == 105 * MIB
    rows = summary_rows({}, gc.target)
    assert len(rows) == 11 and all(r["met"] is None for r in rows), rows
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="gpucheck_13b.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-smoke", action="store_true", required=True,
                    help="run the part's driver on the host backend with tiny shapes")
    ap.add_argument("--bin", default="build/bin", help="the build's bin/ (ferry, ferry-gpt)")
    ap.add_argument("--ferry", default=None, help="the ferry program (default BIN/ferry)")
    ap.add_argument("--gpt", default=None, help="ferry-gpt (default BIN/ferry-gpt)")
    ap.add_argument("--root", default=".", help="the repository (docs/, examples/configs/)")
    ap.add_argument("--out", default="build/gpucheck-13b-smoke")
    ap.add_argument("--budget", type=float, default=100, help="seconds for the whole smoke")
    ap.add_argument("--host-mem", type=int, default=None,
                    help="bytes of RAM to plan against instead of /proc/meminfo's")
    return host_smoke(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
