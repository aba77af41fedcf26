#!/usr/bin/env python3
"""tools/call_cycles.py — find circles between the library's rooms: calls,
from the symbols of their object files (nm), and names shared at source
level (types, macros, enum constants, header inlines, struct fields).

  tools/call_cycles.py [BUILD_DIR [--rules RULES] [--impl-as-source PART,...]
                       [--no-names]]   (default: build)

A room is a source file with its own header of the same stem (see "names
shared at source level" below for headers). Room A uses room B when A's
object has an undefined symbol that B's object defines, or when A's source
names a type, macro, enum constant, inline or field that B defines. A
circle is a strongly connected component of that graph with more than one
room. Prints each circle with the calls and names that close it, and the
folder-level edges of calls. With --rules (build/parts/rules.txt, written by
cmake/ferry_part.cmake: one "part: used parts..." line each), a call from one
part into a part it does not declare is an error too. Exits 1 on a circle or
an undeclared call, 0 otherwise (the tests build.layers, and build.rooms
with --impl-as-source offload).
"""
import glob, os, re, subprocess, sys

def read_rules(path):
    """build/parts/rules.txt: {part: set of the parts it uses} (also read by
    tools/check_rooms.py and tools/sizes.py)."""
    rules = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            name, sep, uses = line.partition(":")
            if not sep:
                raise SystemExit("%s:%d: not 'name: uses...': %r" % (path, n, line))
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

# ---- names shared at source level ------------------------------------------
#
# A room is a source file (.c or .cu) with its own header of the same stem
# (drain.c + drain.h); a header with no source of its stem (a part's contract
# or aggregate: comm_impl.h, mem_impl.h, engine_state.h) is a room of its
# own, and so is the header named after its part (plan/plan.h, core/core.h):
# the part's face, which every file of the part may use. The strict reading (--impl-as-source PART,...) counts a part's
# X_impl.h as X.c's, as a structure tool that goes by names does: read so,
# the engine's old engine_impl.h, which held every room's state, made
# engine.c one circle with the rooms it calls. A file uses another room when
# it names a type, macro, enum constant, header inline function or struct
# field that room defines, among the definitions it sees (its own and the
# headers it includes, followed through their includes). A field is resolved
# through the type of the expression before its `.` or `->` where the file
# declares it (e->drain.stage[i].lent: ferry_engine, eng_drain,
# eng_drain_stage), else by its name when one room alone defines it (a name
# several rooms define, the user's own among them, is taken as its own). One
# rule for aggregates: in a header with no source of its own, a member whose
# type (by value) another room of the same folder defines is that room's
# slot (struct ferry_engine's `drain` is drain.c's), so the aggregate does
# not depend on the rooms it embeds. Public headers (include/) are no room.

TOKEN = re.compile(r"[A-Za-z_]\w*|->|\d[\w.]*|\S")
IDENT = re.compile(r"[A-Za-z_]\w*")
QUALIFIERS = {"const", "volatile", "restrict", "static", "extern", "inline", "register",
              "unsigned", "signed", "_Atomic", "struct", "union", "enum"}

def strip_source(text):
    """The text without comments, literals and directives (a #define's body
    and an #if's condition stay), its #define names and #include paths."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    defines, includes, lines = [], [], []
    for line in text.split("\n"):
        m = re.match(r"\s*#\s*(\w+)\s*(.*)", line)
        if not m:
            lines.append(line)
            continue
        word, rest = m.group(1), m.group(2)
        inc = re.match(r'"([^"]+)"', rest)
        if word == "include" and inc:
            includes.append(inc.group(1))
        d = re.match(r"(\w+)(.*)", rest)
        if word == "define" and d:
            defines.append(d.group(1))
            lines.append(re.sub(r"^\([^)]*\)", "", d.group(2)))
        else:
            lines.append(rest if word in ("if", "elif") else "")
    body = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '""', "\n".join(lines))
    return body, defines, includes

def matching(toks, i):
    """The index of the bracket that closes toks[i]."""
    pair = {"{": "}", "(": ")", "[": "]"}[toks[i]]
    depth = 0
    for j in range(i, len(toks)):
        depth += toks[j] == toks[i]
        depth -= toks[j] == pair
        if depth == 0:
            return j
    return len(toks) - 1

def split_at(toks, sep):
    """toks split at `sep` outside brackets, with each part's offset."""
    parts, start, depth = [], 0, 0
    for k, t in enumerate(toks):
        depth += t in "([{"
        depth -= t in ")]}"
        if t == sep and depth == 0:
            parts.append((start, toks[start:k]))
            start = k + 1
    parts.append((start, toks[start:]))
    return [(o, p) for o, p in parts if p]

def declarator(toks):
    """(name, type token index or -1, by value) of one declarator."""
    for k in range(len(toks) - 2):  # a function pointer: ( * name )
        if toks[k] == "(" and toks[k + 1] == "*" and IDENT.fullmatch(toks[k + 2]):
            return toks[k + 2], -1, False
    core = []
    for k, t in enumerate(toks):
        if t in ("[", ":", "="):
            break
        core.append((k, t))
    idents = [(k, t) for k, t in core if IDENT.fullmatch(t) and t not in QUALIFIERS]
    if not idents:
        return None
    types = idents[:-1]
    return idents[-1][1], (types[-1][0] if types else -1), "*" not in [t for _, t in core]

class Unit:
    """One file's tokens and what it defines."""
    def __init__(self, path, node, text):
        self.path, self.node = path, node
        body, self.defines, self.includes = strip_source(text)
        self.toks = TOKEN.findall(body)
        self.types, self.enums, self.inlines = set(), set(), set()
        self.aliases = {}  # typedef name -> struct key
        self.structs = {}  # struct key -> {field: [type, by value, type token index, slot owner]}
        self.parse()

    def names(self):
        return self.types | self.enums | self.inlines | set(self.defines)

    def struct_body(self, key, i, j):
        """The fields of the struct whose braces are toks[i] and toks[j]."""
        fields = self.structs.setdefault(key, {})
        for off, decl in split_at(self.toks[i + 1:j], ";"):
            at = i + 1 + off
            if "{" in decl:  # a nested struct or union: its fields are this one's
                k = decl.index("{")
                close = matching(decl, k)
                self.struct_body(key, at + k, at + close)
                decl, at, base = decl[close + 1:], at + close + 1, []
            else:
                base = decl[:[k for k, t in enumerate(decl) if t not in QUALIFIERS][0] + 1] \
                    if any(t not in QUALIFIERS for t in decl) else []
            for doff, d in split_at(decl, ","):
                r = declarator(d if doff == 0 else base + d)
                if r:
                    tindex = at + doff + r[1] if doff == 0 and r[1] >= 0 else \
                        (at + len(base) - 1 if base else -1)
                    typ = self.toks[tindex] if tindex >= 0 else None
                    fields[r[0]] = [typ, r[2], tindex, None]

    def enum_body(self, i, j):
        for _, item in split_at(self.toks[i + 1:j], ","):
            if IDENT.fullmatch(item[0]):
                self.enums.add(item[0])

    def tagged(self, i):
        """struct/union/enum at toks[i]: (tag or None, index of its '{' or -1)."""
        t = self.toks
        tag = t[i + 1] if i + 1 < len(t) and IDENT.fullmatch(t[i + 1]) else None
        k = i + (2 if tag else 1)
        return tag, (k if k < len(t) and t[k] == "{" else -1)

    def parse(self):
        t, i, n = self.toks, 0, len(self.toks)
        while i < n:
            if t[i] == "typedef":
                end = i
                while end < n and t[end] != ";":
                    end = matching(t, end) + 1 if t[end] in "({[" else end + 1
                key, rest = None, t[i + 1:end]
                if t[i + 1] in ("struct", "union", "enum"):
                    tag, brace = self.tagged(i + 1)
                    key = tag
                    if tag:
                        self.types.add(tag)
                    if brace >= 0:
                        close = matching(t, brace)
                        rest = t[close + 1:end]
                        if t[i + 1] == "enum":
                            self.enum_body(brace, close)
                        else:
                            after = [x for x in rest if IDENT.fullmatch(x)]
                            key = key or (after[-1] if after else None)
                            if key:
                                self.struct_body(key, brace, close)
                r = declarator(rest)
                if r:
                    self.types.add(r[0])
                    if key:
                        self.aliases[r[0]] = key
                i = end + 1
            elif t[i] in ("struct", "union", "enum"):
                tag, brace = self.tagged(i)
                if brace < 0:
                    i += 1
                    continue
                close = matching(t, brace)
                if tag:
                    self.types.add(tag)
                if t[i] == "enum":
                    self.enum_body(brace, close)
                elif tag:
                    self.struct_body(tag, brace, close)
                i = close + 1
            elif t[i] == "{":  # a function body or an initializer
                i = matching(t, i) + 1
            else:
                if t[i] == "(" and self.path.endswith(".h") and "inline" in t[max(0, i - 8):i]:
                    self.inlines.add(t[i - 1])
                i += 1

def source_units(root, parts, impl_parts=()):
    """Every .c, .cu and .h of the parts' folders, each with its room
    (impl_parts: the parts whose X_impl.h is X.c's)."""
    units = {}
    for part in parts:
        folder = os.path.join(root, part)
        files = sorted(f for f in os.listdir(folder) if f.endswith((".c", ".cu", ".h")))
        for f in files:
            stem, ext = os.path.splitext(f)
            room = f
            if ext == ".h" and stem != part:  # X.h is X.c's; X_impl.h too in impl_parts
                base = stem[:-5] if stem.endswith("_impl") and part in impl_parts else stem
                room = next((base + e for e in (".c", ".cu") if base + e in files), f)
            path = part + "/" + f
            units[path] = Unit(path, part + "/" + room, open(os.path.join(folder, f)).read())
    return units

def apply_slots(units):
    """The aggregate rule: marks the slot members and returns the type tokens
    they name (not uses of the aggregate)."""
    struct_room, aliases = {}, {}
    for u in units.values():
        aliases.update(u.aliases)
        for key in u.structs:
            struct_room.setdefault(key, set()).add(u.node)
    skip = set()
    for u in units.values():
        if not u.node.endswith(".h"):
            continue
        for fields in u.structs.values():
            for f in fields.values():
                rooms = struct_room.get(aliases.get(f[0], f[0]), set()) - {u.node}
                if f[0] and f[1] and len(rooms) == 1:
                    room = next(iter(rooms))
                    if room.split("/")[0] == u.node.split("/")[0]:
                        f[3] = room
                        skip.add((u.path, f[2]))
    return skip

def name_uses(units):
    """{(user room, owner room): names} of every name one room uses of another."""
    skip = apply_slots(units)
    why = {}
    for u in units.values():
        seen, todo = [], [u.path]
        while todo:
            p = todo.pop()
            if p not in seen and p in units:
                seen.append(p)
                todo += units[p].includes
        names, structs, aliases = {}, {}, {}
        for v in (units[p] for p in seen):
            for nm in v.names():
                names.setdefault(nm, set()).add(v.node)
            for key, fields in v.structs.items():
                structs.setdefault(key, []).append((v.node, fields))
            aliases.update(v.aliases)
        def fields_of(typ):
            return structs.get(aliases.get(typ, typ), [])
        def use(room, nm):
            if room != u.node:
                why.setdefault((u.node, room), set()).add(nm)
        t = u.toks
        var = {}  # the variables (and parameters) it declares of a known struct type
        for i in range(len(t) - 1):
            if IDENT.fullmatch(t[i]) and fields_of(t[i]):
                j = i + 1
                while j < len(t) and t[j] in ("*", "const"):
                    j += 1
                if j + 1 < len(t) and IDENT.fullmatch(t[j]) and t[j + 1] in "=;,)[":
                    var[t[j]] = t[i]
        etype = [None] * len(t)  # the struct type of the expression ending at each token
        for i, tok in enumerate(t):
            if tok == "]":
                depth, j = 0, i
                while j > 0:
                    depth += t[j] == "]"
                    depth -= t[j] == "["
                    if depth == 0:
                        break
                    j -= 1
                etype[i] = etype[j - 1]
            elif not IDENT.fullmatch(tok):
                continue
            elif i >= 2 and t[i - 1] in (".", "->"):
                cands = [(nd, fl[tok]) for nd, fl in fields_of(etype[i - 2]) if tok in fl]
                if not cands:
                    cands = [(nd, fl[tok]) for lst in structs.values() for nd, fl in lst
                             if tok in fl]
                    rooms = {f[3] or nd for nd, f in cands}
                    if u.node in rooms or len(rooms) != 1:
                        continue  # its own name, or not known whose
                nd, f = cands[0]
                use(f[3] or nd, tok)
                etype[i] = f[0]
            else:
                etype[i] = var.get(tok)
                rooms = names.get(tok, set())
                if (u.path, i) not in skip and len(rooms) == 1 and u.node not in rooms:
                    use(next(iter(rooms)), tok)
    return why

def listed(syms, most=6):
    syms = sorted(syms)
    return ", ".join(syms[:most]) + (" ..." if len(syms) > most else "")

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
    impl_parts = []
    if "--impl-as-source" in args:
        i = args.index("--impl-as-source")
        impl_parts = args[i + 1].split(",")
        del args[i:i + 2]
    flags = [a for a in args if a.startswith("--") and a != "--rules"]
    args = [a for a in args if a not in flags]
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
    names = {}
    if "--no-names" not in flags:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        present = [p for p in parts if os.path.isdir(os.path.join(root, p))]
        names = name_uses(source_units(root, present, impl_parts))
    for (a, b) in names:
        edges.setdefault(a, set()).add(b)
    nodes = sorted(set(defs) | {a for a, _ in names} | {b for _, b in names})
    bad = [c for c in sccs(nodes, edges) if len(c) > 1]
    for c in bad:
        print("circle: " + " <-> ".join(c))
        for a in c:
            for b in c:
                said = []
                if (a, b) in why:
                    said.append("calls " + listed(why[(a, b)]))
                if (a, b) in names:
                    said.append("names " + listed(names[(a, b)]))
                if said:
                    print("  %s uses %s: %s" % (a, b, "; ".join(said)))
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
    print("%d room(s), %d circle(s) of calls and names, %d undeclared call(s)"
          % (len(nodes), len(bad), undeclared))
    return 1 if bad or undeclared else 0

if __name__ == "__main__":
    sys.exit(main())
