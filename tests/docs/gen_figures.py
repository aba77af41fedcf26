#!/usr/bin/env python3
"""tests/docs/gen_figures.py — tools/gen_docs.py's inline figures: a doc
whose figure differs from its command's output fails --check (exit 1) and
is rewritten; one inside a code block or code span is text, left alone; a command that
fails or prints two lines fails the run (exit 2), as does one that prints nothing or a figure
that starts a line (Markdown would take it for an HTML block).

  gen_figures.py --build DIR --work SCRATCH
"""
import argparse
import os
import subprocess
import sys

GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "gen_docs.py")


def gen(a, doc, *flags):
    return subprocess.run([sys.executable, GEN, "--build", a.build, *flags, doc],
                          capture_output=True, text=True, timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    doc = os.path.join(a.work, "figures.md")
    fig = "<!-- fig: tools/plan_figure.py '{placement}' --model gpt2 --gpu-mem 24G --host-mem 32G -->"
    stale = (f"the plan says {fig}nothing<!-- /fig --> and <!-- fig: echo 42 -->41<!-- /fig -->"
             ", shown as `<!-- fig: echo 42 -->41<!-- /fig -->`.\n"
             "```\n<!-- fig: echo 42 -->41<!-- /fig -->\n```\n")
    with open(doc, "w") as f:
        f.write(stale)
    p = gen(a, doc, "--check")
    if p.returncode != 1 or "-->nothing<" not in p.stdout or "-->42<" not in p.stdout:
        sys.exit(f"FAIL: --check on a stale figure: exit {p.returncode}\n{p.stdout}{p.stderr}")
    p = gen(a, doc)
    with open(doc) as f:
        text = f.read()
    line, block = text.split("\n", 1)
    if (p.returncode or "-->all-gpu<" not in line or "-->42<" not in line or "-->41<" not in line
            or "-->41<" not in block):
        sys.exit(f"FAIL: the rewrite: exit {p.returncode}\n{text}{p.stderr}")
    if gen(a, doc, "--check").returncode:
        sys.exit("FAIL: --check after the rewrite still differs")
    for bad in ("a <!-- fig: printf 'a\\nb' -->x<!-- /fig -->\n", "a <!-- fig: true -->x<!-- /fig -->\n",
                "text\n  <!-- fig: echo 1 -->1<!-- /fig --> starts a line\n",
                "a <!-- fig: tools/plan_figure.py '{no.such}' --model gpt2 --gpu-mem 1G -->x<!-- /fig -->\n"):
        with open(doc, "w") as f:
            f.write(bad)
        p = gen(a, doc, "--check")
        if p.returncode != 2:
            sys.exit(f"FAIL: {bad.strip()}: exit {p.returncode}, not 2\n{p.stdout}{p.stderr}")
    print("inline figures: stale ones fail --check and are rewritten; code blocks left; "
          "bad commands refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
