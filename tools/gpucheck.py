#!/usr/bin/env python3
"""tools/gpucheck.py — the logic of the GPU check: the test manifest that
tools/gpu_bundle.sh makes from ctest (so a machine without the build tree
or cmake runs the tests as ctest would), the test runner, and the parts that
tools/gpu_check.sh runs on a machine with a GPU, each written into one
OUTDIR/results.json as soon as it ends. Python's standard library only.

  gpucheck.py manifest CTEST_JSON ROOT BUILD BUNDLE     (gpu_bundle.sh)
  gpucheck.py check --root R --bundle B --out OUTDIR [--budget S] [--dry-run]
                    [--parts LIST]
  gpucheck.py parts [LIST]      (the parts with their limits; LIST checked)
  gpucheck.py run-tests MANIFEST --root R --bundle B --logs DIR [--select RE]
  gpucheck.py selftest                                  (ctest tools.gpu_check)

Paths in the manifest are written as @ROOT@ (the repository) and @BUNDLE@
(gpucheck/, which mirrors the build folder's bin/ and tests/), resolved to
absolute paths where the check runs.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

# ---- the manifest (bundle time) --------------------------------------------------------

# Tests that need the build tree itself, not its programs.
NOT_BUNDLED = {
    "install.consumer": "builds a consumer project against the build folder with cmake",
    "build.layers": "reads the build folder's object files",
    "build.rooms": "reads the build folder's object files",
    "tools.gpu_rehearsal": "bundles the build folder itself (it rehearses the check without a GPU)",
}


# Source folders the bundle carries under src/ (the Python binding and its
# tests, and the PyTorch peer the scale part runs): the python tests run the bundle's copy, the one that matches its
# libferry.so, whatever the repository there holds. (examples/python stays
# the repository's: finetune.py reads the repository's README.md.)
BUNDLED_SOURCES = ("python/ferry", "tests/python", "bench/peers")
_SOURCE_RE = re.compile(r"@ROOT@/(python|tests/python)(?=/|$|[\s;:,'\"])")


def bundle_sources(s):
    """@ROOT@/python and @ROOT@/tests/python as the bundle's src/ copies."""
    return _SOURCE_RE.sub(lambda m: "@BUNDLE@/src/" + m.group(1), s)


def copy_sources(root, bundle):
    n = 0
    for rel in BUNDLED_SOURCES:
        src = os.path.join(root, rel)
        if not os.path.isdir(src):
            raise SystemExit("gpucheck manifest: %s is missing" % src)
        dst = os.path.join(bundle, "src", rel)
        # (bench/peers/deepspeed/wheels travels beside the bundle, carried on its own)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                "*.egg-info", "build", "wheels"))
        n += sum(len(f) for _, _, f in os.walk(dst))
    return n


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def rewrite(s, root, build):
    """The build folder's paths as @BUNDLE@, the repository's as @ROOT@."""
    return s.replace(build, "@BUNDLE@").replace(root, "@ROOT@")


def build_files_named(s, build):
    """The existing regular files under build that string s names."""
    out = []
    for m in re.finditer(re.escape(build) + r"/[^\s'\"=:;,]+", s):
        p = m.group(0)
        if os.path.isfile(p):
            out.append(p)
    return out


def manifest_entry(t, root, build):
    """One ctest test as a manifest entry, or (None, why)."""
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    cmd = t.get("command")
    if t["name"] in NOT_BUNDLED:
        return None, NOT_BUNDLED[t["name"]]
    if not cmd:
        return None, "no command (its program is not built)"
    exe = cmd[0]
    if os.path.isabs(exe) and not exe.startswith(build) and not exe.startswith(root):
        exe = os.path.basename(exe)  # sh, cmake, python3: from PATH there
    words = [exe] + cmd[1:]

    def as_list(v):
        return v if isinstance(v, list) else ([v] if v else [])

    entry = {
        "name": t["name"],
        "command": [bundle_sources(rewrite(w, root, build)) for w in words],
        "cwd": bundle_sources(rewrite(props.get("WORKING_DIRECTORY", build), root, build)),
        "timeout": float(props.get("TIMEOUT", 1500)),
        "skip_rc": props.get("SKIP_RETURN_CODE"),
        "will_fail": bool(props.get("WILL_FAIL", False)),
        "pass_regex": as_list(props.get("PASS_REGULAR_EXPRESSION")),
        "fail_regex": as_list(props.get("FAIL_REGULAR_EXPRESSION")),
        "env": [bundle_sources(rewrite(e, root, build))
                for e in as_list(props.get("ENVIRONMENT"))],
        "serial": bool(props.get("RUN_SERIAL", False)),
        "labels": as_list(props.get("LABELS")),
    }
    return entry, None


def make_manifest(ctest_json, root, build, bundle):
    """Writes BUNDLE/tests.json and copies the files the tests name from the
    build folder (their programs) into BUNDLE at the same relative paths."""
    root, build = os.path.abspath(root), os.path.abspath(build)
    with open(ctest_json) as f:
        tests = json.load(f)["tests"]
    entries, left_out, copied = [], [], set()
    for t in tests:
        entry, why = manifest_entry(t, root, build)
        if not entry:
            left_out.append({"name": t["name"], "why": why})
            continue
        entries.append(entry)
        env = [p["value"] for p in t.get("properties", []) if p["name"] == "ENVIRONMENT"]
        env = env[0] if env and isinstance(env[0], list) else env
        for s in (t.get("command") or []) + env:  # the build's paths, before rewrite
            for p in build_files_named(s, build):
                dst = os.path.join(bundle, os.path.relpath(p, build))
                if p not in copied:
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copy2(p, dst)
                    copied.add(p)
    sources = copy_sources(root, bundle)
    with open(os.path.join(bundle, "tests.json"), "w") as f:
        json.dump({"tests": entries, "left_out": left_out}, f, indent=1)
    print("gpucheck manifest: %d tests, %d left out, %d files copied, %d source files in src/" %
          (len(entries), len(left_out), len(copied), sources))
    return 0


# ---- running tests as ctest would ----------------------------------------------------


# MPI: libferry opens libmpi.so.40 (the bundle carries it and its libraries)
# when the first MPI or NCCL communicator is made, but OpenMPI starts only
# with its mca_* plugins and help files, which the bundle does not carry: a
# test that starts MPI runs only where the machine has OpenMPI (mpirun on
# PATH), else it is a skip saying so. Those tests: label mpi, an MPI
# launcher among the command's words, or NCCL's (its bootstrap is MPI).
MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun")
NEEDS_MPI = {"comm.nccl": "the NCCL communicator starts over MPI"}


def needs_missing_mpi(t):
    """Why manifest entry t cannot run here (it starts MPI and this machine
    has no OpenMPI), or None."""
    words = [os.path.basename(w) for w in t["command"]]
    if not ("mpi" in t.get("labels", []) or t["name"] in NEEDS_MPI or
            any(w in MPI_LAUNCHERS for w in words)):
        return None
    if any(shutil.which(m) for m in MPI_LAUNCHERS):
        return None
    return ("needs OpenMPI (%s), which this machine lacks (no mpirun on PATH) and the bundle "
            "does not carry: its libmpi.so.40 cannot start without OpenMPI's mca_* plugins and "
            "help files" % NEEDS_MPI.get(t["name"], "it starts MPI"))


def resolve(s, root, bundle):
    return s.replace("@ROOT@", root).replace("@BUNDLE@", bundle)


def tail(text, lines=15, chars=2000):
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def test_verdict(t, rc, out):
    """ctest's rules: the skip code first, then the pass/fail expressions,
    then the exit status; WILL_FAIL inverts pass and fail."""
    if t.get("skip_rc") is not None and rc == t["skip_rc"]:
        return "skip"
    if any(re.search(r, out, re.S) for r in t.get("fail_regex", [])):
        ok = False
    elif t.get("pass_regex"):
        ok = any(re.search(r, out, re.S) for r in t["pass_regex"])
    else:
        ok = rc == 0
    if t.get("will_fail"):
        ok = not ok
    return "pass" if ok else "fail"


def run_one_test(t, ctx, deadline, wrap=None, timeout_cap=None):
    """Runs manifest entry t; returns its record. wrap: words put before the
    command (compute-sanitizer)."""
    name = t["name"]
    left = deadline - time.time()
    if left < 3:
        return {"name": name, "status": "not_run", "why": "out of the part's time"}
    why = needs_missing_mpi(t)
    if why:
        return {"name": name, "status": "skip", "why": why}
    limit = min(t["timeout"], left, timeout_cap or t["timeout"])
    cmd = (wrap or []) + [resolve(w, ctx["root"], ctx["bundle"]) for w in t["command"]]
    cwd = resolve(t["cwd"], ctx["root"], ctx["bundle"])
    os.makedirs(cwd, exist_ok=True)
    env = dict(ctx["env"])
    for e in t.get("env", []):
        k, _, v = resolve(e, ctx["root"], ctx["bundle"]).partition("=")
        env[k] = v
    log = os.path.join(ctx["logs"], re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".log")
    t0 = time.time()
    res = run_cmd(cmd, limit, env=env, cwd=cwd, log=log, gpu_optional=True)
    rec = {"name": name, "wall_s": round(time.time() - t0, 3), "rc": res["rc"],
           "log": os.path.relpath(log, ctx["out"]) if ctx.get("out") else log}
    if res["timed_out"] and limit < t["timeout"]:
        rec.update(status="cut", why="stopped at the part's time limit (%.0f s left), not at "
                                     "its own %.0f s" % (limit, t["timeout"]))
    elif res["timed_out"]:
        rec.update(status="timeout", why="ran past its %.0f s" % limit)
    elif res["rc"] is None:
        rec.update(status="fail", why=res["error"])
    else:
        rec["status"] = test_verdict(t, res["rc"], res["output"])
    if rec["status"] != "pass":
        rec["tail"] = tail(res["output"])
    return rec


def run_tests(tests, ctx, deadline, jobs=1, wrap=None, timeout_cap=None):
    """Serial tests (and all of them when jobs is 1) one at a time, the rest
    jobs at a time; records in the manifest's order."""
    serial = [t for t in tests if jobs == 1 or t.get("serial")]
    parallel = [t for t in tests if not (jobs == 1 or t.get("serial"))]
    recs = {}
    for t in serial:
        recs[t["name"]] = run_one_test(t, ctx, deadline, wrap, timeout_cap)
    if parallel:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = {pool.submit(run_one_test, t, ctx, deadline, wrap, timeout_cap): t
                    for t in parallel}
            for fu in concurrent.futures.as_completed(futs):
                recs[futs[fu]["name"]] = fu.result()
    return [recs[t["name"]] for t in tests]


def count_statuses(recs):
    c = {}
    for r in recs:
        c[r["status"]] = c.get(r["status"], 0) + 1
    return c


# ---- processes -----------------------------------------------------------------------


# Every child started (each leads its own process group, so a time limit
# kills its whole tree); the check kills those left when it is stopped.
LIVE = set()


def kill_live():
    for p in list(LIVE):
        kill_group(p)


def run_cmd(cmd, timeout, env=None, cwd=None, log=None, gpu_optional=False):
    """Runs cmd with a time limit (its whole process group is killed past
    it); output (stdout and stderr together) into log and returned. In a
    rehearsal (--rehearse) a program that finds no GPU raises
    gpucheck_rehearse.NeedsGpu, unless gpu_optional (the part goes on
    without its figures, as it would on the GPU machine)."""
    res = _run_cmd(cmd, timeout, env, cwd, log)
    if not gpu_optional:
        gpucheck_rehearse.stop_if_no_gpu(cmd, res["rc"], res["output"])
    return res


def _run_cmd(cmd, timeout, env, cwd, log):
    t0 = time.time()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                             cwd=cwd, start_new_session=True)
        LIVE.add(p)
    except OSError as e:
        out = "cannot run %s: %s" % (cmd[0], e)
        if log:
            with open(log, "w") as f:
                f.write("$ %s\n%s\n" % (shlex.join(cmd), out))
        return {"rc": None, "timed_out": False, "output": out, "error": out,
                "wall_s": 0.0, "stdout": ""}
    timed_out = False
    try:
        out, _ = p.communicate(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(p)
        out, _ = p.communicate()
    LIVE.discard(p)
    text = out.decode("utf-8", "replace")
    if log:
        with open(log, "w") as f:
            f.write("$ %s\n%s" % (shlex.join(cmd), text))
            if timed_out:
                f.write("\n[gpucheck: killed after %.0f s]\n" % timeout)
    return {"rc": None if timed_out else p.returncode, "timed_out": timed_out,
            "output": text, "error": "timed out" if timed_out else "",
            "wall_s": round(time.time() - t0, 3)}


def kill_group(p):
    try:
        os.killpg(p.pid, 9)
    except OSError:
        pass


def json_lines(text):
    """The JSON objects among text's lines."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


class MemSampler:
    """nvidia-smi's memory.used (MiB) of GPU 0 every 100 ms while running."""

    def __init__(self):
        self.peak = None
        self.samples = 0
        self.p = None
        if not shutil.which("nvidia-smi"):
            return
        try:
            self.p = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-lms", "100", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True)
            LIVE.add(self.p)
        except OSError:
            return
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            try:
                v = float(line.decode().strip())
            except ValueError:
                continue
            self.samples += 1
            self.peak = v if self.peak is None else max(self.peak, v)

    def stop(self):
        if self.p:
            time.sleep(0.25)  # one more sample after the run
            kill_group(self.p)
            self.p.wait()
            LIVE.discard(self.p)
            self.t.join(2)
        return self.peak


def gpu_memory_used_mib():
    r = run_cmd(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-i", "0"], 20)
    try:
        return float(r["output"].strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


# ---- results.json --------------------------------------------------------------------


class Results:
    """OUTDIR/results.json, rewritten whole (atomically) after every part."""

    def __init__(self, out, header):
        self.path = os.path.join(out, "results.json")
        self.data = dict(header)
        self.data["parts"] = {}
        self.t0 = time.time()
        self.write()

    def part(self, name, status, command="", wall_s=0.0, figures=None, reason=None, log=None,
             timed_out=False, quiet=False):
        p = {"status": status, "command": command, "wall_s": round(wall_s, 3),
             "limit_s": ALLOW.get(name), "figures": figures or {}}
        if reason:
            p["reason"] = reason
        if log:
            p["log"] = log
        if timed_out:
            p["timed_out"] = True
        self.data["parts"][name] = p
        self.write()
        if not quiet:
                print("gpucheck: %-12s %-4s %6.1f s%s" % (name, status, wall_s,
                                                       "  (" + reason + ")" if reason else ""),
                  flush=True)

    def write(self):
        self.data["wall_s"] = round(time.time() - self.t0, 3)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


# ---- figures (pure functions: selftest covers them) ----------------------------------


def copy_rows(ferry_runs, peak_runs):
    """Per direction and size: the best GB/s of each program over its runs
    and ferry / peak."""
    def best(runs):
        b = {}
        for run in runs:
            for o in run:
                k = (o.get("direction"), o.get("bytes"))
                if "gb_per_s" in o and (k not in b or o["gb_per_s"] > b[k]):
                    b[k] = o["gb_per_s"]
        return b
    f, p = best(ferry_runs), best(peak_runs)
    rows = []
    for k in sorted(set(f) | set(p), key=lambda k: (str(k[0]), k[1] or 0)):
        r = {"direction": k[0], "bytes": k[1], "ferry_gbps": f.get(k), "peak_gbps": p.get(k)}
        if f.get(k) and p.get(k):
            r["ratio"] = round(f[k] / p[k], 4)
        rows.append(r)
    return rows


def losses_of(text):
    """The per-step losses of a ferry-gpt --json run, and its lines."""
    objs = json_lines(text)
    steps = [o for o in objs if "step" in o and "loss" in o and not o.get("final")]
    return [o["loss"] for o in steps], steps


def max_rel_diff(a, b):
    """max |a_i - b_i| / |b_i| over the common steps (b: the reference)."""
    n = min(len(a), len(b))
    if n == 0:
        return None
    return max(abs(a[i] - b[i]) / max(abs(b[i]), 1e-30) for i in range(n))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def parse_size_mib(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)i?B?\s*", str(s), re.I)
    if not m:
        return None
    mul = {"": 1.0 / 1048576, "K": 1.0 / 1024, "M": 1.0, "G": 1024.0, "T": 1048576.0}
    return float(m.group(1)) * mul[m.group(2).upper()]


def timeline_overlap(trace, steps):
    """From a Chrome trace of the engine (format/timeline.c): each lane's
    busy seconds per step (the union of its spans), the step time (the
    trace's extent / steps) and step time / the busiest lane."""
    names, spans = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e.get("args", {}).get("name", str(e["tid"]))
        elif e.get("ph") == "X":
            spans.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    if not spans or steps < 1:
        return None
    lo = min(s[0] for v in spans.values() for s in v)
    hi = max(s[1] for v in spans.values() for s in v)
    busy = {}
    for tid, v in spans.items():
        total, end = 0.0, None
        for a, b in sorted(v):
            if end is None or a > end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
        busy[names.get(tid, str(tid))] = total * 1e-6 / steps
    busy.pop("step", None)  # the step lane spans the whole step
    step_s = (hi - lo) * 1e-6 / steps
    longest = max(busy, key=busy.get) if busy else None
    return {"step_s": step_s, "busy_s": busy, "longest": longest,
            "ratio": step_s / busy[longest] if longest and busy[longest] > 0 else None}


def probe_verdict(output, rc):
    """A python's PY_PROBE output: (its figures, None) when torch imports and
    sees a GPU, else (figures, why not)."""
    objs = json_lines(output)
    d = objs[-1] if objs else {}
    if rc != 0 or not objs:
        return d, "the probe exited %s: %s" % (rc, tail(output, 2) or "no output")
    if "error" in d:
        return d, d["error"]
    if not d.get("available"):
        return d, "torch %s (CUDA %s) sees no GPU: torch.cuda.is_available() is false" % (
            d.get("torch"), d.get("cuda"))
    return d, None


def python_cuda_tests(manifest, python):
    """The manifest's python tests as the python part runs them: under python
    (the one whose torch sees the GPU) with FERRY_PY_DEVICE=cuda. Returns
    (entries, {name: why left out}); only entries that run a python script
    count (a build without torch registers them as sh -c skips)."""
    tests, left = [], {}
    for t in manifest:
        if not t["name"].startswith("python."):
            continue
        if t["name"] in PY_NOT_ON_CUDA:
            left[t["name"]] = PY_NOT_ON_CUDA[t["name"]]
        elif not os.path.basename(t["command"][0]).startswith("python"):
            left[t["name"]] = "registered without python (the build found none with torch): " \
                + shlex.join(t["command"])[:120]
        else:
            tests.append(dict(t, command=[python] + t["command"][1:],
                              env=t.get("env", []) + ["FERRY_PY_DEVICE=cuda"]))
    return tests, left


def target(name, value, limit, kind="max", note=None):
    """One summary row: met when value <= limit (kind max) or >= (min);
    None when not measured."""
    met = None
    if value is not None and limit is not None:
        met = value <= limit if kind == "max" else value >= limit
    t = {"target": name, "value": value, "limit": limit, "kind": kind, "met": met}
    if note:
        t["note"] = note
    return t


# ---- the machine ---------------------------------------------------------------------


def cuda_lib_dirs(needs):
    """Folders of this machine's CUDA libraries that hold the sonames the
    bundle needs (the bundle carries none): nvcc's toolkit, /usr/local/cuda*,
    pip's nvidia wheels. Returns (folders, sonames not found)."""
    cands = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        top = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        cands += [os.path.join(top, "lib64"), os.path.join(top, "targets/x86_64-linux/lib")]
    cands += ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
    cands += sorted(glob.glob("/usr/local/cuda-*/lib64"), reverse=True)
    for sp in sys.path:
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    cands += ["/usr/lib/x86_64-linux-gnu", "/usr/local/lib"]
    chosen, missing = [], set(needs)
    for d in cands:
        if not missing:
            break
        have = {n for n in missing if os.path.exists(os.path.join(d, n))}
        if have and d not in chosen:
            chosen.append(d)
            missing -= have
    return chosen, sorted(missing)


def bundle_env(bundle, lib_dirs):
    """The environment the bundle's programs run in: its lib/ first, then
    the CUDA folders and the driver's."""
    env = dict(os.environ)
    dirs = [os.path.join(bundle, "lib")] + lib_dirs
    if os.path.isdir("/usr/local/nvidia/lib64"):
        dirs.append("/usr/local/nvidia/lib64")
    if env.get("LD_LIBRARY_PATH"):
        dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(dirs)
    return env


def bundle_elves(bundle):
    out = []
    for sub in ("bin", "tests", "lib"):
        for dirpath, _, files in os.walk(os.path.join(bundle, sub)):
            out += [os.path.join(dirpath, f) for f in sorted(files)
                    if is_elf(os.path.join(dirpath, f))]
    return out


def ldd_missing(files, env, deadline=None):
    """{file: [sonames ldd cannot find]} leaving out the driver's libcuda;
    past deadline the files left are named as not checked."""
    bad = {}
    for f in files:
        if deadline is not None and time.time() > deadline:
            bad[f] = ["not checked: out of the part's time"]
            continue
        r = run_cmd(["ldd", f], 30 if deadline is None else max(deadline - time.time(), 1),
                    env=env)
        miss = [ln.split()[0] for ln in r["output"].splitlines() if "not found" in ln]
        miss = [m for m in miss if not m.startswith("libcuda.so")]
        if miss or r["rc"] not in (0, 1):
            bad[f] = miss or [tail(r["output"], 3)]
    return bad


def gpu_info():
    """(info dict, None) or (None, why there is no usable GPU)."""
    if not shutil.which("nvidia-smi"):
        return None, "nvidia-smi not found: no NVIDIA driver here"
    r = run_cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                 "--format=csv,noheader,nounits"], 30)
    lines = [ln for ln in r["output"].splitlines() if ln.strip()]
    if r["rc"] != 0 or not lines:
        return None, "nvidia-smi failed: " + tail(r["output"], 2)
    f = [x.strip() for x in lines[0].split(",")]
    return {"name": f[0], "driver": f[1] if len(f) > 1 else "",
            "memory_total_mib": float(f[2]) if len(f) > 2 else None, "count": len(lines)}, None


# ---- the check -----------------------------------------------------------------------

SIZES = "4M,64M,1G"
# model: (batch, seq, CPU reference timeout s, GPU run timeout s)
GPT_MODELS = {"small": (4, 128, 90, 45), "gpt2": (2, 128, 300, 75)}
PLACEMENTS = ("resident", "offload-host", "offload-nvme")
# tiers.gpu.budget per model and placement: the weights (bf16), what the
# placement keeps on the GPU, the activations and the workspace.
GPT_BUDGETS = {("small", "resident"): "1G", ("small", "offload-host"): "512M",
               ("small", "offload-nvme"): "256M", ("gpt2", "resident"): "4G",
               ("gpt2", "offload-host"): "2G", ("gpt2", "offload-nvme"): "1G"}
# The parts in the order they run, and each one's time limit (s): its
# longest share of the budget. preflight always runs; gpt, scale and 13b
# need context's figure (the memory of a bare CUDA context), so naming one
# in --parts runs context too. An issue's parts (say tests,scale) fit in
# gpu_check.sh's 455 s: 30 + 15 + 100 + 300.
ALLOW = {"preflight": 30, "context": 15, "tests": 100, "copy": 45, "bench_step": 70,
         "gpt": 170, "python": 90, "memcheck": 60, "scale": 300, "13b": 300,
         "tests_rest": 400}
ALLOW["adam"] = 60  # tools/gpucheck_adam.py: the CPU AdamW on the host, 16 threads
ALLOW["peers"] = 540  # tools/gpucheck_peers.py: ferry against DeepSpeed, resumable
ALLOW["tests_rest"] = ALLOW.pop("tests_rest")  # last: it takes what time is left
PARTS = tuple(ALLOW)
PART_NEEDS = {"gpt": ("context",), "scale": ("context",), "13b": ("context",)}


def select_parts(spec):
    """--parts LIST (comma-separated names; None: every part): (the parts to
    run in the check's order, preflight and what they need included, None)
    or (None, why LIST is refused)."""
    if spec is None:
        return list(PARTS), None
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in ALLOW]
    if bad or not names:
        return None, "unknown part%s %s; the parts: %s" % (
            "s" if len(bad) > 1 else "", ", ".join(repr(n) for n in bad) or "(none named)",
            parts_text())
    want = {"preflight"} | set(names)
    for n in names:
        want |= set(PART_NEEDS.get(n, ()))
    return [n for n in PARTS if n in want], None


def parts_text():
    return ", ".join("%s (%d s)" % (n, ALLOW[n]) for n in PARTS)


# The python part: the pythons tried in order (FERRY_GPU_PYTHON alone when
# set), the probe each runs (its arguments: more modules it must import),
# and the python tests it does not run on cuda.
GPU_PYTHONS = ("/opt/torch/.venv/bin/python", "python3")
PY_PROBE = ("import importlib, json, sys\n"
            "for m in ['torch'] + sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "    except Exception as e:\n"
            "        print(json.dumps({'error': 'import %s: %s' % (m, e)}))\n"
            "        raise SystemExit(0)\nimport torch\n"
            "d = {'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "     'available': torch.cuda.is_available()}\n"
            "if d['available']:\n    d['device'] = torch.cuda.get_device_name(0)\n"
            "print(json.dumps(d))\n")
PY_NOT_ON_CUDA = {"python.install": "pip packaging: nothing of the device",
                  "python.install.full": "pip packaging: nothing of the device",
                  "python.finetune_example": "examples/python/finetune.py runs the host "
                                             "backend only"}


class Check:
    def __init__(self, a):
        self.root, self.bundle = os.path.abspath(a.root), os.path.abspath(a.bundle)
        self.out = os.path.abspath(a.out)
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.nvme = os.path.join(self.out, "nvme")
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget
        self.dry_run = a.dry_run
        gpucheck_rehearse.ON = self.rehearse = a.rehearse and not a.dry_run
        self.parts, _ = select_parts(a.parts)
        self.no_gpu = "--dry-run: the GPU parts are not run" if a.dry_run else None
        self.manifest = []
        self.context_mib = None
        self.baseline_mib = None
        self.cpu_ref = {}
        self.cpu_thread = None
        needs = self.read_list("cuda_needs.txt")
        self.lib_dirs, self.libs_missing = cuda_lib_dirs(needs)
        self.env = bundle_env(self.bundle, self.lib_dirs)
        gpu, why = (None, self.no_gpu) if self.no_gpu else gpu_info()
        if self.rehearse:  # every part runs until a program finds no GPU
            gpu, why = {"name": "none (--rehearse)", "driver": "", "memory_total_mib": None,
                        "count": 0}, None
        self.no_gpu = self.no_gpu or why
        self.res = Results(self.out, {
            "schema": 1, "tool": "tools/gpu_check.sh", "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": a.budget,
            "gpu": gpu, "no_gpu_reason": self.no_gpu, "bundle": self.bundle,
            "parts_asked": a.parts or "all", "parts_run": self.parts, "rehearsal": self.rehearse,
            "cuda_lib_dirs": self.lib_dirs, "ld_library_path": self.env["LD_LIBRARY_PATH"]})

    def read_list(self, name):
        try:
            with open(os.path.join(self.bundle, name)) as f:
                return f.read().split()
        except OSError:
            return []

    def prog(self, name):
        return os.path.join(self.bundle, "bin", name)

    def allow(self, part):
        return min(ALLOW[part], self.deadline - time.time())

    def ctx(self):
        return {"root": self.root, "bundle": self.bundle, "env": self.env, "logs": self.logs,
                "out": self.out}

    def log(self, name):
        return os.path.join(self.logs, name + ".log")

    def run(self, cmd, timeout, log, sampler=False):
        """A bundle program: its result, and the peak memory.used while it ran."""
        s = MemSampler() if sampler else None
        r = run_cmd(cmd, timeout, env=self.env, cwd=self.root, log=self.log(log))
        r["peak_mib"] = s.stop() if s else None
        r["command"] = shlex.join(cmd)
        return r

    def gpu_skip(self, name):
        """Records part name as skipped when there is no GPU: True then."""
        if not self.no_gpu:
            return False
        self.res.part(name, "skip", reason=self.no_gpu)
        return True

    def time_skip(self, name, need=8):
        if self.deadline - time.time() >= need:
            return False
        self.res.part(name, "skip", reason="out of time: the check's budget is spent")
        return True

    # -- preflight: the bundle is there and every library resolves
    def preflight(self):
        t0 = time.time()
        figs = {"cuda_needs": self.read_list("cuda_needs.txt"), "cuda_lib_dirs": self.lib_dirs,
                "cuda_libs_missing": self.libs_missing}
        mf = os.path.join(self.bundle, "tests.json")
        if not os.path.isfile(mf):
            self.res.part("preflight", "fail", "", time.time() - t0, figs,
                          reason="no bundle at %s (run tools/gpu_bundle.sh where ferry builds, "
                                 "then carry gpucheck/)" % self.bundle)
            return False
        with open(mf) as f:
            self.manifest = json.load(f)["tests"]
        elves = bundle_elves(self.bundle)
        for f in elves:  # in case the copy lost the mode bits
            if "/lib/" not in f and not os.access(f, os.X_OK):
                os.chmod(f, 0o755)
        bad = ldd_missing(elves, self.env, t0 + self.allow("preflight")) \
            if shutil.which("ldd") else {}
        figs.update(files_checked=len(elves), unresolved={
            os.path.relpath(k, self.bundle): v for k, v in bad.items()}, tests=len(self.manifest))
        ok = not bad and not self.libs_missing
        self.res.part("preflight", "pass" if ok else "fail", "ldd on every bundled file",
                      time.time() - t0, figs,
                      reason=None if ok else "libraries not found (figures.unresolved, "
                                             "figures.cuda_libs_missing)")
        return True

    # -- the tests, as ctest runs them
    def tests_part(self, name, select, jobs):
        if self.gpu_skip(name) or self.time_skip(name):
            return
        tests = [t for t in self.manifest if select(t["name"])]
        t0 = time.time()
        recs = run_tests(tests, self.ctx(), t0 + self.allow(name), jobs=jobs)
        c = count_statuses(recs)
        bad = c.get("fail", 0) + c.get("timeout", 0)
        short = c.get("cut", 0) + c.get("not_run", 0)  # said, never passed over in silence
        why = ["%d failed or timed out" % bad] if bad else []
        if short:
            why.append("%d of %d cut or not run: out of the part's %.0f s" % (
                short, len(recs), ALLOW[name]))
        self.res.part(name, "fail" if bad else "pass", "the manifest's commands (gpucheck/tests.json)",
                      time.time() - t0, {"counts": c, "tests": recs},
                      reason="; ".join(why) or None)
        return recs

    # -- the memory an idle CUDA context takes (the allowance over the budget)
    def context_part(self):
        if self.gpu_skip("context") or self.time_skip("context"):
            return
        self.baseline_mib = gpu_memory_used_mib()
        cmd = [self.prog("ferry-cuda-peak"), "--context", "--hold", "2", "--json"]
        r = self.run(cmd, self.allow("context"), "context", sampler=True)
        objs = json_lines(r["output"])
        figs = {"baseline_mib": self.baseline_mib, "peak_mib": r["peak_mib"],
                "cuda_mem_get_info": objs[0] if objs else None}
        if r["peak_mib"] is not None and self.baseline_mib is not None:
            self.context_mib = r["peak_mib"] - self.baseline_mib
        elif objs:
            self.context_mib = objs[0].get("used_bytes", 0) / 1048576.0
        figs["context_mib"] = self.context_mib
        ok = r["rc"] == 0
        self.res.part("context", "pass" if ok else "fail", r["command"], r["wall_s"], figs,
                      log="logs/context.log", timed_out=r["timed_out"],
                      reason=None if ok else tail(r["output"], 3))
        if r["rc"] == 77:  # the driver is there but CUDA cannot use the GPU
            self.no_gpu = "CUDA cannot use the GPU (part context): " + tail(r["output"], 1)

    # -- ferry bench copy against the raw cudaMemcpyAsync ceiling
    def copy_part(self):
        if self.gpu_skip("copy") or self.time_skip("copy"):
            return
        t0 = time.time()
        deadline = t0 + self.allow("copy")
        peak = [self.prog("ferry-cuda-peak"), "--size", SIZES, "--iters", "10", "--json"]
        fer = [self.prog("ferry"), "bench", "copy", "--device", "cuda", "--size", SIZES,
               "--iters", "10", "--json"]
        runs = {"peak": [], "ferry": []}
        errors = []
        for k, (what, cmd) in enumerate([("peak", peak), ("ferry", fer)] * 2):
            left = deadline - time.time()
            if left < 3:
                errors.append("%s run %d: out of the part's time" % (what, k // 2 + 1))
                continue
            r = self.run(cmd, left, "copy-%s-%d" % (what, k // 2 + 1))
            if r["rc"] != 0:
                errors.append("%s: %s" % (what, r["error"] or tail(r["output"], 3)))
            runs[what].append(json_lines(r["output"]))
        rows = copy_rows(runs["ferry"], runs["peak"])
        figs = {"rows": rows, "method": "best of two runs of each, each the median of 10 "
                "after a warm-up; wall time to stream synchronize"}
        for d in ("h2d", "d2h", "bidirectional"):
            rs = [r["ratio"] for r in rows if r["direction"] == d and "ratio" in r]
            figs["min_ratio_" + d] = min(rs) if rs else None
        ok = not errors and all(figs["min_ratio_" + d] is not None and figs["min_ratio_" + d] >= 0.9
                                for d in ("h2d", "d2h"))
        self.res.part("copy", "pass" if ok else "fail", shlex.join(fer) + " ; " + shlex.join(peak),
                      time.time() - t0, figs, log="logs/copy-*.log",
                      reason="; ".join(errors) if errors else
                      (None if ok else "ferry's H2D or D2H below 0.90 of the raw peak"))

    # -- ferry bench step on cuda: params on the host, optimizer host then NVMe
    def bench_step_part(self):
        if self.gpu_skip("bench_step") or self.time_skip("bench_step"):
            return
        t0 = time.time()
        deadline = t0 + self.allow("bench_step")
        base = [self.prog("ferry"), "bench", "step", "--config",
                os.path.join(self.root, "examples/configs/offload-nvme.cfg"), "--set", "device=cuda",
                "--set", "tiers.host.pinned=true", "--set", "tiers.nvme.paths=" + self.nvme]
        timed = ["--groups", "24", "--dim", "2048", "--compute-ms", "4", "--steps", "5",
                 "--no-validate", "--set", "tiers.gpu.budget=512M", "--set", "tiers.host.budget=4G",
                 "--json"]
        runs = [("validated", base + ["--set", "placement.optimizer=host", "--groups", "4", "--dim",
                                      "256", "--compute-ms", "1", "--steps", "2", "--json"]),
                ("optimizer_host", base + ["--set", "placement.optimizer=host"] + timed +
                 ["--timeline", os.path.join(self.out, "bench-step-host.trace.json")]),
                ("optimizer_nvme", base + timed +
                 ["--timeline", os.path.join(self.out, "bench-step-nvme.trace.json")])]
        figs, errors, cmds = {}, [], []
        for what, cmd in runs:
            os.makedirs(self.nvme, exist_ok=True)
            left = deadline - time.time()
            if left < 3:
                errors.append(what + ": out of the part's time")
                continue
            r = self.run(cmd, left, "bench-step-" + what)
            cmds.append(r["command"])
            objs = json_lines(r["output"])
            figs[what] = objs[-1] if objs else {"rc": r["rc"], "tail": tail(r["output"])}
            if r["rc"] != 0:
                errors.append("%s: %s" % (what, "timed out" if r["timed_out"] else
                                          tail(r["output"], 3)))
        self.res.part("bench_step", "fail" if errors else "pass", " ; ".join(cmds),
                      time.time() - t0, figs, log="logs/bench-step-*.log",
                      reason="; ".join(errors) if errors else None)

    # -- ferry-gpt on cuda in each placement against --device cpu
    def gpt_args(self, model):
        batch, seq, _, _ = GPT_MODELS[model]
        return ["train", "--model", model, "--data",
                os.path.join(self.root, "docs/FERRY-GPT.md"), "--steps", "10", "--batch",
                str(batch), "--seq", str(seq), "--seed", "1", "--json"]

    def start_cpu_reference(self):
        """The --device cpu runs, one model after the other, on 8 threads
        beside the GPU parts (the engine's losses do not depend on the
        placement, so one reference per model serves all three)."""
        if self.no_gpu or self.rehearse or not os.path.exists(self.prog("ferry-gpt")):
            return  # (a rehearsal's gpt part stops at its first GPU run)

        def work():
            for model in GPT_MODELS:
                cmd = [self.prog("ferry-gpt")] + self.gpt_args(model) + [
                    "--device", "cpu", "--threads", "8", "--engine",
                    os.path.join(self.root, "examples/configs/resident.cfg"), "--set",
                    "device=host", "--set", "tiers.gpu.budget=4G", "--set", "tiers.host.budget=2G"]
                left = min(GPT_MODELS[model][2], self.deadline - time.time())
                r = self.run(cmd, max(left, 1), "gpt-%s-cpu" % model)
                losses, steps = losses_of(r["output"])
                self.cpu_ref[model] = {
                    "status": "pass" if r["rc"] == 0 and len(losses) == 10 else "fail",
                    "command": r["command"], "wall_s": r["wall_s"], "timed_out": r["timed_out"],
                    "losses": losses,
                    "tokens_per_s": median([s.get("tokens_per_s") for s in steps[1:]
                                            if s.get("tokens_per_s")])}
                if r["rc"] != 0:
                    self.cpu_ref[model]["tail"] = tail(r["output"])

        self.cpu_thread = threading.Thread(target=work, daemon=True)
        self.cpu_thread.start()

    def gpt_run(self, model, cfg, timeout):
        budget = GPT_BUDGETS[(model, cfg)]
        cmd = [self.prog("ferry-gpt")] + self.gpt_args(model) + [
            "--device", "cuda", "--engine", os.path.join(self.root, "examples/configs", cfg + ".cfg"),
            "--set", "device=cuda", "--set", "tiers.gpu.budget=" + budget,
            "--set", "tiers.host.pinned=true"]
        trace = None
        if cfg == "offload-nvme":
            os.makedirs(self.nvme, exist_ok=True)
            cmd += ["--set", "tiers.nvme.paths=" + self.nvme]
            if model == "gpt2":
                trace = os.path.join(self.out, "gpt-gpt2-offload-nvme.trace.json")
                cmd += ["--timeline", trace]
        r = self.run(cmd, timeout, "gpt-%s-%s" % (model, cfg), sampler=True)
        losses, steps = losses_of(r["output"])
        rec = {"model": model, "placement": cfg, "status": "pass" if r["rc"] == 0 else "fail",
               "rc": r["rc"], "timed_out": r["timed_out"], "command": r["command"],
               "wall_s": r["wall_s"], "losses": losses, "budget": budget,
               "budget_mib": parse_size_mib(budget),
               "tokens_per_s": median([s.get("tokens_per_s") for s in steps[1:]
                                       if s.get("tokens_per_s")]),
               "peak_bytes": steps[-1].get("peak_bytes") if steps else None,
               "peak_mem_used_mib": r["peak_mib"]}
        if r["peak_mib"] is not None and self.baseline_mib is not None:
            rec["device_mib"] = r["peak_mib"] - self.baseline_mib
        if r["rc"] != 0 or len(losses) != 10:
            rec["status"] = "fail"
            rec["tail"] = tail(r["output"])
        if trace and os.path.isfile(trace) and r["rc"] == 0:
            try:
                with open(trace) as f:
                    rec["timeline"] = timeline_overlap(json.load(f), max(len(losses), 1))
            except (OSError, ValueError) as e:
                rec["timeline"] = {"error": str(e)}
        return rec

    def gpt_part(self):
        if self.gpu_skip("gpt") or self.time_skip("gpt"):
            return
        t0 = time.time()
        deadline = t0 + self.allow("gpt")
        runs = []
        for model in GPT_MODELS:
            for cfg in PLACEMENTS:
                left = min(GPT_MODELS[model][3], deadline - time.time())
                if left < 5:
                    runs.append({"model": model, "placement": cfg, "status": "not_run",
                                 "why": "out of the part's time"})
                    continue
                runs.append(self.gpt_run(model, cfg, left))
                self.gpt_figures(runs, t0, final=False)
        if self.cpu_thread:
            self.cpu_thread.join(max(deadline - time.time(), 1))
        self.gpt_figures(runs, t0, final=True)

    def gpt_figures(self, runs, t0, final):
        for rec in runs:
            ref = self.cpu_ref.get(rec["model"], {}).get("losses")
            if rec.get("losses") and ref:
                rec["max_rel_diff_vs_cpu"] = max_rel_diff(rec["losses"], ref)
            if rec.get("device_mib") is not None and self.context_mib is not None:
                rec["allowed_mib"] = rec["budget_mib"] + self.context_mib
                rec["within_budget"] = rec["device_mib"] <= rec["allowed_mib"]
        bad = [r for r in runs if r["status"] != "pass"]
        figs = {"runs": runs, "cpu_reference": self.cpu_ref, "context_mib": self.context_mib,
                "baseline_mib": self.baseline_mib}
        status = "fail" if bad else "pass"
        if not final:
            status = "fail" if bad else "running"
        self.res.part("gpt", status, "ferry-gpt train ... (figures.runs[].command)",
                      time.time() - t0, figs, log="logs/gpt-*.log", quiet=not final,
                      reason="%d of %d runs failed or did not run" % (len(bad), len(runs))
                      if bad else None)

    # -- the Python binding on cuda: the python tests with FERRY_PY_DEVICE=cuda
    def gpu_python(self, modules=()):
        """The first python whose torch sees the GPU and that imports
        modules: (its path or None, each candidate's probe)."""
        wanted = os.environ.get("FERRY_GPU_PYTHON")
        cands = [wanted] if wanted else list(GPU_PYTHONS)
        probes = []
        for c in cands:
            exe = c if os.path.isabs(c) else shutil.which(c)
            if not exe or not os.access(exe, os.X_OK):
                probes.append({"python": c, "why": "not found"})
                continue
            r = run_cmd([exe, "-c", PY_PROBE] + list(modules), 90, env=self.env, cwd=self.root,
                        gpu_optional=True)
            figs, why = probe_verdict(r["output"], r["rc"])
            probes.append(dict(figs, python=exe, why=why) if why else dict(figs, python=exe))
            if not why:
                return exe, probes
        return None, probes

    def python_part(self):
        if self.gpu_skip("python") or self.time_skip("python"):
            return
        t0 = time.time()
        python, probes = self.gpu_python()
        figs = {"python": python, "probes": probes}
        if not python:
            self.res.part("python", "skip", "", time.time() - t0, figs,
                          reason="no python whose torch sees the GPU: " + "; ".join(
                              "%s: %s" % (p["python"], p["why"]) for p in probes))
            return
        tests, left = python_cuda_tests(self.manifest, python)
        figs["left_out"] = left
        if not tests:
            self.res.part("python", "skip", "", time.time() - t0, figs,
                          reason="the bundle's manifest has no python test to run")
            return
        recs = run_tests(tests, self.ctx(), t0 + self.allow("python"), jobs=4)
        c = count_statuses(recs)
        figs.update(counts=c, tests=recs)
        bad = c.get("fail", 0) + c.get("timeout", 0)
        self.res.part("python", "fail" if bad else "pass",
                      "FERRY_PY_DEVICE=cuda %s <each python test of the manifest>" % python,
                      time.time() - t0, figs, log="logs/python.*.log",
                      reason="%d failed or timed out" % bad if bad else None)

    # -- compute-sanitizer memcheck on the CUDA tests
    def sanitizer(self):
        found = shutil.which("compute-sanitizer")
        nvcc = shutil.which("nvcc")
        cands = [found] if found else []
        if nvcc:
            cands.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), "compute-sanitizer"))
        cands += ["/usr/local/cuda/bin/compute-sanitizer",
                  "/usr/local/cuda/compute-sanitizer/compute-sanitizer"]
        return next((c for c in cands if c and os.access(c, os.X_OK)), None)

    def memcheck_part(self):
        if self.gpu_skip("memcheck") or self.time_skip("memcheck", 15):
            return
        tool = self.sanitizer()
        if not tool:
            self.res.part("memcheck", "skip", reason="compute-sanitizer not found (PATH, nvcc's "
                          "folder, /usr/local/cuda)")
            return
        t0 = time.time()
        tests = sorted([t for t in self.manifest if "cuda" in t["name"]], key=lambda t: t["timeout"])
        wrap = [tool, "--tool", "memcheck", "--error-exitcode", "1", "--target-processes", "all"]
        recs = run_tests(tests, self.ctx(), t0 + self.allow("memcheck"), jobs=1, wrap=wrap,
                         timeout_cap=45)
        unsupported = None
        for r in recs:
            m = re.search(r"Device not supported|not supported on this|Unable to find injection|"
                          r"unsupported", r.get("tail", ""))
            if r["status"] == "fail" and m:
                r["status"], r["why"] = "skip", "compute-sanitizer cannot run here: " + m.group(0)
                unsupported = r["why"]
            elif r["status"] == "fail":
                # memcheck's target is memory errors: a program that made no CUDA
                # call, or a test that failed on its own with 0 errors found (the
                # tests part counts that failure), is not one (seen on an H100)
                tail = r.get("tail", "")
                if "terminated before first instrumented API call" in tail:
                    r["status"], r["why"] = "skip", "no CUDA call: memcheck had nothing to check"
                elif "ERROR SUMMARY: 0 errors" in tail:
                    r["status"], r["why"] = "skip", ("the test itself failed (see the tests part); "
                                                     "memcheck found 0 errors")
        c = count_statuses(recs)
        status = "fail" if c.get("fail") else ("skip" if unsupported and not c.get("pass")
                                               else "pass")
        self.res.part("memcheck", status, shlex.join(wrap) + " <each CUDA test>", time.time() - t0,
                      {"counts": c, "tests": recs, "tool": tool}, log="logs/",
                      reason=unsupported if status == "skip" else
                      ("memcheck found errors (figures.tests)" if status == "fail" else None))

    # -- the summary: each target, met or not
    def summary(self):
        P = self.res.data["parts"]
        fig = lambda name: P.get(name, {}).get("figures", {})
        rows = [target("ferry H2D / raw cudaMemcpyAsync (min over 4M, 64M, 1G)",
                       fig("copy").get("min_ratio_h2d"), 0.90, "min"),
                target("ferry D2H / raw cudaMemcpyAsync (min over 4M, 64M, 1G)",
                       fig("copy").get("min_ratio_d2h"), 0.90, "min")]
        nvme = [r for r in fig("gpt").get("runs", [])
                if r["model"] == "gpt2" and r["placement"] == "offload-nvme"]
        rows.append(target("gpt2 step, params on the host (offload-nvme): step time / longest "
                           "component (timeline)",
                           ((nvme[0].get("timeline") or {}) if nvme else {}).get("ratio"), 1.15))
        for what in ("optimizer_host", "optimizer_nvme"):
            rows.append(target("bench step %s: overlap_ratio (modelled compute)" % what,
                               fig("bench_step").get(what, {}).get("overlap_ratio"), 1.15, "max"))
        runs = {(r["model"], r["placement"]): r for r in fig("gpt").get("runs", [])}
        for run in [runs.get((m, c), {"model": m, "placement": c})
                    for m in GPT_MODELS for c in PLACEMENTS]:
            name = "%s %s on cuda" % (run["model"], run["placement"])
            rows.append(target(name + ": losses vs --device cpu, max relative difference",
                               run.get("max_rel_diff_vs_cpu"), 1e-2, "max"))
            rows.append(target(name + ": peak device memory (MiB, nvidia-smi) vs budget + context",
                               run.get("device_mib"), run.get("allowed_mib"), "max",
                               note="budget %s + context %s MiB" % (
                                   GPT_BUDGETS[(run["model"], run["placement"])],
                                   self.context_mib)))
        c = fig("python").get("counts")
        rows.append(target("python on cuda: fail",
                           None if c is None else c.get("fail", 0) + c.get("timeout", 0), 0))
        for part, what in (("tests", ("fail", "timeout")), ("tests_rest", ("fail", "timeout")),
                           ("memcheck", ("fail",))):
            c = fig(part).get("counts")
            rows.append(target("%s: %s" % (part, " or ".join(what)),
                               None if c is None else sum(c.get(w, 0) for w in what), 0))
        rows += gpucheck_scale.summary_rows(fig("scale"), target)
        rows += gpucheck_13b.summary_rows(fig("13b"), target)
        rows += gpucheck_adam.summary_rows(fig("adam"), target)
        rows += gpucheck_peers.summary_rows(fig("peers"), target)
        met = [r for r in rows if r["met"] is True]
        missed = [r for r in rows if r["met"] is False]
        self.res.data["summary"] = {"targets": rows, "met": len(met), "not_met": len(missed),
                                    "not_measured": len(rows) - len(met) - len(missed)}
        failed = [k for k, v in P.items() if v["status"] == "fail"]
        self.res.data["status"] = "fail" if failed else "pass"
        self.res.data["failed_parts"] = failed
        self.res.write()
        return 1 if failed else 0

    def stopped(self, signum, frame):
        """SIGTERM (gpu_check.sh's timeout) or SIGINT: kill what runs, keep
        the parts that ended, say so in results.json, exit 124."""
        kill_live()
        self.res.data["stopped"] = "signal %d after %.0f s: the parts not listed did not end" % (
            signum, time.time() - self.t0)
        try:
            self.summary()
        except Exception as e:  # the file must still say it was stopped
            self.res.data["summary_error"] = str(e)
        self.res.data["status"] = "fail"
        self.res.write()
        print("gpucheck: stopped by signal %d; partial results written" % signum, flush=True)
        os._exit(124)

    def main(self):
        signal.signal(signal.SIGTERM, self.stopped)
        signal.signal(signal.SIGINT, self.stopped)
        print("gpucheck: results in %s/results.json%s" % (
            self.out, "" if not self.no_gpu else "; no GPU: " + self.no_gpu), flush=True)
        cuda_or_engine = lambda n: "cuda" in n or n.startswith("offload.") or "engine" in n
        run = {"context": self.context_part,
               "tests": lambda: self.tests_part("tests", cuda_or_engine, jobs=4),
               "copy": self.copy_part, "bench_step": self.bench_step_part, "gpt": self.gpt_part,
               "python": self.python_part, "memcheck": self.memcheck_part,
               "scale": lambda: gpucheck_scale.scale_part(self),
               "13b": lambda: gpucheck_13b.part_13b(self),
               "tests_rest": lambda: self.tests_part("tests_rest",
                                                     lambda n: not cuda_or_engine(n), jobs=6)}
        run["adam"] = lambda: gpucheck_adam.adam_part(self)
        run["peers"] = lambda: gpucheck_peers.peers_part(self)
        if self.preflight():
            if "gpt" in self.parts:
                self.start_cpu_reference()
            for name in self.parts[1:]:
                t0 = time.time()
                try:
                    run[name]()
                except gpucheck_rehearse.NeedsGpu as e:  # only in a rehearsal
                    kill_live()
                    gpucheck_rehearse.reached(self.res, name, e, time.time() - t0)
        else:
            for name in self.parts[1:]:
                self.res.part(name, "skip", reason="no bundle (see preflight)")
        rc = self.summary()
        s = self.res.data["summary"]
        print("gpucheck: %s: targets met %d, not met %d, not measured %d; %.0f s" % (
            self.res.data["status"], s["met"], s["not_met"], s["not_measured"],
            time.time() - self.t0), flush=True)
        return rc


# ---- self test (ctest tools.gpu_check) -------------------------------------------------


def selftest():
    """The figures, the test verdicts and the python part's parsing on canned
    inputs."""
    ferry = [[{"direction": "h2d", "bytes": 4, "gb_per_s": 45.0},
              {"direction": "d2h", "bytes": 4, "gb_per_s": 40.0}],
             [{"direction": "h2d", "bytes": 4, "gb_per_s": 46.0}]]
    peak = [[{"direction": "h2d", "bytes": 4, "gb_per_s": 50.0},
             {"direction": "d2h", "bytes": 4, "gb_per_s": 50.0}]]
    rows = {(r["direction"], r["bytes"]): r for r in copy_rows(ferry, peak)}
    assert rows[("h2d", 4)]["ratio"] == 0.92, rows
    assert rows[("d2h", 4)]["ratio"] == 0.8, rows
    assert abs(max_rel_diff([1.0, 2.02], [1.0, 2.0]) - 0.01) < 1e-12
    assert max_rel_diff([], [1.0]) is None
    assert parse_size_mib("1G") == 1024 and parse_size_mib("512M") == 512
    assert parse_size_mib("nonsense") is None
    text = '{"step": 1, "loss": 5.5, "tokens_per_s": 10}\nnoise\n{"step": 2, "loss": 5.25, ' \
           '"tokens_per_s": 30}\n{"final": true, "step": 2, "loss": 5.25}\n'
    losses, steps = losses_of(text)
    assert losses == [5.5, 5.25] and len(steps) == 2, losses
    trace = {"traceEvents": [
        {"ph": "M", "tid": 0, "name": "thread_name", "args": {"name": "compute"}},
        {"ph": "M", "tid": 1, "name": "thread_name", "args": {"name": "H2D"}},
        {"ph": "M", "tid": 5, "name": "thread_name", "args": {"name": "step"}},
        {"ph": "X", "tid": 0, "ts": 0, "dur": 400}, {"ph": "X", "tid": 0, "ts": 300, "dur": 300},
        {"ph": "X", "tid": 1, "ts": 100, "dur": 800}, {"ph": "X", "tid": 5, "ts": 0, "dur": 1000}]}
    tl = timeline_overlap(trace, 1)
    assert abs(tl["busy_s"]["compute"] - 600e-6) < 1e-12, tl
    assert tl["longest"] == "H2D" and abs(tl["ratio"] - 1000 / 800) < 1e-9, tl
    t = {"skip_rc": 77, "pass_regex": [], "fail_regex": [], "will_fail": False}
    assert test_verdict(t, 0, "") == "pass" and test_verdict(t, 77, "") == "skip"
    assert test_verdict(t, 1, "") == "fail"
    assert test_verdict(dict(t, will_fail=True), 1, "") == "pass"
    assert test_verdict(dict(t, pass_regex=["ok"]), 1, "it is ok") == "pass"
    assert test_verdict(dict(t, pass_regex=["ok"]), 0, "nope") == "fail"
    assert test_verdict(dict(t, pass_regex=["a.*z"]), 0, "a\nz") == "pass"  # "." spans lines
    assert target("x", 0.95, 0.9, "min")["met"] is True
    assert target("x", 1.2, 1.15)["met"] is False and target("x", None, 1)["met"] is None
    assert target("x", 3, None)["met"] is None
    for name in ("build.rooms", "tools.gpu_rehearsal"):  # they need the build tree
        assert manifest_entry({"name": name, "command": ["x"]}, "/r", "/r/b") == \
            (None, NOT_BUNDLED[name]), name
    assert rewrite("/r/build-gpu/bin/ferry /r/tests/x", "/r", "/r/build-gpu") == \
        "@BUNDLE@/bin/ferry @ROOT@/tests/x"
    # the python part: the bundle's sources, the probe's verdict, the tests it runs
    assert bundle_sources("PYTHONPATH=@ROOT@/python") == "PYTHONPATH=@BUNDLE@/src/python"
    assert bundle_sources("@ROOT@/tests/python/test_a.py @ROOT@/tests/pythonx "
                          "@ROOT@/examples/python/f.py") == \
        "@BUNDLE@/src/tests/python/test_a.py @ROOT@/tests/pythonx @ROOT@/examples/python/f.py"
    ok = '{"torch": "2.5.1", "cuda": "12.4", "available": true, "device": "H100"}\n'
    assert probe_verdict("warning\n" + ok, 0) == (json.loads(ok), None)
    d, why = probe_verdict('{"torch": "2.5.1", "cuda": null, "available": false}', 0)
    assert "sees no GPU" in why and d["torch"] == "2.5.1", why
    assert probe_verdict('{"error": "import torch: No module named torch"}', 0)[1] == \
        "import torch: No module named torch"
    assert "exited 1" in probe_verdict("Traceback\nImportError: x", 1)[1]
    py = lambda n, cmd: {"name": n, "command": cmd, "env": ["PYTHONPATH=@BUNDLE@/src/python"]}
    tests, left = python_cuda_tests([
        py("python.a", ["python3", "@BUNDLE@/src/tests/python/test_a.py"]),
        py("python.install", ["sh", "install_test.sh"]),
        py("python.b", ["sh", "-c", "echo 'skip: no torch'; exit 77"]),
        py("offload.x", ["python3", "x.py"])], "/opt/torch/.venv/bin/python")
    assert [t["name"] for t in tests] == ["python.a"], tests
    assert tests[0]["command"] == ["/opt/torch/.venv/bin/python",
                                   "@BUNDLE@/src/tests/python/test_a.py"], tests
    assert tests[0]["env"][-1] == "FERRY_PY_DEVICE=cuda" and len(tests[0]["env"]) == 2, tests
    assert sorted(left) == ["python.b", "python.install"], left
    assert select_parts("scale,tests")[0] == ["preflight", "context", "tests", "scale"]
    assert "unknown part 'x'" in select_parts("tests,x")[1] and select_parts(",")[0] is None
    gpucheck_scale.selftest()
    gpucheck_13b.selftest()
    gpucheck_adam.selftest()
    gpucheck_peers.selftest()
    gpucheck_rehearse.selftest()
    mpi = {"name": "comm.mpi.np2", "command": ["mpirun", "-np", "2", "x"], "labels": []}
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = "/nonexistent"
    try:
        assert "needs OpenMPI (it starts MPI)" in needs_missing_mpi(mpi)
        assert "NCCL communicator" in needs_missing_mpi(dict(mpi, name="comm.nccl", command=["t"]))
        assert needs_missing_mpi(dict(mpi, labels=["mpi"], command=["t"])) is not None
        assert needs_missing_mpi(dict(mpi, name="comm.self", command=["t"])) is None
        rec = run_one_test(dict(mpi, timeout=5, cwd="/"), {"root": "/", "bundle": "/", "env": {},
                                                  "logs": "/nonexistent"}, time.time() + 9)
        assert rec["status"] == "skip" and "OpenMPI" in rec["why"], rec
    finally:
        os.environ["PATH"] = path
    print("gpucheck selftest: ok")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="gpucheck.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    for k in ("ctest_json", "root", "build", "bundle"):
        m.add_argument(k)
    c = sub.add_parser("check")
    c.add_argument("--root", default=".")
    c.add_argument("--bundle", default="gpucheck")
    c.add_argument("--out", default="build/gpucheck")
    c.add_argument("--budget", type=float, default=450)
    c.add_argument("--dry-run", action="store_true")
    c.add_argument("--rehearse", action="store_true",
                   help="no GPU needed: each part runs until a program finds none")
    c.add_argument("--parts", default=None, help="comma-separated parts to run (default: all)")
    pl = sub.add_parser("parts")
    pl.add_argument("list", nargs="?", default=None)
    r = sub.add_parser("run-tests")
    r.add_argument("manifest")
    r.add_argument("--root", default=".")
    r.add_argument("--bundle", default="gpucheck")
    r.add_argument("--logs", required=True)
    r.add_argument("--select", default="")
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--budget", type=float, default=600)
    sub.add_parser("selftest")
    a = ap.parse_args(argv)
    if a.cmd == "manifest":
        return make_manifest(a.ctest_json, a.root, a.build, a.bundle)
    if a.cmd == "selftest":
        return selftest()
    if a.cmd in ("parts", "check"):
        chosen, why = select_parts(a.parts if a.cmd == "check" else a.list)
        if why:
            print("gpucheck: --parts: %s" % why, file=sys.stderr)
            return 2
        if a.cmd == "parts":
            print(" ".join(chosen) if a.list else parts_text())
            return 0
    if a.cmd == "run-tests":
        with open(a.manifest) as f:
            tests = [t for t in json.load(f)["tests"] if re.search(a.select, t["name"])]
        os.makedirs(a.logs, exist_ok=True)
        root, bundle = os.path.abspath(a.root), os.path.abspath(a.bundle)
        try:
            with open(os.path.join(bundle, "cuda_needs.txt")) as f:
                needs = f.read().split()
        except OSError:
            needs = []
        ctx = {"root": root, "bundle": bundle, "logs": os.path.abspath(a.logs),
               "env": bundle_env(bundle, cuda_lib_dirs(needs)[0])}
        recs = run_tests(tests, ctx, time.time() + a.budget, jobs=a.jobs)
        print(json.dumps({"counts": count_statuses(recs), "tests": recs}, indent=1))
        return 1 if any(x["status"] in ("fail", "timeout") for x in recs) else 0
    return Check(a).main()


# the scale and 13b parts' modules import this one by name
sys.modules.setdefault("gpucheck", sys.modules[__name__])
import gpucheck_scale  # noqa: E402  (tools/, beside this file)
import gpucheck_13b  # noqa: E402
import gpucheck_adam  # noqa: E402
import gpucheck_peers  # noqa: E402
import gpucheck_rehearse  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
