#!/usr/bin/env python3
"""tools/call_cycles.py — find circles of calls between the library's source
files, from the symbols of their object files (nm).

  tools/call_cycles.py [BUILD_DIR [--rules RULES]]   (default: build)

File A uses file B when A's object has an undefined symbol that B's object
defines. A circle is a strongly connected component of that graph with more
than one file. Prints each circle with the symbols that close it, and the
folder-level edges. With --rules (build/parts/rules.txt, written by
cmake/ferry_part.cmake: one "part: used parts..." line each), a call from one
part into a part it does not declare is an error too. Exits 1 on a circle or
an undeclared call, 0 otherwise (the test build.layers).
"""
import glob, os, subprocess, sys

def read_rules(path):
    rules = {}
    for line in open(path):
        if ":" in line:
            name, uses = line.split(":", 1)
            rules[name.strip()] = set(uses.split())
    return rules

def objects(build, parts):
    objs = []
    for part in parts:
        objs += glob.glob(os.path.join(build, part, "CMakeFiles", "ferry_%s.dir" % part, "*.o"))
    return sorted(objs)

def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, undef = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undef.add(name)
        elif kind in "TDBRVWtdbr" and kind.isupper():
            defined.add(name)
    return defined, undef

def name_of(obj):
    part = obj.split(os.sep + "CMakeFiles" + os.sep)[0].rsplit(os.sep, 1)[-1]
    base = os.path.basename(obj)[:-2]
    return part + "/" + base

def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))
    for v in nodes:
        if v not in index:
            visit(v)
    return out

def main():
    args = sys.argv[1:]
    rules = None
    if "--rules" in args:
        i = args.index("--rules")
        rules = read_rules(args[i + 1])
        del args[i:i + 2]
    build = args[0] if args else "build"
    parts = sorted(rules) if rules else ("core", "device", "memory", "nvme", "optim", "comm", "format", "offload",
                                         "plan")
    objs = objects(build, parts)
    if not objs:
        print("call_cycles: no object files under %s (build first)" % build, file=sys.stderr)
        return 2
    defs, undefs, owner = {}, {}, {}
    for o in objs:
        n = name_of(o)
        d, u = symbols(o)
        defs[n], undefs[n] = d, u
        for s in d:
            owner.setdefault(s, n)
    edges, why = {}, {}
    for n, u in undefs.items():
        for s in u:
            m = owner.get(s)
            if m and m != n:
                edges.setdefault(n, set()).add(m)
                why.setdefault((n, m), []).append(s)
    bad = [c for c in sccs(sorted(defs), edges) if len(c) > 1]
    for c in bad:
        print("circle: " + " <-> ".join(c))
        for a in c:
            for b in c:
                if (a, b) in why:
                    syms = sorted(why[(a, b)])
                    print("  %s uses %s: %s%s" % (a, b, ", ".join(syms[:6]),
                                                  " ..." if len(syms) > 6 else ""))
    folders = {}
    for (a, b) in why:
        fa, fb = a.split("/")[0], b.split("/")[0]
        if fa != fb:
            folders.setdefault(fa, set()).add(fb)
    print("folder edges:")
    undeclared = 0
    for fa in sorted(folders):
        print("  %s -> %s" % (fa, ", ".join(sorted(folders[fa]))))
        for fb in sorted(folders[fa]):
            if rules is not None and fb not in rules.get(fa, ()):
                undeclared += 1
                syms = sorted(s for (a, b), ss in why.items() if a.split("/")[0] == fa
                              and b.split("/")[0] == fb for s in ss)
                print("  error: %s calls into %s, which it does not declare (%s)"
                      % (fa, fb, ", ".join(syms[:6])))
    print("%d file(s), %d circle(s), %d undeclared call(s)" % (len(defs), len(bad), undeclared))
    return 1 if bad or undeclared else 0

if __name__ == "__main__":
    sys.exit(main())
