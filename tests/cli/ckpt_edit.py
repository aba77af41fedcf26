#!/usr/bin/env python3
"""tests/cli/ckpt_edit.py STEP [--rename FILE OLD NEW]... [--add REL]...:
edits a checkpoint folder STEP the way an attacker handing a user a
checkpoint would, keeping its manifest valid: renames tensor OLD to NEW in
the safetensors file STEP/FILE (header rewritten, data kept), lists the
file STEP/REL in the manifest, then rewrites every "file" line with the
files' sizes and CRC32C and the manifest's own crc32c line."""
import argparse
import json
import os
import struct


def crc32c(data, crc=0):
    table = crc32c.table
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    crc32c.table.append(c)

ap = argparse.ArgumentParser()
ap.add_argument("step")
ap.add_argument("--rename", nargs=3, action="append", default=[])
ap.add_argument("--add", action="append", default=[])
a = ap.parse_args()
for rel, old, new in a.rename:
    p = os.path.join(a.step, rel)
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head[new] = head.pop(old)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(p, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
mp = os.path.join(a.step, "manifest")
lines = open(mp).read().splitlines()
at = next(i for i, l in enumerate(lines) if l.startswith("files "))
head = lines[:at]  # the lines after the file list (param_steps) stay after it
tail = [l for l in lines[at + 1:] if not l.startswith(("file ", "crc32c "))]
paths = sorted({l.split()[1] for l in lines if l.startswith("file ")} | set(a.add))
body = "\n".join(head) + "\nfiles %d\n" % len(paths)
for rel in paths:
    data = open(os.path.join(a.step, rel), "rb").read()
    body += "file %s %d %08x\n" % (rel, len(data), crc32c(data))
body += "".join(l + "\n" for l in tail)
open(mp, "w").write(body + "crc32c %08x\n" % crc32c(body.encode()))
