#!/usr/bin/env python3
"""tests/docs/data_files.py — every data file an example names exists
(docs.data_files): each `--data PATH` in the repository's markdown files and
in ferry-gpt's help text (examples/gpt/args.c) is a path that exists
(relative to the repository root, or absolute), or the same file names it
once more outside `--data`, where it says how to make it. Placeholders (FILE,
$DATA, <text>) and words of prose (`--data that`) are not paths.

  data_files.py ROOT
"""
import os
import re
import subprocess
import sys

DATA = re.compile(r"--data[ =]+([^\s`'\")\\]+)")
SKIP = ("CHANGELOG.md",)  # history: names what was there then


def sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "*.md"], capture_output=True,
                         text=True)
    if out.returncode:  # not a git checkout: walk it
        names = [os.path.relpath(os.path.join(d, f), root)
                 for d, _, fs in os.walk(root) for f in fs if f.endswith(".md")]
    else:
        names = out.stdout.split()
    names = [n for n in names if not n.startswith(("tests/fixtures/", "build")) and
             os.path.basename(n) not in SKIP]
    return sorted(names) + ["examples/gpt/args.c"]


def is_path(tok):
    if tok[0] in "$<{[" or re.fullmatch(r"[A-Z0-9_]+", tok):
        return False  # a placeholder
    return "/" in tok or "." in tok  # else a word of prose


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad, seen = [], 0
    for name in sources(root):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in DATA.finditer(text):
            tok = m.group(1).rstrip(".,;:")
            if not tok or not is_path(tok):
                continue
            seen += 1
            full = tok if os.path.isabs(tok) else os.path.join(root, tok)
            if os.path.exists(full):
                continue
            if text.count(tok) > len(re.findall(r"--data[ =]+" + re.escape(tok), text)):
                continue  # the file says how to make it
            line = text.count("\n", 0, m.start()) + 1
            bad.append("%s:%d: --data %s: no such file, and the text does not say how to "
                       "make it" % (name, line, tok))
    for b in bad:
        print(b)
    print("%d --data paths checked, %d missing" % (seen, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
