#!/usr/bin/env python3
"""tools/check_c_loop.py — compiles README.md's C training loop against the public API.

  tools/check_c_loop.py --cc CC --lib LIBFERRY [--doc FILE] [--out DIR]

README.md shows the training loop as a fenced ```c block right after the
line `<!-- c-loop -->`. This program wraps the block in a main() that
declares what the snippet leaves to the reader (the config, engine, stream,
pointers, layer names and shapes, the init callback, the forward and
backward kernels), compiles it with CC -std=c11 -Wall -Wextra -Werror
against include/ferry.h and links it with LIBFERRY, so a renamed call or a
changed signature fails here. It does not run the program. Exit 0 when it
builds, 1 when it does not (the compiler's messages are printed).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HARNESS = """#include "ferry.h"

static void forward(ferry_stream *s, int layer, void *w) { (void)s, (void)layer, (void)w; }
static void backward(ferry_stream *s, int layer, void *w, void *g) {
  (void)s, (void)layer, (void)w, (void)g;
}
static int init_fn(void *user, const char *name, float *v, size_t n) {
  (void)user, (void)name, (void)v, (void)n;
  return 0;
}

int main(void) {
  enum { L = 4 };
  int steps = 1;
  const char *name[L] = {"w0", "w1", "w2", "w3"};
  int64_t shape[2] = {32, 32};
  ferry_config *cfg;
  ferry_engine *e;
  ferry_stream *s;
  void *w, *g;
  ferry_step_info info;
#line 1 "README.md (the C training loop)"
%s
  ferry_engine_destroy(e);
  return 0;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cc", required=True)
    ap.add_argument("--lib", required=True, help="libferry.so to link")
    ap.add_argument("--doc", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    text = open(a.doc, encoding="utf-8").read()
    m = re.search(r"^<!-- c-loop -->\n```c\n(.*?)^```", text, re.M | re.S)
    if not m:
        print(f"check_c_loop: {a.doc}: no ```c block after '<!-- c-loop -->'")
        return 1
    os.makedirs(a.out, exist_ok=True)
    src = os.path.join(a.out, "readme_c_loop.c")
    with open(src, "w", encoding="utf-8") as f:
        f.write(HARNESS % m.group(1))
    exe = os.path.join(a.out, "readme_c_loop")
    cmd = [a.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
           src, a.lib, "-o", exe]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        print("check_c_loop: README.md's C loop does not build against the public API:")
        print(" ".join(cmd))
        print(p.stdout + p.stderr)
        return 1
    print(f"check_c_loop: README.md's C loop ({len(m.group(1).splitlines())} lines) builds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
