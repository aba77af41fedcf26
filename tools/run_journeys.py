#!/usr/bin/env python3
"""tools/run_journeys.py — runs README.md's journeys as a newcomer would type them.

  tools/run_journeys.py [--build DIR] [--python PY] [--doc FILE] [NAME...]

README.md marks each journey's command block with a line
`<!-- journey: NAME -->` right before its fenced block. Each block runs as
one `bash -e -x` script, as written, all of them at once (each writes its
own files; DIR/journeys/NAME.log keeps its output), in a fresh scratch folder made to look
like the repository root after a build: a link to every top-level entry of
the tree, and a `build/` folder of its own holding links to DIR's bin/ and
lib/ (DIR defaults to build). So what a journey writes under build/ lands
in the scratch folder (every run starts clean), and it runs the programs of
DIR. The scratch folder is DIR/journeys/, removed first.

`python3` in a block is PY (default /usr/bin/python3, Debian's, whose
python3-torch the suite's python tests use): a link in the scratch's PATH.
A journey that runs python3 is skipped, saying why, when PY cannot import
torch. Exit 0 when every journey named (default: all) passes or is
skipped, 1 when one fails (its output is printed), 77 when all are skipped.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"^<!-- journey: ([A-Za-z0-9_-]+) -->\s*$")


def journeys(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = MARK.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise SystemExit(f"{path}:{i + 1}: journey {m.group(1)}: no fenced block on the next line")
        j = i + 2
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out[m.group(1)] = "\n".join(lines[i + 2:j]) + "\n"
    return out


def scratch(build, python):
    top = os.path.join(build, "journeys")
    shutil.rmtree(top, ignore_errors=True)
    tree = os.path.join(top, "tree")
    os.makedirs(os.path.join(tree, "build"))
    for name in os.listdir(ROOT):
        if name != "build" and not name.startswith("."):
            os.symlink(os.path.join(ROOT, name), os.path.join(tree, name))
    for sub in ("bin", "lib"):
        os.symlink(os.path.join(build, sub), os.path.join(tree, "build", sub))
    shim = os.path.join(top, "shim")
    os.makedirs(shim)
    os.symlink(python, os.path.join(shim, "python3"))
    return tree, shim


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--doc", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    found = journeys(a.doc)
    names = a.names or list(found)
    for n in names:
        if n not in found:
            print(f"run_journeys: no journey '{n}' in {a.doc} (it has: {', '.join(found)})")
            return 1
    if not found:
        print(f"run_journeys: {a.doc} marks no journey")
        return 1
    torch_ok = subprocess.run([a.python, "-c", "import torch"], capture_output=True).returncode == 0 \
        if os.path.exists(a.python) else False
    tree, shim = scratch(build, a.python)
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ["PATH"], LC_ALL="C")
    failed = skipped = 0
    running = {}
    for n in names:  # the journeys run at once: each waits mostly on its own I/O
        script = found[n]
        if re.search(r"\bpython3\b", script) and not torch_ok:
            print(f"run_journeys: {n}: skip: {a.python} cannot import torch "
                  "(apt-get install python3-torch)")
            skipped += 1
            continue
        log = open(os.path.join(os.path.dirname(tree), n + ".log"), "w+b")
        p = subprocess.Popen(["bash", "-e", "-x", "-c", script], cwd=tree, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
        running[n] = (p, log, time.monotonic())
    for n, (p, log, t) in running.items():
        rc = p.wait()
        dt = time.monotonic() - t
        if rc:
            failed += 1
            log.seek(0)
            print(f"run_journeys: {n}: FAILED (exit {rc}, {dt:.1f} s); its output:")
            print(log.read().decode(errors="replace"))
        else:
            print(f"run_journeys: {n}: ok ({dt:.1f} s)")
        log.close()
    if failed:
        return 1
    return 77 if skipped == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
