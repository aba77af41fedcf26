#!/usr/bin/env python3
"""tools/gen_docs.py — writes the program output the docs show, from the programs.

  tools/gen_docs.py [--build DIR] [--check] [FILE.md...]

A doc marks a generated block with two lines:

  <!-- gen: ferry plan --model llama-2-13b --gpu-mem 24G ... -->
  ...                     (rewritten: the command, then its output, fenced)
  <!-- end gen -->

`<!-- gen-output: ... -->` writes the output alone, without the command
(for a command the doc has just shown); `<!-- gen-markdown: ... -->` writes
it as it is, unfenced (a command that prints a Markdown table). A figure
inside a sentence is marked in the line itself:

  ... recommends <!-- fig: CMD -->zero-infinity<!-- /fig --> at ...

and rewritten to CMD's output, its last newline dropped (one line, not
empty; several figures may share a line, none may start one; one right
after a backtick is code shown, left alone). tools/plan_figure.py prints figures of `ferry
plan --json` in the units the plan's text uses.

Each command runs under bash (pipefail) from the repository root with
DIR/bin first on PATH (DIR defaults to build), LC_ALL=C, and a soft
RLIMIT_MEMLOCK of 8 MiB, the one machine figure `ferry plan` prints when it
is given every size. Only deterministic output belongs here: `ferry plan`
with --gpu-mem, --host-mem and --nvme, --help texts, ferry-gpt's sizes
(--steps 0); timings and bytes that vary from run to run stay hand-written
with the command that measured them. Exit status 0 and 1 both
count as output (`ferry plan` exits 1 when nothing fits), as does a SIGPIPE
of a program whose reader stopped (`| head`); any other status fails.

Without FILE the docs are every README.md and docs/*.md of the tree (build
folders and hidden folders left out). --check writes nothing: it prints a
unified diff of each doc that differs from what the programs print now and
exits 1. Commands run in parallel; the whole tree takes a few seconds.
"""
import argparse
import concurrent.futures
import difflib
import os
import re
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = re.compile(r"^<!-- gen(-output|-markdown)?: (.*?) -->\s*$")
END = "<!-- end gen -->"
FIG = re.compile(r"(?<!`)<!-- fig: (.*?) -->(.*?)<!-- /fig -->")  # `<!-- fig...`: shown as code
MEMLOCK = 8 << 20


def find_docs():
    docs = []
    for d, subs, files in os.walk(ROOT):
        subs[:] = sorted(s for s in subs if not s.startswith((".", "build", "gpucheck")))
        rel = os.path.relpath(d, ROOT)
        for f in sorted(files):
            if f == "README.md" or (rel == "docs" and f.endswith(".md")):
                docs.append(os.path.join(d, f))
    return docs


def blocks(path, lines):
    """(first line, end line, command, kind) of each marked block outside code
    blocks; raises on a marker without its end."""
    out, i, fenced = [], 0, False
    while i < len(lines):
        if lines[i].startswith("```"):  # a marker shown inside a code block is text
            fenced = not fenced
        m = None if fenced else BEGIN.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and lines[j].rstrip("\n") != END:
                if BEGIN.match(lines[j]):
                    break
                j += 1
            if j == len(lines) or lines[j].rstrip("\n") != END:
                raise SystemExit(f"{path}:{i + 1}: '<!-- gen: ... -->' without '{END}'")
            out.append((i, j, m.group(2), m.group(1) or ""))
            i = j
        i += 1
    return out


def figures(path, lines):
    """The commands of the inline figures outside code blocks; exits on one
    that starts a line (Markdown would take the line for an HTML block)."""
    out, fenced = [], False
    for i, ln in enumerate(lines):
        if ln.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out += [m.group(1) for m in FIG.finditer(ln)]
            if FIG.match(ln.lstrip()):
                print(f"gen_docs: {path}:{i + 1}: a figure starts the line (Markdown would end "
                      "the paragraph there): put a word before it", file=sys.stderr)
                raise SystemExit(2)
    return out


def one_line(cmd, output):
    value = output.rstrip("\n")
    if not value or "\n" in value or "<!--" in value:
        what = "more than one line" if value else "nothing"
        print(f"gen_docs: the figure `{cmd}` printed {what}:\n{output}",
              file=sys.stderr)
        raise SystemExit(2)
    return value


def fill_figures(lines, outputs):
    """lines with each inline figure set to its command's output."""
    out, fenced = [], False
    for ln in lines:
        if ln.startswith("```"):
            fenced = not fenced
        elif not fenced:
            ln = FIG.sub(lambda m: f"<!-- fig: {m.group(1)} -->"
                         f"{one_line(m.group(1), outputs[m.group(1)])}<!-- /fig -->", ln)
        out.append(ln)
    return out


def limit_memlock():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard == resource.RLIM_INFINITY or hard >= MEMLOCK:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (MEMLOCK, hard))


def run(cmd, env):
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, env=env,
                       capture_output=True, text=True, preexec_fn=limit_memlock, timeout=60)
    if p.returncode not in (0, 1, 141):  # 141: SIGPIPE, a `| head` that stopped reading
        raise RuntimeError(f"`{cmd}` exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def render(cmd, output, kind):
    if output and not output.endswith("\n"):
        output += "\n"
    if kind == "-markdown":
        return output.splitlines(True)
    shown = [] if kind == "-output" else ["```\n", cmd + "\n", "```\n", "\n"]
    return shown + ["```\n"] + output.splitlines(True) + ["```\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build folder (default: build)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    ap.add_argument("docs", nargs="*")
    a = ap.parse_args()
    build = os.path.abspath(os.path.join(ROOT, a.build)) if not os.path.isabs(a.build) else a.build
    if not os.path.exists(os.path.join(build, "bin", "ferry")):
        print(f"gen_docs: {build}/bin/ferry not found: build first, or give --build DIR",
              file=sys.stderr)
        return 2
    env = dict(os.environ, PATH=os.path.join(build, "bin") + os.pathsep + os.environ["PATH"],
               LC_ALL="C")
    docs = [os.path.abspath(d) for d in a.docs] or find_docs()
    texts, jobs = {}, {}
    for d in docs:
        with open(d, encoding="utf-8") as f:
            texts[d] = f.readlines()
        for b in blocks(os.path.relpath(d, ROOT), texts[d]):
            jobs.setdefault(b[2], None)
        for cmd in figures(os.path.relpath(d, ROOT), texts[d]):
            jobs.setdefault(cmd, None)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futs = {c: pool.submit(run, c, env) for c in jobs}
        try:
            outputs = {c: f.result() for c, f in futs.items()}
        except RuntimeError as e:
            print(f"gen_docs: {e}", file=sys.stderr)
            return 2
    drift = 0
    for d in docs:
        old = texts[d]
        new, last = [], 0
        for i, j, cmd, kind in blocks(d, old):
            new += old[last:i + 1] + render(cmd, outputs[cmd], kind)
            last = j
        new += old[last:]
        new = fill_figures(new, outputs)
        if new == old:
            continue
        rel = os.path.relpath(d, ROOT)
        if a.check:
            drift = 1
            sys.stdout.writelines(difflib.unified_diff(old, new, rel + " (in the tree)",
                                                       rel + " (from the programs)"))
        else:
            with open(d, "w", encoding="utf-8") as f:
                f.writelines(new)
            print(f"gen_docs: rewrote {rel}")
    if drift:
        print("gen_docs: the docs above differ from what the programs print; "
              "run tools/gen_docs.py to rewrite them", file=sys.stderr)
    return drift


if __name__ == "__main__":
    sys.exit(main())
