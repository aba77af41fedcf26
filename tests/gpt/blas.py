#!/usr/bin/python3
"""tests/gpt/blas.py — the OpenBLAS kernel ferry-gpt runs (examples/gpt/blas.c):
one short `ferry-gpt train` per case, the kernel read from --stats-json's
"blas" object:

  default      OpenBLAS's own pick, or the CPU's kernel where it falls back;
               never Prescott on a CPU with AVX2 and FMA; `ferry info --json`
               names the same kernel
  fallback     OpenBLAS made to look as if it fell back to Prescott
               (FERRY_GPT_TEST_BLAS_PICK): the kernel the CPU's flags in
               /proc/cpuinfo call for, chosen_by "cpuid", a note on stderr,
               and one restart (one execve of /proc/self/exe beside the
               reference GEMM's child) even under ulimit -v, which restarts too
  user         the same with the user's OPENBLAS_CORETYPE=Prescott: kept
  check        the same with the reference GEMM spoiled
               (FERRY_GPT_TEST_BLAS_BAD): OpenBLAS's own pick, the choice
               named as rejected, a warning on stderr

usage: blas.py --gpt FERRY-GPT --ferry FERRY --data FILE --work DIR [--ulimit KB]
(--ulimit 0: no address-space limit, for sanitizer builds)
exit: 0 pass, 1 a check failed, 77 skip (not x86-64).
"""
import argparse
import json
import os
import platform
import subprocess
import sys


def expected_kernel():
    """The kernel the CPU's flags call for, as core/cpu.c chooses it."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def train(a, name, env, limit_kb=None):
    """One 1-step run; (its "blas" object, stderr, the execve count or None)."""
    stats = os.path.join(a.work, name + ".stats.json")
    cmd = [a.gpt, "train", "--model", "tiny", "--data", a.data, "--steps", "1", "--batch", "2",
           "--seq", "16", "--seed", "1", "--stats-json", stats]
    trace = os.path.join(a.work, name + ".execve")
    if limit_kb:
        cmd = ["sh", "-c", "ulimit -v %d && exec \"$@\"" % limit_kb, "sh"] + cmd
    if a.strace:
        cmd = [a.strace, "-f", "-e", "trace=execve", "-o", trace] + cmd
    e = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "FERRY_GPT_TEST_BLAS_PICK", "FERRY_GPT_TEST_BLAS_BAD",
              "OPENBLAS_NUM_THREADS", "FERRY_GPT_BLAS_CHOSE"):
        e.pop(k, None)
    e.update(env)
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        print("blas: %s: ferry-gpt exited %d" % (name, p.returncode))
        sys.exit(1)
    with open(stats) as f:
        blas = json.load(f)["blas"]
    restarts = None
    if a.strace:
        with open(trace) as f:
            restarts = sum(1 for line in f if 'execve("/proc/self/exe"' in line and "= 0" in line)
    print("blas: %-9s %s" % (name, blas))
    return blas, p.stderr, restarts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k in ("--gpt", "--ferry", "--data", "--work"):
        ap.add_argument(k, required=True)
    ap.add_argument("--ulimit", type=int, default=500000)
    ap.add_argument("--no-strace", action="store_true",
                    help="do not count restarts with strace (sanitizer builds: their leak and "
                         "race checkers refuse to run under ptrace)")
    a = ap.parse_args()
    if platform.machine() not in ("x86_64", "AMD64"):
        print("skip: the kernel choice is for x86-64")
        return 77
    os.makedirs(a.work, exist_ok=True)
    a.strace = None if a.no_strace else next(
        (p for p in ("/usr/bin/strace", "/bin/strace") if os.access(p, os.X_OK)), None)
    if a.strace and subprocess.run([a.strace, "-o", os.devnull, "true"],
                                   stderr=subprocess.DEVNULL).returncode != 0:
        a.strace = None  # ptrace refused here: the restart count goes unchecked
    want = expected_kernel()
    bad = []

    d, _, _ = train(a, "default", {})
    if want and d["kernel"] == "Prescott":
        bad.append("default: Prescott on a CPU with AVX2 and FMA")
    info = json.loads(subprocess.run([a.ferry, "info", "--json"], stdout=subprocess.PIPE,
                                     text=True, check=True).stdout)["blas"]
    if not info or info["kernel"] != d["kernel"] or info["chosen_by"] != d["chosen_by"]:
        bad.append("ferry info --json names %s, ferry-gpt runs %s" % (info, d))

    f, err, restarts = train(a, "fallback", {"FERRY_GPT_TEST_BLAS_PICK": "Prescott"},
                             limit_kb=a.ulimit)
    if want:
        if f["kernel"] != want or f["chosen_by"] != "cpuid" or f["rejected"] is not None:
            bad.append("fallback: want %s chosen by cpuid, got %s" % (want, f))
        if "OpenBLAS does not know this CPU" not in err:
            bad.append("fallback: no note on stderr:\n" + err)
        if restarts is not None and restarts != 2:  # the reference GEMM's child and one restart
            bad.append("fallback: %d execve of /proc/self/exe, want 2" % restarts)
    elif f["chosen_by"] != "openblas":
        bad.append("fallback: no AVX2: want OpenBLAS's pick, got %s" % f)

    u, _, _ = train(a, "user", {"FERRY_GPT_TEST_BLAS_PICK": "Prescott",
                                "OPENBLAS_CORETYPE": "Prescott"})
    if u["kernel"] != "Prescott" or u["chosen_by"] != "OPENBLAS_CORETYPE":
        bad.append("user: OPENBLAS_CORETYPE=Prescott not kept: %s" % u)

    if want:
        c, err, _ = train(a, "check", {"FERRY_GPT_TEST_BLAS_PICK": "Prescott",
                                       "FERRY_GPT_TEST_BLAS_BAD": "1"})
        if c["kernel"] != d["kernel"] or c["chosen_by"] != "openblas" or c["rejected"] != want:
            bad.append("check: want OpenBLAS's %s with %s rejected, got %s"
                       % (d["kernel"], want, c))
        if "failed a check against a reference GEMM" not in err:
            bad.append("check: no warning on stderr:\n" + err)

    for b in bad:
        print("blas: FAIL: " + b)
    print("blas: %s" % ("FAILED" if bad else "passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
