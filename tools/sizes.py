#!/usr/bin/env python3
"""tools/sizes.py — the library's size rules, checked from its sources.

  tools/sizes.py [SOURCE_DIR [--rules RULES]]   (default: .)

The library is the folders named in RULES (build/parts/rules.txt, one
"part: used parts..." line each; without it, the parts of the layout). A
library file (.c, .h, .cu) has at most 1000 lines, and one in offload/ at
most 800. A function of more than 80 lines (its definition line to its
closing brace at column 0) is allowed only when the comment just above it
says why, with the words "long because". Prints each violation with its file
and line; exits 1 on any (the test build.sizes), 0 otherwise.
"""
import glob, os, re, sys

from call_cycles import read_rules  # the one reader of rules.txt

FILE_MAX, OFFLOAD_MAX, FUNC_MAX = 1000, 800, 80
PARTS = ("core", "device", "memory", "nvme", "optim", "comm", "format", "offload", "plan")
SKIP = ("#", "/", "*", "}", "typedef", "extern", "static const", "static inline void ")
HEAD = re.compile(r"(\w+)\s*\(")

def functions(lines):
    """(name, first line index, line count, index of the line above)."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and "(" in line and not line.startswith(SKIP[:5]):
            j, head = i, line
            while not head.rstrip().endswith(("{", ";", ")")) and j + 1 < len(lines) and j < i + 8:
                j += 1
                head += " " + lines[j].strip()
            if head.rstrip().endswith("{") and "=" not in head.split("(")[0]:
                k = j + 1
                while k < len(lines) and lines[k] != "}":
                    k += 1
                m = HEAD.search(head)
                out.append((m.group(1) if m else "?", i, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out

def comment_above(lines, i):
    """The comment block that ends on the line just above line i."""
    j, block = i - 1, []
    while j >= 0 and (lines[j].startswith(("/*", " *", "//")) or lines[j].rstrip().endswith("*/")):
        block.append(lines[j])
        if lines[j].startswith("/*") or lines[j].startswith("//"):
            break
        j -= 1
    return " ".join(reversed(block))

def main():
    args = sys.argv[1:]
    parts = PARTS
    if "--rules" in args:
        i = args.index("--rules")
        parts = sorted(read_rules(args[i + 1]))
        del args[i:i + 2]
    root = args[0] if args else "."
    bad = nfiles = nfuncs = 0
    for part in parts:
        limit = OFFLOAD_MAX if part == "offload" else FILE_MAX
        for path in sorted(glob.glob(os.path.join(root, part, "*.[ch]")) +
                           glob.glob(os.path.join(root, part, "*.cu"))):
            lines = open(path, errors="replace").read().split("\n")
            rel = os.path.relpath(path, root)
            nfiles += 1
            n = len(lines) - (1 if lines and lines[-1] == "" else 0)
            if n > limit:
                print("%s: %d lines (at most %d)" % (rel, n, limit))
                bad += 1
            for name, first, count in functions(lines):
                nfuncs += 1
                if count > FUNC_MAX and not re.search(r"long because", comment_above(lines, first),
                                                      re.I):
                    print("%s:%d: %s has %d lines (at most %d without a comment above it that "
                          "says why: 'long because ...')" % (rel, first + 1, name, count, FUNC_MAX))
                    bad += 1
    print("sizes: %d file(s), %d function(s), %d violation(s)" % (nfiles, nfuncs, bad))
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
