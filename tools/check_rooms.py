#!/usr/bin/env python3
"""tools/check_rooms.py — holds docs/ARCHITECTURE.md's rooms table to the build's rules.

  tools/check_rooms.py [BUILD_DIR] [--rules FILE] [--doc FILE]

The build writes each part's declaration, ferry_part(NAME USES ...), to
BUILD_DIR/parts/rules.txt (cmake/ferry_part.cmake: one "name: used parts..."
line each). docs/ARCHITECTURE.md draws the same rules as a table between

  <!-- rooms -->  and  <!-- end rooms -->

whose first column is the part's folder (`name/`) and whose last column
lists the folders it may use (`core/`, `device/`, ... or —). This program
reads both and exits 1, naming every difference, when a part is in one and
not the other or when its uses differ; 0 when they agree.

It also holds the docs' shape: ARCHITECTURE.md at most 350 lines, and every
top-level folder of the tree (hidden and build folders aside) with a
README.md of at most 150 lines, where the detail lives.
"""
import argparse
import os
import re
import sys

from call_cycles import read_rules  # the one reader of rules.txt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCH_LINES, README_LINES = 350, 150
FOLDER = re.compile(r"`([A-Za-z0-9_]+)/`")


def read_table(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^<!-- rooms -->\s*$(.*?)^<!-- end rooms -->\s*$", text, re.M | re.S)
    if not m:
        raise SystemExit(f"{path}: no '<!-- rooms -->' ... '<!-- end rooms -->' table")
    table = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "folder":
            continue
        name = FOLDER.fullmatch(cells[0])
        if not name:
            raise SystemExit(f"{path}: rooms row {line.strip()!r}: the first cell is not `folder/`")
        table[name.group(1)] = set(FOLDER.findall(cells[-1]))
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rules", help="default: BUILD_DIR/parts/rules.txt")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "ARCHITECTURE.md"))
    a = ap.parse_args()
    rules = read_rules(a.rules or os.path.join(a.build, "parts", "rules.txt"))
    table = read_table(a.doc)
    bad = []
    for part in sorted(set(rules) | set(table)):
        if part not in table:
            bad.append(f"{part}/: declared by the build (uses {fmt(rules[part])}), "
                       "missing from the rooms table")
        elif part not in rules:
            bad.append(f"{part}/: in the rooms table (uses {fmt(table[part])}), "
                       "not a part the build declares")
        elif rules[part] != table[part]:
            bad.append(f"{part}/: the build declares {fmt(rules[part])}, "
                       f"the rooms table says {fmt(table[part])}")
    bad += shape(a.doc)
    for b in bad:
        print("check_rooms: " + b)
    if bad:
        print("check_rooms: the docs and the build disagree: fix whichever is wrong")
        return 1
    print(f"check_rooms: {len(rules)} parts, the rooms table matches the build; "
          "every folder has its README.md")
    return 0


def lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def shape(doc):
    bad = []
    if lines(doc) > ARCH_LINES:
        bad.append(f"{os.path.relpath(doc, ROOT)} has {lines(doc)} lines (at most {ARCH_LINES}): "
                   "move detail to the folders' README.md")
    for name in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, name)
        if not os.path.isdir(d) or name.startswith((".", "build", "gpucheck")):
            continue
        readme = os.path.join(d, "README.md")
        if not os.path.exists(readme):
            bad.append(f"{name}/ has no README.md")
        elif lines(readme) > README_LINES:
            bad.append(f"{name}/README.md has {lines(readme)} lines (at most {README_LINES})")
    return bad


def fmt(uses):
    return ", ".join(sorted(uses)) if uses else "nothing"


if __name__ == "__main__":
    sys.exit(main())
